"""The harness presets: how each agent harness runs a turn in the sandbox, offline (docs/harnesses.md).

A preset owns its run command (the instruction is one argv element, read from a file and never
interpreted by a shell), its model environment, its offline switches, where its native log and
session state live under ``/logs/agent/``, whether and how it continues a session, the model APIs
it speaks, and the patterns of its output that tell its failures apart. Its toolchain — a
self-contained tree with its own loader and libraries — reaches any task image through an init
container (``hack/toolchain``); the harness never needs the network but the model's.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from episode_operator.api.models import ModelApi, ModelEndpoint
from episode_operator.api.vocabulary import AgentFailure
from episode_operator.runtime.agents.model import PLACEHOLDER_KEY, Toolchain, proxied_base_url
from episode_operator.runtime.turn.context import LOGS_AGENT

# Stands for the instruction in a preset's argv: replaced by the file's content as one argv element.
INSTRUCTION: Final = "\0instruction\0"
LOGS: Final = LOGS_AGENT


@dataclass(frozen=True)
class HarnessRun:
    """What a preset builds one turn's command from."""

    toolchain: Toolchain
    model: str  # the model's name at the endpoint
    # Where the harness sends its calls, with the version path (``http://127.0.0.1:PORT/v1``: the pod's
    # capture proxy), and the key it sends (a placeholder: the proxy holds the real one).
    base_url: str
    api_key: str
    continue_session: bool  # continue the session of the earlier turns (turnSessions: continue, not the first turn)


def harness_run(toolchain: Toolchain, model: ModelEndpoint, *, continue_session: bool) -> HarnessRun:
    """A turn's run through the pod's capture proxy."""
    return HarnessRun(toolchain, model.name, proxied_base_url(model), PLACEHOLDER_KEY, continue_session)


@dataclass(frozen=True)
class HarnessPreset:
    name: str
    version: str  # the default (its toolchain image's tag)
    apis: frozenset[ModelApi]
    continues: bool
    argv: Callable[[HarnessRun], list[str]]
    env: Callable[[HarnessRun], dict[str, str]]
    # Where its native log and session state live (kept across turns; Gym's cleanup removes only
    # trajectory.json): what `continue` relies on.
    state: tuple[str, ...]
    # Its output's say on a failure, when the model calls recorded none (first match wins).
    failure_patterns: tuple[tuple[re.Pattern[str], AgentFailure], ...] = field(default=())

    def command(self, run: HarnessRun, instruction_file: str) -> str:
        """The shell line the supervisor runs: each argv element quoted, the instruction read from its file.

        A command substitution inside double quotes is one word whose content no shell interprets,
        so any instruction — quotes, ``$``, backticks, newlines — reaches the harness as written.
        """
        read = f'"$(cat {shlex.quote(instruction_file)})"'
        return "exec " + " ".join(
            read.join(shlex.quote(piece) if piece else "" for piece in part.split(INSTRUCTION))
            if INSTRUCTION in part
            else shlex.quote(part)
            for part in self.argv(run)
        )


def _opencode_config(run: HarnessRun) -> str:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "episode",
        "options": {"baseURL": run.base_url, "apiKey": "{env:EPISODE_MODEL_API_KEY}"},
        "models": {run.model: {}},
    }
    return json.dumps({"autoupdate": False, "share": "disabled", "provider": {"episode": provider}})


def _codex_provider(run: HarnessRun) -> str:
    return (
        'model_providers.episode={name="episode", '
        f'base_url="{run.base_url}", env_key="EPISODE_MODEL_API_KEY", wire_api="responses"}}'
    )


