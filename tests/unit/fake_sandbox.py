"""An in-memory sandbox for the runtime's unit tests.

Scripts in test task folders are written in a tiny line language that this fake
interprets, so a test states what an agent, a setup.sh or a test.sh does without a real
shell (the cluster tests run real bash):

    write PATH TEXT       append PATH TEXT (adds a newline)       remove PATH
    exit N                timeout                unstartable
    reward VALUE          reward-json JSON
    check PATH TEXT       (reward 1 if PATH holds TEXT, where \n is a newline, else 0)
    pass-after SECONDS    (exit 0 once the fake monotonic clock has passed SECONDS, else 1)
    lose-pod              (the pod disappears: every later call raises SandboxError)

Relative paths are below the working directory ``/app``. ``bash X`` and ``sh X`` run the
file X; any other command is read as script text itself.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from episode_operator.api.models import EpisodeStatus
from episode_operator.runtime.sandbox import (
    CommandFailed,
    FileContent,
    JobSpec,
    JobState,
    SandboxError,
    Upload,
    Waiting,
    WaitingReport,
)
from episode_operator.taskfolder.plan import NetworkPolicy, VerifierPlan

WORKDIR = "/app"


@dataclass
class Clock:
    """Wall and monotonic time that only move when the runner sleeps or a script says so."""

    now: float = 1_800_000_000.0
    monotonic_now: float = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.monotonic_now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.monotonic_now += seconds


@dataclass
class JobRecord:
    spec: JobSpec
    state: JobState
    output: bytes


class FakeSandbox:
    def __init__(self, name: str, clock: Clock, world: World) -> None:
        self.name = name
        self.workdir = WORKDIR
        self.clock = clock
        self.world = world
        self.files: dict[str, dict[str, bytes]] = {"main": {}}
        self.jobs: dict[tuple[str, str], JobRecord] = {}
        self.starts: list[str] = []  # ids of jobs that actually ran
        self.users: list[str | int] = []
        self.lost = False
        self.modified: dict[str, float] = {}  # fake modification times, where a test sets them
        self.uploads: list[str] = []
        self.calls: Counter[str] = Counter()  # how many round trips each operation cost

    # Sandbox protocol ----------------------------------------------------------------
    def _alive(self) -> None:
        if self.lost:
            raise SandboxError(f"pod {self.name} was deleted", kind="pod-lost")

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        self.calls["start_job"] += 1
        self._alive()
        key = (spec.container, spec.id)
        if key not in self.jobs:
            if upload is not None:  # as the supervisor: the inputs only with the start, first
                self._upload(upload.archive, upload.destination, spec.container, upload.clear)
            self.starts.append(spec.id)
            self.world.before_job(self, spec)
            self.jobs[key] = self._execute(spec)
            self.world.after_job(spec)
        self._alive()
        return self._answer(spec)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        self.calls["wait_job"] += 1
        self._alive()
        return self._answer(spec)

    def _answer(self, spec: JobSpec) -> JobState:
        """The final state with what the spec asks back, as the supervisor's answer carries it."""
        record = self.jobs.get((spec.container, spec.id))
        if record is None:
            return JobState(spec.id, "unknown")
        files = None
        if spec.read_after:
            files = {
                path: FileContent(self.files[spec.container].get(path), self.modified.get(path))
                for path in spec.read_after
            }
        output = record.output[-spec.tail :] if spec.tail > 0 else None
        return replace(record.state, output=output, files=files)

    async def job_output(self, job_id: str, *, container: str = "main", limit: int) -> bytes:
        self.calls["job_output"] += 1
        self._alive()
        record = self.jobs[(container, job_id)]
        return record.output[-limit:]

    async def upload(
        self, archive: bytes, destination: str, *, container: str = "main", clear: Sequence[str] = ()
    ) -> None:
        self.calls["upload"] += 1
        self._alive()
        self._upload(archive, destination, container, clear)

    def _upload(self, archive: bytes, destination: str, container: str, clear: Sequence[str]) -> None:
        if self.world.unclearable.intersection(clear):
            raise CommandFailed("supervisor: clear: cannot remove a protected path", step="clear")
        self._clear(clear, container)
        self.uploads.append(destination)
        if destination in self.world.broken_uploads:
            raise CommandFailed(f"supervisor: upload: tar: cannot unpack into {destination}", step="upload")
        files = self.files.setdefault(container, {})
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar:
                if member.isfile():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    files[_join(destination, member.name)] = extracted.read()

    async def download(self, paths: Sequence[str], *, container: str = "main", exclude: Sequence[str] = ()) -> bytes:
        self.calls["download"] += 1
        self._alive()
        files = self.files.setdefault(container, {})
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in paths:
                for name, data in sorted(files.items()):
                    if name == path or name.startswith(path.rstrip("/") + "/"):
                        info = tarfile.TarInfo(name.lstrip("/"))
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
                if _join(path, ".keep") in files:  # an empty directory marker
                    info = tarfile.TarInfo(path.lstrip("/"))
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
        return buffer.getvalue()

    async def read_files(self, paths: Sequence[str], *, container: str = "main") -> dict[str, FileContent]:
        self.calls["read_files"] += 1
        self._alive()
        files = self.files.setdefault(container, {})
        return {path: FileContent(files.get(path), self.modified.get(path)) for path in paths}

    async def clear(self, paths: Sequence[str], *, container: str = "main") -> None:
        self.calls["clear"] += 1
        self._alive()
        if self.world.unclearable.intersection(paths):
            raise CommandFailed("supervisor: clear: cannot remove a protected path", step="clear")
        self._clear(paths, container)

    def _clear(self, paths: Sequence[str], container: str) -> None:
        files = self.files.setdefault(container, {})
        for path in paths:
            prefix = path.rstrip("/") + "/"
            for name in [n for n in files if n == path.rstrip("/") or n.startswith(prefix)]:
                del files[name]

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        self.calls["switch_user"] += 1
        self._alive()
        if user in self.world.missing_users:
            raise CommandFailed(f"no such user: {user}")
        self.users.append(user)

    # The script language ---------------------------------------------------------------
    def _execute(self, spec: JobSpec) -> JobRecord:
        files = self.files.setdefault(spec.container, {})
        script = self._script(spec.command, files)
        output = io.BytesIO()
        code, timed_out, reason = 0, False, None
        for line in script.splitlines():
            word, _, rest = line.strip().partition(" ")
            if word == "write":
                path, _, text = rest.partition(" ")
                files[_join(WORKDIR, path)] = text.encode()
            elif word == "append":
                path, _, text = rest.partition(" ")
                target = _join(WORKDIR, path)
                files[target] = files.get(target, b"") + text.encode() + b"\n"
            elif word == "remove":
                files.pop(_join(WORKDIR, rest), None)
            elif word == "exit":
                code = int(rest)
                break
            elif word == "timeout":
                code, timed_out = 124, True
                self.clock.monotonic_now += spec.timeout_sec
                break
            elif word == "unstartable":
                return JobRecord(spec, JobState(spec.id, "unstartable", reason="bash: not found"), b"")
            elif word == "reward":
                files["/logs/verifier/reward.txt"] = rest.encode()
            elif word == "reward-json":
                files["/logs/verifier/reward.json"] = rest.encode()
            elif word == "check":
                path, _, text = rest.partition(" ")
                good = files.get(_join(WORKDIR, path)) == text.replace("\\n", "\n").encode()
                files["/logs/verifier/reward.txt"] = b"1" if good else b"0"
            elif word == "pass-after":
                code = 0 if self.clock.monotonic_now >= float(rest) else 1
            elif word == "lose-pod":
                self.lost = True
            elif word == "echo":
                output.write(rest.encode() + b"\n")
        data = output.getvalue() or self.world.printed(spec) or f"ran {spec.id}\n".encode()
        if spec.output:
            files[spec.output] = data
        state = JobState(
            spec.id,
            "exited",
            exit_code=code,
            timed_out=timed_out,
            reason=reason,
            started_at=self.clock.now,
            finished_at=self.clock.now,
        )
        return JobRecord(spec, state, data)

    def _script(self, command: str, files: dict[str, bytes]) -> str:
        word, _, rest = command.partition(" ")
        if word in ("bash", "sh") and rest.startswith("/"):
            return files.get(rest, b"exit 127").decode()
        return command


