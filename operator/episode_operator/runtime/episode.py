"""The episode runner: attempts, the seed and the turns (each driven by its table), the endings.

An attempt's seed is the sequence of ``runtime/seed.py`` and a turn the state machine of
``runtime/turn/table.py``; this module walks them, and owns what outlives a stage: the
sandboxes (a replayed image's settings over them, a waiting pod's condition), the job runner
and its deadline, the status and when it is written, Events and metrics, outages and
retries, the roll-up (docs/task-format.md §3.7) and the episode's end.

Failures keep Gym's classes apart (``runtime/turn/turn_failures.py``): a *measured* 0 ends the
episode with a reward; a *terminal* failure (preparation at step 1) ends it without one and
is not retried; a *masked* turn masks the episode; an *outage* (the sandbox failed under us)
restarts the episode in a fresh sandbox, up to a limit.

Crash safety: the status is the only state. Every command is a supervised job with a
deterministic id whose inputs travel in the exec that starts it, and the table says which
stages are written to the status before they run; so a runner started on the status a
crashed one left re-attaches to the running job, redoes only what is safe to redo, and never
runs a turn twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from episode_operator.api.episode_resource import (
    AgentSpec,
    AttemptStatus,
    EpisodeStatus,
    ImageStatus,
    PodRecord,
    PodRole,
    RetryPolicy,
    TaskStatus,
    TurnStatus,
)
from episode_operator.api.vocabulary import (
    AGENT_CAUSABLE_OUTAGES,
    DEFAULT_AGENT_OUTCOMES,
    FAILURE_BROKE_SANDBOX,
    FAILURE_DEADLINE,
    FAILURE_OUTPUT_LIMIT,
    FAILURE_VERIFIER,
    PODS_READY,
    AgentFailure,
    AgentOutcome,
    ConditionStatus,
    Outcome,
    SeedStage,
    Stage,
    is_terminal,
    outage_failure_kind,
    parse_timestamp,
    set_condition,
    timestamp,
)
from episode_operator.runtime.episode_store import SEED_LOGS, EpisodeStore
from episode_operator.runtime.limits import OutputLimitExceeded, OutputLimits
from episode_operator.runtime.replay_runner import (
    ReplayConfig,
    ReplayedSandbox,
    ReplayReady,
    ReplaySource,
    entrypoint_job,
    replayed_image,
)
from episode_operator.runtime.sandbox_images import ImageBuilder, ImagePlan, SandboxImage
from episode_operator.runtime.sandbox_protocol import (
    MAIN_CONTAINER,
    CommandFailed,
    JobSpec,
    JobState,
    KeyedSandbox,
    Sandbox,
    SandboxError,
    SandboxProvider,
    Upload,
    Waiting,
)
from episode_operator.runtime.seed import (
    SEED,
    ReplayProblem,
    build_images,
    replay_in,
    seed_passed,
    seed_resumes_at,
    seed_work,
)
from episode_operator.runtime.timing import DEFAULT_TIMING, KILL_AFTER_SEC, Timing
from episode_operator.runtime.turn.context import TurnRun
from episode_operator.runtime.turn.prepare import prepares_nothing
from episode_operator.runtime.turn.table import TURN, Network, is_published, restart_at
from episode_operator.runtime.turn.turn_failures import (
    Call,
    EpisodeEnds,
    Outage,
    PreparationFailed,
    TurnFailed,
    check_started,
    output_limit,
    sandbox_call,
    sandbox_lost,
)
from episode_operator.runtime.turn.verify import record_score, stops_episode
from episode_operator.taskfolder import EpisodePlan, TaskFiles
from episode_operator.taskfolder.healthcheck import poll_healthcheck
from episode_operator.taskfolder.plan import NetworkPolicy, baseline_policy
from episode_operator.taskfolder.rewards import TurnScore, roll_up
from episode_operator.taskfolder.task_toml import EnvironmentConfig, Healthcheck

# Past a job's own bound the supervisor kills it; this margin only covers the kill itself.
# An episode whose config names no images runs a prebuilt image in every sandbox.
PREBUILT = ImagePlan(SandboxImage("", "prebuilt"), ())
# A condition reason is CamelCase letters, digits, '_', ',' and ':' (metav1.Condition).
CONDITION_REASON_CHARS = re.compile(r"[^A-Za-z0-9_,:]")


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
    # spec.retries: how many fresh attempts outages get, and whether an agent-causable outage after an
    # agent acted is retried (Gym) or scored a measured 0 (RL).
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    keep_pods_on_failure: bool = False
    timing: Timing = DEFAULT_TIMING
    # What a sandbox's answers and a turn's artifacts may hold (runtime/limits.py); the log tail among them.
    limits: OutputLimits = field(default_factory=OutputLimits)
    generation: int | None = None
    # How each sandbox's image is made (runtime/sandbox_images.py); None: prebuilt images only.
    images: ImagePlan | None = None
    # spec.agent.env/envFrom as read by the operator: the agent's own jobs get them, nothing else.
    agent_env: Mapping[str, str] = field(default_factory=dict)
    # spec.harbor.agentOutcomePolicy: what each agent failure does (retry, fail, measure).
    agent_outcomes: Mapping[AgentFailure, AgentOutcome] = field(default_factory=lambda: dict(DEFAULT_AGENT_OUTCOMES))


class EpisodeRunner:
    """Runs one Episode from whatever status it is in to a terminal phase.

    It implements :class:`~episode_operator.runtime.turn.context.TurnServices` for the steps.
    """

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
        builder: ImageBuilder | None = None,
        job_keys: Callable[[], str] = lambda: secrets.token_hex(16),
    ) -> None:
        self.config = config
        self._builder = builder
        self.plan = config.plan
        self.provider = provider
        self.sink = sink
        self._store = store
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.observer: EpisodeObserver = observer or _Unobserved()
        self._job_keys = job_keys
        self._baseline = baseline_policy(self.plan.environment)
        self.status = EpisodeStatus()
        self._agent_sandbox: Sandbox | None = None
        self._agent_replay: ReplayReady | None = None
        # Built images' tags → the same images by the manifest digest their builds pushed (the images stage).
        self._pins: dict[str, str] = {}
        self._verifier_sandboxes: dict[int, Sandbox] = {}
        # Healthcheck attempts of this runner never collide with a crashed runner's.
        self._incarnation = f"{int(clock() * 1000) % 10**9:x}"

    # Entry point -----------------------------------------------------------------------
    async def run(self, status: EpisodeStatus | None) -> EpisodeStatus:
        """Run to ``Succeeded`` or ``Failed`` from ``status`` (None or empty: the start)."""
        self.status = (status or EpisodeStatus()).model_copy(deep=True)
        if is_terminal(self.status.phase):
            return self.status
        if self.status.outcome is not None:
            # Written by a runner that was ending the episode and stopped while it released the
            # sandboxes: the ending is repeated as recorded, never the turns in pods it deleted.
            await self._end(self.status.outcome, self.status.failure_kind, self.status.message or "")
            return self.status
        if self.status.phase in (None, "Pending") or not self.status.attempts:
            self._begin()
            await self.publish()
        elif self._attempt.finished_at is not None and self._attempt.reason is not None:
            # Written by a runner that ended an attempt in an outage and stopped before it wrote the next one.
            await self._next_attempt(0.0)
        while not is_terminal(self.status.phase):
            try:
                await self._run_attempt()
            except Outage as outage:
                if self._agent_broke_the_sandbox(outage):
                    await self._score_outage(outage)
                else:
                    await self._after_outage(outage)
            except EpisodeEnds as ending:
                await self._end(ending.outcome, ending.failure_kind, str(ending))
            except OutputLimitExceeded as error:
                # Outside a turn (the seed: the agent's setup has run in its sandbox), as a failed setup.
                await self._end("Ungraded", FAILURE_OUTPUT_LIMIT, f"refused what the sandbox sent: {error}")
        return self.status

    def _begin(self) -> None:
        now = self.clock()
        self.status.phase = "Running"
        self.status.started_at = self.status.started_at or timestamp(now)
        self.status.task = TaskStatus(digest=self.config.digest, steps=len(self.plan.turns), name=self.config.task_name)
        self.status.attempts = [AttemptStatus(number=1, started_at=timestamp(now), job_key=self._job_keys())]
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
        if attempt.started_at is None:
            # The back-off after an outage, its end written before it began: a restart waits out the rest.
            assert attempt.not_before is not None
            await self.sleep(max(parse_timestamp(attempt.not_before) - self.clock(), 0.0))
            attempt.started_at = timestamp(self.clock())
        if attempt.ready_at is not None and self.images.builds() and not self._pins:
            # A restarted runner past the seed: the builds' digests, read back from their Jobs, before any
            # pod (a later separate verifier's) is made; the tags are never what a pod names.
            await build_images(self)
        if attempt.ready_at is None:
            await self._seed()
            ready = self.clock()
            attempt.ready_at = timestamp(ready)
            attempt.deadline_at = timestamp(math.ceil(ready + self.plan.deadline_sec))
            # Not written on its own: the next write (a turn's first published stage, a regrade's
            # separate verify-prepare, the ending) comes before anything runs in a pod, and a restart
            # before it finds the seed unfinished, as it would before a write here (the seed resumes
            # safely). One status write fewer between a sandbox and the agent's first command.
        assert attempt.deadline_at is not None
        remaining = parse_timestamp(attempt.deadline_at) - self.clock()
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                await self._run_turns()
        except TimeoutError:
            raise self._past_deadline() from None

    async def _seed(self) -> None:
        """The seed table (``runtime/seed.py``), walked from where the attempt's status says it was."""
        attempt = self._attempt
        work = seed_work(self)
        stage: SeedStage | None = seed_resumes_at(attempt.seed_stage, work)
        while stage is not None:
            row = SEED[stage]
            attempt.seed_stage = stage
            if work.publishes(row.published):
                await self.publish()
            async with self.timed(f"seed-{stage}"):
                await row.step(self)
            stage = row.next

    async def _run_turns(self) -> None:
        for index in range(self.status.current_turn or 0, len(self.plan.turns)):
            self.status.current_turn = index
            if await self._run_turn(TurnRun(self, index)):
                if index < len(self.plan.turns) - 1:
                    self.status.stopped_after_turn = self.plan.turns[index].name
                break
        await self._finish_graded()

    # One turn: the stage table, walked -----------------------------------------------------
    async def _run_turn(self, turn: TurnRun) -> bool:
        """Run ``turn`` from its recorded stage through ``done``; whether the episode stops after it."""
        try:
            return await self._walk_turn(turn)
        finally:
            if turn.agent_archive is not None:  # brought by the agent's answer, never collected
                turn.agent_archive.discard()

    async def _walk_turn(self, turn: TurnRun) -> bool:
        record = turn.record
        if record.stage is None:
            record.phase = "Running"
            record.started_at = timestamp(self.clock())
            record.verifier_mode = turn.plan.verifier.mode
            await self._enter(turn, self._first_stage(turn), publish=not self._quiet_start(turn))
            await self.event("TurnStarted", f"turn {turn.label()} started")
        else:
            # A restart: the table says where.
            record.stage = restart_at(record.stage, turn.separate)
        while True:
            assert record.stage is not None
            row = TURN[record.stage]
            await self._network_for(turn, row.network)
            following: Stage | None = row.next
            try:
                async with self.timed(record.stage):
                    await row.step(turn)
            except PreparationFailed as failure:
                if turn.first:
                    # No agent has acted yet: a terminal failure, no reward, no retry (Gym).
                    record.phase = "Failed"
                    record.failure_kind = failure.failure_kind
                    record.message = str(failure)
                    raise EpisodeEnds("TerminalFailure", failure.failure_kind, f"turn {turn.name}: {failure}") from None
                # From step 2 on it is a measured 0 that ends the episode.
                await record_score(turn, TurnScore(valid=False), failure.failure_kind, str(failure))
                following = Stage.DONE
            except (TurnFailed, OutputLimitExceeded) as error:
                failed = error if isinstance(error, TurnFailed) else output_limit(error)
                await record_score(turn, TurnScore(valid=False), failed.failure_kind, str(failed))
                following = Stage.DONE
            if following is None:
                return stops_episode(record)
            await self._enter(turn, following)

    def _first_stage(self, turn: TurnRun) -> Stage:
        """Where a turn starts: its cleanup (a regrade's turn starts at its verifier: runtime/regrade.py)."""
        return Stage.CLEANUP

    def _quiet_start(self, turn: TurnRun) -> bool:
        """Whether an attempt's first turn runs nothing in the sandbox before its agent's stage, which
        is published: its start then rides on that write (one status write fewer before the agent's
        first command). Only the first turn: the status before it holds no earlier turn of the attempt
        whose end (a shared turn's ``done``) waits for this turn's first write."""
        return turn.first and self._first_stage(turn) is Stage.CLEANUP and prepares_nothing(turn)

    async def _enter(self, turn: TurnRun, stage: Stage, *, publish: bool = True) -> None:
        """Record ``stage`` as the turn's, written to the status when the table says so (and the
        caller does not defer it to the next stage's write)."""
        turn.record.stage = stage
        self._progress()
        if publish and is_published(stage, turn.separate):
            await self.publish()

    async def _network_for(self, turn: TurnRun, network: Network) -> None:
        policy: NetworkPolicy | None = {
            Network.UNCHANGED: None,
            Network.BASELINE: self._baseline,
            Network.AGENT: turn.plan.agent.network,
            Network.VERIFIER: None if turn.separate else turn.plan.verifier.network,
        }[network]
        if policy is not None:
            await self.set_network(policy)

    # Endings ---------------------------------------------------------------------------
    async def _finish_graded(self) -> None:
        ran = [record for record in self.status.turns if record.stage == Stage.DONE]
        scores = [TurnScore(record.verifier_rewards, bool(record.reward_valid)) for record in ran]
        score = roll_up(self.plan.reward_strategy, scores)
        modes = {record.verifier_mode for record in ran}
        self.status.reward = score.reward
        self.status.verifier_rewards = score.verifier_rewards
        self.status.verifier_mode = modes.pop() if len(modes) == 1 else "mixed"
        failed = next((record.failure_kind for record in ran if record.failure_kind), None)
        await self._end("Graded", failed, f"reward {score.reward}")

    async def _end(self, outcome: Outcome, failure_kind: str | None, message: str) -> None:
        now = timestamp(self.clock())
        success = outcome == "Graded"
        self.status.outcome = outcome
        self.status.failure_kind = failure_kind
        self.status.message = message
        self._attempt.finished_at = self._attempt.finished_at or now
        for record in self.status.turns:
            if record.stage is None:
                record.phase = "Skipped"
        self._progress()
        # The ending, written before the sandboxes go (a shared turn's reward is in no status yet):
        # a restart from here on repeats this ending (see run) and never meets the deleted pods.
        await self.publish()
        self.status.phase = "Succeeded" if success else "Failed"
        self.status.finished_at = now
        self._condition("Running", "False", outcome, message)
        self._condition("Complete" if success else "Failed", "True", outcome, message)
        self.observer.episode_finished(outcome, failure_kind, self.status.reward)
        # The terminal status comes last: it ends the driver (the operator stops watching the
        # episode), and a restart before it is published only repeats this ending.
        await self._release_all(keep=self.config.keep_pods_on_failure and not success)
        await self.event(
            "EpisodeFinished",
            f"{outcome}: {message}" + (f" ({failure_kind})" if failure_kind else ""),
            warning=not success,
        )
        await self.publish()

    async def _after_outage(self, outage: Outage) -> None:
        attempt = self._attempt
        attempt.reason = f"{outage.kind}: {outage}"
        self.observer.outage(outage.kind)
        attempt.finished_at = timestamp(self.clock())
        await self.event("Outage", f"attempt {attempt.number}: {attempt.reason}", warning=True)
        await self._release_all(keep=False)
        if attempt.number > self.config.retries.outages:
            await self._end(
                "Ungraded",
                outage_failure_kind(outage.kind),
                f"{attempt.number} attempt(s) failed; last: {attempt.reason}",
            )
            return
        await self._next_attempt(self.config.timing.backoff_sec(attempt.number))

    def _agent_broke_the_sandbox(self, outage: Outage) -> bool:
        """Whether ``outage`` is scored, not retried: spec.retries.agentOutages says score, the kind is one
        an agent can cause, and an agent acted in the attempt (a turn reached its agent stage)."""
        if self.config.retries.agent_outages != "score" or outage.kind not in AGENT_CAUSABLE_OUTAGES:
            return False
        order = list(TURN)
        return any(
            record.stage is not None and order.index(record.stage) >= order.index(Stage.AGENT)
            for record in self.status.turns
        )

    async def _score_outage(self, outage: Outage) -> None:
        """The turn the outage stopped counts a measured 0 and the episode ends there, graded."""
        index = self.status.current_turn or 0
        turn = TurnRun(self, index)
        self._attempt.reason = f"{outage.kind}: {outage}"
        self.observer.outage(outage.kind)
        await self.event("Outage", f"attempt {self._attempt.number}: {self._attempt.reason}; scored", warning=True)
        await record_score(
            turn, TurnScore(valid=False), FAILURE_BROKE_SANDBOX, f"the sandbox broke after an agent acted: {outage}"
        )
        turn.record.stage = Stage.DONE
        if not turn.last:
            self.status.stopped_after_turn = turn.name
        await self._finish_graded()

    async def _next_attempt(self, delay: float) -> None:
        """Write the next attempt, to start ``delay`` seconds from now, before waiting for it: a
        runner that dies in the back-off leaves a status whose lost attempt is over for good."""
        number = self._attempt.number + 1
        not_before = timestamp(math.ceil(self.clock() + delay))
        self.status.attempts.append(AttemptStatus(number=number, not_before=not_before, job_key=self._job_keys()))
        self.status.stopped_after_turn = None
        self._reset_turns(number)
        await self.publish()

    def _past_deadline(self) -> Outage:
        return Outage(FAILURE_DEADLINE, f"past the episode deadline of {self.plan.deadline_sec:.0f} s")

    def _progress(self) -> None:
        done = sum(1 for record in self.status.turns if record.stage == Stage.DONE)
        self.status.progress = f"{done}/{len(self.plan.turns)}"

    def _condition(self, kind: str, value: ConditionStatus, reason: str, message: str) -> None:
        set_condition(
            self.status.conditions,
            kind,
            value,
            reason,
            message,
            now=timestamp(self.clock()),
            generation=self.config.generation,
        )

    async def _release_all(self, *, keep: bool) -> None:
        self._forget_sandboxes()
        try:
            await self.provider.release_all(keep=keep)
        except SandboxError as error:
            await self.event("CleanupFailed", f"could not remove sandboxes: {error}", warning=True)

    # TurnServices: what the steps use ---------------------------------------------------------
    @property
    def files(self) -> TaskFiles:
        return self.config.files

    @property
    def agent_spec(self) -> AgentSpec:
        return self.config.agent

    @property
    def agent_env(self) -> Mapping[str, str]:
        return self.config.agent_env

    @property
    def agent_outcomes(self) -> Mapping[AgentFailure, AgentOutcome]:
        return self.config.agent_outcomes

    @property
    def attempt_number(self) -> int:
        return self._attempt.number

    @property
    def store(self) -> EpisodeStore:
        return self._store

    @property
    def limits(self) -> OutputLimits:
        return self.config.limits

    def now(self) -> float:
        return self.clock()

    def _forget_sandboxes(self) -> None:
        self._agent_sandbox = None
        self._agent_replay = None
        self._verifier_sandboxes.clear()

    async def agent_sandbox(self) -> Sandbox:
        if self._agent_sandbox is None:
            recorded = self._pod_record("agent", None)
            try:
                async with self.timed("pod_start"):
                    sandbox = await self.provider.agent(
                        self._attempt.number, waiting=self.pod_waiting, uid=recorded.uid if recorded else None
                    )
            except SandboxError as error:
                raise sandbox_lost(error) from error
            changed = self._record_pod(recorded, "agent", None, sandbox)
            if self.status.pod_name != sandbox.name:
                self.status.pod_name = sandbox.name
                changed = True
            image = self._image_status()
            if self.status.image != image:
                self.status.image = image
                changed = True
            if changed:
                # Before any job runs in it: a restart then knows this pod, and never uses another in its place.
                await self.publish()
            self._agent_sandbox = self._keyed(sandbox)
            attempt = self._attempt
            source = self.images.agent.replay
            if source is not None and (
                attempt.ready_at is not None or seed_passed(attempt.seed_stage, SeedStage.REPLAY)
            ):
                # A restarted runner: the replay is done, its settings are read back from the pod.
                self.replayed(await self._recall_replay(self._agent_sandbox, source))
        return self._agent_sandbox

    def _image_status(self) -> ImageStatus | None:
        """Which image the agent sandbox started from and why (None: an episode of prebuilt images the
        runner was given no plan of)."""
        if self.config.images is None:
            return None
        agent = self.images.agent
        ref = self._pins.get(agent.image, agent.image)
        return ImageStatus(ref=ref, made=agent.made, message=f"{agent.origin}: {agent.why}" if agent.why else None)

    def _keyed(self, sandbox: Sandbox) -> Sandbox:
        key = self._attempt.job_key
        return KeyedSandbox(sandbox, key) if key else sandbox  # no key: an attempt begun before keys

    def _pod_record(self, role: PodRole, turn: int | None) -> PodRecord | None:
        return next((pod for pod in self._attempt.pods if pod.role == role and pod.turn == turn), None)

    def _record_pod(self, recorded: PodRecord | None, role: PodRole, turn: int | None, sandbox: Sandbox) -> bool:
        """Record the attempt's pod as first seen running; whether the status changed."""
        if recorded is not None or not sandbox.uid:
            return False
        self._attempt.pods.append(PodRecord(role=role, turn=turn, name=sandbox.name, uid=sandbox.uid))
        return True

    async def _recall_replay(self, sandbox: Sandbox, source: ReplaySource) -> ReplayReady:
        config = self.replay_config(
            turn=SEED_LOGS, log_name="replay", budget_sec=self.plan.environment.build_timeout_sec
        )
        try:
            with sandbox_call(Call.REPLAY):
                outcome = await replayed_image(sandbox, self.files, source, self.plan.environment, config)
        except SandboxError as error:
            raise sandbox_lost(error) from error
        if not isinstance(outcome, ReplayReady):
            raise Outage("pod_lost", f"the replayed sandbox {sandbox.name} cannot be read back: {outcome}")
        return outcome

    async def verifier_sandbox(self, index: int) -> Sandbox:
        if index in self._verifier_sandboxes:
            return self._verifier_sandboxes[index]
        plan = self.plan.turns[index].verifier
        recorded = self._pod_record("verifier", index + 1)
        try:
            sandbox = await self.provider.verifier(
                self._attempt.number, index, plan, waiting=self.pod_waiting, uid=recorded.uid if recorded else None
            )
        except SandboxError as error:
            raise sandbox_lost(error) from error
        if self._record_pod(recorded, "verifier", index + 1, sandbox):
            await self.publish()
        sandbox = self._keyed(sandbox)
        image = self.images.verifier(index)
        if image is not None and image.replay is not None:
            assert plan.environment is not None
            sandbox = await self._replay_verifier(sandbox, index, image.replay, plan.environment)
        self._verifier_sandboxes[index] = sandbox
        return sandbox

    async def _replay_verifier(
        self, sandbox: Sandbox, index: int, source: ReplaySource, environment: EnvironmentConfig
    ) -> Sandbox:
        """A separate verifier's environment from its Dockerfile, as the seed makes the agent's (idempotent)."""
        turn = self.plan.turns[index]
        outcome = await replay_in(self, sandbox, source, environment, turn=turn.name, log_name="verifier-replay")
        if isinstance(outcome, ReplayProblem):
            # The verifier's environment cannot be made: Gym masks a verifier that cannot start.
            message = f"turn {turn.name}: the verifier's environment: {outcome.message}"
            raise EpisodeEnds("Masked", FAILURE_VERIFIER, message)
        config = self.replay_config(
            turn=turn.name, log_name="verifier-replay", budget_sec=environment.build_timeout_sec
        )
        start = entrypoint_job(outcome, config)
        if start is not None:
            with sandbox_call(Call.START_ENTRYPOINT):
                state = await sandbox.start_job(start, wait_sec=1.0)
            if state.phase == "unstartable":
                message = f"turn {turn.name}: the verifier's ENTRYPOINT could not start ({state.reason})"
                raise EpisodeEnds("Masked", FAILURE_VERIFIER, message)
        return ReplayedSandbox(sandbox, outcome.settings)

    async def release_agent(self) -> None:
        self._agent_sandbox = None
        try:
            await self.provider.release_agent(self._attempt.number)
        except SandboxError as error:
            raise sandbox_lost(error) from error

    async def release_verifier(self, index: int) -> None:
        self._verifier_sandboxes.pop(index, None)
        try:
            await self.provider.release_verifier(self._attempt.number, index)
        except SandboxError as error:
            raise sandbox_lost(error) from error

    async def run_job(self, sandbox: Sandbox, spec: JobSpec, *, upload: Upload | None = None) -> JobState:
        """Run a supervised job to its end, re-attaching if it already exists.

        ``upload`` (the job's inputs) is placed by the exec that starts the job, not by one
        that re-attaches; its failure raises :class:`CommandFailed`. The final answer also
        carries the output's tail (for the kept logs) and any files the spec asks for, so a
        short job costs one exec.
        """
        self._check_deadline()
        if spec.tail == 0:
            spec = replace(spec, tail=self.config.limits.log_bytes)
        try:
            first_wait = min(spec.timeout_sec + KILL_AFTER_SEC, self.config.timing.poll_interval_sec)
            state = await sandbox.start_job(spec, wait_sec=first_wait, upload=upload)
            while not state.done:
                if state.phase == "unknown":
                    raise Outage("lost_job", f"job {spec.id} vanished from the sandbox")
                state = await sandbox.wait_job(spec, max_wait_sec=self.config.timing.poll_interval_sec)
        except SandboxError as error:
            raise sandbox_lost(error) from error
        self._check_deadline()
        return state

    def _check_deadline(self) -> None:
        """Between jobs, by the wall clock; ``asyncio.timeout`` in ``_run_attempt`` covers a hang."""
        deadline = self._attempt.deadline_at
        if deadline is not None and self.clock() > parse_timestamp(deadline):
            raise self._past_deadline()

    async def save_job_log(
        self, sandbox: Sandbox, turn: str, name: str, state: JobState, *, container: str = MAIN_CONTAINER
    ) -> None:
        output = state.output
        if output is None:  # a job that ended before this runner asked for its tail
            try:
                output = await sandbox.job_output(state.id, container=container, limit=self.config.limits.log_bytes)
            except (SandboxError, CommandFailed):
                return  # logs are best effort; the outcome does not depend on them
        await self._store.save_log(self._attempt.number, turn, name, output)

    async def healthcheck(self, sandbox: Sandbox, check: Healthcheck, prefix: str, user: str | int | None) -> bool:
        attempts = 0

        async def attempt(timeout: float) -> bool:
            nonlocal attempts
            attempts += 1
            state = await self.run_job(
                sandbox,
                JobSpec(
                    id=f"{prefix}.{self._incarnation}.{attempts}", command=check.command, timeout_sec=timeout, user=user
                ),
            )
            check_started(Call.RUN_HEALTHCHECK, state)
            return state.succeeded

        return await poll_healthcheck(check, attempt, self.monotonic, self.sleep)

    async def set_network(self, policy: NetworkPolicy) -> None:
        try:
            await self.provider.apply_network(self._attempt.number, policy)
        except SandboxError as error:
            raise sandbox_lost(error) from error

    async def publish(self) -> None:
        await self.sink.publish(self.status)

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        await self.sink.event(reason, message, warning=warning)

    @contextlib.asynccontextmanager
    async def timed(self, phase: str) -> AsyncIterator[None]:
        started = self.monotonic()
        try:
            yield
        finally:
            self.observer.phase_finished(phase, self.monotonic() - started)

    def turn_finished(self, result: str, failure_kind: str | None) -> None:
        self.observer.turn_finished(result, failure_kind)

    # SeedServices: what the seed's steps use besides ---------------------------------------------
    @property
    def images(self) -> ImagePlan:
        return self.config.images or PREBUILT

    @property
    def builder(self) -> ImageBuilder | None:
        return self._builder

    @property
    def agent_replay(self) -> ReplayReady | None:
        return self._agent_replay

    def replay_config(self, *, turn: str, log_name: str, budget_sec: float) -> ReplayConfig:
        return ReplayConfig(
            attempt=self._attempt.number,
            budget_sec=budget_sec,
            turn=turn,
            log_name=log_name,
            poll_interval_sec=self.config.timing.poll_interval_sec,
        )

    def pin(self, image: str, pinned: str) -> None:
        self._pins[image] = pinned
        self.provider.pin_images(self._pins)

    def replayed(self, ready: ReplayReady) -> None:
        assert self._agent_sandbox is not None
        self._agent_replay = ready
        inner = self._agent_sandbox.inner if isinstance(self._agent_sandbox, ReplayedSandbox) else self._agent_sandbox
        self._agent_sandbox = ReplayedSandbox(inner, ready.settings)

    async def pod_waiting(self, report: Waiting | None) -> None:
        """The ``PodsReady`` condition says why a pod the episode needs waits; one Event per pod and reason.

        The condition is the record: a restarted runner told the same again neither writes the
        status nor repeats the Event.
        """
        current = next((c for c in self.status.conditions if c.type == PODS_READY), None)
        waiting = current is not None and current.status == "False"
        if report is None:
            if waiting:
                assert current is not None
                pod = current.message.split(":", 1)[0]
                self._condition(PODS_READY, "True", "PodsRunning", f"{pod} runs")
                self.status.message = None
                await self.publish()
            return
        reason = CONDITION_REASON_CHARS.sub("", report.reason) or "Waiting"
        subject = f"{report.role} pod {report.pod}"
        message = f"{subject}: {report.message}"
        if waiting and current is not None and (current.reason, current.message) == (reason, message):
            return
        repeated = waiting and current is not None and current.reason == reason and current.message.startswith(subject)
        self._condition(PODS_READY, "False", reason, message)
        self.status.message = f"waiting: {message}"
        await self.publish()
        if not repeated:
            await self.event("PodWaiting", f"{message} ({reason})", warning=True)
