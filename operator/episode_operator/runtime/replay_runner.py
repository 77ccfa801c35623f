"""Replay a task's Dockerfile in a started sandbox (Gym's image rule), against the Sandbox protocol only.

The sandbox runs the Dockerfile's ``FROM`` image (mirrored as the operator is told). Replay
first reads the image's own environment, machine and working directory (one job), plans with
them (:func:`episode_operator.taskfolder.replay_plan.plan_replay`, so ``ENV PATH=/x:$PATH`` means
what a build means), then applies each step as a supervised job in order:

- ``RUN``: the command as the build's user, in its WORKDIR, with its ENV and ARGs;
- ``COPY``/``ADD``: the files travel with the task — a tar of the step's sources is uploaded
  into a staging folder by the exec that starts the job, and the job places them, with
  ``--chown``/``--chmod``, then removes the staging folder;
- ``WORKDIR``/``VOLUME``: the directory is created.

Every job has a deterministic id, and an upload travels only with the exec that starts its
job, so a restarted operator re-attaches to the step that was running and never runs a
``RUN`` line twice. The whole replay is bounded by ``build_timeout_sec`` from the first job's
start (read back from the sandbox, so the bound survives a restart), and its output is kept
as one log per sandbox, updated after every step.

Then ``ENTRYPOINT`` starts (:func:`entrypoint_job`, a step of its own in the seed) as a
long-running supervised job with the image's environment under ``[environment.env]`` and the
sandbox's keep-alive as its arguments: ``CMD`` is replaced, as a prebuilt image's pod replaces it
and as Harbor's compose does (``sleep infinity``), so an entrypoint that starts services and then
``exec "$@"`` behaves as it would there. It cannot be the container's own process: the sandbox
pod was created before the Dockerfile was read, and its PID 1 is the operator's keep-alive (the
base image's ENTRYPOINT, if any, runs with the keep-alive as its arguments). Started under the
supervisor, the entrypoint's services run for the life of the pod, and the environment health
check that follows waits for them as it would for a container's.

The Dockerfile's ``WORKDIR``, ``ENV`` and ``USER`` (``task.toml`` winning) become the defaults of
every later job in the sandbox (:class:`ReplayedSandbox`). A restarted operator does not keep
them: :func:`replayed_image` reads them back from the pod (the first job's record of the base
image's environment) and plans again, one exec, deterministic.

Results are typed: :class:`ReplayReady`; :class:`ReplayFailed` and :class:`ReplayTimedOut`
(the task's failure: terminal); :class:`ReplayRefused` (the Dockerfile cannot be replayed with
this base image). A :class:`SandboxError` from the sandbox propagates: it is an outage.
"""

from __future__ import annotations

import io
import math
import shlex
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from episode_operator.runtime.episode_store import EpisodeStore
from episode_operator.runtime.sandbox_protocol import (
    KEEP_ALIVE,
    MAIN_CONTAINER,
    CommandFailed,
    JobSpec,
    JobState,
    Sandbox,
    SandboxError,
    SandboxWrapper,
    Upload,
)
from episode_operator.runtime.supervisor import SUPERVISOR_DIR
from episode_operator.runtime.timing import DEFAULT_TIMING
from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.replay_plan import (
    BaseImage,
    CopyStep,
    ImageSettings,
    MakeDirectoryStep,
    ReplayPlan,
    RunStep,
    copy_command,
    merged_settings,
    mkdir_command,
    plan_replay,
    staging_archive,
)
from episode_operator.taskfolder.sources import TaskFiles
from episode_operator.taskfolder.task_toml import EnvironmentConfig

# The base image's machine, then its environment NUL-separated (values may hold newlines).
BASE_PROBE = "uname -m 2>/dev/null || echo unknown; cat /proc/self/environ"
# Variables of the probing shell itself, not of the image.
SHELL_VARIABLES = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
BASE_PROBE_TIMEOUT_SEC = 60.0
SCRIPT_NAME = "script"
# How long a step found running past the bound (after a restart) is waited for: its own bound kills it.
KILL_MARGIN_SEC = 10.0


@dataclass(frozen=True)
class ReplaySource:
    """Which Dockerfile to replay, with which folder of the task as its build context."""

    dockerfile: str = "environment/Dockerfile"
    context: str = "environment"
    build_args: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayConfig:
    """Where replay runs and keeps its log, and its bounds.

    ``job_prefix`` makes the job ids (one replay per container of a sandbox); ``turn`` and
    ``log_name`` name the kept log (:meth:`EpisodeStore.save_log`).
    """

    attempt: int
    budget_sec: float
    job_prefix: str = "replay"
    container: str = MAIN_CONTAINER
    turn: str = "seed"
    log_name: str = "replay"
    poll_interval_sec: float = DEFAULT_TIMING.poll_interval_sec
    tail_bytes: int = 64 * 1024


@dataclass(frozen=True)
class ReplayReady:
    """Replay finished; later jobs run with ``settings`` (workdir, env, default user), task.toml winning."""

    plan: ReplayPlan
    settings: ImageSettings


