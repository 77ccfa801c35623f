"""Harness toolchains in a sandbox pod, as a preset would run them (helpers of the harness tests).

A toolchain image (`hack/cluster images`, built by hack/toolchain) holds one self-contained tree;
an init container copies it into an emptyDir that the main container -- the task's image, here
the plain sandbox image -- mounts read-only at the tree's own path. `HARNESSES` is the command
line, environment and native log of each harness exactly as docs/harnesses.md gives them: the
lead turns these rows into the operator's presets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.stream import stream

TOOLCHAIN_ROOT = "/opt/episode-operator/toolchains"
LOGS = "/logs/agent"
API_KEY = "sk-episode-test-key"  # a fake: the scripted server records it, tests check it arrived
KEY_VARIABLE = "EPISODE_MODEL_API_KEY"
KEEP_ALIVE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


@dataclass(frozen=True)
class Harness:
    """How one harness runs from its toolchain (one row of docs/harnesses.md)."""

    name: str
    version: str
    dialect: str  # the model API it speaks: chat | responses | messages
    command: Callable[[str, str, str, bool], list[str]]  # (instruction, model, base_url, continue) -> argv
    environment: Callable[[str, str], dict[str, str]]  # (model, base_url) -> env (the key comes separately)
    native_logs: tuple[str, ...] = field(default=())  # globs under LOGS the harness writes

    @property
    def image(self) -> str:
        return f"episode-operator.local/toolchain-{self.name}:{self.version}"

    @property
    def root(self) -> str:
        return f"{TOOLCHAIN_ROOT}/{self.name}"

    @property
    def entry(self) -> str:
        """The harness's executable (the first word of its command)."""
        return self.command("-", "-", "-", False)[0]


def mini_swe_agent_command(instruction: str, model: str, base_url: str, continue_session: bool) -> list[str]:
    if continue_session:
        raise ValueError("mini-swe-agent cannot continue a session")
    return [
        f"{TOOLCHAIN_ROOT}/mini-swe-agent/bin/mini-swe-agent",
        "--yolo",
        f"--model=openai/{model}",
        f"--task={instruction}",
        f"--output={LOGS}/mini-swe-agent.trajectory.json",
        "-c",
        "mini",
        "--exit-immediately",
    ]


def mini_swe_agent_environment(model: str, base_url: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "true",
    }


def opencode_command(instruction: str, model: str, base_url: str, continue_session: bool) -> list[str]:
    return [
        f"{TOOLCHAIN_ROOT}/opencode/bin/opencode",
        f"--model=episode/{model}",
        "run",
        "--format=json",
        *(["--continue"] if continue_session else []),
        "--dangerously-skip-permissions",
        "--",
        instruction,
    ]


def opencode_environment(model: str, base_url: str) -> dict[str, str]:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "episode",
        "options": {"baseURL": f"{base_url}/v1", "apiKey": f"{{env:{KEY_VARIABLE}}}"},
        "models": {model: {}},
    }
    config = {"autoupdate": False, "share": "disabled", "provider": {"episode": provider}}
    return {
        KEY_VARIABLE: API_KEY,
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "XDG_DATA_HOME": f"{LOGS}/opencode/xdg-data",
        "XDG_STATE_HOME": f"{LOGS}/opencode/xdg-state",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "true",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "true",
    }


def claude_code_command(instruction: str, model: str, base_url: str, continue_session: bool) -> list[str]:
    return [
        f"{TOOLCHAIN_ROOT}/claude-code/bin/claude",
        "--verbose",
        "--output-format=stream-json",
        "--permission-mode=bypassPermissions",
        *(["--continue"] if continue_session else []),
        "--print",
        "--",
        instruction,
    ]


def claude_code_environment(model: str, base_url: str) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_MODEL": model,
        "CLAUDE_CONFIG_DIR": f"{LOGS}/sessions",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "IS_SANDBOX": "1",
    }


def codex_command(instruction: str, model: str, base_url: str, continue_session: bool) -> list[str]:
    provider = f'{{name="episode", base_url="{base_url}/v1", env_key="{KEY_VARIABLE}", wire_api="responses"}}'
    settings = [
        'model_provider="episode"',
        f"model_providers.episode={provider}",
        "features.plugins=false",
        "features.remote_plugin=false",
        "features.apps=false",
        "check_for_update_on_startup=false",
        "analytics.enabled=false",
        'web_search="disabled"',
    ]
    return [
        f"{TOOLCHAIN_ROOT}/codex/bin/codex",
        "exec",
        *(["resume", "--last"] if continue_session else []),
        "--dangerously-bypass-approvals-and-sandbox",
        "--skip-git-repo-check",
        "--model",
        model,
        "--json",
        *[part for setting in settings for part in ("-c", setting)],
        "--",
        instruction,
    ]