PRESETS: Final[Mapping[str, HarnessPreset]] = {
    preset.name: preset
    for preset in (
        HarnessPreset(
            name="mini-swe-agent",
            version="2.4.6",
            apis=frozenset({"chat-completions"}),
            continues=False,
            argv=lambda run: [
                f"{run.toolchain.path}/bin/mini-swe-agent",
                "--yolo",
                f"--model=openai/{run.model}",
                f"--task={INSTRUCTION}",
                f"--output={LOGS}/mini-swe-agent.trajectory.json",
                "-c",
                "mini",
                "--exit-immediately",
            ],
            env=lambda run: {
                "OPENAI_API_KEY": run.api_key,
                "OPENAI_BASE_URL": run.base_url,
                "MSWEA_CONFIGURED": "true",
                "MSWEA_COST_TRACKING": "ignore_errors",
                # Offline: litellm reads its cost map from the package, not the internet.
                "LITELLM_LOCAL_MODEL_COST_MAP": "true",
            },
            state=(f"{LOGS}/mini-swe-agent.trajectory.json",),
        ),
        HarnessPreset(
            name="opencode",
            version="1.17.11",
            apis=frozenset({"chat-completions"}),
            continues=True,
            argv=lambda run: [
                f"{run.toolchain.path}/bin/opencode",
                f"--model=episode/{run.model}",
                "run",
                "--format=json",
                *(["--continue"] if run.continue_session else []),
                "--dangerously-skip-permissions",
                "--",
                INSTRUCTION,
            ],
            env=lambda run: {
                "EPISODE_MODEL_API_KEY": run.api_key,
                "OPENCODE_CONFIG_CONTENT": _opencode_config(run),
                "XDG_DATA_HOME": f"{LOGS}/opencode/xdg-data",
                "XDG_STATE_HOME": f"{LOGS}/opencode/xdg-state",
                # Offline: no update check, no sharing, no models.dev catalogue, no LSP downloads.
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_SHARE": "1",
                "OPENCODE_DISABLE_MODELS_FETCH": "true",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "true",
            },
            state=(f"{LOGS}/opencode/",),
        ),
        HarnessPreset(
            name="claude-code",
            version="2.1.332",
            apis=frozenset({"messages"}),
            continues=True,
            argv=lambda run: [
                f"{run.toolchain.path}/bin/claude",
                "--verbose",
                "--output-format=stream-json",
                "--permission-mode=bypassPermissions",
                *(["--continue"] if run.continue_session else []),
                "--print",
                "--",
                INSTRUCTION,
            ],
            env=lambda run: {
                "ANTHROPIC_API_KEY": run.api_key,
                "ANTHROPIC_BASE_URL": run.base_url.removesuffix("/v1"),
                "ANTHROPIC_MODEL": run.model,
                "CLAUDE_CONFIG_DIR": f"{LOGS}/sessions",
                # Offline: no telemetry, no update checks; bypassPermissions as root in a sandbox.
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "IS_SANDBOX": "1",
            },
            state=(f"{LOGS}/sessions/",),
        ),
        HarnessPreset(
            name="codex",
            version="0.144.4",
            apis=frozenset({"responses"}),
            continues=True,
            argv=lambda run: [
                f"{run.toolchain.path}/bin/codex",
                "exec",
                *(["resume", "--last"] if run.continue_session else []),
                "--dangerously-bypass-approvals-and-sandbox",
                "--skip-git-repo-check",
                "--model",
                run.model,
                "--json",
                "-c",
                'model_provider="episode"',
                "-c",
                _codex_provider(run),
                # Offline: without these codex reaches chatgpt.com and api.github.com at start.
                "-c",
                "features.plugins=false",
                "-c",
                "features.remote_plugin=false",
                "-c",
                "features.apps=false",
                "-c",
                "check_for_update_on_startup=false",
                "-c",
                "analytics.enabled=false",
                "-c",
                'web_search="disabled"',
                "--",
                INSTRUCTION,
            ],
            env=lambda run: {"EPISODE_MODEL_API_KEY": run.api_key, "CODEX_HOME": f"{LOGS}/codex"},
            state=(f"{LOGS}/codex/",),
        ),
    )
}
