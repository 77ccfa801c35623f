"""The turn, as one declared state machine: one row per stage.

Every turn walks these stages in order (docs/task-format.md §3.4). For each stage the table says:

- **step** — the function that does the stage's work (each in its own module of this package);
- **next** — the stage after it (a failed preparation from step 2 on jumps to ``done`` with a
  measured 0; every other failure ends the attempt or the episode, see ``turn_failures.py``);
- **published** — whether the stage is written to the Episode's status *before* its step
  runs. Only where a restart must not redo what came before: everything between two
  published stages is safe to redo, so a restart resumes at the last published stage;
- **network** — the agent pod's NetworkPolicy while the step runs (Harbor's phase overrides);
- **restart** — what a restarted operator does when the status shows the stage.

Questions a newcomer asks, answered by one row each:
where does turn N's verifier run → ``verify-prepare`` / ``verify`` (``verify.py``);
where is the gate applied → ``verify`` (``record_score``, kept in ``status.turns[].gate``);
what is redone after a restart → the ``restart`` column.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from episode_operator.api.vocabulary import Stage
from episode_operator.runtime.turn.agent import run_agent, write_trajectory
from episode_operator.runtime.turn.collect import collect
from episode_operator.runtime.turn.context import TurnRun
from episode_operator.runtime.turn.prepare import (
    clear_grading_files,
    poll_step_healthcheck,
    run_setup,
    switch_user_and_merge_workdir,
)
from episode_operator.runtime.turn.verify import prepare_verifier, release_verifier, verify

Step = Callable[[TurnRun], Awaitable[None]]


class Published(enum.Enum):
    """When a stage is written to the status before its step runs."""

    ALWAYS = "always"
    NEVER = "never"
    SEPARATE = "when the turn verifies in a separate sandbox"


class Network(enum.Enum):
    """The agent pod's network while a stage's step runs."""

    UNCHANGED = "as the stage before"
    BASELINE = "[environment]'s baseline"
    AGENT = "the agent phase's ([agent] override)"
    VERIFIER = "the verifier phase's ([verifier] override), when it verifies in the agent's sandbox"


@dataclass(frozen=True)
class StageRow:
    step: Step
    next: Stage | None
    published: Published
    network: Network
    restart: str


TURN: Final[Mapping[Stage, StageRow]] = {
    Stage.CLEANUP: StageRow(
        clear_grading_files,
        Stage.WORKDIR,
        Published.ALWAYS,  # with the turn's start (phase Running, TurnStarted)
        Network.UNCHANGED,
        "Clears the previous shared turn's /tests, /logs/verifier and trajectory.json again (idempotent), "
        "then goes on.",
    ),
    Stage.WORKDIR: StageRow(
        switch_user_and_merge_workdir,
        Stage.SETUP,
        Published.NEVER,
        Network.BASELINE,
        "Not published: resumes at cleanup; the user switch and a workdir/ merge (done here only when no "
        "setup.sh follows) are idempotent.",
    ),
    Stage.SETUP: StageRow(
        run_setup,
        Stage.HEALTHCHECK,
        Published.NEVER,
        Network.UNCHANGED,
        "Not published: resumes at cleanup and re-attaches to setup.sh, whose start exec carried the "
        "workdir/ merge, so nothing is merged or run twice.",
    ),
    Stage.HEALTHCHECK: StageRow(
        poll_step_healthcheck,
        Stage.AGENT,
        Published.NEVER,
        Network.UNCHANGED,
        "Not published: resumes at cleanup and polls [steps.healthcheck] afresh (new job ids).",
    ),
    Stage.AGENT: StageRow(
        run_agent,
        Stage.TRAJECTORY,
        Published.ALWAYS,
        Network.AGENT,
        "Re-attaches to the agent's job (or harvests its end); its inputs were placed by the exec that "
        "started it and are never placed again. The capture proxy's turn marks and the harvest of the "
        "turn's model calls re-attach too, and the failure is classified again from the same records.",
    ),
    Stage.TRAJECTORY: StageRow(
        write_trajectory,
        Stage.COLLECT,
        Published.NEVER,
        Network.BASELINE,
        "Not published: resumes at agent and writes the same trajectory from the same stored calls again.",
    ),
    Stage.COLLECT: StageRow(
        collect,
        Stage.VERIFY_PREPARE,
        Published.NEVER,
        Network.UNCHANGED,
        "Not published: resumes at agent, re-attaches to the finished agent job and collects again "
        "(hooks get the same job ids, so each runs once).",
    ),
    Stage.VERIFY_PREPARE: StageRow(
        prepare_verifier,
        Stage.VERIFY,
        Published.SEPARATE,  # the agent pod's release and the verifier pod are not redone from collect
        Network.VERIFIER,
        "Separate: re-attaches to the verifier pod (created if the attempt recorded none: a recorded one gone is "
        "an outage) and places the artifacts again "
        "(nothing has run there yet). Shared: not published, resumes at agent.",
    ),
    Stage.VERIFY: StageRow(
        verify,
        Stage.DONE,
        Published.SEPARATE,  # a restart must not empty the folders again under test.sh
        Network.VERIFIER,
        "Re-attaches to test.sh (its tests were placed by the exec that started it) and reads the reward "
        "files it left. Shared: not published, resumes at agent and re-attaches all the way here.",
    ),
    Stage.DONE: StageRow(
        release_verifier,
        None,
        Published.SEPARATE,  # the reward is recorded before the verifier pod goes
        Network.UNCHANGED,
        "The reward is in the status: deletes a separate turn's verifier pod again (idempotent) and goes "
        "to the next turn. Shared: published with the next turn's cleanup.",
    ),
}


def is_published(stage: Stage, separate: bool) -> bool:
    """Whether entering ``stage`` writes the status, for a turn that verifies separately or not."""
    published = TURN[stage].published
    return published is Published.ALWAYS or (published is Published.SEPARATE and separate)


def resumes_at(stage: Stage, separate: bool) -> Stage:
    """Where a restart resumes when the turn was last seen in ``stage``: the last published stage at or before it."""
    order = list(TURN)
    for candidate in reversed(order[: order.index(stage) + 1]):
        if is_published(candidate, separate):
            return candidate
    return order[0]


def restart_at(recorded: Stage, separate: bool) -> Stage:
    """Where a restarted runner begins a turn whose status records ``recorded``: where the table
    resumes it (:func:`resumes_at`), except that a turn recorded ``done`` has its reward in the
    status (a shared turn's ``done`` is written with the next turn's cleanup) and is not redone."""
    return recorded if TURN[recorded].next is None else resumes_at(recorded, separate)


def render_table() -> str:
    """The table as Markdown, for the docs (``python -m episode_operator.runtime.turn.table``)."""
    lines = [
        "| stage | step | next | published | network | after a restart |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for stage, row in TURN.items():
        step = f"`{row.step.__module__.rsplit('.', 1)[-1]}.{row.step.__name__}`"
        following = f"`{row.next}`" if row.next else "—"
        lines.append(
            f"| `{stage}` | {step} | {following} | {row.published.value} | {row.network.value} | {row.restart} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
