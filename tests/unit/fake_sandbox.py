"""An in-memory sandbox for the runtime's unit tests, faithful to what the supervisor does.

Scripts in test task folders are written in a tiny line language that this fake
interprets, so a test states what an agent, a setup.sh or a test.sh does without a real
shell (the cluster tests, and ``local_sandbox``, run real bash):

    write PATH TEXT       append PATH TEXT (adds a newline)       remove PATH
    echo TEXT             (to the job's output)
    exit N                timeout (runs until its time limit kills it)       unstartable
    sleep SECONDS         (the job takes that long on the fake clock)
    expect VALUE WANTED   (exit 1, saying so in the output, unless VALUE is WANTED)
    reward VALUE          reward-json JSON
    check PATH TEXT       (reward 1 if PATH holds TEXT, where \\n is a newline, else 0)
    pass-after SECONDS    (exit 0 once the fake monotonic clock has passed SECONDS, else 1)
    later SECONDS LINE    (leaves a process behind that runs LINE after SECONDS, job or no job)
    lose-pod              (the pod disappears: every later call raises SandboxError)

Job ids arrive keyed (``runtime/sandbox_protocol.py`` :func:`keyed_job_id`), as the supervisor gets
them: jobs are kept under them, while ``starts``, ``hooks``, ``outputs`` and ``crash_after``
speak of the ids the runtime made before keying (``raw_starts`` keeps what arrived).
    vanish                (the supervisor loses the job: it reads ``unknown`` from then on)

``$NAME`` and ``${NAME}`` expand to the job's environment, as a shell's would: the
container's, then HOME/USER/LOGNAME of the job's user, then the job's own variables; ``$PWD``
is its working directory. Relative paths are below that directory (the spec's ``cwd``, else
the sandbox's ``/app``). ``bash X`` and ``sh X`` run the file X; any other command is read as
script text itself.

Answers are held to the operator's bounds (``runtime/limits.py``, the world's ``limits``) as the
transport holds the real ones: an answer bigger than the bound its command carries raises
:class:`OutputLimitExceeded` with the same words. A hostile pod (an agent that replaced its
supervisor or tar) is the world's ``padded`` (job id suffix → bytes more in its answers) and
``crafted`` (artifact path → the bytes its download answers with).

Time is the :class:`Clock`'s and moves only when something waits: a job's start and its
long polls wait (up to what they were given) for the job, the runner's ``sleep`` waits, and
a job past its ``timeout_sec`` is killed then (``timed_out``, exit 143) whatever it does.
Modification times of written files are the clock's at the write.
"""

from __future__ import annotations

