"""A reward nobody can forge or lose, at the runner: keyed job ids, lost pods, the outage back-off.

Each test is the attack or the fault next to what must come of it: an agent that plants the
verifier's job record does not pre-empt it; a pod lost while the operator was away (deleted, or
deleted and made again under its name) is an outage and a fresh attempt, never a turn graded in
a new pod; a runner that dies in an outage's back-off leaves the next attempt written.
"""

from __future__ import annotations

from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.runtime.sandbox_protocol import JobSpec, JobState, keyed_job_id
from tests.unit.episodes import run, three_steps
from tests.unit.fake_sandbox import Crash, FakeSandbox, FakeSink, JobRecord, World, unkeyed

# After the verifier pod's uid is recorded, a crash: the pod, created again under the same name, is not it.
SEPARATE = 'artifacts = ["/app/runs.txt"]\n[steps.verifier]\nenvironment_mode = "separate"\n'


def counting_steps(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Turn i's test passes only when i solutions ran in this sandbox (a ledger of one line each)."""
    files = {f"steps/{name}/solution/solve.sh": f"append runs.txt {name}" for name in "abc"}
    files |= {
        "steps/a/tests/test.sh": "check runs.txt a\\n",
        "steps/b/tests/test.sh": "check runs.txt a\\nb\\n",
        "steps/c/tests/test.sh": "check runs.txt a\\nb\\nc\\n",
    }
    return three_steps(extra=extra, files=files)


def lose_pod_once(sandbox: FakeSandbox, spec: JobSpec) -> None:
    """The pod is lost as this job starts, the first time it does."""
    if sandbox.world.created[sandbox.name] == 1:
        sandbox.lost = True


def crashed_at(folder: dict[str, str], world: World, stage: str, turn: int) -> EpisodeStatus:
    """The last status a runner wrote before it died as turn ``turn`` (from 0) published ``stage``."""
    dying = FakeSink(crash_when=lambda status: status.current_turn == turn and status.turns[turn].stage == stage)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    return dying.statuses[-1]


# --- keyed job ids ------------------------------------------------------------------------------
def test_every_job_id_carries_its_attempts_key_and_each_attempt_has_its_own() -> None:
    world = World(hooks={"a1.t2.agent": lose_pod_once})
    status = run(counting_steps(), world=world)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 2), status.message
    keys = [attempt.job_key for attempt in status.attempts]
    assert all(keys) and len(set(keys)) == 2
    for number, key in enumerate(keys, start=1):
        assert key is not None
        raw = world.sandboxes[f"pod-a{number}"].raw_starts
        assert raw and all(job_id == keyed_job_id(key, unkeyed(job_id)) for job_id in raw), raw


def plant_verifier_record(sandbox: FakeSandbox, spec: JobSpec) -> None:
    """What a root agent does in two lines of shell: a finished record for the verifier's job under
    every id it can name, and a reward of 1."""
    now = sandbox.clock.now
    for job_id in ("a1.t1.verify", spec.id.replace(".agent", ".verify")):
        planted = JobSpec(id=job_id, command="bash /tests/test.sh", timeout_sec=60)
        state = JobState(job_id, "exited", exit_code=0, started_at=now, finished_at=now)
        sandbox.jobs[("main", job_id)] = JobRecord(planted, state)
    sandbox.files["main"]["/logs/verifier/reward.txt"] = b"1"
    sandbox.modified["/logs/verifier/reward.txt"] = now


@pytest.mark.parametrize("attack", [False, True], ids=["honest", "planted-record"])
def test_an_agent_that_plants_the_verifiers_job_record_does_not_pre_empt_it(attack: bool) -> None:
    folder = three_steps(rewards=("0", "1", "1"))
    world = World(hooks={"a1.t1.agent": plant_verifier_record} if attack else {})
    status = run(folder, world=world)[0]
    # test.sh always writes 0 for turn a: so does the run with the attack.
    assert (status.phase, status.outcome, status.turns[0].reward) == ("Succeeded", "Graded", 0.0)
    assert status.reward == pytest.approx(2 / 3)
    assert world.sandboxes["pod-a1"].starts.count("a1.t1.verify") == 1


# --- lost pods ----------------------------------------------------------------------------------
@pytest.mark.parametrize("made_again", [False, True], ids=["deleted", "deleted-and-made-again"])
def test_an_agent_pod_lost_while_the_operator_was_away_is_an_outage(made_again: bool) -> None:
    """Operator down, the agent pod deleted during turn 2, operator back: an outage and a fresh
    attempt scoring what the task gives (1), never turn 2 graded in a new pod (a measured 0.25)."""
    world = World()
    folder = counting_steps()
    last = crashed_at(folder, world, "agent", 1)
    assert [(pod.role, pod.name) for pod in last.attempts[0].pods] == [("agent", "pod-a1")]
    world.delete_pod("pod-a1")
    if made_again:
        world.sandbox("pod-a1")  # someone (an older operator, a user) made it again under its name
    status = run(folder, world=world, status=last)[0]
    assert (status.phase, status.outcome, status.reward, status.attempt) == ("Succeeded", "Graded", 1.0, 2)
    assert (status.attempts[0].reason or "").startswith("pod_lost: ")
    assert world.created["pod-a1"] == (2 if made_again else 1)  # the runner never made it again
    assert world.sandboxes["pod-a2"].starts.count("a2.t1.agent") == 1


def test_a_verifier_pod_lost_while_the_operator_was_away_is_an_outage() -> None:
    world = World()
    folder = counting_steps({name: SEPARATE for name in "abc"})
    last = crashed_at(folder, world, "verify", 0)
    assert ("verifier", 1, "pod-a1-v1") in [(pod.role, pod.turn, pod.name) for pod in last.attempts[0].pods]
    world.delete_pod("pod-a1-v1")
    status = run(folder, world=world, status=last)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 2), status.message
    assert (status.attempts[0].reason or "").startswith("pod_lost: ")
    assert world.created["pod-a1-v1"] == 1


