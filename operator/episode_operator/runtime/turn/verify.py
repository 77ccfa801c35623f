"""Stages ``verify-prepare``, ``verify`` and ``done``: the verifier, the reward, the gate.

Shared (docs/task-format.md §3.3 step 4): in the agent's sandbox, ``/tests`` and ``/logs/verifier``
sealed (root's, 0755, then emptied: what the agent left there is gone, and its leftover processes
can neither add to them nor rename them away; ``/logs/verifier`` then given to test.sh's user) and
the layered tests uploaded by the exec that starts ``test.sh`` — so a restarted runner re-attaching
to ``test.sh`` neither clears its reward files nor replaces its tests.

Separate (§3.4.6): the agent's sandbox stops first on the last turn; a fresh verifier sandbox
gets the collected artifacts at their original absolute paths (the first upload sealing
``/tests``) — the tars the operator re-packed, never what the agent's pod sent — then ``test.sh``
as above; the verifier sandbox goes once the reward is recorded (stage ``done``).

Then the reward file is read (``reward.json``, else ``reward.txt``), refused if it changed
after ``test.sh`` exited, and the turn's score and ``min_reward`` gate are recorded — the
gate decided here, once, and kept in ``status.turns[].gate``.
"""

from __future__ import annotations

from episode_operator.api.episode_resource import TurnStatus
from episode_operator.api.vocabulary import timestamp
from episode_operator.runtime.archive import mapped_tar
from episode_operator.runtime.sandbox_protocol import JOB_USER, JobSpec, Upload, sealed
from episode_operator.runtime.turn.context import (
    GRADING_FILES,
    LOGS_VERIFIER,
    REWARD_JSON_PATH,
    REWARD_TXT_PATH,
    TEST_STDOUT,
    TESTS,
    TurnRun,
)
from episode_operator.runtime.turn.turn_failures import Call, check_started, sandbox_call
from episode_operator.taskfolder.rewards import TurnScore, check_min_reward, parse_reward_files

# The folders emptied before test.sh runs (not the trajectory: it is this turn's transcript), sealed:
# /tests root's, /logs/verifier test.sh's user's (it writes the rewards there).
assert {f"{TESTS}/", f"{LOGS_VERIFIER}/"} <= set(GRADING_FILES)
SEALED_TESTS = sealed(f"{TESTS}/")
SEALED_REWARDS = sealed(f"{LOGS_VERIFIER}/", JOB_USER)
TEST_SCRIPT = "test.sh"


async def prepare_verifier(turn: TurnRun) -> None:
    """Stage ``verify-prepare``: for a separate turn, the verifier sandbox with the turn's artifacts."""
    if not turn.separate:
        return
    services = turn.services
    if turn.last:
        # The agent's sandbox stops before the last turn's separate verifier starts (Gym).
        await services.release_agent()
    sandbox = await services.verifier_sandbox(turn.index)
    # The clean tars collect re-packed (runtime/archive.py), streamed from the store through files.
    archives = await services.store.artifact_archives(services.attempt_number, turn.name)
    try:
        with sandbox_call(Call.PLACE_VERIFIER_INPUTS):
            if not archives:
                await sandbox.clear([SEALED_TESTS])
            clear: tuple[str, ...] = (SEALED_TESTS,)
            for archive in archives:
                await sandbox.upload(archive, "/", clear=clear)
                clear = ()
    finally:
        for archive in archives:
            archive.discard()


async def verify(turn: TurnRun) -> None:
    """Stage ``verify``: ``bash /tests/test.sh`` as the verifier user; the reward and gate recorded."""
    services = turn.services
    plan = turn.plan
    sandbox = await (services.verifier_sandbox(turn.index) if turn.separate else services.agent_sandbox())
    spec = JobSpec(
        id=turn.job_id("verify"),
        command=f"bash {TESTS}/{TEST_SCRIPT}",
        timeout_sec=plan.verifier.timeout_sec,
        user=plan.verifier.user,
        env=plan.verifier.env,
        output=TEST_STDOUT,
        read_after=(REWARD_JSON_PATH, REWARD_TXT_PATH),
    )
    # A separate verifier's /tests was sealed by verify-prepare, before its artifacts arrived.
    folders = (SEALED_REWARDS,) if turn.separate else (SEALED_TESTS, SEALED_REWARDS)
    # test.sh executable, as Harbor's verifier makes it (`chmod +x` as root) before running it.
    tests = Upload(mapped_tar(services.files, plan.tests, script=TEST_SCRIPT), TESTS, folders)
    with sandbox_call(Call.START_VERIFIER):
        state = await services.run_job(sandbox, spec, upload=tests)
    await services.save_job_log(sandbox, turn.name, "verifier", state)
    check_started(Call.START_VERIFIER, state)
    files = state.files
    if files is None:  # a job that ended before this runner asked for its files
        with sandbox_call(Call.READ_REWARD):
            files = await sandbox.read_files([REWARD_JSON_PATH, REWARD_TXT_PATH])
    tampered = [
        path
        for path, content in files.items()
        if content.data is not None
        and content.modified is not None
        and state.finished_at is not None
        and content.modified > state.finished_at  # both by the container's clock
    ]
    if tampered:
        # Something kept writing after test.sh exited (e.g. a process the agent left in a
        # shared sandbox): the file is not the verifier's, so there is no valid reward.
        await record_score(
            turn,
            TurnScore(valid=False),
            None,
            f"no valid reward file: {', '.join(tampered)} changed after test.sh exited",
        )
        await services.event(
            "RewardTampered",
            f"turn {turn.name}: {', '.join(tampered)} changed after test.sh exited; the turn counts 0",
            warning=True,
        )
        return
    result = parse_reward_files(files[REWARD_JSON_PATH].data, files[REWARD_TXT_PATH].data)
    if result.rewards is None:
        timed_out = " (the verifier timed out)" if state.timed_out else ""
        await record_score(turn, TurnScore(valid=False), None, f"no valid reward file{timed_out}: {result.error}")
    else:
        await record_score(turn, TurnScore(result.rewards), None, None)


async def release_verifier(turn: TurnRun) -> None:
    """Stage ``done``: a separate turn's verifier sandbox goes (its reward is recorded)."""
    if turn.separate:
        await turn.services.release_verifier(turn.index)


async def record_score(turn: TurnRun, score: TurnScore, failure_kind: str | None, message: str | None) -> None:
    """Record a finished turn: its reward, failure and gate (decided here, once), and say so."""
    record = turn.record
    services = turn.services
    record.reward = score.reward
    record.verifier_rewards = dict(score.rewards)
    record.reward_valid = score.valid
    record.failure_kind = failure_kind
    record.phase = "Succeeded" if score.valid and failure_kind is None else "Failed"
    record.gate = None
    if score.valid and turn.plan.min_reward is not None:
        miss = check_min_reward(turn.plan.min_reward, score.rewards)
        record.gate = "missed" if miss else "passed"
        message = message or (f"min_reward missed: {miss}" if miss else None)
    if message:
        record.message = message
    record.finished_at = timestamp(services.now())
    services.turn_finished("failed" if failure_kind else "graded" if score.valid else "measured_zero", failure_kind)
    reward = "no valid reward" if not score.valid else f"reward {score.reward}"
    await services.event(
        "TurnFinished",
        f"turn {turn.label()}: {reward}" + (f" ({failure_kind})" if failure_kind else ""),
        warning=not score.valid,
    )


def stops_episode(record: TurnStatus) -> bool:
    """Whether a finished turn stops the episode: no valid reward, a failure, or a missed gate (§3.8)."""
    return not record.reward_valid or record.failure_kind is not None or record.gate == "missed"
