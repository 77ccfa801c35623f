"""How the runner wires each job: as whom, where, with which environment and for how long.

The in-memory sandbox runs a job's script as the supervisor would (see fake_sandbox.py): in
the job's environment (with HOME and USER of its user), in its working directory, on the
fake clock, killed at its time limit. So each test here fails when the runner gives a job
the wrong user, environment, directory or limit; ``tests/mutations.py`` checks that they do.
"""

from __future__ import annotations

import io
import tarfile
from datetime import datetime

import pytest

from episode_operator.api.episode_resource import EpisodeStatus, TurnStatus
from tests.unit.episodes import run
from tests.unit.fake_sandbox import KILLED_BY_TERM, MemoryStore, World
from tests.unit.folders import multi_step, single_step, steps_toml


def seconds(turn: TurnStatus) -> float:
    """How long the turn took on the fake wall clock."""
    assert turn.started_at and turn.finished_at
    parse = datetime.fromisoformat
    return (parse(turn.finished_at) - parse(turn.started_at)).total_seconds()


def logs(store: MemoryStore) -> str:
    """Every kept log, for assertion messages (a failed ``expect`` says what it got)."""
    return "\n".join(f"{key}: {data.decode()}" for key, data in store.logs.items())


def graded(status: EpisodeStatus, store: MemoryStore) -> None:
    assert (status.phase, status.outcome, status.reward) == ("Succeeded", "Graded", 1.0), logs(store)


# --- as whom, with which environment ------------------------------------------------------------
def test_verifier_runs_as_its_user_with_its_environment() -> None:
    toml = '[verifier]\nuser = "grader"\n[verifier.env]\nGRADER_KEY = "k"\n'
    check = "expect $USER grader\nexpect $HOME /home/grader\nexpect $GRADER_KEY k\nreward 1"
    status, _, _, store = run(single_step(toml, {"tests/test.sh": check}))
    graded(status, store)


def test_a_steps_verifier_takes_its_own_user_and_adds_to_the_task_environment() -> None:
    toml = '[verifier]\nuser = "grader"\n[verifier.env]\nSHARED = "task"\nKEPT = "task"\n' + steps_toml(
        "a", extra={"a": '[steps.verifier]\nuser = "auditor"\n[steps.verifier.env]\nSHARED = "step"\n'}
    )
    check = "expect $USER auditor\nexpect $SHARED step\nexpect $KEPT task\nreward 1"
    folder = multi_step(toml, ["a"], {"steps/a/solution/solve.sh": "exit 0", "steps/a/tests/test.sh": check})
    status, _, _, store = run(folder)
    graded(status, store)


def test_separate_verifier_runs_as_its_user_with_its_environment() -> None:
    toml = '[verifier]\nenvironment_mode = "separate"\nuser = "grader"\n[verifier.env]\nGRADER_KEY = "k"\n'
    check = "expect $USER grader\nexpect $GRADER_KEY k\nreward 1"
    status, world, _, store = run(single_step(toml, {"tests/test.sh": check}))
    graded(status, store)
    assert "a1.t1.verify" in world.sandboxes["pod-a1-v1"].starts


def test_oracle_runs_as_the_agent_user_with_the_solution_environment() -> None:
    toml = '[agent]\nuser = "agent"\n[solution.env]\nHINT = "h"\n'
    solve = "expect $USER agent\nexpect $HINT h\nexpect $DEBIAN_FRONTEND noninteractive\nwrite done.txt ok"
    folder = single_step(toml, {"solution/solve.sh": solve, "tests/test.sh": "check done.txt ok"})
    status, _, _, store = run(folder)
    graded(status, store)


def test_the_solution_environment_is_the_oracles_alone() -> None:
    toml = '[solution.env]\nHINT = "h"\n'
    check = "expect x$HINT x\nreward 1"  # unset for the verifier
    status, _, _, store = run(single_step(toml, {"tests/test.sh": check}))
    graded(status, store)


