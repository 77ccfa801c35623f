"""The harness presets: how each agent harness runs a turn in the sandbox, offline (docs/harnesses.md).

A preset is a harness's registry entry (``harness_registry.py``: its version, the model APIs it
speaks, whether it continues a session, where its native log and session state live under
``/logs/agent/``, its toolchain) with its code here, keyed by the entry's name (``COMMANDS``): its
run command (the instruction is one argv element, read from a file and never interpreted by a
shell), its model environment and offline switches, and the patterns of its output that tell its
failures apart. Its toolchain — a self-contained tree with its own loader and libraries — reaches
any task image through an init container (``hack/toolchain``); the harness never needs the network
but the model's.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, cast, get_args

from episode_operator.api.episode_resource import ModelApi, ModelEndpoint
from episode_operator.api.vocabulary import AgentFailure
from episode_operator.runtime.agents.harness_registry import HARNESSES, HarnessEntry
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
    api: ModelApi  # the model API it speaks this run (spec.agent.model.api, one of its entry's)


def harness_run(toolchain: Toolchain, model: ModelEndpoint, *, continue_session: bool) -> HarnessRun:
    """A turn's run through the pod's capture proxy."""
    return HarnessRun(toolchain, model.name, proxied_base_url(model), PLACEHOLDER_KEY, continue_session, model.api)


@dataclass(frozen=True)
class HarnessCommand:
    """The code of one harness, keyed by its registry name in ``COMMANDS``."""

    argv: Callable[[HarnessRun], list[str]]
    env: Callable[[HarnessRun], dict[str, str]]
    # Its output's say on a failure, when the model calls recorded none (first match wins).
    failure_patterns: tuple[tuple[re.Pattern[str], AgentFailure], ...] = field(default=())


@dataclass(frozen=True)
class HarnessPreset:
    """A harness's registry entry with its code: what the ``harness`` agent kind runs."""

    entry: HarnessEntry
    code: HarnessCommand

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def version(self) -> str:
        """The default version (its toolchain image's tag)."""
        return self.entry.version

    @property
    def apis(self) -> frozenset[ModelApi]:
        return frozenset(model_api(api) for api in self.entry.apis)

    @property
    def continues(self) -> bool:
        return self.entry.continues

    @property
    def state(self) -> tuple[str, ...]:
        """Where its native log and session state live (kept across turns; Gym's cleanup removes only
        trajectory.json): what ``continue`` relies on."""
        return tuple(f"{LOGS}/{path}" for path in self.entry.state)

    def argv(self, run: HarnessRun) -> list[str]:
        return self.code.argv(run)

    def env(self, run: HarnessRun) -> dict[str, str]:
        return self.code.env(run)

    @property
    def failure_patterns(self) -> tuple[tuple[re.Pattern[str], AgentFailure], ...]:
        return self.code.failure_patterns

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


# pi's name of each model API (its models.json's `api`).
PI_APIS: Final[Mapping[ModelApi, str]] = {
    "chat-completions": "openai-completions",
    "responses": "openai-responses",
    "messages": "anthropic-messages",
}


def _pi_models(run: HarnessRun) -> str:
    """pi's models.json: one provider, the proxy, speaking the run's API (Anthropic's clients add `/v1`)."""
    base_url = run.base_url.removesuffix("/v1") if run.api == "messages" else run.base_url
    provider = {
        "baseUrl": base_url,
        "apiKey": "$EPISODE_MODEL_API_KEY",
        "api": PI_APIS[run.api],
        "models": [{"id": run.model}],
    }
    return json.dumps({"providers": {"episode": provider}})


# kimi-cli compacts its context when it nears this many tokens; the endpoint's window is not known
# here, so Harbor's default for a model litellm does not know.
KIMI_CONTEXT_TOKENS: Final = 131072


