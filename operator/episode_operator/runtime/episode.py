"""The episode runner: a plan, turn by turn, scored as NeMo Gym's harbor server scores it.

TASK-FORMAT.md §3.4 per turn — cleanup, prepare (user, ``workdir/``, ``setup.sh``, step
healthcheck), agent, collect (hooks and artifacts, ``main`` then sidecars), verify (shared
or in a fresh verifier sandbox), gate — then the roll-up. Failures keep Gym's classes apart:
a *measured* 0 ends the episode with a reward; a *terminal* failure (preparation at step 1)
ends it without one and is not retried; a *masked* turn masks the episode; an *outage*
(the sandbox failed under us) restarts the episode in a fresh sandbox, up to a limit.

Crash safety: the status is the only state. Every command is a supervised job with a
deterministic id whose inputs (workdir/, the solution or instruction, the tests) travel in
the exec that starts it, and the turn's ``stage`` is published before any step a restart
must not redo; so a runner started on the status a crashed one left re-attaches to the
running job, redoes only idempotent steps, and never runs a turn twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any, Literal, Protocol

from episode_operator.api.models import (
    AgentSpec,
    ArtifactSummary,
    AttemptStatus,
    Condition,
    EpisodeStatus,
    TaskStatus,
    TurnStatus,
)
from episode_operator.runtime.archive import archive_summary, folder_tar, mapped_tar, text_tar
from episode_operator.runtime.sandbox import (
    MAIN_CONTAINER,
    CommandFailed,
    JobSpec,
    JobState,
    Sandbox,
    SandboxError,
    SandboxProvider,
    Upload,
)
from episode_operator.runtime.store import EpisodeStore
from episode_operator.taskfolder import EpisodePlan, TaskFiles, TurnPlan
from episode_operator.taskfolder.healthcheck import poll_healthcheck
from episode_operator.taskfolder.models import MAIN_SERVICE
from episode_operator.taskfolder.plan import ArtifactPlan, NetworkPolicy, baseline_policy
from episode_operator.taskfolder.rewards import (
    TurnScore,
    check_min_reward,
    parse_reward_files,
    roll_up,
)

FAILURE_SETUP = "harbor:step_setup_failed"
FAILURE_WORKDIR = "harbor:step_workdir_failed"
FAILURE_HEALTHCHECK = "harbor:step_healthcheck_failed"
FAILURE_DEADLINE = "harbor:task_deadline"
FAILURE_VERIFIER = "harbor:verifier_error"
FAILURE_AGENT_SETUP = "agent:setup_failed"
TERMINAL_PHASES = ("Succeeded", "Failed")
STAGES = ("cleanup", "workdir", "setup", "healthcheck", "agent", "collect", "verify-prepare", "verify", "done")
LOGS_VERIFIER = "/logs/verifier"
REWARD_JSON = f"{LOGS_VERIFIER}/reward.json"
REWARD_TXT = f"{LOGS_VERIFIER}/reward.txt"
TEST_STDOUT = f"{LOGS_VERIFIER}/test-stdout.txt"
TESTS = "/tests"
SOLUTION = "/solution"
TRAJECTORY = "/logs/agent/trajectory.json"
# What Gym empties after a turn verified in the agent's sandbox.
GRADING_FILES = (f"{TESTS}/", f"{LOGS_VERIFIER}/", TRAJECTORY)
INSTRUCTIONS = "/episode-operator/instructions"
# Past a job's own bound the supervisor kills it; this margin only covers the kill itself.
KILL_AFTER_SEC = 5.0


class Outage(Exception):
    """The sandbox failed under us: the attempt is lost and a fresh one may start."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _PreparationFailed(Exception):
    def __init__(self, failure_kind: str, message: str) -> None:
        super().__init__(message)
        self.failure_kind = failure_kind


class _EpisodeEnds(Exception):
    """Ends the episode now with this outcome (terminal, masked, ungraded)."""

    def __init__(self, outcome: Literal["TerminalFailure", "Masked", "Ungraded"], failure_kind: str, message: str):
        super().__init__(message)
        self.outcome = outcome
        self.failure_kind = failure_kind


class EpisodeObserver(Protocol):
    """What the runner tells about its work, e.g. for metrics."""

    def phase_finished(self, phase: str, seconds: float) -> None: ...

    def turn_finished(self, result: str, failure_kind: str | None) -> None: ...

    def outage(self, kind: str) -> None: ...

    def episode_finished(self, outcome: str, failure_kind: str | None, reward: float | None) -> None: ...


class _Unobserved:
    def phase_finished(self, phase: str, seconds: float) -> None:
        pass

    def turn_finished(self, result: str, failure_kind: str | None) -> None:
        pass

    def outage(self, kind: str) -> None:
        pass

    def episode_finished(self, outcome: str, failure_kind: str | None, reward: float | None) -> None:
        pass


