"""The baseline: the same minimal work done directly on one pod with the synchronous Python client.

No supervisor, no status, no events: create a pod of the same image and shape as the
operator's agent pod, wait for it with a watch, then per turn the fewest execs the work allows —
the best script a user could write by hand, combining what the operator combines:

1. ``workdir/`` rides with ``setup.sh``: one exec extracts the tar from stdin (``head -c N | tar x``:
   a 1.20 API server cannot half-close an exec's stdin) and runs the script;
2. the solution rides with ``solve.sh`` the same way;
3. ``/tests`` and ``/logs/verifier`` are cleared, the tests extracted, ``test.sh`` run and the reward
   file printed, all in one exec: the reward comes back in the answer that ends the job.

Three execs per turn, then the pod is deleted. :func:`run_direct_shell` is the same work over one
exec held open (a shell reading one command line at a time, each job's inputs read from the same
stdin by ``head -c``), the way the operator's sessions carry its calls: one exec per episode.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client
from kubernetes.stream import stream

from .cluster import new_watch
from .tasks import IMAGE, WORKDIR, DirectTurn

# The operator's agent pod, less what only the operator needs (labels, owner).
KEEP_ALIVE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
UPLOAD = 'mkdir -p "$1" && head -c "$2" | tar -x -f - -C "$1"'
# $1: where the tar goes, $2: its length, $3: the script to run once it is there.
UPLOAD_AND_RUN = f'{UPLOAD} && bash "$3"'
# Over one open exec: each line is one job, its inputs after it on stdin; the marker ends its answer.
# The scripts read nothing of that stdin (</dev/null): it carries the next jobs.
SHELL_LOOP = 'while IFS= read -r line; do eval "$line"; echo "@@END $?"; done'
END = b"@@END "
SHELL_UPLOAD_AND_RUN = f'{UPLOAD} && bash "$3" </dev/null'
# $1: the tests tar's length: clear the grading folders, extract the tests, run them, print the reward.
VERIFY = (
    'rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier && head -c "$1" | tar -x -f - -C /tests '
    "&& { bash /tests/test.sh >/dev/null 2>&1; cat /logs/verifier/reward.txt; }"
)


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

    def upload_and_run(self, label: str, archive: bytes, destination: str, script: str) -> bytes:
        """One exec: the tar extracted into ``destination``, then ``bash script``."""
        argv = ["sh", "-c", UPLOAD_AND_RUN, "sh", destination, str(len(archive)), script]
        return self.checked(label, argv, archive)

    def verify(self, label: str, tests: bytes) -> bytes:
        """One exec: the grading folders cleared, the tests extracted and run; the reward file."""
        return self.checked(label, ["sh", "-c", VERIFY, "sh", str(len(tests))], tests)

    def open_shell(self) -> DirectShell:
        """One exec kept open for all of the episode's jobs."""
        started = time.time()
        connection = stream(
            self.core.connect_get_namespaced_pod_exec,
            self.name,
            self.namespace,
            command=["sh", "-c", SHELL_LOOP],
            container="main",
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            binary=True,
        )
        self._timed("shell-open", started)
        return DirectShell(self, connection)

    def delete(self) -> None:
        started = time.time()
        self.core.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=1)
        self._timed("pod-delete", started)


@dataclass
class DirectShell:
    """Jobs as command lines on one open exec (``SHELL_LOOP``); each timed as the exec it replaces."""

    pod: DirectPod
    connection: Any

    def run(self, label: str, line: str, stdin: bytes = b"", timeout: float = 60) -> bytes:
        started = time.time()
        self.connection.write_stdin(line.encode() + b"\n" + stdin)
        out = b""
        deadline = time.monotonic() + timeout
        while not (END in out and out.endswith(b"\n")):
            if not self.connection.is_open() or time.monotonic() > deadline:
                raise ExecFailed(f"{label} in {self.pod.name}: the shell ended or did not answer: {out[-300:]!r}")
            self.connection.update(timeout=1)
            if self.connection.peek_stdout():
                out += self.connection.read_stdout()
        self.pod._timed(label, started)
        answer, _, status = out.rpartition(END)
        if status.strip() != b"0":
            raise ExecFailed(f"{label} in {self.pod.name}: exit {status.strip().decode()}: {answer[-300:]!r}")
        return answer

    def upload_and_run(self, label: str, archive: bytes, destination: str, script: str) -> bytes:
        line = f"set -- {shlex.quote(destination)} {len(archive)} {shlex.quote(script)}; {SHELL_UPLOAD_AND_RUN}"
        return self.run(label, line, archive)

    def upload(self, label: str, archive: bytes, destination: str) -> None:
        self.run(label, f"set -- {shlex.quote(destination)} {len(archive)}; {UPLOAD}", archive)

    def verify(self, label: str, tests: bytes) -> bytes:
        verify = VERIFY.replace("bash /tests/test.sh", "bash /tests/test.sh </dev/null")
        return self.run(label, f"set -- {len(tests)}; {verify}", tests)

    def close(self) -> None:
        self.connection.close()


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


class Jobs(Protocol):
    """What runs an episode's jobs: an exec each (:class:`DirectPod`) or one open exec (:class:`DirectShell`)."""

    def upload_and_run(self, label: str, archive: bytes, destination: str, script: str) -> bytes: ...

    def upload(self, label: str, archive: bytes, destination: str) -> None: ...

    def verify(self, label: str, tests: bytes) -> bytes: ...


def run_turns(jobs: Jobs, turns: Sequence[DirectTurn]) -> tuple[list[str], float]:
    """Every turn's jobs; the rewards and when the first command was sent."""
    first_command_at = 0.0
    rewards = []
    for turn in turns:
        if turn.setup and turn.workdir_tar is not None:
            first_command_at = first_command_at or time.time()
            jobs.upload_and_run("workdir + setup.sh", turn.workdir_tar, WORKDIR, f"{WORKDIR}/setup.sh")
        elif turn.workdir_tar is not None:
            jobs.upload("workdir", turn.workdir_tar, WORKDIR)
        first_command_at = first_command_at or time.time()
        jobs.upload_and_run("solution + solve.sh", turn.solution_tar, "/solution", "/solution/solve.sh")
        rewards.append(jobs.verify("tests + test.sh + reward", turn.tests_tar).decode().strip())
    return rewards, first_command_at


def run_direct(api: client.ApiClient, namespace: str, name: str, turns: Sequence[DirectTurn]) -> DirectRun:
    """The baseline of one episode, from pod creation to its deletion."""
    pod = DirectPod(api, namespace, name)
    started = pod.create()
    running_at = pod.wait_running()
    try:
        rewards, first_command_at = run_turns(pod, turns)
    finally:
        pod.delete()
    return DirectRun(name, started, running_at, first_command_at, time.time(), rewards, pod.timings)


def run_direct_shell(api: client.ApiClient, namespace: str, name: str, turns: Sequence[DirectTurn]) -> DirectRun:
    """The same episode, its jobs over one exec held open (what the operator's sessions do)."""
    pod = DirectPod(api, namespace, name)
    started = pod.create()
    running_at = pod.wait_running()
    try:
        shell = pod.open_shell()
        try:
            rewards, first_command_at = run_turns(shell, turns)
        finally:
            shell.close()
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