def test_command_agent_and_its_setup_run_as_the_agent_user_with_the_turn_in_their_environment() -> None:
    toml = '[agent]\nuser = "agent"\n'
    turn = "expect $USER agent\nexpect $EPISODE_TURN 1\nexpect $EPISODE_TURNS 1\nexpect $EPISODE_TURN_NAME task"
    agent = {"kind": "command", "setup": f"{turn}\nwrite setup.txt ok", "command": f"{turn}\nwrite done.txt ok"}
    folder = single_step(toml, {"tests/test.sh": "check done.txt ok"})
    status, world, _, store = run(folder, agent=agent)
    graded(status, store)
    assert world.sandboxes["pod-a1"].files["main"]["/app/setup.txt"] == b"ok"


def test_setup_sh_and_the_step_healthcheck_run_as_the_step_agent_user() -> None:
    extra = '[steps.agent]\nuser = "bob"\n[steps.healthcheck]\ncommand = "expect $USER bob"\nretries = 0\n'
    folder = multi_step(
        steps_toml("a", extra={"a": extra}),
        ["a"],
        {
            "steps/a/workdir/setup.sh": "expect $USER bob\nwrite setup.txt ok",
            "steps/a/solution/solve.sh": "expect $USER bob",
            "steps/a/tests/test.sh": "check setup.txt ok",
        },
    )
    status, _, _, store = run(folder)
    graded(status, store)


def test_collect_hooks_run_as_their_user() -> None:
    hook = '[[verifier.collect]]\ncommand = "expect $USER collector\\nwrite /logs/artifacts/hook.txt ok"\n'
    toml = hook + 'user = "collector"\n'
    status, _, _, store = run(single_step(toml, {"tests/test.sh": "reward 1"}))
    graded(status, store)
    manifest = store.manifests[(1, "task")]
    assert manifest[0]["status"] == "ok", logs(store)
    with tarfile.open(fileobj=io.BytesIO(store.artifacts[(1, "task")][0])) as archive:
        assert archive.getnames() == ["logs/artifacts/hook.txt"]


# --- where --------------------------------------------------------------------------------------
def test_every_job_runs_in_the_working_directory() -> None:
    """Relative paths of setup.sh, the healthcheck, the agent, a collect hook and test.sh all land in /app."""
    here = "expect $PWD /app\nwrite {}.txt here"
    toml = steps_toml(
        "a",
        extra={"a": f'[steps.healthcheck]\ncommand = "{here.format("healthcheck").replace(chr(10), chr(92) + "n")}"\n'},
    )
    toml = f'[[verifier.collect]]\ncommand = "{here.format("hook").replace(chr(10), chr(92) + "n")}"\n' + toml
    folder = multi_step(
        toml,
        ["a"],
        {
            "steps/a/workdir/setup.sh": here.format("setup"),
            "steps/a/solution/solve.sh": here.format("agent"),
            "steps/a/tests/test.sh": here.format("verifier") + "\nreward 1",
        },
    )
    status, world, _, store = run(folder)
    graded(status, store)
    files = world.sandboxes["pod-a1"].files["main"]
    assert {name for name in files if name.endswith(".txt") and name.startswith("/app/")} == {
        f"/app/{job}.txt" for job in ("setup", "healthcheck", "agent", "hook", "verifier")
    }


# --- for how long -------------------------------------------------------------------------------
def test_an_agent_past_its_budget_is_killed_and_the_verifier_still_decides() -> None:
    toml = "[agent]\ntimeout_sec = 30\n"
    solve = "write started.txt 1\nsleep 60\nwrite finished.txt 1"
    folder = single_step(toml, {"solution/solve.sh": solve, "tests/test.sh": "check started.txt 1"})
    status, world, _, store = run(folder)
    graded(status, store)
    turn = status.turns[0]
    assert (turn.agent_exit_code, turn.message) == (KILLED_BY_TERM, "the agent ran out of its 30 s budget")
    assert "/app/finished.txt" not in world.sandboxes["pod-a1"].files["main"]
    assert seconds(turn) == 30  # killed at its limit, not when it would have ended