class StatusSink(Protocol):
    """Where the runner reports: the Episode's status subresource and its events."""

    async def publish(self, status: EpisodeStatus) -> None: ...

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None: ...


@dataclass(frozen=True)
class EpisodeConfig:
    """Everything the runner needs besides its collaborators."""

    plan: EpisodePlan
    files: TaskFiles
    agent: AgentSpec
    digest: str
    task_name: str | None = None
    outage_retries: int = 2
    keep_pods_on_failure: bool = False
    poll_interval_sec: float = 30.0
    backoff_base_sec: float = 5.0
    backoff_max_sec: float = 120.0
    log_limit: int = 1 << 20


def timestamp(epoch: float) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


class EpisodeRunner:
    """Runs one Episode from whatever status it is in to a terminal phase."""

    def __init__(
        self,
        config: EpisodeConfig,
        provider: SandboxProvider,
        sink: StatusSink,
        store: EpisodeStore,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        observer: EpisodeObserver | None = None,
    ) -> None:
        self.config = config
        self.plan = config.plan
        self.provider = provider
        self.sink = sink
        self.store = store
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.observer: EpisodeObserver = observer or _Unobserved()
        self._baseline = baseline_policy(self.plan.environment)
        self.status = EpisodeStatus()
        self._agent_sandbox: Sandbox | None = None
        # Healthcheck attempts of this runner never collide with a crashed runner's.
        self._incarnation = f"{int(clock() * 1000) % 10**9:x}"

    # Entry point -----------------------------------------------------------------------
    async def run(self, status: EpisodeStatus | None) -> EpisodeStatus:
        """Run to ``Succeeded`` or ``Failed`` from ``status`` (None or empty: the start)."""
        self.status = (status or EpisodeStatus()).model_copy(deep=True)
        if self.status.phase in TERMINAL_PHASES:
            return self.status
        if self.status.phase in (None, "Pending") or not self.status.attempts:
            self._begin()
            await self._publish()
        while self.status.phase not in TERMINAL_PHASES:
            try:
                await self._run_attempt()
            except Outage as outage:
                await self._after_outage(outage)
            except _EpisodeEnds as ending:
                await self._end(ending.outcome, ending.failure_kind, str(ending))
        return self.status

    def _begin(self) -> None:
        now = self.clock()
        self.status.phase = "Running"
        self.status.started_at = self.status.started_at or timestamp(now)
        self.status.task = TaskStatus(digest=self.config.digest, steps=len(self.plan.turns), name=self.config.task_name)
        self.status.attempts = [AttemptStatus(number=1, started_at=timestamp(now))]
        self._reset_turns(1)
        self._condition("Running", "True", "Started", "the episode is running")

    def _reset_turns(self, attempt: int) -> None:
        self.status.attempt = attempt
        self.status.current_turn = 0
        self.status.turns = [TurnStatus(name=turn.name) for turn in self.plan.turns]
        self.status.pod_name = None
        self._progress()

    @property
    def _attempt(self) -> AttemptStatus:
        return self.status.attempts[-1]

    # One attempt -----------------------------------------------------------------------
    async def _run_attempt(self) -> None:
        attempt = self._attempt
        if attempt.ready_at is None:
            sandbox = await self._agent()
            await self._seed(sandbox)
            ready = self.clock()
            attempt.ready_at = timestamp(ready)
            attempt.deadline_at = timestamp(math.ceil(ready + self.plan.deadline_sec))
            await self._publish()
        assert attempt.deadline_at is not None
        remaining = parse_timestamp(attempt.deadline_at) - self.clock()
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                await self._run_turns()
        except TimeoutError:
            raise Outage(FAILURE_DEADLINE, f"past the episode deadline of {self.plan.deadline_sec:.0f} s") from None

    async def _run_turns(self) -> None:
        start = self.status.current_turn or 0
        for index in range(start, len(self.plan.turns)):
            self.status.current_turn = index
            stop = await self._run_turn(index)
            if stop:
                if index < len(self.plan.turns) - 1:
                    self.status.stopped_after_turn = self.plan.turns[index].name
                break
        await self._finish_graded()

    async def _agent(self) -> Sandbox:
        if self._agent_sandbox is None:
            try:
                async with self._timed("pod_start"):
                    self._agent_sandbox = await self.provider.agent(self._attempt.number)
            except SandboxError as error:
                raise Outage(error.kind, str(error)) from error
            if self.status.pod_name != self._agent_sandbox.name:
                self.status.pod_name = self._agent_sandbox.name
                await self._publish()
        return self._agent_sandbox

    async def _seed(self, sandbox: Sandbox) -> None:
        """Seed-time work: the environment healthcheck, then the command agent's own setup."""
        check = self.plan.environment.healthcheck
        if check is not None:
            passed = await self._healthcheck(sandbox, check, "seed", self.plan.turns[0].agent.user)
            if not passed:
                raise Outage("environment-healthcheck", "[environment.healthcheck] never passed")
        agent = self.config.agent
        if agent.kind == "command" and agent.setup:
            first = self.plan.turns[0]
            state = await self._job(
                sandbox,
                JobSpec(
                    id=f"a{self._attempt.number}.agent-setup",
                    command=agent.setup,
                    timeout_sec=first.agent.timeout_sec,
                    user=first.agent.user,
                    env=self._agent_env(0),
                ),
            )
            await self._save_job_log(sandbox, "seed", "agent-setup", state)
            if not state.succeeded:
                raise _EpisodeEnds("Ungraded", FAILURE_AGENT_SETUP, f"the agent's setup {self._describe(state)}")

    # One turn --------------------------------------------------------------------------
    async def _run_turn(self, index: int) -> bool:
        """Run turn ``index`` from its recorded stage; True when the episode stops after it."""
        turn = self.plan.turns[index]
        record = self.status.turns[index]
        if record.stage == "done":
            return self._stopped(index)
        if record.stage is None:
            record.phase = "Running"
            record.started_at = timestamp(self.clock())
            record.verifier_mode = turn.verifier.mode
            await self._stage(record, "cleanup")
            await self.sink.event("TurnStarted", f"turn {index + 1}/{len(self.plan.turns)} {turn.name} started")
        try:
            # A stage is published only where a restart must not redo what came before it.
            # Until the agent, a restart redoes only what is harmless to redo — the cleanup,
            # the user switch, a workdir/ merge with no setup.sh after it, the healthcheck —
            # and re-attaches to setup.sh, whose start exec carries the workdir/ merge (a
            # setup.sh always lives in workdir/) and so never merges it again.
            if record.stage == "cleanup":
                if self._cleanup_carrier(index) == "own":
                    await self._clear_grading_files()
                await self._stage(record, "workdir", publish=False)
            if record.stage == "workdir":
                await self._network(self._baseline)
                await self._prepare_workdir(index)
                await self._stage(record, "setup", publish=False)
            if record.stage == "setup":
                async with self._timed("setup"):
                    await self._setup(index)
                # Not published: a restart here re-attaches to setup.sh and polls again.
                await self._stage(record, "healthcheck", publish=False)
            if record.stage == "healthcheck":
                async with self._timed("healthcheck"):
                    await self._step_healthcheck(index)
                await self._stage(record, "agent")
        except _PreparationFailed as failure:
            if index == 0:
                # No agent has acted yet: a terminal failure, no reward, no retry (Gym).
                record.phase = "Failed"
                record.failure_kind = failure.failure_kind
                record.message = str(failure)
                raise _EpisodeEnds("TerminalFailure", failure.failure_kind, f"turn {turn.name}: {failure}") from None
            # From step 2 on it is a measured 0 that ends the episode.
            await self._finish_turn(index, TurnScore(valid=False), failure.failure_kind, str(failure))
            return True
        if record.stage == "agent":
            await self._network(turn.agent.network)
            async with self._timed("agent"):
                await self._run_agent(index)
            # Not published: collecting again after a restart re-attaches to the agent's job.
            await self._stage(record, "collect", publish=False)
        if record.stage == "collect":
            await self._network(self._baseline)
            async with self._timed("collect"):
                await self._collect(index)
            # Published for a separate verifier only: its pod (and, on the last turn, the
            # release of the agent's) must not be redone. A shared one collects again and
            # re-attaches to test.sh, whose start exec uploaded the tests.
            await self._stage(record, "verify-prepare", publish=turn.verifier.mode == "separate")
        async with self._timed("verify"):
            return await self._verify(index)

    def _stopped(self, index: int) -> bool:
        """Whether a finished turn stopped the episode: no valid reward, a failure, or a missed gate."""
        record = self.status.turns[index]
        if not record.reward_valid or record.failure_kind:
            return True
        return check_min_reward(self.plan.turns[index].min_reward, record.verifier_rewards) is not None

    async def _network(self, policy: NetworkPolicy) -> None:
        """The agent pod's network for the phase about to run (Harbor's phase overrides)."""
        try:
            await self.provider.apply_network(self._attempt.number, policy)
        except SandboxError as error:
            raise Outage(error.kind, str(error)) from error

    async def _stage(self, record: TurnStatus, stage: str, *, publish: bool = True) -> None:
        record.stage = stage
        if publish:
            await self._publish()

    def _cleanup_carrier(self, index: int) -> Literal["none", "own", "workdir", "agent"]:
        """Which exec empties the previous shared turn's grading files (Gym's cleanup).

        Always before any task code of this turn runs: with the workdir/ upload when there is
        one; else with the agent's own upload when nothing (setup.sh, healthcheck) runs first;
        else in an exec of its own. Clearing is idempotent, so a restart may clear again.
        """
        if index == 0 or self.plan.turns[index - 1].verifier.mode != "shared":
            return "none"
        turn = self.plan.turns[index]
        if turn.workdir is not None:
            return "workdir"
        if not turn.setup and turn.healthcheck is None and self.config.agent.kind != "nop":
            return "agent"
        return "own"

    def _grading_files(self, index: int, carrier: str) -> list[str]:
        return list(GRADING_FILES) if self._cleanup_carrier(index) == carrier else []

    async def _clear_grading_files(self) -> None:
        sandbox = await self._agent()
        try:
            await sandbox.clear(list(GRADING_FILES))
        except CommandFailed as error:
            raise _grading_cleanup_outage(error) from error
        except SandboxError as error:
            raise Outage(error.kind, str(error)) from error

    async def _prepare_workdir(self, index: int) -> None:
        turn = self.plan.turns[index]
        sandbox = await self._agent()
        user = turn.agent.user
        previous = self.plan.turns[index - 1].agent.user if index > 0 else None
        if user is not None and (index == 0 or user != previous):
            try:
                await sandbox.switch_user(user, sandbox.workdir)
            except (SandboxError, CommandFailed) as error:
                raise _outage(error, "user-switch", f"cannot switch to user {user!r}: {error}") from error
        if turn.workdir is None or turn.setup:
            return  # none, or merged by the exec that starts setup.sh
        try:
            workdir = self._workdir_upload(index, sandbox)
            await sandbox.upload(workdir.archive, workdir.destination, clear=workdir.clear)
        except CommandFailed as error:
            raise _workdir_failure(error) from error
        except SandboxError as error:
            raise Outage(error.kind, str(error)) from error

    def _workdir_upload(self, index: int, sandbox: Sandbox) -> Upload:
        turn = self.plan.turns[index]
        assert turn.workdir is not None
        return Upload(
            folder_tar(self.config.files, turn.workdir),
            sandbox.workdir,
            tuple(self._grading_files(index, "workdir")),
        )

    async def _setup(self, index: int) -> None:
        turn = self.plan.turns[index]
        if not turn.setup:
            return
        sandbox = await self._agent()
        assert turn.setup_timeout_sec is not None
        spec = JobSpec(
            id=self._job_id(index, "setup"),
            command=f"bash {PurePosixPath(sandbox.workdir) / 'setup.sh'}",
            timeout_sec=turn.setup_timeout_sec,
            user=turn.agent.user,
        )
        try:
            state = await self._job(sandbox, spec, upload=self._workdir_upload(index, sandbox))
        except CommandFailed as error:
            raise _workdir_failure(error) from error
        await self._save_job_log(sandbox, turn.name, "setup", state)
        if state.phase == "unstartable":
            raise Outage("run-command", f"setup.sh cannot start: {state.reason}")
        if not state.succeeded:
            raise _PreparationFailed(FAILURE_SETUP, f"setup.sh {self._describe(state)}")

    async def _step_healthcheck(self, index: int) -> None:
        turn = self.plan.turns[index]
        if turn.healthcheck is None:
            return
        sandbox = await self._agent()
        if not await self._healthcheck(sandbox, turn.healthcheck, self._job_id(index, "healthcheck"), turn.agent.user):
            raise _PreparationFailed(FAILURE_HEALTHCHECK, "[steps.healthcheck] never passed")

    async def _healthcheck(self, sandbox: Sandbox, check: Any, prefix: str, user: str | int | None) -> bool:
        attempts = 0

        async def attempt(timeout: float) -> bool:
            nonlocal attempts
            attempts += 1
            state = await self._job(
                sandbox,
                JobSpec(
                    id=f"{prefix}.{self._incarnation}.{attempts}",
                    command=check.command,
                    timeout_sec=timeout,
                    user=user,
                ),
            )
            if state.phase == "unstartable":
                raise Outage("run-command", f"the healthcheck cannot start: {state.reason}")
            return state.succeeded

        return await poll_healthcheck(check, attempt, self.monotonic, self.sleep)

    async def _run_agent(self, index: int) -> None:
        turn = self.plan.turns[index]
        record = self.status.turns[index]
        agent = self.config.agent
        if agent.kind == "nop":
            return
        sandbox = await self._agent()
        grading = tuple(self._grading_files(index, "agent"))
        # The agent's inputs travel in the exec that starts it, so a restarted runner that
        # re-attaches never changes them under a running agent.
        if agent.kind == "oracle":
            assert turn.solution is not None
            inputs = Upload(folder_tar(self.config.files, turn.solution), SOLUTION, (f"{SOLUTION}/", *grading))
            what, failure = "the oracle's solution", "place-solution"
        else:
            inputs = Upload(text_tar({self._instruction_file(index): turn.instruction}), INSTRUCTIONS, grading)
            what, failure = "the instruction", "place-instruction"
        try:
            state = await self._job(sandbox, self._agent_job(index), upload=inputs)
        except CommandFailed as error:
            if grading and error.step == "clear":
                raise _grading_cleanup_outage(error) from error
            raise _outage(error, failure, f"cannot place {what}: {error}") from error
        await self._save_job_log(sandbox, turn.name, "agent", state)
        if state.phase == "unstartable":
            raise Outage("run-command", f"the agent cannot start: {state.reason}")
        record.agent_exit_code = state.exit_code
        if state.timed_out:
            record.message = f"the agent ran out of its {turn.agent.timeout_sec:.0f} s budget"
        # Harbor's rule: an agent's non-zero exit or timeout is recorded; the verifier decides.

    def _instruction_file(self, index: int) -> str:
        return f"{index + 1:02d}-{self.plan.turns[index].name}.md"

    def _agent_job(self, index: int) -> JobSpec:
        """The agent's job for a turn: the oracle's solve.sh, or the command agent's command."""
        turn = self.plan.turns[index]
        agent = self.config.agent
        if agent.kind == "oracle":
            return JobSpec(
                id=self._job_id(index, "agent"),
                command=f"bash {SOLUTION}/solve.sh",
                timeout_sec=turn.agent.timeout_sec,
                user=turn.agent.user,
                env={**self.plan.solution_env, "DEBIAN_FRONTEND": "noninteractive"},
                output="/logs/agent/oracle.txt",
            )
        assert agent.command is not None
        return JobSpec(
            id=self._job_id(index, "agent"),
            command=agent.command,
            timeout_sec=turn.agent.timeout_sec,
            user=turn.agent.user,
            env={
                **self._agent_env(index),
                "EPISODE_INSTRUCTION_FILE": f"{INSTRUCTIONS}/{self._instruction_file(index)}",
            },
        )

    def _agent_env(self, index: int) -> dict[str, str]:
        turn = self.plan.turns[index]
        return {
            "EPISODE_TURN": str(index + 1),
            "EPISODE_TURN_NAME": turn.name,
            "EPISODE_TURNS": str(len(self.plan.turns)),
        }

    async def _collect(self, index: int) -> None:
        """Collect hooks, then artifacts: ``main`` first, then the sidecars (best effort)."""
        turn = self.plan.turns[index]
        sandbox = await self._agent()
        attempt = self._attempt.number
        manifest: list[dict[str, Any]] = []
        claimed: list[str] = []
        counts = ArtifactSummary()
        services = {hook.service for hook in turn.collect} | {artifact.service for artifact in turn.artifacts}
        sidecar_services = sorted(services - {MAIN_SERVICE})
        for service in [MAIN_SERVICE, *sidecar_services]:
            for number, hook in enumerate(turn.collect):
                if hook.service != service:
                    continue
                state = await self._job(
                    sandbox,
                    JobSpec(
                        id=f"{service}.{self._job_id(index, 'collect')}.{number}",
                        command=hook.command,
                        timeout_sec=hook.timeout_sec,
                        user=hook.user,
                        shell="bash" if service == MAIN_SERVICE else "sh",
                        container=service,
                    ),
                )
                await self._save_job_log(sandbox, turn.name, f"collect-{number}", state, container=service)
            for entry in turn.artifacts:
                if entry.service != service:
                    continue
                status, kind = await self._collect_artifact(sandbox, attempt, turn, len(manifest), entry, claimed)
                manifest.append(
                    {
                        "source": entry.source,
                        "destination": entry.destination,
                        "type": kind,
                        "status": status,
                        "service": entry.service,
                        "origin": entry.origin,
                    }
                )
                setattr(counts, _SUMMARY_FIELD[status], getattr(counts, _SUMMARY_FIELD[status]) + 1)
        await self.store.save_manifest(attempt, turn.name, manifest)
        self.status.turns[index].artifacts = counts

    async def _collect_artifact(
        self, sandbox: Sandbox, attempt: int, turn: TurnPlan, position: int, entry: ArtifactPlan, claimed: list[str]
    ) -> tuple[str, str]:
        if any(_overlaps(entry.destination, earlier) for earlier in claimed):
            return "skipped", "directory"
        try:
            archive = await sandbox.download([entry.source], container=entry.service, exclude=entry.exclude)
        except CommandFailed:
            return "failed", "directory"
        except SandboxError as error:
            raise Outage(error.kind, str(error)) from error
        kind, count, present = archive_summary(archive, entry.source)
        if not present:
            return "failed", kind
        claimed.append(entry.destination)
        await self.store.save_artifact(attempt, turn.name, position, archive)
        return ("ok" if count else "empty"), kind

    async def _verify(self, index: int) -> bool:
        turn = self.plan.turns[index]
        record = self.status.turns[index]
        separate = turn.verifier.mode == "separate"
        if separate and index == len(self.plan.turns) - 1:
            # The agent's sandbox stops before the last turn's separate verifier starts
            # (after the stage is recorded, so a restart never collects from a new pod).
            await self._release_agent()
        if not separate:
            await self._network(turn.verifier.network)
        sandbox = await self._verifier_sandbox(index)
        # The grading folders are emptied in the same exec as the first upload, and the tests
        # travel in the exec that starts test.sh: a restarted runner re-attaching to test.sh
        # neither clears its reward files nor replaces its tests.
        clear: tuple[str, ...] = (f"{TESTS}/", f"{LOGS_VERIFIER}/")
        if record.stage == "verify-prepare":
            # A separate verifier gets the declared artifacts, at their original absolute paths.
            archives = await self.store.artifact_archives(self._attempt.number, turn.name) if separate else []
            try:
                for archive in archives:
                    await sandbox.upload(archive, "/", clear=clear)
                    clear = ()
            except (SandboxError, CommandFailed) as error:
                raise _outage(error, "clear-grading-files", f"cannot prepare verification: {error}") from error
            # Published once the artifacts' upload cleared the grading folders: a restart
            # must not clear them again under test.sh.
            await self._stage(record, "verify", publish=bool(archives))
        elif separate:
            clear = ()  # a separate verifier's published "verify": the artifacts' upload cleared them
        try:
            state = await self._job(
                sandbox,
                JobSpec(
                    id=self._job_id(index, "verify"),
                    command=f"bash {TESTS}/test.sh",
                    timeout_sec=turn.verifier.timeout_sec,
                    user=turn.verifier.user,
                    env=turn.verifier.env,
                    output=TEST_STDOUT,
                    read_after=(REWARD_JSON, REWARD_TXT),
                ),
                upload=Upload(mapped_tar(self.config.files, turn.tests), TESTS, clear),
            )
        except CommandFailed as error:
            raise _outage(error, "clear-grading-files", f"cannot prepare verification: {error}") from error
        await self._save_job_log(sandbox, turn.name, "verifier", state)
        if state.phase == "unstartable":
            record.phase = "Failed"
            record.failure_kind = FAILURE_VERIFIER
            record.message = f"test.sh cannot start: {state.reason}"
            raise _EpisodeEnds("Masked", FAILURE_VERIFIER, f"turn {turn.name}: test.sh cannot start: {state.reason}")
        files = state.files
        if files is None:  # a job that ended before this runner asked for its files
            try:
                files = await sandbox.read_files([REWARD_JSON, REWARD_TXT])
            except (SandboxError, CommandFailed) as error:
                raise _outage(error, "read-reward", f"cannot read the reward files: {error}") from error
        tampered = [
            path
            for path, content in files.items()
            if content.data is not None and _changed_after(content.modified, state.finished_at)
        ]
        if tampered:
            # Something kept writing after test.sh exited (e.g. a process the agent left in a
            # shared sandbox): the file is not the verifier's, so there is no valid reward.
            await self._finish_turn(
                index,
                TurnScore(valid=False),
                None,
                f"no valid reward file: {', '.join(tampered)} changed after test.sh exited",
            )
            if separate:
                await self._release_verifier(index)
            await self.sink.event(
                "RewardTampered",
                f"turn {turn.name}: {', '.join(tampered)} changed after test.sh exited; the turn counts 0",
                warning=True,
            )
            return True
        result = parse_reward_files(files[REWARD_JSON].data, files[REWARD_TXT].data)
        if result.rewards is None:
            timed_out = " (the verifier timed out)" if state.timed_out else ""
            await self._finish_turn(
                index, TurnScore(valid=False), None, f"no valid reward file{timed_out}: {result.error}"
            )
        else:
            miss = check_min_reward(turn.min_reward, result.rewards)
            await self._finish_turn(
                index, TurnScore(result.rewards), None, f"min_reward missed: {miss}" if miss else None
            )
        if separate:
            # Only once the reward is recorded: a restart before this re-attaches to the pod.
            await self._release_verifier(index)
        return self._stopped(index)

    async def _verifier_sandbox(self, index: int) -> Sandbox:
        turn = self.plan.turns[index]
        if turn.verifier.mode == "shared":
            return await self._agent()
        try:
            return await self.provider.verifier(self._attempt.number, index, turn.verifier)
        except SandboxError as error:
            raise Outage(error.kind, str(error)) from error

    async def _finish_turn(self, index: int, score: TurnScore, failure_kind: str | None, message: str | None) -> None:
        record = self.status.turns[index]
        record.reward = score.reward
        record.verifier_rewards = dict(score.rewards)
        record.reward_valid = score.valid
        record.failure_kind = failure_kind
        record.phase = "Succeeded" if score.valid and failure_kind is None else "Failed"
        if message:
            record.message = message
        record.finished_at = timestamp(self.clock())
        record.stage = "done"
        self.observer.turn_finished(
            "failed" if failure_kind else "graded" if score.valid else "measured_zero", failure_kind
        )
        self._progress()
        if self.plan.turns[index].verifier.mode == "separate":
            # Its verifier pod goes next: a restart must find the reward recorded. A shared
            # turn's is published with the next stage (a restart re-reads it from its job).
            await self._publish()
        reward = "no valid reward" if not score.valid else f"reward {score.reward}"
        await self.sink.event(
            "TurnFinished",
            f"turn {index + 1}/{len(self.plan.turns)} {record.name}: {reward}"
            + (f" ({failure_kind})" if failure_kind else ""),
            warning=not score.valid,
        )

    # Endings ---------------------------------------------------------------------------
    async def _finish_graded(self) -> None:
        ran = [record for record in self.status.turns if record.stage == "done"]
        scores = [TurnScore(record.verifier_rewards, bool(record.reward_valid)) for record in ran]
        score = roll_up(self.plan.reward_strategy, scores)
        modes = {
            self.plan.turns[i].verifier.mode for i, record in enumerate(self.status.turns) if record.stage == "done"
        }
        self.status.reward = score.reward
        self.status.verifier_rewards = score.verifier_rewards
        self.status.verifier_mode = modes.pop() if len(modes) == 1 else "mixed"
        failed = next((record.failure_kind for record in ran if record.failure_kind), None)
        self.status.failure_kind = failed
        await self._end("Graded", failed, f"reward {score.reward}")

    async def _end(self, outcome: Any, failure_kind: str | None, message: str) -> None:
        now = timestamp(self.clock())
        success = outcome == "Graded"
        self.status.phase = "Succeeded" if success else "Failed"
        self.status.outcome = outcome
        self.status.failure_kind = failure_kind
        self.status.message = message
        self.status.finished_at = now
        self._attempt.finished_at = self._attempt.finished_at or now
        for record in self.status.turns:
            if record.stage is None:
                record.phase = "Skipped"
        self._progress()
        self._condition("Running", "False", outcome, message)
        self._condition("Complete" if success else "Failed", "True", outcome, message)
        self.observer.episode_finished(outcome, failure_kind, self.status.reward)
        # The terminal status comes last: it ends the driver (the operator stops watching the
        # episode), and a restart before it is published only repeats this ending.
        await self._release_all(keep=self.config.keep_pods_on_failure and not success)
        await self.sink.event(
            "EpisodeFinished",
            f"{outcome}: {message}" + (f" ({failure_kind})" if failure_kind else ""),
            warning=not success,
        )
        await self._publish()

    async def _after_outage(self, outage: Outage) -> None:
        attempt = self._attempt
        attempt.reason = f"{outage.kind}: {outage}"
        self.observer.outage(outage.kind)
        attempt.finished_at = timestamp(self.clock())
        await self.sink.event("Outage", f"attempt {attempt.number}: {attempt.reason}", warning=True)
        self._agent_sandbox = None
        await self._release_all(keep=False)
        if attempt.number > self.config.outage_retries:
            failure = outage.kind if outage.kind.startswith("harbor:") else f"outage:{outage.kind}"
            await self._end("Ungraded", failure, f"{attempt.number} attempt(s) failed; last: {attempt.reason}")
            return
        delay = min(self.config.backoff_base_sec * 2 ** (attempt.number - 1), self.config.backoff_max_sec)
        await self._publish()
        await self.sleep(delay)
        number = attempt.number + 1
        self.status.attempts.append(AttemptStatus(number=number, started_at=timestamp(self.clock())))
        self.status.stopped_after_turn = None
        self._reset_turns(number)
        await self._publish()

    # Helpers ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _timed(self, phase: str) -> AsyncIterator[None]:
        started = self.monotonic()
        try:
            yield
        finally:
            self.observer.phase_finished(phase, self.monotonic() - started)

    async def _job(self, sandbox: Sandbox, spec: JobSpec, *, upload: Upload | None = None) -> JobState:
        """Run a supervised job to its end, re-attaching if it already exists.

        ``upload`` (the job's inputs) is placed by the exec that starts the job, not by one
        that re-attaches; its failure raises :class:`CommandFailed`. The final answer also
        carries the output's tail (for the kept logs) and any files the spec asks for, so a
        short job costs one exec.
        """
        self._check_deadline()
        if spec.tail == 0:
            spec = replace(spec, tail=self.config.log_limit)
        try:
            state = await sandbox.start_job(
                spec, wait_sec=min(spec.timeout_sec + KILL_AFTER_SEC, self.config.poll_interval_sec), upload=upload
            )
            while not state.done:
                if state.phase == "unknown":
                    raise Outage("lost-job", f"job {spec.id} vanished from the sandbox")
                state = await sandbox.wait_job(spec, max_wait_sec=self.config.poll_interval_sec)
        except SandboxError as error:
            raise Outage(error.kind, str(error)) from error
        self._check_deadline()
        return state

    def _check_deadline(self) -> None:
        """Between jobs, by the wall clock; ``asyncio.timeout`` in ``_run_attempt`` covers a hang."""
        deadline = self._attempt.deadline_at
        if deadline is not None and self.clock() > parse_timestamp(deadline):
            raise Outage(FAILURE_DEADLINE, f"past the episode deadline of {self.plan.deadline_sec:.0f} s")

    async def _save_job_log(
        self, sandbox: Sandbox, turn: str, name: str, state: JobState, *, container: str = MAIN_CONTAINER
    ) -> None:
        output = state.output
        if output is None:  # a job that ended before this runner asked for its tail
            try:
                output = await sandbox.job_output(state.id, container=container, limit=self.config.log_limit)
            except (SandboxError, CommandFailed):
                return  # logs are best effort; the outcome does not depend on them
        await self.store.save_log(self._attempt.number, turn, name, output)

    def _job_id(self, index: int, stage: str) -> str:
        return f"a{self._attempt.number}.t{index + 1}.{stage}"

    @staticmethod
    def _describe(state: JobState) -> str:
        if state.timed_out:
            return "ran out of its time bound"
        return f"exited with {state.exit_code}"

    async def _release_agent(self) -> None:
        self._agent_sandbox = None
        await self.provider.release_agent(self._attempt.number)

    async def _release_verifier(self, index: int) -> None:
        await self.provider.release_verifier(self._attempt.number, index)

    async def _release_all(self, *, keep: bool) -> None:
        self._agent_sandbox = None
        try:
            await self.provider.release_all(keep=keep)
        except SandboxError as error:
            await self.sink.event("CleanupFailed", f"could not remove sandboxes: {error}", warning=True)

    def _progress(self) -> None:
        done = sum(1 for record in self.status.turns if record.stage == "done")
        self.status.progress = f"{done}/{len(self.plan.turns)}"

    def _condition(self, kind: str, value: Literal["True", "False", "Unknown"], reason: str, message: str) -> None:
        now = timestamp(self.clock())
        for condition in self.status.conditions:
            if condition.type == kind:
                if condition.status != value:
                    condition.last_transition_time = now
                condition.status, condition.reason, condition.message = value, reason, message
                return
        self.status.conditions.append(
            Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=now)
        )

    async def _publish(self) -> None:
        await self.sink.publish(self.status)