def test_a_runner_that_dies_in_the_back_off_leaves_the_next_attempt_written() -> None:
    """Agent pod lost in turn 2, then the operator dies while it waits to retry: the restarted one
    waits out the rest of the back-off and runs attempt 2 from the start, never attempt 1 on."""
    world = World(hooks={"a1.t2.agent": lose_pod_once})
    folder = counting_steps()

    def waiting_to_retry(status: EpisodeStatus) -> bool:
        return len(status.attempts) == 2

    dying = FakeSink(crash_when=waiting_to_retry)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    last = dying.statuses[-1]
    first, second = last.attempts
    assert first.finished_at and (first.reason or "").startswith("pod_lost: ")
    assert (second.started_at, second.not_before is not None, last.attempt) == (None, True, 2)
    status = run(folder, world=world, status=last)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 2), status.message
    assert second.not_before is not None and status.attempts[1].started_at is not None
    assert status.attempts[1].started_at >= second.not_before
    assert world.sandboxes["pod-a1"].starts.count("a1.t2.agent") == 1  # attempt 1 was not taken up again


def test_an_attempt_ended_by_an_older_runner_before_it_wrote_the_next_is_not_resumed() -> None:
    """A status of the kind older runners wrote in the back-off: the lost attempt ended, no next one."""
    world = World(hooks={"a1.t2.agent": lose_pod_once})
    folder = counting_steps()
    dying = FakeSink(crash_when=lambda status: len(status.attempts) == 2)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    # The last status before the outage, then what an older runner wrote as the outage ended it.
    older: Any = next(status for status in reversed(dying.statuses) if len(status.attempts) == 1)
    assert (older.current_turn, older.turns[1].stage) == (1, "agent")
    ended = dying.statuses[-1].attempts[0]
    older.attempts[0].reason, older.attempts[0].finished_at = ended.reason, ended.finished_at
    older.attempts[0].pods, older.attempts[0].job_key = [], None  # older runners recorded neither
    world.delete_pod("pod-a1")  # released with the outage
    status = run(folder, world=world, status=older)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 2), status.message


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_a_runner_that_dies_releasing_the_finished_episodes_pods_does_not_run_it_again(separate: bool) -> None:
    """Every turn graded, the pods deleted, the operator dead before the terminal status: the
    restarted runner only repeats the ending (the reward it had), never a lost-pod outage and a
    second attempt that runs the agents again."""
    world = World()
    folder = counting_steps({name: SEPARATE for name in "abc"} if separate else None)
    dying = FakeSink(crash_at_event="EpisodeFinished")
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    last = dying.statuses[-1]
    assert last.phase == "Running" and "pod-a1" in world.gone
    status = run(folder, world=world, status=last)[0]
    assert (status.phase, status.outcome, status.reward, status.attempt) == ("Succeeded", "Graded", 1.0, 1)
    assert [world.sandboxes["pod-a1"].starts.count(f"a1.t{turn}.agent") for turn in (1, 2, 3)] == [1, 1, 1]
    assert world.created["pod-a1"] == 1


def test_a_runner_that_dies_releasing_a_failed_episodes_pods_repeats_the_failure_not_the_setup() -> None:
    """Turn 1's setup.sh failed (a terminal failure, no retry), the operator dead as the pods went:
    the restarted runner ends as recorded, and runs no setup.sh in a second attempt."""
    world = World()
    folder = counting_steps({"a": ""}) | {"steps/a/workdir/setup.sh": "exit 1"}
    dying = FakeSink(crash_at_event="EpisodeFinished")
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    last = dying.statuses[-1]
    assert (last.phase, last.outcome) == ("Running", "TerminalFailure")
    status = run(folder, world=world, status=last)[0]
    assert (status.phase, status.outcome, status.attempt) == ("Failed", "TerminalFailure", 1), status.message
    assert status.failure_kind == last.failure_kind and "pod-a2" not in world.sandboxes


# --- spec.retries.agentOutages -------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["retry", "score"])
def test_an_outage_an_agent_caused_is_retried_by_default_and_scored_when_asked(policy: str) -> None:
    """Turn 1's agent left its trajectory uncleanable: turn 2 cannot start (Gym: an outage, even when
    an agent caused it). Retried, every attempt meets it again; scored, turn 2 counts a measured 0."""
    world = World(unclearable={"/logs/agent/trajectory.json"})
    status = run(three_steps(), world=world, retries=1, agent_outages=policy)[0]
    if policy == "retry":
        assert (status.outcome, status.failure_kind, status.attempt) == ("Ungraded", "outage:clear_grading_files", 2)
        return
    assert (status.phase, status.outcome, status.attempt, status.stopped_after_turn) == ("Succeeded", "Graded", 1, "b")
    assert [(t.reward, t.failure_kind) for t in status.turns[:2]] == [(1.0, None), (0.0, "agent:broke_sandbox")]
    assert status.reward == pytest.approx(0.5) and status.failure_kind == "agent:broke_sandbox"
    assert (status.attempts[0].reason or "").startswith("clear_grading_files: ")


def test_an_outage_before_any_agent_acted_is_retried_even_when_scoring() -> None:
    """The control: nothing an agent did can have caused it."""
    world = World(missing_users={"ghost"})
    folder = three_steps(toml='[agent]\nuser = "ghost"\n')
    status = run(folder, world=world, retries=1, agent_outages="score")[0]
    assert (status.outcome, status.failure_kind, status.attempt) == ("Ungraded", "outage:user_switch", 2)
