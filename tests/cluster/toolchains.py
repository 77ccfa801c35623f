"""Harness toolchains in a sandbox pod, as a preset would run them (helpers of the harness tests).

A toolchain image (`hack/cluster images`, built by hack/toolchain) holds one self-contained tree;
an init container copies it into an emptyDir that the main container -- the task's image, here
the plain sandbox image -- mounts read-only at the tree's own path. `HARNESSES` runs the
operator's own presets (runtime/agents/harnesses.py), one per entry of the harness registry,
pointed straight at the scripted server.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.stream import stream

from episode_operator.api.episode_resource import ModelApi
from episode_operator.kube.objects.pods import AgentImages
from episode_operator.runtime.agents.harnesses import INSTRUCTION, PRESETS, HarnessPreset, HarnessRun, model_api
from episode_operator.runtime.agents.model import Toolchain
from episode_operator.runtime.sandbox_protocol import KEEP_ALIVE

LOGS = "/logs/agent"
API_KEY = "sk-episode-test-key"  # a fake: the scripted server records it, tests check it arrived


@dataclass(frozen=True)
class Harness:
    """One operator preset (runtime/agents/harnesses.py) run straight at a model server, key included.

    The proof tests run the presets' own command lines and environments, so what they prove is what
    the operator runs; only the model's address and key differ (the operator puts its capture proxy
    and a placeholder there).
    """

    preset: HarnessPreset
    api: ModelApi  # the model API it is run with: one of its entry's

    @property
    def name(self) -> str:
        return self.preset.name

    @property
    def native_logs(self) -> tuple[str, ...]:
        """Globs under LOGS of the files a run writes (its registry entry's)."""
        return self.preset.entry.native_logs

    @property
    def version(self) -> str:
        return self.preset.version

    @property
    def dialect(self) -> str:
        """The scripted server's name of the model API the harness speaks in this run."""
        return DIALECTS[self.api]

    @property
    def toolchain(self) -> Toolchain:
        return Toolchain(self.name, self.version)

    @property
    def image(self) -> str:
        return AgentImages().toolchain(self.toolchain)

    @property
    def root(self) -> str:
        return self.toolchain.path

    @property
    def entry(self) -> str:
        """The harness's executable (the first word of its command)."""
        return self.command("-", "-", "-", False)[0]

    def run(self, model: str, base_url: str, continue_session: bool) -> HarnessRun:
        # The preset's base URL carries the endpoint's version path; the scripted server serves /v1.
        return HarnessRun(self.toolchain, model, f"{base_url}/v1", API_KEY, continue_session, self.api)

    def command(self, instruction: str, model: str, base_url: str, continue_session: bool) -> list[str]:
        """The preset's argv with the instruction in place (one element, as the shell line makes it)."""
        if continue_session and not self.preset.continues:
            raise ValueError(f"{self.name} cannot continue a session")
        argv = self.preset.argv(self.run(model, base_url, continue_session))
        return [part.replace(INSTRUCTION, instruction) for part in argv]

    def environment(self, model: str, base_url: str) -> dict[str, str]:
        return self.preset.env(self.run(model, base_url, False))

    def loop_steps(self, scripted: int) -> list[int]:
        """The script's step each request of the agent's loop gets, for a rule of `scripted` steps ending in a
        finish. A harness whose model acts by tools asks for each step (the finish ends its loop); Terminus-2
        asks once more whether it is done, and is answered past the last step. One whose model acts by the
        edits of its one answer (its registry entry's ``acts``: aider) asks for the first only."""
        if self.preset.entry.acts == "edits":
            return [0]
        return list(range(scripted + 1 if self.name in CONFIRMS_FINISH else scripted))


DIALECTS = {"chat-completions": "chat", "responses": "responses", "messages": "messages"}
# Harnesses that ask the model to confirm it is done ("task_complete" twice: Terminus-2).
CONFIRMS_FINISH = frozenset({"terminus-2"})
# Each preset with its default API (its entry's first).
HARNESSES: dict[str, Harness] = {
    name: Harness(preset, model_api(preset.entry.apis[0])) for name, preset in PRESETS.items()
}
# Each preset with each API it speaks, as "NAME" for its default and "NAME:API" for the others.
HARNESS_APIS: dict[str, Harness] = {
    name if api == preset.entry.apis[0] else f"{name}:{api}": Harness(preset, model_api(api))
    for name, preset in PRESETS.items()
    for api in preset.entry.apis
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
                    "args": list(KEEP_ALIVE),
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


def conversation_text(record: dict[str, Any]) -> str:
    """The conversation a recorded model request carried (chat messages, or a Responses input), as JSON text."""
    return json.dumps(record["body"].get("messages") or record["body"].get("input") or [])