def _kimi_config(run: HarnessRun) -> str:
    """kimi-cli's whole configuration, as its ``--config`` takes it: no file in the agent's home. The key
    is not in it (argv is visible to the agent's commands): ``OPENAI_API_KEY`` overrides the empty one."""
    provider = {"type": "openai_legacy", "base_url": run.base_url, "api_key": ""}
    model = {"provider": "episode", "model": run.model, "max_context_size": KIMI_CONTEXT_TOKENS}
    return json.dumps(
        {
            "default_model": "episode",
            "providers": {"episode": provider},
            "models": {"episode": model},
            "telemetry": False,
        }
    )


# cline's provider for each model API (its providers.json), and the variable each takes its key from.
CLINE_PROVIDERS: Final[Mapping[ModelApi, tuple[str, str]]] = {
    "chat-completions": ("openai-compatible", "OPENAI_API_KEY"),
    "responses": ("openai-native", "OPENAI_API_KEY"),
    "messages": ("anthropic", "ANTHROPIC_API_KEY"),
}


def _cline_providers(run: HarnessRun) -> str:
    """cline's providers.json: one provider, the proxy, speaking the run's API, in the shape cline writes
    it (it replaces one of another shape with the command line's provider, losing the base URL). The key
    is not in it: cline reads it from its provider's variable. Anthropic's base URL keeps ``/v1`` here:
    cline appends ``/messages`` alone."""
    provider, _ = CLINE_PROVIDERS[run.api]
    entry = {
        "settings": {"provider": provider, "model": run.model, "baseUrl": run.base_url},
        "updatedAt": "1970-01-01T00:00:00.000Z",
        "tokenSource": "manual",
    }
    return json.dumps({"version": 1, "lastUsedProvider": provider, "modes": {}, "providers": {provider: entry}})


