"""What a stage's step sees: the turn it works on, and the runner's services it may use.

A step is a function of a :class:`TurnRun`. Everything that outlives one turn — the sandboxes,
the job runner with its deadline, the status and its publication, the store, Events — is the
runner's (:class:`TurnServices`, implemented by ``runtime/episode.py``), so a step holds no
state of its own and can be re-run from the status alone after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from episode_operator.api.episode_resource import AgentSpec, EpisodeStatus, TurnStatus
from episode_operator.api.vocabulary import AgentFailure, AgentOutcome, Stage
from episode_operator.runtime.episode_store import EpisodeStore
from episode_operator.runtime.limits import OutputLimits
from episode_operator.runtime.sandbox_protocol import (
    MAIN_CONTAINER,
    ArchiveFile,
    JobSpec,
    JobState,
    Sandbox,
    Upload,
    keyed_job_id,
)
from episode_operator.taskfolder import EpisodePlan, TaskFiles, TurnPlan
from episode_operator.taskfolder.plan import CONVENTION_ARTIFACTS, NetworkPolicy
from episode_operator.taskfolder.rewards import REWARD_JSON_NAME, REWARD_TXT_NAME
from episode_operator.taskfolder.task_toml import Healthcheck

# Fixed paths in the sandbox (docs/task-format.md §1.4).
LOGS_AGENT = "/logs/agent"
LOGS_VERIFIER = "/logs/verifier"
# Where the verifier writes them in the sandbox (their names and how they are read: taskfolder/rewards.py).
REWARD_JSON_PATH = f"{LOGS_VERIFIER}/{REWARD_JSON_NAME}"
REWARD_TXT_PATH = f"{LOGS_VERIFIER}/{REWARD_TXT_NAME}"
TEST_STDOUT = f"{LOGS_VERIFIER}/test-stdout.txt"
TESTS = "/tests"
SOLUTION = "/solution"
TRAJECTORY = f"{LOGS_AGENT}/trajectory.json"
# The folders Harbor gives every environment before its agent starts (mounted from the host there):
# a task's solution may look for them (a solve.sh telling a shared verifier by its /logs/verifier).
SANDBOX_LAYOUT = (LOGS_AGENT, LOGS_VERIFIER, CONVENTION_ARTIFACTS)
# What Gym empties after a turn verified in the agent's sandbox.
GRADING_FILES = (f"{TESTS}/", f"{LOGS_VERIFIER}/", TRAJECTORY)
# Where the instructions of agents that read them from a file are placed.
INSTRUCTIONS = "/episode-operator/instructions"


def turn_job_id(attempt: int, turn_index: int, stage: Stage | str) -> str:
    """The id of the job of ``stage`` in turn ``turn_index`` (from 0) of attempt ``attempt``, before
    the attempt's key is applied (``runtime/sandbox_protocol.py`` :func:`keyed_job_id`)."""
    return f"a{attempt}.t{turn_index + 1}.{stage}"


# The name the agent job's output is kept under, per turn (``kubectl episode logs``).
AGENT_LOG = "agent"


@dataclass(frozen=True)
class RunningAgent:
    """The agent job a turn runs now: its pod, its keyed job id, and where its output is kept
    (the turn's name and number, the attempt)."""

    pod: str
    job_id: str
    turn: str
    turn_number: int
    attempt: int


def running_agent_job(status: EpisodeStatus) -> RunningAgent | None:
    """The agent the Episode's current turn runs now, else None (not running, between stages, or
    its pod not recorded yet): what ``kubectl episode logs -f`` follows."""
    if status.phase != "Running" or status.current_turn is None or status.current_turn >= len(status.turns):
        return None
    turn = status.turns[status.current_turn]
    if turn.stage != Stage.AGENT:
        return None
    attempt = next((each for each in status.attempts if each.number == status.attempt), None)
    pod = next((pod.name for pod in attempt.pods if pod.role == "agent"), None) if attempt else None
    if attempt is None or pod is None or not attempt.job_key:
        return None
    job_id = keyed_job_id(attempt.job_key, turn_job_id(attempt.number, status.current_turn, Stage.AGENT))
    return RunningAgent(pod, job_id, turn.name, status.current_turn + 1, attempt.number)