def _join(base: str, path: str) -> str:
    if path.startswith("/"):
        return path
    return f"{base.rstrip('/')}/{path}" if path else base


@dataclass
class World:
    """Every sandbox of one episode, and the faults a test injects."""

    clock: Clock = field(default_factory=Clock)
    sandboxes: dict[str, FakeSandbox] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    kept: bool = False
    broken_uploads: set[str] = field(default_factory=set)
    missing_users: set[str | int] = field(default_factory=set)
    unclearable: set[str] = field(default_factory=set)  # paths whose clearing fails
    fail_creation: int = 0  # the next N sandbox creations fail as image pulls
    hooks: dict[str, Any] = field(default_factory=dict)  # job id suffix → callable(sandbox, spec)
    networks: list[str] = field(default_factory=list)  # the agent pod's network modes, as they changed
    crash_after: set[str] = field(default_factory=set)  # job id suffixes: the runner dies once they started
    outputs: dict[str, bytes] = field(default_factory=dict)  # job id suffix → what its command prints
    # pod name → why it waits (reported, in order, when it is created), as a starting pod's state says
    pending: dict[str, list[Waiting]] = field(default_factory=dict)

    def printed(self, spec: JobSpec) -> bytes | None:
        return next((data for suffix, data in self.outputs.items() if spec.id.endswith(suffix)), None)

    def before_job(self, sandbox: FakeSandbox, spec: JobSpec) -> None:
        for suffix, hook in self.hooks.items():
            if spec.id.endswith(suffix):
                hook(sandbox, spec)

    def after_job(self, spec: JobSpec) -> None:
        for suffix in list(self.crash_after):
            if spec.id.endswith(suffix):
                self.crash_after.discard(suffix)
                raise Crash(f"the operator died after starting {spec.id}")

    def sandbox(self, name: str) -> FakeSandbox:
        if name not in self.sandboxes:
            if self.fail_creation:
                self.fail_creation -= 1
                raise SandboxError(f"image for {name} cannot be pulled", kind="image-pull")
            self.sandboxes[name] = FakeSandbox(name, self.clock, self)
        return self.sandboxes[name]


