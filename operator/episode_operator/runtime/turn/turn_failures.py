"""How a turn fails, and the one place where a failed sandbox call becomes one of those failures.

Gym keeps four classes apart (docs/task-format.md §3.9): a *measured* 0 (the turn scored, the
episode stops), a *terminal* failure (preparation at step 1: no reward, no retry), a *masked*
episode (the verifier's environment failed) and an *outage* (the sandbox failed under us: the
attempt is lost and a fresh one may start). The runner raises the exceptions below; which one
a failed sandbox call raises is decided by :data:`COMMAND_FAILURES` alone.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

from episode_operator.api.vocabulary import (
    FAILURE_ENVIRONMENT_BUILD,
    FAILURE_OUTPUT_LIMIT,
    FAILURE_VERIFIER,
    FAILURE_WORKDIR,
    FailureKind,
    OutageKind,
)
from episode_operator.runtime.limits import OutputLimitExceeded
from episode_operator.runtime.sandbox_protocol import CommandFailed, JobState, SandboxError


class Outage(Exception):
    """The sandbox failed under us: the attempt is lost and a fresh one may start."""

    def __init__(self, kind: OutageKind, message: str) -> None:
        super().__init__(message)
        self.kind: OutageKind = kind


class PreparationFailed(Exception):
    """A turn's preparation failed: terminal at step 1, a measured 0 from step 2 on (Gym)."""

    def __init__(self, failure_kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.failure_kind: FailureKind = failure_kind


class TurnFailed(Exception):
    """The turn fails with a measured 0 at any step, its verifier not run: the agent's own doing
    (what its sandbox sent back passed a bound, runtime/limits.py). Not an outage: a retry would
    do the same."""

    def __init__(self, failure_kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.failure_kind: FailureKind = failure_kind


def output_limit(error: OutputLimitExceeded) -> TurnFailed:
    """What a sandbox sending past a bound means in a turn: the turn fails, a measured 0."""
    return TurnFailed(FAILURE_OUTPUT_LIMIT, f"refused what the sandbox sent: {error}")


EndingOutcome = Literal["TerminalFailure", "Masked", "Ungraded"]


class EpisodeEnds(Exception):
    """Ends the episode now with this outcome (terminal, masked, ungraded)."""

    def __init__(self, outcome: EndingOutcome, failure_kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.outcome: EndingOutcome = outcome
        self.failure_kind: FailureKind = failure_kind


class Call(enum.StrEnum):
    """What the runner asked of a sandbox when a command failed."""

    CLEAR_GRADING_FILES = "clear the previous turn's grading files"
    SWITCH_USER = "switch the turn's user"
    MERGE_WORKDIR = "merge workdir/"
    START_SETUP = "start setup.sh"
    RUN_HEALTHCHECK = "run the healthcheck"
    START_AGENT = "start the agent's setup"
    PLACE_SOLUTION = "place the oracle's solution"
    PLACE_INSTRUCTION = "place the instruction"
    PLACE_VERIFIER_INPUTS = "place the artifacts in the verifier's sandbox"
    START_VERIFIER = "start test.sh"
    READ_REWARD = "read the reward files"
    # At seed (runtime/seed.py).
    REPLAY = "replay the Dockerfile"
    PLACE_ENVIRONMENT_FILES = "copy environment/ into the working directory"
    START_ENTRYPOINT = "start the ENTRYPOINT"


@dataclass(frozen=True)
class Becomes:
    """What a failed command turns into: an outage of ``outage`` kind, a failed preparation, a
    terminal failure of the task (at seed) or a masked episode; ``doing`` names the part that
    failed when it is not the whole call."""

    outage: OutageKind | None = None
    preparation: FailureKind | None = None
    terminal: FailureKind | None = None
    masked: bool = False
    doing: str | None = None


_CLEAR: Final = Becomes(outage="clear_grading_files", doing=Call.CLEAR_GRADING_FILES)
_CANNOT_RUN: Final = Becomes(outage="run_command")
# A job whose shell, user or directory is unusable (the supervisor's ``unstartable``).
UNSTARTABLE: Final = "unstartable"

#: Call → the part of the supervisor's command that failed (``CommandFailed.step``: ``clear``
#: the grading folders, ``upload`` the inputs; ``unstartable``: the job could not start;
#: None: anything else) → what it means. A :class:`SandboxError` (pod lost, exec
#: transport…) is always an outage of its own kind.
COMMAND_FAILURES: Final[dict[Call, dict[str | None, Becomes]]] = {
    Call.CLEAR_GRADING_FILES: {None: _CLEAR},
    # Gym: a sandbox that cannot switch the user is an outage.
    Call.SWITCH_USER: {None: Becomes(outage="user_switch")},
    # workdir/ that cannot unpack over what earlier turns left is the task's failure.
    Call.MERGE_WORKDIR: {"clear": _CLEAR, None: Becomes(preparation=FAILURE_WORKDIR)},
    # setup.sh always lives in workdir/, which the exec starting it merges.
    Call.START_SETUP: {"clear": _CLEAR, "upload": Becomes(preparation=FAILURE_WORKDIR), None: _CANNOT_RUN},
    Call.RUN_HEALTHCHECK: {None: _CANNOT_RUN},
    Call.START_AGENT: {None: _CANNOT_RUN},
    Call.PLACE_SOLUTION: {"clear": _CLEAR, UNSTARTABLE: _CANNOT_RUN, None: Becomes(outage="place_solution")},
    Call.PLACE_INSTRUCTION: {"clear": _CLEAR, UNSTARTABLE: _CANNOT_RUN, None: Becomes(outage="place_instruction")},
    # The verifier's image must provide bash, timeout, tar, gzip and find: a verifier that cannot
    # receive its inputs or start test.sh masks the episode (docs/task-format.md §3.3).
    Call.PLACE_VERIFIER_INPUTS: {
        "clear": Becomes(outage="clear_grading_files", doing="empty /tests and /logs/verifier"),
        None: Becomes(masked=True),
    },
    Call.START_VERIFIER: {
        "clear": Becomes(outage="clear_grading_files", doing="empty /tests and /logs/verifier"),
        "upload": Becomes(masked=True),
        UNSTARTABLE: Becomes(masked=True),
        None: _CANNOT_RUN,
    },
    Call.READ_REWARD: {None: Becomes(outage="read_reward")},
    # A replay step that fails is the task's (runtime/replay_runner.py says which); a supervisor that
    # cannot start one is not.
    Call.REPLAY: {None: _CANNOT_RUN},
    # environment/ that cannot unpack in the image, or an ENTRYPOINT that cannot start: the task's environment.
    Call.PLACE_ENVIRONMENT_FILES: {None: Becomes(terminal=FAILURE_ENVIRONMENT_BUILD)},
    Call.START_ENTRYPOINT: {UNSTARTABLE: Becomes(terminal=FAILURE_ENVIRONMENT_BUILD), None: _CANNOT_RUN},
}


def failure_of(call: Call, error: SandboxError | CommandFailed) -> Outage | PreparationFailed | EpisodeEnds:
    """The failure a failed sandbox call means (see :data:`COMMAND_FAILURES`)."""
    if isinstance(error, SandboxError):
        return Outage(error.kind, f"cannot {call}: {error}")
    return _verdict(call, error.step, str(error))


def check_started(call: Call, state: JobState) -> None:
    """Raise the failure a job that could not start means; nothing for a job that ran."""
    if state.phase == "unstartable":
        raise _verdict(call, UNSTARTABLE, state.reason or "the job could not start")


def _verdict(call: Call, step: str | None, detail: str) -> Outage | PreparationFailed | EpisodeEnds:
    rules = COMMAND_FAILURES[call]
    verdict = rules.get(step, rules[None])
    message = f"cannot {verdict.doing or call}: {detail}"
    if verdict.masked:
        return EpisodeEnds("Masked", FAILURE_VERIFIER, message)
    if verdict.terminal is not None:
        return EpisodeEnds("TerminalFailure", verdict.terminal, message)
    if verdict.preparation is not None:
        return PreparationFailed(verdict.preparation, message)
    assert verdict.outage is not None
    return Outage(verdict.outage, message)


@contextlib.contextmanager
def sandbox_call(call: Call) -> Iterator[None]:
    """Run a sandbox call; a failure leaves as the failure it means (:func:`failure_of`)."""
    try:
        yield
    except (SandboxError, CommandFailed) as error:
        raise failure_of(call, error) from error


def sandbox_lost(error: SandboxError) -> Outage:
    """A sandbox that failed under a call with no command of its own (pod start, job poll…)."""
    return Outage(error.kind, str(error))
