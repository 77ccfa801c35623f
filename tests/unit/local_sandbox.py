"""Sandboxes that run the real supervisor as a pod would, each in a mount namespace of its own.

The in-memory sandbox (fake_sandbox.py) models what the supervisor does; this runs the thing
itself, so the models are checked against it: the operator's own :class:`KubeSandbox` ships
each command (supervisor.py's argv) to :class:`LocalPods` instead of the API server, which
runs it with bubblewrap (unpacked by hack/venv) as a ``kubectl exec`` into the pod would:

- a pod is a directory that becomes ``/`` (so ``/app``, ``/tests``, ``/logs``, ``/solution``,
  ``/episode-operator`` and ``/tmp`` are the pod's own and persist between execs), with the
  host's ``/usr`` and ``/etc`` read-only under it, its passwd adding the tests' users;
- as root with all capabilities (users are switched by the supervisor with setpriv), the
  working directory ``/app``, and an environment of PATH, HOME and the pod's container env;
- the supervisor's jobs outlive the exec that started them, in the host's pid namespace; a
  pod's release kills them (every job's process group, as the supervisor recorded it).

Needs root, as the unit tier does (CI and ``hack/test`` run as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from episode_operator.kube.client import stdin_frames
from episode_operator.kube.pod_sandbox import KubeSandbox
from episode_operator.runtime.limits import AnswerSink, OutputLimits
from episode_operator.runtime.sandbox_protocol import ArchiveFile, WaitingReport
from episode_operator.runtime.supervisor import SUPERVISOR_DIR
from episode_operator.runtime.turn.context import SANDBOX_LAYOUT
from episode_operator.taskfolder.plan import NetworkPolicy, VerifierPlan
from tests.unit.tools import tool

WORKDIR = "/app"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Users the tests' tasks name, added to the host's passwd inside every pod (uid = gid).
USERS = {"agent": 2001, "grader": 2002, "bob": 2003}
#: What a pod's ``/`` holds besides its own directories: Debian's merged /usr.
MERGED_USR = ("bin", "lib", "lib64", "sbin")


class LocalPods:
    """What :class:`KubeSandbox` needs of a ``KubeClient`` (exec, read_pod), for local pods."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bwrap = tool("bwrap")
        self.env: dict[str, dict[str, str]] = {}
        self.execs = 0
        self.streams: list[LocalStream] = []
        self.pieces = random.Random(0)

    def create(self, name: str, env: Mapping[str, str]) -> Path:
        """The pod's ``/`` (kept if it exists: a re-attaching provider gets the same pod)."""
        pod = self.path(name, "/")
        if not pod.exists():
            for directory in ("app", "tmp", "root", "home"):
                (pod / directory).mkdir(parents=True)
            (pod / "tmp").chmod(0o1777)
            for link in MERGED_USR:
                (pod / link).symlink_to(f"usr/{link}")
            etc = self.root / "etc" / name
            etc.mkdir(parents=True)
            for database, line in (("passwd", "{0}:x:{1}:{1}::/home/{0}:/bin/sh"), ("group", "{0}:x:{1}:")):
                entries = Path("/etc", database).read_text().rstrip("\n").split("\n")
                entries += [line.format(user, uid) for user, uid in USERS.items()]
                (etc / database).write_text("\n".join(entries) + "\n")
        self.env[name] = dict(env)
        return pod

    def argv(self, pod: str, command: Sequence[str]) -> list[str]:
        etc = self.root / "etc" / pod
        env = {"PATH": PATH, "HOME": "/root", **self.env[pod]}
        setenv = [arg for name, value in env.items() for arg in ("--setenv", name, value)]
        return [
            self.bwrap,
            *("--bind", str(self.path(pod, "/")), "/"),
            *("--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"),
            *("--ro-bind", str(etc / "passwd"), "/etc/passwd", "--ro-bind", str(etc / "group"), "/etc/group"),
            *("--proc", "/proc", "--dev", "/dev", "--chdir", WORKDIR, "--cap-add", "ALL", "--clearenv"),
            *setenv,
            "--",
            *command,
        ]

    async def exec(
        self,
        namespace: str,
        pod: str,
        container: str,
        argv: Sequence[str],
        *,
        stdout: AnswerSink,
        stderr: AnswerSink,
        stdin: bytes | None = None,
        stdin_file: ArchiveFile | None = None,
        timeout_sec: float = 60.0,
    ) -> int:
        """As the client's exec: stdin sent, then the file streamed; stdout and stderr written to
        the sinks as they come, the process killed at once when a sink refuses what passed its bound."""
        self.execs += 1
        has_stdin = stdin is not None or stdin_file is not None
        # A process group of its own: a refused answer kills all of it (e.g. a replaced supervisor's
        # endless `yes`, which would otherwise hold the pipes open); the supervisor's jobs have
        # their own sessions and outlive it, as they outlive an exec.
        process = await asyncio.create_subprocess_exec(
            *self.argv(pod, argv),
            stdin=asyncio.subprocess.PIPE if has_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )

        async def send() -> None:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it ended before reading it all
                async for frame in stdin_frames(stdin, stdin_file):
                    process.stdin.write(frame)
                    await process.stdin.drain()
                process.stdin.close()

        async def pump(stream: asyncio.StreamReader | None, sink: AnswerSink) -> None:
            assert stream is not None
            while piece := await stream.read(self.pieces.choice((1, 7, 64, 4096, 65536))):
                sink.write(piece)

        work = [
            asyncio.ensure_future(pump(process.stdout, stdout)),
            asyncio.ensure_future(pump(process.stderr, stderr)),
        ]
        if has_stdin:
            work.append(asyncio.ensure_future(send()))
        try:
            async with asyncio.timeout(timeout_sec):
                await asyncio.gather(*work)
                return await process.wait()
        finally:
            for task in work:
                task.cancel()
            await asyncio.gather(*work, return_exceptions=True)
            if process.returncode is None:  # a sink refused what came, or the exec timed out
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                # Read the pipes to their end: a pipe left unread past its buffer is never seen
                # to close, and wait() waits for that too.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        for stream in (process.stdout, process.stderr):
                            while stream is not None and await stream.read(1 << 16):
                                pass
                await process.wait()

    async def exec_stream(self, namespace: str, pod: str, container: str, argv: Sequence[str]) -> LocalStream:
        """An exec kept open, as the API server's websocket gives it: stdin written as it comes,
        stdout read back in pieces of any size (its messages do not follow the writes)."""
        self.execs += 1
        # The session's shell dies with its bwrap (the stream's process): killing one kills the session.
        bwrap, *rest = self.argv(pod, argv)
        process = await asyncio.create_subprocess_exec(
            bwrap,
            "--die-with-parent",
            *rest,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # aborted, all of it goes (as in exec)
        )
        stream = LocalStream(process)
        self.streams.append(stream)
        return stream

    def end_streams(self) -> None:
        """KILL the shells of sessions still open (a test that failed before releasing its pods)."""
        for stream in self.streams:
            if stream.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stream.process.pid, signal.SIGKILL)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Asked when an exec fails: the pod is there and running (a pod lost is not modelled here)."""
        main = {"name": "main", "ready": True, "state": {"running": {}}}
        return {"metadata": {"name": name}, "status": {"phase": "Running", "containerStatuses": [main]}}

    def kill(self, name: str) -> None:
        """KILL every job and runner the pod's supervisor recorded."""
        kill_jobs(self.path(name, SUPERVISOR_DIR) / "jobs")

    def names(self) -> list[str]:
        pods = self.root / "pods"
        return sorted(pod.name for pod in pods.iterdir()) if pods.is_dir() else []

    def path(self, pod: str, inside: str) -> Path:
        """Where ``inside`` (an absolute path in the pod) is on the host."""
        return self.root / "pods" / pod / inside.lstrip("/")