# Hermes's provider for each model API, and the variables of its key and base URL (Anthropic's
# client adds ``/v1``).
HERMES_PROVIDERS: Final[Mapping[ModelApi, tuple[str, str, str]]] = {
    "chat-completions": ("openai-api", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "messages": ("anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
}


def _hermes_env(run: HarnessRun) -> dict[str, str]:
    _, key, base_url = HERMES_PROVIDERS[run.api]
    return {
        key: run.api_key,
        base_url: run.base_url.removesuffix("/v1") if run.api == "messages" else run.base_url,
        # Its configuration, sessions (state.db) and logs: ~/.hermes otherwise.
        "HERMES_HOME": f"{LOGS}/hermes",
        # Offline, and the agent's calls only: the tree's managed scope (hack/toolchain), which wins over
        # the home's config.yaml: no tirith download, no language servers, no model catalogue, no memory
        # review, curator or title calls of Hermes's own.
        "HERMES_MANAGED_DIR": f"{run.toolchain.path}/share/hermes",
    }


def _codex_provider(run: HarnessRun) -> str:
    return (
        'model_providers.episode={name="episode", '
        f'base_url="{run.base_url}", env_key="EPISODE_MODEL_API_KEY", wire_api="responses"}}'
    )


# What kimi-cli prints on stdout when the model endpoint fails it, on a line of its own (its conversation's
# JSON lines cannot start one): the provider's status, or the client's connection error; then it exits 1,
# or 75 when it deems the error retryable (429, 5xx, connection). Seen in the offline trials.
KIMI_FAILURES: Final[tuple[tuple[re.Pattern[str], AgentFailure], ...]] = (
    (re.compile(r"^Error code: 40[13]\b", re.M), "model_auth"),
    (re.compile(r"^Error code: 404\b", re.M), "model_not_found"),
    (re.compile(r"^Error code: 429\b", re.M), "model_rate_limit"),
    (re.compile(r"^Error code: 5\d\d\b", re.M), "model_unavailable"),
    (re.compile(r"^Connection error\.$", re.M), "model_unavailable"),
)
# What aider prints on stdout when the model endpoint fails it: litellm's exception, on a line of its own,
# before each retry (429 and 5xx for about a minute) or once (401). It exits 0 even then: these count when
# the turn's budget ended it, or it exited non-zero, and the capture recorded no failed call. Seen in the
# offline trials.
AIDER_FAILURES: Final[tuple[tuple[re.Pattern[str], AgentFailure], ...]] = (
    (re.compile(r"^litellm\.AuthenticationError:", re.M), "model_auth"),
    (re.compile(r"^litellm\.RateLimitError:", re.M), "model_rate_limit"),
    (re.compile(r"^litellm\.(?:InternalServerError|APIConnectionError):", re.M), "model_unavailable"),
)
# What cline prints on stdout when the model endpoint fails it: an `error` event of its agent, on a line of
# its own (a tool's output is a JSON string inside a line), with cline's class of the error -- `auth`,
# `context_window_exceeded` (the context-window wording the classifier reads anyway) or `unknown` -- then it
# exits 1. It retries 429, 5xx and refused connections silently. Seen in the trials against the scripted server.
CLINE_FAILURES: Final[tuple[tuple[re.Pattern[str], AgentFailure], ...]] = (
    (
        re.compile(r'^\{"ts":"[^"]*","type":"agent_event","event":\{"type":"error",.*"errorClass":"auth"', re.M),
        "model_auth",
    ),
)
# What Hermes prints on stdout when the model endpoint fails it, on a line of its own: the status and the
# provider's message (`HTTP 401: ...` at once; `API call failed after 3 retries: HTTP 429: ...` after its
# retries, or the client's error there when no status came), then it exits 1. Seen in the trials against the
# scripted server.
HERMES_RETRIED: Final = r"^(?:API call failed after \d+ retries: )?"
HERMES_FAILURES: Final[tuple[tuple[re.Pattern[str], AgentFailure], ...]] = (
    (re.compile(HERMES_RETRIED + r"HTTP 40[13]\b", re.M), "model_auth"),
    (re.compile(HERMES_RETRIED + r"HTTP 404\b", re.M), "model_not_found"),
    (re.compile(HERMES_RETRIED + r"HTTP 429\b", re.M), "model_rate_limit"),
    (re.compile(HERMES_RETRIED + r"HTTP 5\d\d\b", re.M), "model_unavailable"),
    (re.compile(r"^API call failed after \d+ retries: ", re.M), "model_unavailable"),
)

COMMANDS: Final[Mapping[str, HarnessCommand]] = {
    "mini-swe-agent": HarnessCommand(
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
    ),
    "opencode": HarnessCommand(
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
    ),
    "claude-code": HarnessCommand(
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
    ),
    "codex": HarnessCommand(
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
    ),
    "terminus-2": HarnessCommand(
        # Our runner of Harbor's own Terminus2 (hack/toolchains/terminus-2/episode_terminus.py); litellm's
        # openai/ provider speaks chat completions to any OpenAI-compatible base URL.
        argv=lambda run: [
            f"{run.toolchain.path}/bin/terminus-2",
            f"--model=openai/{run.model}",
            f"--api-base={run.base_url}",
            f"--logs-dir={LOGS}/terminus-2",
            "--",
            INSTRUCTION,
        ],
        env=lambda run: {
            "OPENAI_API_KEY": run.api_key,
            # Offline: litellm reads its cost map from the package, not the internet.
            "LITELLM_LOCAL_MODEL_COST_MAP": "true",
        },
    ),
    "qwen-code": HarnessCommand(
        argv=lambda run: [
            f"{run.toolchain.path}/bin/qwen",
            "--auth-type=openai",
            f"--model={run.model}",
            "--output-format=stream-json",
            "--yolo",
            "--chat-recording",
            *(["--continue"] if run.continue_session else []),
            # One argv element whatever the instruction starts with (a positional prompt after `--`
            # is not read: qwen then waits for stdin).
            f"--prompt={INSTRUCTION}",
        ],
        env=lambda run: {
            "OPENAI_API_KEY": run.api_key,
            "OPENAI_BASE_URL": run.base_url,
            # Its settings, session chats and usage records: ~/.qwen otherwise.
            "QWEN_HOME": f"{LOGS}/qwen-code",
            # Offline: the tree's settings (hack/toolchain), qwen's system layer, which a task's own
            # .qwen/settings.json cannot undo: no usage statistics (else it resolves its collector's
            # host), no update check, no telemetry, no background memory calls of its own.
            "QWEN_CODE_SYSTEM_SETTINGS_PATH": f"{run.toolchain.path}/share/qwen-code/system-settings.json",
            # Offline: no HEAD request to the provider's default host when a proxy is configured.
            "QWEN_CODE_DISABLE_PRECONNECT": "1",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        },
    ),
    "pi": HarnessCommand(
        argv=lambda run: [
            f"{run.toolchain.path}/bin/pi",
            # pi's options take their values as the next argument (it refuses `--model=M`).
            "--provider",
            "episode",
            "--model",
            run.model,
            "--mode",
            "json",
            *(["--continue"] if run.continue_session else []),
            "--print",
            # The launcher passes it on pi's stdin: pi takes an argument starting with `@` for a file.
            "--",
            INSTRUCTION,
        ],
        env=lambda run: {
            "EPISODE_MODEL_API_KEY": run.api_key,
            # The launcher writes it to $PI_CODING_AGENT_DIR/models.json: pi reads a provider nowhere else.
            "EPISODE_PI_MODELS": _pi_models(run),
            # Its settings, models.json and sessions (sessions/<cwd>/*.jsonl): ~/.pi/agent otherwise.
            "PI_CODING_AGENT_DIR": f"{LOGS}/pi",
            # Offline: no model catalogue refresh, no version check, no install telemetry.
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
        },
    ),
    "kimi-cli": HarnessCommand(
        argv=lambda run: [
            f"{run.toolchain.path}/bin/kimi",
            "--print",
            "--output-format=stream-json",
            *(["--continue"] if run.continue_session else []),
            f"--config={_kimi_config(run)}",
            f"--prompt={INSTRUCTION}",
        ],
        env=lambda run: {
            # For an openai_legacy provider these override its configured key and base URL (and would
            # from the task's environment, so the preset sets both).
            "OPENAI_API_KEY": run.api_key,
            "OPENAI_BASE_URL": run.base_url,
            "KIMI_SHARE_DIR": f"{LOGS}/kimi",
            # Offline: no telemetry, no update check.
            "KIMI_DISABLE_TELEMETRY": "1",
            "KIMI_CLI_NO_AUTO_UPDATE": "1",
        },
        failure_patterns=KIMI_FAILURES,
    ),
    "aider": HarnessCommand(
        argv=lambda run: [
            f"{run.toolchain.path}/bin/aider",
            f"--model=openai/{run.model}",
            "--yes-always",
            *(["--restore-chat-history"] if run.continue_session else []),
            f"--chat-history-file={LOGS}/aider/chat.history.md",
            f"--input-history-file={LOGS}/aider/input.history",
            f"--llm-history-file={LOGS}/aider/llm.history",
            # Offline: no update check, no release notes, no analytics, no fetching of URLs the
            # instruction names; no model warnings (they offer to open a browser).
            "--no-check-update",
            "--no-show-release-notes",
            "--no-analytics",
            "--no-detect-urls",
            "--no-show-model-warnings",
            # Else aider adds .aider* to a task repository's .gitignore.
            "--no-gitignore",
            "--no-pretty",
            "--no-fancy-input",
            f"--message={INSTRUCTION}",
        ],
        env=lambda run: {
            "OPENAI_API_KEY": run.api_key,
            "OPENAI_API_BASE": run.base_url,
            # Offline: litellm reads its cost map from the package, not the internet.
            "LITELLM_LOCAL_MODEL_COST_MAP": "true",
        },
        failure_patterns=AIDER_FAILURES,
    ),
    "cline": HarnessCommand(
        argv=lambda run: [
            f"{run.toolchain.path}/bin/cline",
            "--provider",
            CLINE_PROVIDERS[run.api][0],
            "--model",
            run.model,
            "--json",
            # Every tool call approved, as Harbor runs it.
            "--yolo",
            "--",
            INSTRUCTION,
        ],
        env=lambda run: {
            CLINE_PROVIDERS[run.api][1]: run.api_key,
            # The launcher writes it to $CLINE_DATA_DIR/settings/providers.json: cline reads a base URL nowhere else.
            "EPISODE_CLINE_PROVIDERS": _cline_providers(run),
            # Its rules, hooks and skills, and its data (sessions, settings, logs): ~/.cline otherwise.
            "CLINE_DIR": f"{LOGS}/cline",
            "CLINE_DATA_DIR": f"{LOGS}/cline/data",
            # Offline: the tree's global settings (no telemetry, no self-update), no update check, and
            # no feature flags fetched from its vendor (E2E_TEST is cline's only switch for that).
            "CLINE_GLOBAL_SETTINGS_PATH": f"{run.toolchain.path}/share/cline/global-settings.json",
            "CLINE_NO_AUTO_UPDATE": "1",
            "E2E_TEST": "true",
        },
        failure_patterns=CLINE_FAILURES,
    ),
    "hermes": HarnessCommand(
        argv=lambda run: [
            f"{run.toolchain.path}/bin/hermes",
            # Every command approved, as Harbor runs it.
            "--yolo",
            "chat",
            *(["--continue"] if run.continue_session else []),
            # Its final answer and the session's id only, no banner or spinner.
            "--quiet",
            "--model",
            run.model,
            "--provider",
            HERMES_PROVIDERS[run.api][0],
            f"--query={INSTRUCTION}",
        ],
        env=_hermes_env,
        failure_patterns=HERMES_FAILURES,
    ),
}


def model_api(name: str) -> ModelApi:
    """A registry entry's API as the spec's name of it (the registry, stdlib-only, spells it as a string)."""
    if name not in get_args(ModelApi):
        raise ValueError(f"harness registry: {name!r} is not a model API ({', '.join(get_args(ModelApi))})")
    return cast(ModelApi, name)


def paired(entries: Mapping[str, HarnessEntry], commands: Mapping[str, HarnessCommand]) -> dict[str, HarnessPreset]:
    """Each registry entry with its code: an entry without code, or code without an entry, stops the import."""
    unpaired = sorted(entries.keys() ^ commands.keys())
    if unpaired:
        raise LookupError(f"harnesses without both a registry entry and a COMMANDS entry: {', '.join(unpaired)}")
    return {name: HarnessPreset(entry, commands[name]) for name, entry in entries.items()}


PRESETS: Final[Mapping[str, HarnessPreset]] = paired(HARNESSES, COMMANDS)

# How the docs' table names each model API.
API_NAMES: Final[Mapping[ModelApi, str]] = {
    "chat-completions": "chat completions",
    "responses": "Responses",
    "messages": "Anthropic Messages",
}


def continue_arguments(preset: HarnessPreset) -> list[str]:
    """The arguments a continued turn's command has and a fresh one's has not (empty: it cannot continue)."""
    model = ModelEndpoint.model_validate({"name": "m", "baseURL": "http://model/v1", "api": sorted(preset.apis)[0]})
    toolchain = Toolchain(preset.name, preset.version)
    fresh = preset.argv(harness_run(toolchain, model, continue_session=False))
    continued = preset.argv(harness_run(toolchain, model, continue_session=True))
    return [part for part in continued if part not in fresh]


def render_table(image: Callable[[Toolchain], str], presets: Mapping[str, HarnessPreset] = PRESETS) -> str:
    """The harness table of README.md and docs/harnesses.md (tests/doc_tables.py), one row per registry
    entry; ``image`` names a toolchain's image (the kube layer's ``AgentImages().toolchain``)."""
    lines = ["| harness | version | toolchain image | model API | continue |", "| --- | --- | --- | --- | --- |"]
    for preset in presets.values():
        entry = preset.entry
        version = f"{entry.version} ({entry.version_note})" if entry.version_note else entry.version
        apis = " or ".join(API_NAMES[model_api(api)] for api in entry.apis)
        resume = continue_arguments(preset)
        continues = f"`{' '.join(resume)}`" if preset.continues else "no"
        image_name = image(Toolchain(preset.name, preset.version))
        lines.append(f"| {entry.name} ({entry.origin}) | {version} | `{image_name}` | {apis} | {continues} |")
    return "\n".join(lines) + "\n"