class FakeProvider:
    def __init__(self, world: World) -> None:
        self.world = world
        self.verifier_plans: dict[str, VerifierPlan] = {}

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None) -> FakeSandbox:
        name = f"pod-a{attempt}"
        if name in self.world.released:
            raise AssertionError(f"{name} was released and must not be used again")
        await self._start(name, waiting)
        return self.world.sandbox(name)

    async def verifier(
        self, attempt: int, turn: int, plan: VerifierPlan, *, waiting: WaitingReport | None = None
    ) -> FakeSandbox:
        name = f"pod-a{attempt}-v{turn + 1}"
        self.verifier_plans[name] = plan
        await self._start(name, waiting)
        return self.world.sandbox(name)

    async def _start(self, name: str, waiting: WaitingReport | None) -> None:
        """As the kube provider: why the pod waits, each reason once, then that it runs."""
        reports = self.world.pending.pop(name, [])
        if waiting is not None:
            for report in reports:
                await waiting(report)
            await waiting(None)

    async def apply_network(self, attempt: int, policy: NetworkPolicy) -> None:
        if not self.world.networks or self.world.networks[-1] != policy.mode:
            self.world.networks.append(policy.mode)

    async def release_verifier(self, attempt: int, turn: int) -> None:
        self.world.released.append(f"pod-a{attempt}-v{turn + 1}")

    async def release_agent(self, attempt: int) -> None:
        self.world.released.append(f"pod-a{attempt}")

    async def release_all(self, *, keep: bool) -> None:
        self.world.kept = keep
        if not keep:
            self.world.released.append("all")


class Crash(Exception):
    """Simulates the operator dying at a chosen status."""


class FakeSink:
    def __init__(self, crash_when: Any = None) -> None:
        self.statuses: list[EpisodeStatus] = []
        self.events: list[tuple[str, str, bool]] = []
        self.crash_when = crash_when

    async def publish(self, status: EpisodeStatus) -> None:
        self.statuses.append(status.model_copy(deep=True))
        if self.crash_when is not None and self.crash_when(status):
            self.crash_when = None
            raise Crash()

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


class MemoryStore:
    def __init__(self) -> None:
        self.logs: dict[tuple[int, str, str], bytes] = {}
        self.artifacts: dict[tuple[int, str], dict[int, bytes]] = {}
        self.manifests: dict[tuple[int, str], list[dict[str, Any]]] = {}

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        self.logs[(attempt, turn, name)] = data

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None:
        self.artifacts.setdefault((attempt, turn), {})[index] = archive

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None:
        self.manifests[(attempt, turn)] = json.loads(json.dumps(manifest))

    async def artifact_archives(self, attempt: int, turn: str) -> list[bytes]:
        return [data for _, data in sorted(self.artifacts.get((attempt, turn), {}).items())]
