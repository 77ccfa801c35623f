"""Before the agent: the cleanup of the previous turn's grading files, then the turn's preparation.

docs/task-format.md §3.4.1–§3.4.2. Cleanup: after a turn verified in the agent's sandbox, empty
``/tests`` and ``/logs/verifier`` and remove ``/logs/agent/trajectory.json`` (an outage when
it cannot be done). Preparation: switch to the turn's agent user, merge ``workdir/``, run
``setup.sh``, poll ``[steps.healthcheck]`` — each failure a :class:`PreparationFailed`.

The cleanup always happens before any of this turn's task code runs, in the first exec that
writes into the sandbox: the ``workdir/`` merge when there is one, else the agent's own start
when nothing runs before it, else an exec of its own (:func:`cleanup_carrier`).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from episode_operator.api.vocabulary import FAILURE_HEALTHCHECK, FAILURE_SETUP, Stage
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.archive import folder_tar
from episode_operator.runtime.sandbox_protocol import JobSpec, JobState, Sandbox, Upload
from episode_operator.runtime.turn.context import GRADING_FILES, TurnRun
from episode_operator.runtime.turn.turn_failures import Call, PreparationFailed, check_started, sandbox_call

Carrier = Literal["none", "own", "workdir", "agent"]


def cleanup_carrier(turn: TurnRun) -> Carrier:
    """Which exec empties the previous shared turn's grading files (Gym's cleanup); ``none``
    when there is nothing to clear. Clearing is idempotent, so a restart may clear again."""
    previous = turn.previous
    if previous is None or previous.verifier.mode != "shared":
        return "none"
    if turn.plan.workdir is not None:
        return "workdir"
    if not turn.plan.setup and turn.plan.healthcheck is None and agent_kind(turn.services.agent_spec).acts:
        return "agent"
    return "own"


def carried_cleanup(turn: TurnRun, carrier: Carrier) -> tuple[str, ...]:
    """The grading files an exec of ``carrier`` clears before it writes (none unless it carries the cleanup)."""
    return GRADING_FILES if cleanup_carrier(turn) == carrier else ()


async def clear_grading_files(turn: TurnRun) -> None:
    """Stage ``cleanup``: the previous shared turn's grading files, in an exec of their own if no other carries them."""
    if cleanup_carrier(turn) != "own":
        return
    sandbox = await turn.services.agent_sandbox()
    with sandbox_call(Call.CLEAR_GRADING_FILES):
        await sandbox.clear(list(GRADING_FILES))


def switches_user(turn: TurnRun) -> bool:
    """Whether the turn's agent user differs from the one the sandbox was left with."""
    user = turn.plan.agent.user
    previous = turn.previous
    return user is not None and (previous is None or user != previous.agent.user)


def prepares_nothing(turn: TurnRun) -> bool:
    """Whether the stages before the agent's (cleanup, workdir, setup, healthcheck) run nothing in
    the sandbox for this turn: no grading files of their own to clear, no user to switch, no
    ``workdir/``, no ``setup.sh``, no healthcheck."""
    return (
        cleanup_carrier(turn) != "own"
        and not switches_user(turn)
        and turn.plan.workdir is None
        and not turn.plan.setup
        and turn.plan.healthcheck is None
    )


async def switch_user_and_merge_workdir(turn: TurnRun) -> None:
    """Stage ``workdir``: the turn's agent user owns the working directory; ``workdir/`` merged
    (unless a ``setup.sh`` follows: the exec that starts it merges ``workdir/``)."""
    sandbox = await turn.services.agent_sandbox()
    user = turn.plan.agent.user
    if user is not None and switches_user(turn):
        with sandbox_call(Call.SWITCH_USER):
            await sandbox.switch_user(user, sandbox.workdir)
    if turn.plan.workdir is None or turn.plan.setup:
        return
    workdir = workdir_upload(turn, sandbox)
    with sandbox_call(Call.MERGE_WORKDIR):
        await sandbox.upload(workdir.archive, workdir.destination, clear=workdir.clear)


def workdir_upload(turn: TurnRun, sandbox: Sandbox) -> Upload:
    """``workdir/`` as merged into the working directory (root-owned, modes kept, nothing removed)."""
    assert turn.plan.workdir is not None
    return Upload(folder_tar(turn.services.files, turn.plan.workdir), sandbox.workdir, carried_cleanup(turn, "workdir"))


async def run_setup(turn: TurnRun) -> None:
    """Stage ``setup``: ``bash <workdir>/setup.sh`` as the turn's agent user, bounded; it fails the preparation."""
    if not turn.plan.setup:
        return
    assert turn.plan.setup_timeout_sec is not None
    sandbox = await turn.services.agent_sandbox()
    spec = JobSpec(
        id=turn.job_id(Stage.SETUP),
        command=f"bash {PurePosixPath(sandbox.workdir) / 'setup.sh'}",
        timeout_sec=turn.plan.setup_timeout_sec,
        user=turn.plan.agent.user,
    )
    with sandbox_call(Call.START_SETUP):
        state = await turn.services.run_job(sandbox, spec, upload=workdir_upload(turn, sandbox))
    await turn.services.save_job_log(sandbox, turn.name, "setup", state)
    check_started(Call.START_SETUP, state)
    if not state.succeeded:
        raise PreparationFailed(FAILURE_SETUP, f"setup.sh {describe(state)}")


async def poll_step_healthcheck(turn: TurnRun) -> None:
    """Stage ``healthcheck``: ``[steps.healthcheck]`` polled as the turn's agent user."""
    check = turn.plan.healthcheck
    if check is None:
        return
    sandbox = await turn.services.agent_sandbox()
    if not await turn.services.healthcheck(sandbox, check, turn.job_id(Stage.HEALTHCHECK), turn.plan.agent.user):
        raise PreparationFailed(FAILURE_HEALTHCHECK, "[steps.healthcheck] never passed")


def describe(state: JobState) -> str:
    """How a finished job that did not succeed ended, for messages."""
    if state.timed_out:
        return "ran out of its time bound"
    return f"exited with {state.exit_code}"