@dataclass(frozen=True)
class ReplayFailed:
    """A step failed (a RUN exited non-zero, a user did not exist…): the task's failure, terminal."""

    line: int
    instruction: str
    message: str
    output: bytes = b""


@dataclass(frozen=True)
class ReplayTimedOut:
    """Replay ran past ``build_timeout_sec``, at ``line``: terminal (the task asked for that bound)."""

    line: int
    instruction: str
    message: str


@dataclass(frozen=True)
class ReplayRefused:
    """The Dockerfile cannot be replayed in this base image; ``problems`` name the lines."""

    problems: tuple[Problem, ...]


ReplayOutcome = ReplayReady | ReplayFailed | ReplayTimedOut | ReplayRefused


def entrypoint_job(ready: ReplayReady, config: ReplayConfig) -> JobSpec | None:
    """``ENTRYPOINT`` as a supervised job for the life of the pod, with the sandbox's keep-alive as its
    arguments (CMD replaced, as for a prebuilt image's pod and in Harbor), as the image's USER, in its
    WORKDIR, with ``[environment.env]`` over its ENV; None when the Dockerfile declares none."""
    if ready.plan.entrypoint is None:
        return None
    settings = ready.settings
    return JobSpec(
        id=f"{config.job_prefix}.start",
        command="exec " + shlex.join([*ready.plan.entrypoint, *KEEP_ALIVE]),
        timeout_sec=math.inf,
        user=settings.user,
        cwd=settings.workdir,
        env=settings.env,
        shell="sh",
        container=config.container,
        tail=config.tail_bytes,
    )


async def replayed_image(
    sandbox: Sandbox,
    files: TaskFiles,
    source: ReplaySource,
    environment: EnvironmentConfig,
    config: ReplayConfig,
) -> ReplayReady | ReplayFailed | ReplayRefused:
    """What a replay in ``sandbox`` left — its plan and settings — read back without running a step.

    The base image's environment comes from the replay's first job (re-attached; started if the
    pod never had it, which reads the same image's environment), so the plan is the one the
    replay applied. For a restarted operator that resumes after the replay.
    """
    run = _Replay(sandbox, files, source, environment, None, config, time.time)
    base = await run.base_image()
    if isinstance(base, ReplayFailed):
        return base
    planning = plan_replay(files, source.dockerfile, source.context, base=base, build_args=source.build_args)
    if planning.plan is None:
        return ReplayRefused(planning.problems)
    return ReplayReady(planning.plan, merged_settings(planning.plan, environment))


async def replay_dockerfile(
    sandbox: Sandbox,
    files: TaskFiles,
    source: ReplaySource,
    environment: EnvironmentConfig,
    store: EpisodeStore,
    config: ReplayConfig,
    *,
    clock: Callable[[], float] = time.time,
) -> ReplayOutcome:
    """Apply ``source``'s Dockerfile in ``sandbox``; safe to call again after a crash (it re-attaches).

    ``clock`` is wall time, compared with the jobs' start times the sandbox reports.
    """
    return await _Replay(sandbox, files, source, environment, store, config, clock).run()


