"""The baseline: the same minimal work done directly on one pod with the synchronous Python client.

No supervisor, no status, no events: create a pod of the same image and shape as the
operator's agent pod, wait for it with a watch, then per turn one exec per operation —
upload ``workdir/`` (a tar on stdin read by ``head -c N | tar x``: a 1.20 API server cannot
half-close an exec's stdin), run ``setup.sh``, upload the solution, run ``solve.sh``, clear
``/tests`` and ``/logs/verifier``, upload the tests, run ``test.sh``, read the reward file —
and delete the pod. This is what a user scripting sandboxes by hand would at least do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.stream import stream

from .cluster import new_watch
from .tasks import IMAGE, WORKDIR, DirectTurn

# The operator's agent pod, less what only the operator needs (labels, owner).
KEEP_ALIVE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
UPLOAD = 'mkdir -p "$1" && head -c "$2" | tar -x -f - -C "$1"'
CLEAR = "rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier"


def pod_manifest(name: str, image: str = IMAGE, workdir: str = WORKDIR) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"episode-operator.dev/bench": "baseline"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": KEEP_ALIVE,
                    "workingDir": workdir,
                    "volumeMounts": [{"name": "scratch", "mountPath": "/episode-operator"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


class ExecFailed(Exception):
    pass


@dataclass
class DirectPod:
    """One pod driven by plain execs; every operation's duration is kept in ``timings``."""

    api: client.ApiClient
    namespace: str
    name: str
    timings: list[tuple[str, float]] = field(default_factory=list)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def _timed(self, label: str, started: float) -> None:
        self.timings.append((label, time.time() - started))

    def create(self) -> float:
        """Create the pod; returns when the request was sent."""
        sent = time.time()
        self.core.create_namespaced_pod(self.namespace, pod_manifest(self.name))
        self._timed("pod-create", sent)
        return sent

    def wait_running(self, timeout: float = 120) -> float:
        """Until the container runs (a watch, so no poll interval adds to it); returns when seen."""
        started = time.time()
        events = new_watch()
        for event in events.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            field_selector=f"metadata.name={self.name}",
            timeout_seconds=int(timeout),
        ):
            pod = event["object"]
            statuses = pod.status.container_statuses or []
            if pod.status.phase == "Running" and statuses and all(s.state.running for s in statuses):
                events.stop()
                seen = time.time()
                self._timed("pod-running", started)
                return seen
            if pod.status.phase in ("Failed", "Succeeded"):
                events.stop()
                raise ExecFailed(f"pod {self.name} ended: {pod.status.phase}")
        raise TimeoutError(f"pod {self.name} not running after {timeout:.0f} s")

    def exec(self, argv: Sequence[str], stdin: bytes | None = None, timeout: float = 60) -> tuple[int, bytes, bytes]:
        """One exec: exit code, stdout, stderr."""
        connection = stream(
            self.core.connect_get_namespaced_pod_exec,
            self.name,
            self.namespace,
            command=list(argv),
            container="main",
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            binary=True,
        )
        try:
            if stdin is not None:
                connection.write_stdin(stdin)
            connection.run_forever(timeout=timeout)
            if connection.is_open():
                raise TimeoutError(f"exec {argv[:3]} in {self.name}: no answer in {timeout:.0f} s")
            stdout, stderr = connection.read_stdout(), connection.read_stderr()
            code = connection.returncode
        finally:
            connection.close()
        return int(code), bytes(stdout), bytes(stderr)

    def checked(self, label: str, argv: Sequence[str], stdin: bytes | None = None) -> bytes:
        started = time.time()
        code, stdout, stderr = self.exec(argv, stdin)
        self._timed(label, started)
        if code != 0:
            raise ExecFailed(f"{label} in {self.name}: exit {code}: {stderr.decode(errors='replace')[:300]}")
        return stdout

    def upload(self, label: str, archive: bytes, destination: str) -> None:
        self.checked(label, ["sh", "-c", UPLOAD, "sh", destination, str(len(archive))], archive)

    def delete(self) -> None:
        started = time.time()
        self.core.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=1)
        self._timed("pod-delete", started)


@dataclass(frozen=True)
class DirectRun:
    """One baseline episode: wall times and every operation's duration."""

    name: str
    started: float
    running_at: float
    first_command_at: float
    finished: float
    rewards: list[str]
    timings: list[tuple[str, float]]

    @property
    def wall(self) -> float:
        return self.finished - self.started


def run_direct(api: client.ApiClient, namespace: str, name: str, turns: Sequence[DirectTurn]) -> DirectRun:
    """The baseline of one episode, from pod creation to its deletion."""
    pod = DirectPod(api, namespace, name)
    started = pod.create()
    running_at = pod.wait_running()
    first_command_at = 0.0
    rewards = []
    try:
        for turn in turns:
            if turn.workdir_tar is not None:
                pod.upload("upload-workdir", turn.workdir_tar, WORKDIR)
            if turn.setup:
                first_command_at = first_command_at or time.time()
                pod.checked("setup.sh", ["bash", f"{WORKDIR}/setup.sh"])
            pod.upload("upload-solution", turn.solution_tar, "/solution")
            first_command_at = first_command_at or time.time()
            pod.checked("solve.sh", ["bash", "/solution/solve.sh"])
            pod.checked("clear", ["sh", "-c", CLEAR])
            pod.upload("upload-tests", turn.tests_tar, "/tests")
            pod.checked("test.sh", ["bash", "/tests/test.sh"])
            rewards.append(pod.checked("read_reward", ["cat", "/logs/verifier/reward.txt"]).decode().strip())
    finally:
        pod.delete()
    return DirectRun(name, started, running_at, first_command_at, time.time(), rewards, pod.timings)


def bare_start(api: client.ApiClient, namespace: str, name: str) -> dict[str, float]:
    """A bare pod: created → running (watch) → the first command (``date`` by exec) → deleted."""
    pod = DirectPod(api, namespace, name)
    sent = pod.create()
    running = pod.wait_running()
    _, stdout, _ = pod.exec(["date", "+%s.%N"])
    pod.delete()
    return {"created": sent, "pod_running": running, "first_command": float(stdout.decode().strip())}