def codex_environment(model: str, base_url: str) -> dict[str, str]:
    return {KEY_VARIABLE: API_KEY, "CODEX_HOME": f"{LOGS}/codex"}


HARNESSES: dict[str, Harness] = {
    harness.name: harness
    for harness in (
        Harness(
            "mini-swe-agent",
            "2.4.6",
            "chat",
            mini_swe_agent_command,
            mini_swe_agent_environment,
            ("mini-swe-agent.trajectory.json",),
        ),
        Harness(
            "opencode",
            "1.17.11",
            "chat",
            opencode_command,
            opencode_environment,
            ("opencode/xdg-data/opencode/opencode.db",),
        ),
        Harness(
            "claude-code",
            "2.1.332",
            "messages",
            claude_code_command,
            claude_code_environment,
            ("sessions/projects/*/*.jsonl",),
        ),
        Harness(
            "codex", "0.144.4", "responses", codex_command, codex_environment, ("codex/sessions/*/*/*/rollout-*.jsonl",)
        ),
    )
}


def toolchain_pod(name: str, harness: Harness, sandbox_image: str) -> dict[str, Any]:
    """A sandbox pod with `harness`'s toolchain copied in, the task image's entrypoint kept.

    No DNS server (the nameserver is loopback, where nothing listens): the harness must reach
    nothing by name, the model included (it is addressed by IP).
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"episode-operator.dev/test": "toolchain"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "initContainers": [
                {
                    "name": "toolchain",
                    "image": harness.image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/cp", "-a", f"{harness.root}/.", "/toolchain/"],
                    "volumeMounts": [{"name": "toolchain", "mountPath": "/toolchain"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": sandbox_image,
                    "imagePullPolicy": "Never",
                    "args": KEEP_ALIVE,
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["NET_RAW"]}},
                    "volumeMounts": [
                        {"name": "toolchain", "mountPath": harness.root, "readOnly": True},
                        {"name": "logs", "mountPath": "/logs"},
                    ],
                }
            ],
            "volumes": [{"name": "toolchain", "emptyDir": {}}, {"name": "logs", "emptyDir": {}}],
        },
    }


@dataclass(frozen=True)
class PodStart:
    """When a toolchain pod was scheduled, its toolchain copied and its main container started."""

    scheduled: float
    toolchain_copied: float
    main_started: float


def wait_for_running(core: client.CoreV1Api, namespace: str, name: str, timeout: float = 180) -> PodStart:
    """Wait until the pod's main container runs; fail with the init container's log if it failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        for status in pod.status.init_container_statuses or []:
            terminated = status.state.terminated
            if terminated is not None and terminated.exit_code != 0:
                log = core.read_namespaced_pod_log(name, namespace, container=status.name)
                raise AssertionError(f"init container {status.name} exited {terminated.exit_code}:\n{log}")
        if pod.status.phase == "Running":
            scheduled = next(c.last_transition_time for c in pod.status.conditions if c.type == "PodScheduled")
            copied = pod.status.init_container_statuses[0].state.terminated.finished_at
            started = pod.status.container_statuses[0].state.running.started_at
            return PodStart(scheduled.timestamp(), copied.timestamp(), started.timestamp())
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} ended {pod.status.phase} before running")
        time.sleep(0.3)
    raise TimeoutError(f"pod {namespace}/{name} not running after {timeout} s")


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


def exec_argv(
    core: client.CoreV1Api,
    namespace: str,
    pod: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> ExecResult:
    """Run argv in the pod's main container (no shell: each element reaches the program as it is).

    The environment is set with `env NAME=VALUE ... argv`, still without a shell.
    """
    command = ["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv] if env else argv
    connection = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container="main",
        command=command,
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    stdout, stderr = [], []
    deadline = time.monotonic() + timeout
    while connection.is_open():
        if time.monotonic() > deadline:
            connection.close()
            raise TimeoutError(f"{argv[0]} still running after {timeout} s")
        connection.update(timeout=1)
        if connection.peek_stdout():
            stdout.append(connection.read_stdout())
        if connection.peek_stderr():
            stderr.append(connection.read_stderr())
    exit_code = connection.returncode
    connection.close()
    return ExecResult(exit_code if exit_code is not None else -1, "".join(stdout), "".join(stderr))