@dataclass
class _Replay:
    sandbox: Sandbox
    files: TaskFiles
    source: ReplaySource
    environment: EnvironmentConfig
    store: EpisodeStore | None  # None: reading a replay back keeps no log (the replay kept its own)
    config: ReplayConfig
    clock: Callable[[], float]
    log: bytearray = field(default_factory=bytearray)
    started_at: float = 0.0

    def job_id(self, name: str) -> str:
        return f"{self.config.job_prefix}.{name}"

    def remaining(self) -> float:
        return self.config.budget_sec - (self.clock() - self.started_at)

    async def run(self) -> ReplayOutcome:
        self.started_at = self.clock()
        base = await self.base_image()
        if isinstance(base, ReplayFailed):
            return base
        planning = plan_replay(
            self.files, self.source.dockerfile, self.source.context, base=base, build_args=self.source.build_args
        )
        if planning.plan is None:
            return ReplayRefused(planning.problems)
        plan = planning.plan
        for index, step in enumerate(plan.steps):
            outcome = await self.step(index, step)
            if outcome is not None:
                return outcome
        return ReplayReady(plan, merged_settings(plan, self.environment))

    async def base_image(self) -> BaseImage | ReplayFailed:
        """The image's machine and environment, from one job; its start time starts the budget."""
        spec = JobSpec(
            id=self.job_id("base"),
            command=BASE_PROBE,
            timeout_sec=BASE_PROBE_TIMEOUT_SEC,
            shell="sh",
            container=self.config.container,
            tail=self.config.tail_bytes,
        )
        state = await self.finish(spec, await self.sandbox.start_job(spec, wait_sec=BASE_PROBE_TIMEOUT_SEC))
        if state.started_at is not None:
            self.started_at = state.started_at
        if not state.succeeded:
            return ReplayFailed(
                0, "FROM", f"cannot read the base image's environment: {_describe(state)}", state.output or b""
            )
        machine, _, environ = (state.output or b"").partition(b"\n")
        env: dict[str, str] = {}
        for entry in environ.split(b"\x00"):
            name, separator, value = entry.decode("utf-8", "replace").partition("=")
            if separator and name not in SHELL_VARIABLES and not name.startswith("_EO_"):
                env[name] = value
        return BaseImage(env=env, workdir=self.sandbox.workdir, machine=machine.decode("utf-8", "replace").strip())

    async def step(
        self, index: int, step: RunStep | CopyStep | MakeDirectoryStep
    ) -> ReplayFailed | ReplayTimedOut | None:
        remaining = self.remaining()
        where = f"{self.source.dockerfile}:{step.line}"
        job_id = self.job_id(f"{index + 1:03d}.{step.kind}")
        timed_out = ReplayTimedOut(
            step.line, step.instruction, f"{where}: replay ran past build_timeout_sec ({self.config.budget_sec:g} s)"
        )
        if remaining <= 0:
            # Past the bound nothing new starts; a step that ran in time (a restart after it) still counts.
            seen = await self.sandbox.wait_job(
                JobSpec(id=job_id, command="", timeout_sec=0, container=self.config.container), max_wait_sec=0
            )
            if seen.phase == "unknown":
                return timed_out
            remaining = KILL_MARGIN_SEC
        staging = f"{SUPERVISOR_DIR}/tmp/{job_id}"
        upload: Upload | None = None
        user: str | None = None
        cwd: str | None = None
        env: Mapping[str, str] = {}
        if isinstance(step, RunStep):
            user, cwd, env = step.user, step.cwd, step.env
            command = step.command or f"exec {shlex.quote(f'{staging}/{SCRIPT_NAME}')}"
            if step.script is not None:
                upload = Upload(_script_archive(step.script), staging, clear=(staging,))
        elif isinstance(step, CopyStep):
            command = f"{copy_command(step, staging)}\nrm -rf {shlex.quote(staging)}"
            upload = Upload(staging_archive(step, self.files), staging, clear=(staging,))
        else:
            command = mkdir_command(step)
        spec = JobSpec(
            id=job_id,
            command=command,
            timeout_sec=remaining,
            user=user,
            cwd=cwd,
            env=env,
            shell="sh",
            container=self.config.container,
            tail=self.config.tail_bytes,
        )
        self.log += f"==> {where}: {step.instruction}\n".encode()
        try:
            first = await self.sandbox.start_job(
                spec, wait_sec=min(remaining, self.config.poll_interval_sec), upload=upload
            )
        except CommandFailed as error:
            await self.save_log(f"[upload failed: {error}]\n")
            return ReplayFailed(step.line, step.instruction, f"{where}: cannot stage the files: {error}")
        state = await self.finish(spec, first)
        self.log += state.output or b""
        await self.save_log(f"[{_describe(state)}]\n")
        if state.timed_out:
            return timed_out
        if not state.succeeded:
            return ReplayFailed(
                step.line, step.instruction, f"{where}: {step.instruction}: {_describe(state)}", state.output or b""
            )
        return None

    async def finish(self, spec: JobSpec, state: JobState) -> JobState:
        while not state.done:
            if state.phase == "unknown":
                raise SandboxError(f"replay job {spec.id} vanished from the sandbox", kind="lost_job")
            state = await self.sandbox.wait_job(spec, max_wait_sec=self.config.poll_interval_sec)
        return state

    async def save_log(self, trailer: str) -> None:
        self.log += trailer.encode()
        if self.store is not None:
            await self.store.save_log(self.config.attempt, self.config.turn, self.config.log_name, bytes(self.log))


def _describe(state: JobState) -> str:
    if state.phase == "unstartable":
        return f"could not start ({state.reason or 'unknown reason'})"
    if state.timed_out:
        return "ran out of time"
    if state.exit_code is None:
        return f"ended without an exit code ({state.reason or 'lost'})"
    return f"exited with {state.exit_code}"


def _script_archive(script: str) -> bytes:
    data = script.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(SCRIPT_NAME)
        info.size, info.mode = len(data), 0o755
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class ReplayedSandbox(SandboxWrapper):
    """A sandbox whose image was replayed: its main container's jobs default to the image's settings.

    A job's ``user`` (None: the image's USER), ``cwd`` (None: its WORKDIR) and ``env`` (over the
    image's ENV and ``[environment.env]``) as a container of the built image would give them;
    ``workdir`` is the image's. Sidecar containers are not the replayed image and are untouched.
    """

    inner: Sandbox
    settings: ImageSettings

    @property
    def workdir(self) -> str:
        return self.settings.workdir or self.inner.workdir

    def _defaults(self, spec: JobSpec) -> JobSpec:
        if spec.container != MAIN_CONTAINER:
            return spec
        return replace(
            spec,
            user=spec.user if spec.user is not None else self.settings.user,
            cwd=spec.cwd if spec.cwd is not None else self.settings.workdir,
            env={**self.settings.env, **spec.env},
        )

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        return await self.inner.start_job(self._defaults(spec), wait_sec=wait_sec, upload=upload)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        return await self.inner.wait_job(self._defaults(spec), max_wait_sec=max_wait_sec)

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        await self.inner.switch_user(user, workdir or self.workdir)