def test_an_agent_within_its_budget_is_waited_for_across_polls() -> None:
    """A job longer than one long poll (30 s here): the runner polls until it ends."""
    toml = "[agent]\ntimeout_sec = 300\n"
    folder = single_step(
        toml, {"solution/solve.sh": "sleep 100\nwrite done.txt 1", "tests/test.sh": "check done.txt 1"}
    )
    status, world, _, store = run(folder)
    graded(status, store)
    assert world.sandboxes["pod-a1"].calls["wait_job"] >= 3
    assert seconds(status.turns[0]) == 100


def test_a_verifier_past_its_budget_leaves_no_valid_reward() -> None:
    toml = "[verifier]\ntimeout_sec = 20\n"
    status, _, _, store = run(single_step(toml, {"tests/test.sh": "sleep 30\nreward 1"}))
    assert (status.reward, status.turns[0].reward_valid) == (0.0, False), logs(store)
    assert (status.turns[0].message or "").startswith("no valid reward file (the verifier timed out)")
    assert seconds(status.turns[0]) == 20


def test_setup_sh_past_its_bound_fails_the_step() -> None:
    """setup.sh is bounded by the step's agent budget (Gym's default)."""
    folder = multi_step(
        steps_toml("a", extra={"a": "[steps.agent]\ntimeout_sec = 50\n"}),
        ["a"],
        {"steps/a/workdir/setup.sh": "sleep 100\nwrite late.txt 1"},
    )
    status, world, _, store = run(folder)
    assert (status.outcome, status.failure_kind) == ("TerminalFailure", "harbor:step_setup_failed"), logs(store)
    assert status.turns[0].message == "setup.sh ran out of its time bound"
    assert "/app/late.txt" not in world.sandboxes["pod-a1"].files["main"]


def test_a_collect_hook_past_its_bound_is_killed() -> None:
    toml = '[[verifier.collect]]\ncommand = "sleep 10\\nwrite /logs/artifacts/late.txt x"\ntimeout_sec = 5\n'
    status, _, _, store = run(single_step(toml, {"tests/test.sh": "reward 1"}))
    graded(status, store)
    assert store.manifests[(1, "task")][0]["status"] == "failed"  # /logs/artifacts was never written


# --- what the supervisor reports ------------------------------------------------------------------
@pytest.mark.parametrize("retries", [0, 1])
def test_a_job_the_supervisor_loses_is_an_outage(retries: int) -> None:
    """The supervisor no longer knows a running job (its record is gone): the attempt is lost."""
    world = World()
    folder = single_step(files={"solution/solve.sh": "sleep 40\nvanish\nsleep 100"})
    status = run(folder, world=world, retries=retries)[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "outage:lost_job")
    assert [attempt.reason for attempt in status.attempts] == [
        "lost_job: job a1.t1.agent vanished from the sandbox"
    ] + ["lost_job: job a2.t1.agent vanished from the sandbox"] * retries


def test_each_turn_keeps_only_its_own_agent_log() -> None:
    """Every turn's solve.sh appends to /logs/agent/oracle.txt; each turn's kept log is its own part."""
    folder = multi_step(
        steps_toml("a", "b"),
        ["a", "b"],
        {
            "steps/a/solution/solve.sh": "echo from turn a",
            "steps/b/solution/solve.sh": "echo from turn b",
            "tests/test.sh": "reward 1",
        },
    )
    _, world, _, store = run(folder)
    assert store.logs[(1, "b", "agent")] == b"from turn b\n"
    assert world.sandboxes["pod-a1"].files["main"]["/logs/agent/oracle.txt"] == b"from turn a\nfrom turn b\n"