import functools
import heapq
import io
import itertools
import json
import re
import tarfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.runtime import supervisor
from episode_operator.runtime.limits import OutputLimitExceeded, OutputLimits, bound_name
from episode_operator.runtime.sandbox_protocol import (
    JOB_USER,
    ArchiveFile,
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
#: The environment of a command exec'd into the container, as root (docker sets no USER).
CONTAINER_ENV = {"HOME": "/root", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
#: Home directories of the users the tests name (any other name: /home/<name>).
HOMES = {"root": "/root", "nobody": "/nonexistent"}
KILLED_BY_TERM = 143
MAX_POLLS = 10_000
#: About what a state line, and a read frame's header, take in an answer.
STATE_LINE, FRAME_HEADER = 120, 40
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
KEY_SUFFIX = re.compile(r"\.[0-9a-f]{16}$")


def _cleared(entry: str) -> str:
    """The path a clear entry names (``MODE:OWNER:PATH`` when sealed)."""
    return entry if entry.startswith("/") else entry.split(":", 2)[2]


def unkeyed(job_id: str) -> str:
    """A job id as the runtime made it, before :func:`keyed_job_id` added the attempt's key."""
    return KEY_SUFFIX.sub("", job_id)


@dataclass
class Clock:
    """Wall and monotonic time that only move when something waits; timers fire in order as they do."""

    now: float = 1_800_000_000.0
    monotonic_now: float = 0.0
    _timers: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.monotonic_now

    async def sleep(self, seconds: float) -> None:
        self.run_until(self.now + seconds)

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` once the wall clock reaches ``when``."""
        heapq.heappush(self._timers, (when, next(self._order), action))

    def run_until(self, when: float, done: Callable[[], bool] = lambda: False) -> None:
        """Let time pass up to ``when``, firing due timers in order; stop early once ``done()``."""
        while not done() and self._timers and self._timers[0][0] <= when:
            due, _, action = heapq.heappop(self._timers)
            self._move_to(due)
            action()
        if not done():
            self._move_to(when)

    def _move_to(self, when: float) -> None:
        if when > self.now:
            self.monotonic_now += when - self.now
            self.now = when


@dataclass
class JobRecord:
    """A job as the supervisor keeps it: its spec, its state and its own output."""

    spec: JobSpec
    state: JobState
    output: bytearray = field(default_factory=bytearray)


@dataclass
class Process:
    """A job's (or a leftover's) script being run: the lines left, in its environment and directory."""

    record: JobRecord
    lines: list[str]
    env: dict[str, str]
    cwd: str

    @property
    def running(self) -> bool:
        return self.record.state.phase == "running"


class FakeSandbox:
    def __init__(
        self, name: str, clock: Clock, world: World, env: Mapping[str, str] | None = None, uid: str = ""
    ) -> None:
        self.name = name
        self.uid = uid or f"uid-{name}"
        self.workdir = WORKDIR
        self.clock = clock
        self.world = world
        self.env = {**CONTAINER_ENV, **(env or {})}
        self.files: dict[str, dict[str, bytes]] = {"main": {}}
        self.jobs: dict[tuple[str, str], JobRecord] = {}
        self.starts: list[str] = []  # ids of jobs that actually ran (before keying)
        self.raw_starts: list[str] = []  # the same as they arrived
        self.users: list[str | int] = []
        self.lost = False
        self.modified: dict[str, float] = {}  # modification times (the clock's at each write)
        self.uploads: list[str] = []
        self.sealed: dict[str, str] = {}  # sealed folders → their owner ("": root), as the last clear left them
        self.calls: Counter[str] = Counter()  # how many round trips each operation cost

    def job(self, job_id: str, container: str = "main") -> JobRecord:
        """The record of the job the runtime calls ``job_id`` (before keying)."""
        return next(
            record for (where, id_), record in self.jobs.items() if where == container and unkeyed(id_) == job_id
        )

    # Sandbox protocol ----------------------------------------------------------------
    def _alive(self) -> None:
        if self.lost:
            raise SandboxError(f"pod {self.name} was deleted", kind="pod_lost")

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        self.calls["start_job"] += 1
        self._alive()
        key = (spec.container, spec.id)
        if key not in self.jobs:
            if upload is not None:  # as the supervisor: the inputs only with the start, first
                self._upload(upload.archive, upload.destination, spec.container, upload.clear, spec.user)
            self.starts.append(unkeyed(spec.id))
            self.raw_starts.append(spec.id)
            self.world.before_job(self, spec)
            self._launch(spec)
            self.world.after_job(spec)
        return self._wait(spec, wait_sec)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        self.calls["wait_job"] += 1
        # A runner that polls on where nothing can change (e.g. a job the supervisor lost) would
        # spin without ever yielding: fail the test instead of hanging it.
        assert self.calls["wait_job"] < MAX_POLLS, f"{spec.id}: polled {MAX_POLLS} times"
        return self._wait(spec, max_wait_sec)

    def _wait(self, spec: JobSpec, seconds: float) -> JobState:
        """Up to ``seconds`` for the job to end (time passes meanwhile), then its state."""
        self._alive()
        record = self.jobs.get((spec.container, spec.id))
        if record is not None:
            self.clock.run_until(self.clock.now + seconds, done=lambda: record.state.done or self.lost)
            if record.state.done and self.world.notice_delay_sec:
                self.clock.run_until(self.clock.now + self.world.notice_delay_sec)
        self._alive()
        return self._answer(spec)

    def _answer(self, spec: JobSpec) -> JobState:
        """The state with what the spec asks back once done, as the supervisor's answer carries it."""
        record = self.jobs.get((spec.container, spec.id))
        if record is None:
            return JobState(spec.id, "unknown")
        if not record.state.done:
            self._bounded(
                supervisor.wait(spec, 0, limits=self.world.limits).answer, STATE_LINE + self.world.padding(spec)
            )
            return record.state
        files = None
        if spec.read_after:
            files = {
                path: FileContent(self.files[spec.container].get(path), self.modified.get(path))
                for path in spec.read_after
            }
        output = bytes(record.output[-spec.tail :]) if spec.tail > 0 else None
        tar = self._tar([spec.download_after], spec.container) if spec.download_after is not None else None
        tar = self.world.crafted.get(spec.download_after or "", tar) if tar is not None else None
        # As the transport would: the answer's size (a state line, the frames) against its command's bound.
        bound = supervisor.wait(spec, 0, limits=self.world.limits).answer
        size = STATE_LINE + len(output or b"") + sum(len(c.data or b"") for c in (files or {}).values())
        self._bounded(bound, size + len(tar or b"") + self.world.padding(spec))
        if tar is not None and len(tar) > self.world.limits.artifact_bytes:
            what = f"the download of {spec.download_after} with job {spec.id}'s answer ({len(tar)} bytes)"
            raise OutputLimitExceeded(what, bound_name("artifact_bytes", self.world.limits))
        archive = ArchiveFile.of_bytes(tar) if tar is not None else None
        return replace(record.state, output=output, files=files, archive=archive)

    @staticmethod
    def _bounded(bound: supervisor.AnswerBound, size: int) -> None:
        if size > bound.stdout:
            raise OutputLimitExceeded(bound.what, bound.bound)

    async def job_output(self, job_id: str, *, container: str = "main", limit: int) -> bytes:
        self.calls["job_output"] += 1
        self._alive()
        record = self.jobs[(container, job_id)]
        self._bounded(supervisor.output(job_id, limit, limits=self.world.limits).answer, min(len(record.output), limit))
        return bytes(record.output[-limit:])

    async def upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        *,
        container: str = "main",
        clear: Sequence[str] = (),
    ) -> None:
        self.calls["upload"] += 1
        self._alive()
        self._upload(archive, destination, container, clear)

    def _upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        container: str,
        clear: Sequence[str],
        user: str | int | None = None,
    ) -> None:
        if self.world.unclearable.intersection(_cleared(entry) for entry in clear):
            raise CommandFailed("supervisor: clear: cannot remove a protected path", step="clear")
        self._clear(clear, container, user)
        self.uploads.append(destination)
        if destination in self.world.broken_uploads:
            raise CommandFailed(f"supervisor: upload: tar: cannot unpack into {destination}", step="upload")
        data = archive.read_bytes() if isinstance(archive, ArchiveFile) else archive
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                if member.isfile():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    self._write(container, _join(destination, member.name), extracted.read())

    async def download(
        self, paths: Sequence[str], *, container: str = "main", exclude: Sequence[str] = ()
    ) -> ArchiveFile:
        self.calls["download"] += 1
        self._alive()
        tar = self.world.crafted.get(paths[0], None) if len(paths) == 1 else None
        tar = tar if tar is not None else self._tar(paths, container)
        self._bounded(supervisor.download(paths, exclude, limits=self.world.limits).answer, len(tar))
        return ArchiveFile.of_bytes(tar)

    def _tar(self, paths: Sequence[str], container: str) -> bytes:
        """A tar of ``paths`` as they are now, member names relative to ``/``."""
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
        size = sum(len(files.get(path) or b"") + FRAME_HEADER for path in paths)
        self._bounded(supervisor.read_files(paths, limits=self.world.limits).answer, size)
        return {path: FileContent(files.get(path), self.modified.get(path)) for path in paths}

    async def clear(self, paths: Sequence[str], *, container: str = "main") -> None:
        self.calls["clear"] += 1
        self._alive()
        if self.world.unclearable.intersection(paths):
            raise CommandFailed("supervisor: clear: cannot remove a protected path", step="clear")
        self._clear(paths, container)

    def _clear(self, entries: Sequence[str], container: str, user: str | int | None = None) -> None:
        """As the supervisor: each entry a path, or ``MODE:OWNER:PATH`` sealed (``@job``: the job's user)."""
        files = self.files.setdefault(container, {})
        for entry in entries:
            path = _cleared(entry)
            if path != entry:
                owner = entry.split(":", 2)[1]
                self.sealed[path] = str(
                    user if owner == JOB_USER and user is not None else "" if owner == JOB_USER else owner
                )
            else:
                self.sealed.pop(path, None)
            prefix = path.rstrip("/") + "/"
            for name in [n for n in files if n == path.rstrip("/") or n.startswith(prefix)]:
                del files[name]

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        self.calls["switch_user"] += 1
        self._alive()
        if user in self.world.missing_users:
            raise CommandFailed(f"no such user: {user}")
        self.users.append(user)

    def _write(self, container: str, path: str, data: bytes) -> None:
        self.files.setdefault(container, {})[path] = data
        self.modified[path] = self.clock.now

    # Jobs ------------------------------------------------------------------------------
    def _launch(self, spec: JobSpec) -> None:
        """Start ``spec`` as the supervisor's runner would: as its user, in its directory and environment."""
        now = self.clock.now
        record = JobRecord(spec, JobState(spec.id, "running", started_at=now))
        self.jobs[(spec.container, spec.id)] = record
        if spec.user is not None and spec.user in self.world.missing_users:
            self._end(record, phase="unstartable", reason=f"no such user: {spec.user}")
            return
        cwd = _join(self.workdir, spec.cwd) if spec.cwd else self.workdir
        env = {**self.env, **_user_env(spec.user), **spec.env}
        files = self.files.setdefault(spec.container, {})
        process = Process(record, self._script(spec.command, files).splitlines(), env, cwd)
        if spec.timeout_sec < float("inf"):
            self.clock.at(now + spec.timeout_sec, lambda: self._time_out(record))
        self._run(process)

    def _time_out(self, record: JobRecord) -> None:
        if record.state.phase == "running":
            record.state = replace(record.state, timed_out=True)
            self._end(record, exit_code=KILLED_BY_TERM)

    def _end(self, record: JobRecord, *, phase: str = "exited", exit_code: int | None = None, **state: Any) -> None:
        record.state = replace(record.state, phase=phase, exit_code=exit_code, finished_at=self.clock.now, **state)
        if not record.output and phase == "exited":
            record.output += self.world.printed(record.spec) or f"ran {unkeyed(record.spec.id)}\n".encode()
            self._to_output(record, bytes(record.output))

    def _to_output(self, record: JobRecord, data: bytes) -> None:
        """Append to the job's output file too, where it shares one (e.g. the oracle's log)."""
        if record.spec.output:
            path = _join(self.workdir, record.spec.output)
            files = self.files.setdefault(record.spec.container, {})
            self._write(record.spec.container, path, files.get(path, b"") + data)

    def _run(self, process: Process) -> None:
        """Interpret lines until the script ends, sleeps (resumed by a timer) or is killed."""
        record = process.record
        files = self.files.setdefault(record.spec.container, {})
        container = record.spec.container
        while process.running and process.lines:
            line = _expand(process.lines.pop(0), {**process.env, "PWD": process.cwd})
            word, _, rest = line.strip().partition(" ")
            if word in ("write", "append"):
                path, _, text = rest.partition(" ")
                target = _join(process.cwd, path)
                data = text.encode() if word == "write" else files.get(target, b"") + text.encode() + b"\n"
                self._write(container, target, data)
            elif word == "remove":
                files.pop(_join(process.cwd, rest), None)
            elif word == "echo":
                record.output += rest.encode() + b"\n"
                self._to_output(record, rest.encode() + b"\n")
            elif word == "exit":
                self._end(record, exit_code=int(rest))
            elif word == "timeout":
                return  # runs until its time limit kills it
            elif word == "sleep":
                self.clock.at(self.clock.now + float(rest), lambda: self._run(process))
                return
            elif word == "expect":
                value, _, wanted = rest.partition(" ")
                if value != wanted:
                    record.output += f"expected {wanted!r}, got {value!r}\n".encode()
                    self._end(record, exit_code=1)
            elif word == "unstartable":
                self._end(record, phase="unstartable", reason="bash: not found")
            elif word == "reward":
                self._write(container, "/logs/verifier/reward.txt", rest.encode())
            elif word == "reward-json":
                self._write(container, "/logs/verifier/reward.json", rest.encode())
            elif word == "check":
                path, _, text = rest.partition(" ")
                good = files.get(_join(process.cwd, path)) == text.replace("\\n", "\n").encode()
                self._write(container, "/logs/verifier/reward.txt", b"1" if good else b"0")
            elif word == "pass-after":
                if self.clock.monotonic_now < float(rest):
                    self._end(record, exit_code=1)
            elif word == "later":
                delay, _, later = rest.partition(" ")
                spec = replace(record.spec, id=f"{record.spec.id}.leftover", output=None)
                leftover = Process(JobRecord(spec, JobState(spec.id, "running")), [later], process.env, process.cwd)
                self.clock.at(self.clock.now + float(delay), functools.partial(self._run, leftover))
            elif word == "lose-pod":
                self.lost = True
            elif word == "vanish":
                self.jobs.pop((container, record.spec.id), None)
        if process.running and not process.lines:
            self._end(record, exit_code=0)

    def _script(self, command: str, files: dict[str, bytes]) -> str:
        word, _, rest = command.partition(" ")
        if word in ("bash", "sh") and rest.startswith("/"):
            return files.get(rest, b"exit 127").decode()
        return command


def _user_env(user: str | int | None) -> dict[str, str]:
    """What the supervisor sets for a job's user: HOME, and USER and LOGNAME for a named one."""
    if user is None:
        return {}
    if isinstance(user, int) or user.isdigit():
        return {"HOME": "/"}  # a bare uid, as under docker
    return {"HOME": HOMES.get(user, f"/home/{user}"), "USER": user, "LOGNAME": user}


def _expand(line: str, env: Mapping[str, str]) -> str:
    return VARIABLE.sub(lambda match: env.get(match.group(1) or match.group(2), ""), line)


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
    # Pods deleted by a release: kept in ``sandboxes`` for the tests to read, gone for the runner.
    gone: set[str] = field(default_factory=set)
    broken_uploads: set[str] = field(default_factory=set)
    missing_users: set[str | int] = field(default_factory=set)
    unclearable: set[str] = field(default_factory=set)  # paths whose clearing fails
    fail_creation: int = 0  # the next N sandbox creations fail as image pulls
    hooks: dict[str, Any] = field(default_factory=dict)  # job id suffix → callable(sandbox, spec)
    networks: list[str] = field(default_factory=list)  # the agent pod's network modes, as they changed
    crash_after: set[str] = field(default_factory=set)  # job id suffixes: the runner dies once they started
    # The supervisor's waits poll: it answers (and reads a job's files) this long after the job ended.
    notice_delay_sec: float = 0.0
    outputs: dict[str, bytes] = field(default_factory=dict)  # job id suffix → what its command prints
    # pod name → why it waits (reported, in order, when it is created), as a starting pod's state says
    pending: dict[str, list[Waiting]] = field(default_factory=dict)
    created: Counter[str] = field(default_factory=Counter)  # pod name → how many times it was created
    # The operator's bounds on answers (runtime/limits.py), held here as the transport holds them.
    limits: OutputLimits = field(default_factory=OutputLimits)
    # A hostile pod: job id suffix → bytes more in every answer about the job (an endless supervisor);
    # artifact path → what its download answers with (a crafted tar).
    padded: dict[str, int] = field(default_factory=dict)
    crafted: dict[str, bytes] = field(default_factory=dict)

    def padding(self, spec: JobSpec) -> int:
        job = unkeyed(spec.id)
        return next((size for suffix, size in self.padded.items() if job.endswith(suffix)), 0)

    def printed(self, spec: JobSpec) -> bytes | None:
        return next((data for suffix, data in self.outputs.items() if unkeyed(spec.id).endswith(suffix)), None)

    def before_job(self, sandbox: FakeSandbox, spec: JobSpec) -> None:
        for suffix, hook in self.hooks.items():
            if unkeyed(spec.id).endswith(suffix):
                hook(sandbox, spec)

    def after_job(self, spec: JobSpec) -> None:
        for suffix in list(self.crash_after):
            if unkeyed(spec.id).endswith(suffix):
                self.crash_after.discard(suffix)
                raise Crash(f"the operator died after starting {spec.id}")

    def sandbox(self, name: str, env: Mapping[str, str] | None = None, *, uid: str | None = None) -> FakeSandbox:
        """The sandbox ``name``, created when there is none; ``uid``: the one the runner recorded, which
        must be the one there (as the kube provider: a recorded pod gone or replaced is lost)."""
        existing = None if name in self.gone else self.sandboxes.get(name)
        if uid is not None and (existing is None or existing.uid != uid):
            raise SandboxError(f"pod {name} (uid {uid}) is gone", kind="pod_lost")
        if existing is None:
            if self.fail_creation:
                self.fail_creation -= 1
                raise SandboxError(f"image for {name} cannot be pulled", kind="image_pull")
            self.created[name] += 1
            self.gone.discard(name)
            existing = self.sandboxes[name] = FakeSandbox(
                name, self.clock, self, env, uid=f"uid-{name}-{self.created[name]}"
            )
        return existing

    def delete_pod(self, name: str) -> None:
        """Someone deleted the pod: it is gone with everything in it (a later creation is a new pod)."""
        self.sandboxes.pop(name)


class FakeProvider:
    def __init__(self, world: World) -> None:
        self.world = world
        self.verifier_plans: dict[str, VerifierPlan] = {}
        self.pins: dict[str, str] = {}

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None) -> FakeSandbox:
        name = f"pod-a{attempt}"
        if name in self.world.released:
            raise AssertionError(f"{name} was released and must not be used again")
        await self._start(name, waiting)
        return self.world.sandbox(name, uid=uid)

    async def verifier(
        self,
        attempt: int,
        turn: int,
        plan: VerifierPlan,
        *,
        waiting: WaitingReport | None = None,
        uid: str | None = None,
    ) -> FakeSandbox:
        name = f"pod-a{attempt}-v{turn + 1}"
        self.verifier_plans[name] = plan
        await self._start(name, waiting)
        # As the kube provider: the verifier environment's env is the pod's container env.
        return self.world.sandbox(name, plan.environment.env if plan.environment else None, uid=uid)

    async def _start(self, name: str, waiting: WaitingReport | None) -> None:
        """As the kube provider: why the pod waits, each reason once, then that it runs."""
        reports = self.world.pending.pop(name, [])
        if waiting is not None:
            for report in reports:
                await waiting(report)
            await waiting(None)

    def pin_images(self, pins: Mapping[str, str]) -> None:
        """Recorded: the images the pods made from now on would run instead of the built tags."""
        self.pins.update(pins)

    async def apply_network(self, attempt: int, policy: NetworkPolicy) -> None:
        if not self.world.networks or self.world.networks[-1] != policy.mode:
            self.world.networks.append(policy.mode)

    async def release_verifier(self, attempt: int, turn: int) -> None:
        self.world.released.append(f"pod-a{attempt}-v{turn + 1}")
        self.world.gone.add(f"pod-a{attempt}-v{turn + 1}")

    async def release_agent(self, attempt: int) -> None:
        self.world.released.append(f"pod-a{attempt}")
        self.world.gone.add(f"pod-a{attempt}")

    async def release_all(self, *, keep: bool) -> None:
        """As the kube provider: every pod of the episode deleted (kept only when ``keep``)."""
        self.world.kept = keep
        if not keep:
            self.world.released.append("all")
            self.world.gone.update(self.world.sandboxes)


class Crash(Exception):
    """Simulates the operator dying at a chosen status."""


class FakeSink:
    def __init__(self, crash_when: Any = None, crash_at_event: str | None = None) -> None:
        self.statuses: list[EpisodeStatus] = []
        self.events: list[tuple[str, str, bool]] = []
        self.crash_when = crash_when
        self.crash_at_event = crash_at_event  # the runner dies as it sends this Event (once)

    async def publish(self, status: EpisodeStatus) -> None:
        self.statuses.append(status.model_copy(deep=True))
        if self.crash_when is not None and self.crash_when(status):
            self.crash_when = None
            raise Crash()

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, message, warning))
        if reason == self.crash_at_event:
            self.crash_at_event = None
            raise Crash(f"the operator died as it sent {reason}")


class MemoryStore:
    def __init__(self) -> None:
        self.logs: dict[tuple[int, str, str], bytes] = {}
        self.artifacts: dict[tuple[int, str], dict[int, bytes]] = {}
        self.manifests: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self.files: dict[tuple[int, str, str], bytes] = {}

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        self.logs[(attempt, turn, name)] = data

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: ArchiveFile) -> None:
        self.artifacts.setdefault((attempt, turn), {})[index] = archive.read_bytes()

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None:
        self.manifests[(attempt, turn)] = json.loads(json.dumps(manifest))

    async def artifact_archives(self, attempt: int, turn: str) -> list[ArchiveFile]:
        return [ArchiveFile.of_bytes(data) for _, data in sorted(self.artifacts.get((attempt, turn), {}).items())]

    async def save_file(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        self.files[(attempt, turn, name)] = data

    async def read_file(self, attempt: int, turn: str, name: str) -> bytes | None:
        return self.files.get((attempt, turn, name))
