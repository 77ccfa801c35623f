"""The runner with the real supervisor, real bash and real users, each pod a local namespace.

What test_job_wiring.py checks against the in-memory model, checked once against the thing
itself (see local_sandbox.py): jobs run as their users, in /app, with their environments and
within their time limits; a turn's grading files are gone before the next turn's agent; each
turn keeps its own agent log, and the logs are listed in the order the turns ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from episode_operator.api.episode_resource import AgentSpec, EpisodeStatus, RetryPolicy
from episode_operator.runtime.episode import EpisodeConfig, EpisodeRunner
from episode_operator.runtime.episode_store import EpisodeBlobs, KeptLog
from episode_operator.runtime.episode_store import kept_logs as store_logs
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from tests.unit.fake_sandbox import FakeSink
from tests.unit.folders import multi_step, single_step, steps_toml
from tests.unit.local_sandbox import LocalPods, LocalProvider

KILLED_BY_TERM = 143
# test.sh's helper: 1 when its two arguments are equal, else 0 (and why, on stderr).
SCORE = 'score() { if [ "$1" = "$2" ]; then echo 1; else echo "want [$2], got [$1]" >&2; echo 0; fi; }\n'


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[LocalPods]:
    local = LocalPods(tmp_path / "local")
    try:
        yield local
    finally:
        for name in local.names():
            local.kill(name)
        local.end_streams()


def run(
    folder: dict[str, str], pods: LocalPods, store: EpisodeBlobs, *, agent: dict[str, Any] | None = None
) -> EpisodeStatus:
    files = TaskFiles.from_mapping(folder)
    plan = resolve_plan(load_task(files))
    config = EpisodeConfig(
        plan=plan,
        files=files,
        agent=AgentSpec.model_validate(agent or {"kind": "oracle"}),
        digest=files.digest(),
        retries=RetryPolicy(outages=0),
    )
    runner = EpisodeRunner(config, LocalProvider(pods, plan.main_env), FakeSink(), store)
    return asyncio.run(runner.run(None))


def logs_of(store: EpisodeBlobs) -> list[KeptLog]:
    return asyncio.run(store_logs(store))


def kept_logs(store: EpisodeBlobs) -> str:
    return "".join(f"--- {log.turn}/{log.name}\n{log.data.decode()}" for log in logs_of(store))


def test_every_job_runs_as_its_user_in_the_working_directory_with_its_environment(
    pods: LocalPods, tmp_path: Path
) -> None:
    toml = (
        '[agent]\nuser = "agent"\n[verifier]\nuser = "grader"\n[verifier.env]\nGRADER_KEY = "k"\n'
        '[solution.env]\nHINT = "h"\n'
        + steps_toml(
            "a",
            "b",
            extra={
                "b": 'artifacts = ["/app/setup-b.txt", "/app/agent-b.txt"]\n[steps.agent]\nuser = "bob"\n'
                '[steps.verifier]\nenvironment_mode = "separate"\n'
            },
        )
    )
    check = (
        'setup=$(score "$(cat /app/setup-{step}.txt)" "{user} /app /home/{user}")\n'
        + 'agent=$(score "$(cat /app/agent-{step}.txt)" "{user} /app h noninteractive")\n'
        + 'verifier=$(score "$(id -un) $PWD $HOME $GRADER_KEY" "grader /app /home/grader k")\n'
        + 'echo "{{\\"reward\\": $((setup * agent * verifier)), \\"setup\\": $setup, \\"agent\\": $agent, '
        + '\\"verifier\\": $verifier}}" > /logs/verifier/reward.json\n'
    )
    folder = multi_step(
        toml,
        ["a", "b"],
        {
            f"steps/{step}/{path}": content
            for step, user in (("a", "agent"), ("b", "bob"))
            for path, content in {
                "workdir/setup.sh": f'echo "$(id -un) $PWD $HOME" > setup-{step}.txt\n',
                "solution/solve.sh": f'echo "$(id -un) $PWD $HINT $DEBIAN_FRONTEND" > agent-{step}.txt\n',
                "tests/test.sh": SCORE + check.format(step=step, user=user),
            }.items()
        },
    )
    store = EpisodeBlobs.local(tmp_path / "store")
    status = run(folder, pods, store)
    assert [turn.verifier_rewards for turn in status.turns] == [
        {"reward": 1.0, "setup": 1.0, "agent": 1.0, "verifier": 1.0}
    ] * 2, kept_logs(store)
    assert status.verifier_mode == "mixed" and "pod-a1-v2" in pods.names()


def test_an_agent_is_bound_by_its_budget(pods: LocalPods, tmp_path: Path) -> None:
    """1 s for the agent, the verifier's 600 s left alone: a solve.sh of 3 s is killed at 1 s."""
    folder = single_step(
        "[agent]\ntimeout_sec = 1\n",
        {
            "solution/solve.sh": "touch /app/started; sleep 3; touch /app/late\n",
            "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        },
    )
    store = EpisodeBlobs.local(tmp_path / "store")
    turn = run(folder, pods, store).turns[0]
    assert (turn.agent_exit_code, turn.reward) == (KILLED_BY_TERM, 1.0), kept_logs(store)
    assert pods.path("pod-a1", "/app/started").exists() and not pods.path("pod-a1", "/app/late").exists()


def test_a_verifier_is_bound_by_its_budget(pods: LocalPods, tmp_path: Path) -> None:
    """1 s for test.sh, the agent's 28 800 s left alone: a test.sh of 3 s is killed at 1 s."""
    folder = single_step(
        "[verifier]\ntimeout_sec = 1\n", {"tests/test.sh": "sleep 3; echo 1 > /logs/verifier/reward.txt\n"}
    )
    store = EpisodeBlobs.local(tmp_path / "store")
    turn = run(folder, pods, store).turns[0]
    assert turn.reward_valid is False, kept_logs(store)
    assert (turn.message or "").startswith("no valid reward file (the verifier timed out)")


def test_setup_sh_is_bound_by_the_step_budget(pods: LocalPods, tmp_path: Path) -> None:
    folder = multi_step(
        steps_toml("a", extra={"a": "[steps.agent]\ntimeout_sec = 1\n"}),
        ["a"],
        {"steps/a/workdir/setup.sh": "sleep 30; touch /app/late\n", "steps/a/solution/solve.sh": "true\n"},
    )
    status = run(folder, pods, EpisodeBlobs.local(tmp_path / "store"))
    assert (status.outcome, status.failure_kind, status.turns[0].message) == (
        "TerminalFailure",
        "harbor:step_setup_failed",
        "setup.sh ran out of its time bound",
    )
    assert not pods.path("pod-a1", "/app/late").exists()


def test_a_turns_grading_files_are_gone_before_the_next_turns_agent(pods: LocalPods, tmp_path: Path) -> None:
    """Turn b's agent (as nobody) lists /tests and /logs/verifier; a listing that fails says so."""
    look = (
        'listing() { if found=$(ls -A "$1" 2>&1); then echo $found; else echo "unreadable: $found"; fi; }\n'
        'echo "tests=$(listing /tests)" > /app/observed.txt\n'
        'echo "verifier=$(listing /logs/verifier)" >> /app/observed.txt\n'
    )
    folder = multi_step(
        steps_toml("a", "b", extra={"b": '[steps.agent]\nuser = "nobody"\n'}),
        ["a", "b"],
        {
            "steps/a/solution/solve.sh": "true\n",
            "steps/a/tests/test.sh": "echo a > /logs/verifier/left-behind.txt; echo 1 > /logs/verifier/reward.txt\n",
            "steps/b/solution/solve.sh": look,
        },
    )
    store = EpisodeBlobs.local(tmp_path / "store")
    status = run(folder, pods, store)
    assert [turn.reward for turn in status.turns] == [1.0, 1.0], kept_logs(store)
    assert pods.path("pod-a1", "/app/observed.txt").read_text() == "tests=\nverifier=\n"


def test_each_turn_keeps_its_own_agent_log_and_logs_are_listed_in_run_order(pods: LocalPods, tmp_path: Path) -> None:
    """The oracle's solve.sh of every turn appends to /logs/agent/oracle.txt; ``kubectl episode
    logs`` prints each turn's own part, turns in the order they ran (not one, three, two)."""
    steps = ["one", "two", "three"]
    folder = multi_step(
        steps_toml(*steps),
        steps,
        {f"steps/{step}/solution/solve.sh": f"echo output of {step}\n" for step in steps},
    )
    store = EpisodeBlobs.local(tmp_path / "store")
    status = run(folder, pods, store)
    assert status.reward == 1.0
    assert [(log.turn, log.name) for log in logs_of(store)] == [
        (step, job) for step in steps for job in ("agent", "verifier")
    ]
    agent_logs = [log.data.decode() for log in logs_of(store) if log.name == "agent"]
    assert agent_logs == [f"output of {step}\n" for step in steps]
    everything = "".join(agent_logs)
    assert pods.path("pod-a1", "/logs/agent/oracle.txt").read_text() == everything


# A non-root agent's turn 2: answer, or plant a reward and leave processes that keep at the grading
# folders — writing the reward, renaming a test.sh of their own over the verifier's, making a job
# record — while the verifier runs (as root).
ANSWER = "echo 42 > /app/answer.txt"
FORGER = (
    "echo 1 > /logs/verifier/reward.txt; "
    "nohup sh -c 'while :; do echo 1 > /logs/verifier/reward.txt; "
    'printf "echo 1 > /logs/verifier/reward.txt\\n" > /tmp/forged.sh; mv -f /tmp/forged.sh /tests/test.sh; '
    "mkdir -p /episode-operator/jobs/forged; sleep 0.01; done' >/dev/null 2>&1 &"
)
ANSWER_CHECK = (
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
)


@pytest.mark.parametrize("attack", [False, True], ids=["honest", "leftover-forger"])
def test_a_non_root_agents_leftover_processes_cannot_reach_the_verifiers_folders(
    pods: LocalPods, tmp_path: Path, attack: bool
) -> None:
    """After a shared turn the grading folders are the agent's (mode 0777, as Gym leaves them); while
    the next turn verifies they are root's: the verifier reads only its own reward, untouched."""
    act = FORGER if attack else ANSWER
    folder = multi_step(
        '[agent]\nuser = "agent"\n' + steps_toml("a", "b"),
        ["a", "b"],
        {"steps/a/tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n", "steps/b/tests/test.sh": ANSWER_CHECK},
    )
    command = f'if [ "$EPISODE_TURN" = 2 ]; then\n{act}\nfi'
    store = EpisodeBlobs.local(tmp_path / "store")
    status = run(folder, pods, store, agent={"kind": "command", "command": command})
    second = status.turns[1]
    assert (second.reward, second.reward_valid) == (0.0 if attack else 1.0, True), kept_logs(store)
    assert not pods.path("pod-a1", "/episode-operator/jobs/forged").exists()


# Harbor's own example tasks check the layout in their solutions: a solve.sh that looks for
# /logs/verifier to tell a shared verifier, and writes where the verifier will look.
LAYOUT_SOLVE = (
    "for d in /logs/agent /logs/verifier /logs/artifacts; do\n"
    '  [ -d "$d" ] && [ "$(stat -c %a "$d")" = 777 ] || { echo "no $d" >&2; exit 1; }\n'
    "done\n"
    # What Harbor's `docker compose cp` of solution/ and its `chmod +x` leave.
    '[ "$(stat -c "%U %a" /solution)" = "root 755" ] && [ -x /solution/solve.sh ] || exit 1\n'
    "echo done > /logs/artifacts/made-by-solve.txt\n"
)
# test.sh is made executable before it runs, as Harbor's verifier does.
LAYOUT_CHECK = (
    "if [ -f /logs/artifacts/made-by-solve.txt ] && [ -x /tests/test.sh ]; then echo 1; else echo 0; fi"
    " > /logs/verifier/reward.txt\n"
)


@pytest.mark.parametrize("mode", ["shared", "separate"])
@pytest.mark.parametrize("user", [None, "agent"], ids=["root", "non-root"])
def test_a_solution_finds_harbors_layout_during_its_turn(
    pods: LocalPods, tmp_path: Path, mode: str, user: str | None
) -> None:
    toml = (f'[agent]\nuser = "{user}"\n' if user else "") + (
        '[verifier]\nenvironment_mode = "separate"\n' if mode == "separate" else ""
    )
    folder = single_step(toml, {"solution/solve.sh": LAYOUT_SOLVE, "tests/test.sh": LAYOUT_CHECK})
    store = EpisodeBlobs.local(tmp_path / "store")
    status = run(folder, pods, store)
    assert (status.reward, status.turns[0].agent_exit_code) == (1.0, 0), kept_logs(store)