class TurnServices(Protocol):
    """What the runner offers the steps of a turn (the runner keeps all state across turns)."""

    plan: EpisodePlan
    status: EpisodeStatus

    @property
    def files(self) -> TaskFiles: ...

    @property
    def agent_spec(self) -> AgentSpec: ...

    @property
    def agent_env(self) -> Mapping[str, str]:
        """``spec.agent.env``/``envFrom`` as read by the operator: for the agent's own jobs only."""
        ...

    @property
    def agent_outcomes(self) -> Mapping[AgentFailure, AgentOutcome]:
        """``spec.harbor.agentOutcomePolicy``: what each agent failure does to the episode."""
        ...

    @property
    def attempt_number(self) -> int: ...

    @property
    def store(self) -> EpisodeStore: ...

    @property
    def limits(self) -> OutputLimits:
        """What a sandbox's answers and a turn's artifacts may hold (runtime/limits.py)."""
        ...

    def now(self) -> float: ...

    async def agent_sandbox(self) -> Sandbox:
        """The attempt's agent sandbox, started if needed."""
        ...

    async def verifier_sandbox(self, index: int) -> Sandbox:
        """Turn ``index``'s fresh verifier sandbox (separate verification), started if needed."""
        ...

    async def release_agent(self) -> None: ...

    async def release_verifier(self, index: int) -> None: ...

    async def run_job(self, sandbox: Sandbox, spec: JobSpec, *, upload: Upload | None = None) -> JobState:
        """Run a supervised job to its end, re-attaching if it exists; a lost sandbox is an outage.

        ``upload`` (the job's inputs) is placed only by the exec that starts the job; its
        failure raises :class:`~episode_operator.runtime.sandbox_protocol.CommandFailed`.
        """
        ...

    async def save_job_log(
        self, sandbox: Sandbox, turn: str, name: str, state: JobState, *, container: str = MAIN_CONTAINER
    ) -> None: ...

    async def healthcheck(self, sandbox: Sandbox, check: Healthcheck, prefix: str, user: str | int | None) -> bool:
        """Poll ``check`` as ``user`` (docs/task-format.md §3.4.3); whether it passed."""
        ...

    async def set_network(self, policy: NetworkPolicy) -> None:
        """Put the agent pod under ``policy`` for the phase about to run."""
        ...

    async def publish(self) -> None: ...

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None: ...

    def timed(self, phase: str) -> AbstractAsyncContextManager[None]:
        """Time a phase for the observer (metrics)."""
        ...

    def turn_finished(self, result: str, failure_kind: str | None) -> None:
        """Tell the observer a turn finished (``graded``, ``measured_zero`` or ``failed``)."""
        ...


@dataclass
class TurnRun:
    """One turn of the current attempt, as its steps see it."""

    services: TurnServices
    index: int
    # The tar of the agent's artifacts its job's final answer brought (collect.carried_artifact),
    # as the agent's pod sent it; None: collect downloads them. Collect re-packs and discards it
    # (the runner does if the turn ends first). Not kept: a restart re-attaches to the agent's
    # job, whose answer brings it again.
    agent_archive: ArchiveFile | None = None

    @property
    def plan(self) -> TurnPlan:
        return self.services.plan.turns[self.index]

    @property
    def record(self) -> TurnStatus:
        return self.services.status.turns[self.index]

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == len(self.services.plan.turns) - 1

    @property
    def separate(self) -> bool:
        """Whether this turn verifies in a fresh verifier sandbox."""
        return self.plan.verifier.mode == "separate"

    @property
    def previous(self) -> TurnPlan | None:
        return self.services.plan.turns[self.index - 1] if self.index > 0 else None

    def job_id(self, stage: Stage | str) -> str:
        """The deterministic id of this turn's job for ``stage``: a restart re-attaches to it."""
        return turn_job_id(self.services.attempt_number, self.index, stage)

    def label(self) -> str:
        """``2/3 build``: the turn as Events and messages name it."""
        return f"{self.index + 1}/{len(self.services.plan.turns)} {self.name}"