_SUMMARY_FIELD = {"ok": "collected", "failed": "failed", "skipped": "skipped", "empty": "empty"}


def _overlaps(first: str, second: str) -> bool:
    """Two artifact destinations claim the same place (equal, or one inside the other)."""
    a = PurePosixPath(first.rstrip("/") or ".")
    b = PurePosixPath(second.rstrip("/") or ".")
    return a == b or a in b.parents or b in a.parents


def _changed_after(modified: float | None, finished: float | None) -> bool:
    """A file modified after a job's end (both by the container's clock; unknown times never count)."""
    return modified is not None and finished is not None and modified > finished


def _workdir_failure(error: CommandFailed) -> Exception:
    """A failed workdir/ merge is the task's; the grading cleanup it carried, or a start of
    setup.sh that failed in the supervisor, is an outage."""
    if error.step == "upload":
        return _PreparationFailed(FAILURE_WORKDIR, f"workdir/ cannot unpack: {error}")
    if error.step == "clear":
        return _grading_cleanup_outage(error)
    return Outage("run-command", f"setup.sh cannot start: {error}")


def _grading_cleanup_outage(error: CommandFailed) -> Outage:
    """The previous turn's tests or reward could not be removed: grading this turn would be unsafe."""
    return Outage("clear-grading-files", f"cannot clear the previous turn's grading files: {error}")


def _outage(error: SandboxError | CommandFailed, kind: str, message: str) -> Outage:
    """The outage for a failed sandbox step: the sandbox's own kind (pod lost…) when it has one."""
    if isinstance(error, SandboxError):
        return Outage(error.kind, message)
    return Outage(kind, message)