class LocalStream:
    """A session's exec into a local pod (kube/session.py's ExecStream)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pieces = random.Random(process.pid)

    async def send(self, data: bytes, file: ArchiveFile | None = None) -> None:
        assert self.process.stdin is not None
        async for frame in stdin_frames(data, file):
            self.process.stdin.write(frame)
            await self.process.stdin.drain()

    async def receive(self) -> tuple[int, bytes] | None:
        assert self.process.stdout is not None
        data = await self.process.stdout.read(self.pieces.choice((1, 7, 64, 4096)))
        return (1, data) if data else None

    async def close(self, *, abort: bool = False) -> None:
        """The end of its stdin ends the session's shell, as closing the websocket does; ``abort``
        kills it at once, as a dropped connection ends the exec."""
        assert self.process.stdin is not None and self.process.stdout is not None
        if abort:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.stdin.close()
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            async with asyncio.timeout(10):
                while await self.process.stdout.read(1 << 16):  # to its end: an unread pipe never closes
                    pass
                await self.process.wait()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()

    @property
    def closed(self) -> bool:
        return self.process.returncode is not None


class LocalProvider:
    """A :class:`SandboxProvider` of local pods, named as the fake's are (``pod-a1``, ``pod-a1-v2``)."""

    def __init__(
        self, pods: LocalPods, main_env: Mapping[str, str] | None = None, *, limits: OutputLimits | None = None
    ) -> None:
        self.pods = pods
        self.main_env = dict(main_env or {})
        self.limits = limits or OutputLimits()
        self.released: list[str] = []
        self.networks: list[str] = []
        self.sandboxes: dict[str, KubeSandbox] = {}
        self.pins: dict[str, str] = {}

    async def _ready(
        self, name: str, env: Mapping[str, str], waiting: WaitingReport | None, uid: str | None
    ) -> KubeSandbox:
        # A local pod lives as long as the test: the one recorded is always the one there.
        assert uid in (None, f"local-{name}"), f"{name} recorded as {uid}"
        self.pods.create(name, env)
        sandbox = self.sandboxes.get(name) or KubeSandbox(self.pods, "local", name, f"local-{name}", limits=self.limits)  # type: ignore[arg-type]
        self.sandboxes[name] = sandbox
        await sandbox.place_supervisor(layout=SANDBOX_LAYOUT)  # as the kube provider
        if waiting is not None:  # a local pod never waits: it runs, as the kube provider says of one that does
            await waiting(None)
        return sandbox

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None) -> KubeSandbox:
        return await self._ready(f"pod-a{attempt}", self.main_env, waiting, uid)

    async def verifier(
        self,
        attempt: int,
        turn: int,
        plan: VerifierPlan,
        *,
        waiting: WaitingReport | None = None,
        uid: str | None = None,
    ) -> KubeSandbox:
        env = plan.environment.env if plan.environment else {}
        return await self._ready(f"pod-a{attempt}-v{turn + 1}", env, waiting, uid)

    def pin_images(self, pins: Mapping[str, str]) -> None:
        """Recorded: the images the pods made from now on would run instead of the built tags."""
        self.pins.update(pins)

    async def apply_network(self, attempt: int, policy: NetworkPolicy) -> None:
        if not self.networks or self.networks[-1] != policy.mode:
            self.networks.append(policy.mode)

    async def release_verifier(self, attempt: int, turn: int) -> None:
        await self._release(f"pod-a{attempt}-v{turn + 1}")

    async def release_agent(self, attempt: int) -> None:
        await self._release(f"pod-a{attempt}")

    async def release_all(self, *, keep: bool) -> None:
        if not keep:
            for name in self.pods.names():
                await self._release(name)

    async def _release(self, name: str) -> None:
        """Its processes die, as a deleted pod's do; its files stay for the test to read."""
        sandbox = self.sandboxes.pop(name, None)
        if sandbox is not None:
            await sandbox.close()
        self.pods.kill(name)
        if name not in self.released:
            self.released.append(name)


def kill_jobs(jobs: Path) -> None:
    """KILL the process group of every job, and every runner, recorded under a supervisor's ``jobs/``."""
    for job in jobs.iterdir() if jobs.is_dir() else ():
        for record in ("jobpid", "runner"):
            text = (job / record).read_text().split() if (job / record).is_file() else []
            if text and text[0].isdigit():
                for target in (-int(text[0]), int(text[0])):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(target, signal.SIGKILL)
