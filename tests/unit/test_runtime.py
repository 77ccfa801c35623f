"""The episode runner against the in-memory sandbox: Gym's turn semantics and crash safety."""

from __future__ import annotations

import asyncio
import io
import tarfile
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.vocabulary import Stage
from episode_operator.runtime.archive import text_tar
from episode_operator.runtime.sandbox_protocol import JobSpec, keyed_job_id
from episode_operator.runtime.turn.table import is_published
from tests.unit.episodes import run, three_steps
from tests.unit.fake_sandbox import Crash, FakeSink, World
from tests.unit.folders import multi_step, single_step, steps_toml


# --- scoring ---------------------------------------------------------------------------------
def test_single_step_oracle_is_graded() -> None:
    folder = single_step(files={"solution/solve.sh": "write hello.txt hi", "tests/test.sh": "check hello.txt hi"})
    status, world, sink, _ = run(folder)
    assert (status.phase, status.outcome, status.reward, status.progress) == ("Succeeded", "Graded", 1.0, "1/1")
    assert status.verifier_mode == "shared" and status.stopped_after_turn is None
    assert [t.phase for t in status.turns] == ["Succeeded"]
    assert "all" in world.released
    assert [reason for reason, _, _ in sink.events] == ["TurnStarted", "TurnFinished", "EpisodeFinished"]
    assert {c.type: c.status for c in status.conditions} == {"Running": "False", "Complete": "True"}


@pytest.mark.parametrize(("strategy", "expected"), [("mean", 0.5), ("final", 0.25)])
def test_mean_and_final_roll_up(strategy: str, expected: float) -> None:
    folder = three_steps(toml=f'multi_step_reward_strategy = "{strategy}"\n', rewards=("1", "0.25", "0.25"))
    status = run(folder)[0]
    assert status.reward == expected
    assert [t.reward for t in status.turns] == [1.0, 0.25, 0.25]


def test_min_reward_miss_stops_with_stopped_after_turn() -> None:
    folder = three_steps(extra={"b": "min_reward = 0.5\n"}, rewards=("1", "0.25", "1"))
    status = run(folder)[0]
    assert status.stopped_after_turn == "b"
    assert [t.phase for t in status.turns] == ["Succeeded", "Succeeded", "Skipped"]
    assert status.reward == pytest.approx(0.625)
    assert status.progress == "2/3"
    assert "min_reward missed" in (status.turns[1].message or "")


def test_min_reward_table_with_components() -> None:
    folder = three_steps(
        extra={"a": "min_reward = { core = 0.5 }\n"},
        files={"steps/a/tests/test.sh": 'reward-json {"reward": 0.2, "core": 0.5}'},
    )
    status = run(folder)[0]
    assert status.stopped_after_turn is None
    assert status.verifier_rewards == {"core": pytest.approx(0.5 / 3), "reward": pytest.approx(2.2 / 3)}


def test_setup_failing_at_step_one_is_terminal() -> None:
    folder = three_steps(files={"steps/a/workdir/setup.sh": "exit 1"})
    status, world, _, _ = run(folder)
    assert (status.phase, status.outcome, status.failure_kind) == (
        "Failed",
        "TerminalFailure",
        "harbor:step_setup_failed",
    )
    assert status.reward is None
    assert len(status.attempts) == 1  # not retried
    assert status.turns[0].failure_kind == "harbor:step_setup_failed"
    assert "a1.t1.agent" not in world.sandboxes["pod-a1"].starts  # no agent ran


def test_setup_failing_at_step_two_is_a_measured_zero() -> None:
    folder = three_steps(files={"steps/b/workdir/setup.sh": "timeout"})
    status = run(folder)[0]
    assert (status.phase, status.outcome, status.reward) == ("Succeeded", "Graded", 0.5)
    assert status.turns[1].failure_kind == "harbor:step_setup_failed"
    assert status.failure_kind == "harbor:step_setup_failed"
    assert status.stopped_after_turn == "b"
    assert [t.phase for t in status.turns] == ["Succeeded", "Failed", "Skipped"]


def test_workdir_that_cannot_unpack() -> None:
    world = World(broken_uploads={"/app"})
    folder = three_steps(files={"steps/b/workdir/data.txt": "x"})
    # Turn 1 has no workdir; turn 2's cannot unpack.
    status = run(folder, world=world)[0]
    assert status.turns[1].failure_kind == "harbor:step_workdir_failed" and status.reward == 0.5


def test_step_healthcheck_passes_after_its_start_period() -> None:
    check = (
        '[steps.healthcheck]\ncommand = "pass-after 7"\n'
        "start_period_sec = 5\nstart_interval_sec = 2\ninterval_sec = 2\n"
    )
    passing = run(three_steps(extra={"b": check + "retries = 2\n"}))[0]
    assert passing.reward == 1.0
    failing = run(three_steps(extra={"b": check + "retries = 0\n"}))[0]
    assert failing.turns[1].failure_kind == "harbor:step_healthcheck_failed"
    assert failing.reward == 0.5


def test_no_reward_file_is_a_measured_zero_that_ends_the_episode() -> None:
    folder = three_steps(files={"steps/b/tests/test.sh": "echo nothing"})
    status = run(folder)[0]
    assert status.reward == 0.5 and status.stopped_after_turn == "b"
    assert status.turns[1].reward_valid is False and status.turns[1].reward == 0.0
    assert "no valid reward file" in (status.turns[1].message or "")


def test_reward_json_beats_reward_txt_and_exit_status_is_ignored() -> None:
    folder = single_step(files={"tests/test.sh": 'reward-json {"reward": 0.75}\nreward 1\nexit 7'})
    assert run(folder)[0].reward == 0.75


def test_unstartable_verifier_masks_the_episode() -> None:
    status = run(three_steps(files={"steps/b/tests/test.sh": "unstartable"}))[0]
    assert (status.phase, status.outcome, status.reward, status.failure_kind) == (
        "Failed",
        "Masked",
        None,
        "harbor:verifier_error",
    )


# --- turn mechanics --------------------------------------------------------------------------
# Turn b's own files decide which exec carries the cleanup of turn a's grading files.
@pytest.mark.parametrize(
    ("turn_b", "clears"),
    [({}, 0), ({"steps/b/workdir/notes.txt": "n"}, 0), ({"steps/b/workdir/setup.sh": "exit 0"}, 0)],
    ids=["agent-upload", "workdir-upload", "workdir-with-setup"],
)
def test_grading_files_of_a_shared_turn_are_gone_before_the_next_turn_runs_code(
    turn_b: dict[str, str], clears: int
) -> None:
    """Gym's cleanup, carried by the first exec of turn b: no task code of b sees a's tests or reward."""
    seen: dict[str, tuple[bool, bool]] = {}

    def look(name: str) -> Any:
        def hook(sandbox: Any, spec: Any) -> None:
            files = sandbox.files["main"]
            seen[name] = (any(n.startswith("/tests/") for n in files), "/logs/verifier/reward.txt" in files)

        return hook

    world = World(hooks={"t2.agent": look("agent"), "t2.setup": look("setup")})
    status = run(three_steps(files=turn_b), world=world)[0]
    assert status.reward == 1.0
    assert set(seen.values()) == {(False, False)}
    assert ("setup" in seen) == ("steps/b/workdir/setup.sh" in turn_b)
    assert world.sandboxes["pod-a1"].calls["clear"] == clears


def test_grading_files_before_a_healthcheck_are_cleared_in_an_exec_of_their_own() -> None:
    toml = '[steps.healthcheck]\ncommand = "pass-after 0"\n'
    world = World()
    status = run(three_steps(extra={"b": toml}), world=world)[0]
    assert status.reward == 1.0
    assert world.sandboxes["pod-a1"].calls["clear"] == 1


@pytest.mark.parametrize(
    ("turn_b", "agent"),
    [
        ({}, {"kind": "oracle"}),
        ({}, {"kind": "command", "command": "true"}),
        ({"steps/b/workdir/notes.txt": "n"}, {"kind": "oracle"}),
        ({}, {"kind": "nop"}),
    ],
    ids=["oracle-upload", "instruction-upload", "workdir-upload", "own-exec"],
)
def test_failing_to_clear_grading_files_is_an_outage(turn_b: dict[str, str], agent: dict[str, str]) -> None:
    world = World(unclearable={"/logs/agent/trajectory.json"})  # only the cleanup between turns clears it
    status = run(three_steps(files=turn_b), world=world, retries=0, agent=agent)[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "outage:clear_grading_files")
    assert "previous turn's grading files" in (status.message or "")
    assert [t.phase for t in status.turns][:1] == ["Succeeded"]


def test_planted_grading_files_are_wiped_before_verification() -> None:
    folder = single_step(
        files={
            "solution/solve.sh": "write /tests/test.sh reward 1\nwrite /logs/verifier/reward.txt 1",
            "tests/test.sh": "echo honest verifier writes nothing",
        }
    )
    status = run(folder)[0]
    assert status.reward == 0.0 and status.turns[0].reward_valid is False


def test_workdir_replaces_earlier_files_and_keeps_the_rest() -> None:
    folder = three_steps(
        files={
            "steps/a/solution/solve.sh": "write notes.txt from-agent\nwrite keep.txt kept",
            "steps/b/workdir/notes.txt": "from-workdir",
            "steps/b/tests/test.sh": "check notes.txt from-workdir",
            "steps/c/tests/test.sh": "check keep.txt kept",
        }
    )
    status, world, _, _ = run(folder)
    assert [t.reward for t in status.turns] == [1.0, 1.0, 1.0]
    assert world.sandboxes["pod-a1"].files["main"]["/app/notes.txt"] == b"from-workdir"


def test_user_switch_between_steps() -> None:
    extra = {"b": '[steps.agent]\nuser = "bob"\n', "c": '[steps.agent]\nuser = "bob"\n'}
    status, world, _, _ = run(three_steps(extra=extra))
    assert world.sandboxes["pod-a1"].users == ["bob"]  # once: c keeps b's user
    assert status.reward == 1.0


def test_user_switch_failure_is_an_outage() -> None:
    world = World(missing_users={"ghost"})
    status = run(three_steps(extra={"b": '[steps.agent]\nuser = "ghost"\n'}), world=world, retries=1)[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "outage:user_switch")
    assert [a.number for a in status.attempts] == [1, 2]


def test_separate_verifier_gets_declared_artifacts_only() -> None:
    toml = steps_toml(
        "a",
        "b",
        extra={
            "b": 'artifacts = ["/app/publish"]\n[steps.verifier]\nenvironment_mode = "separate"\n',
        },
    )
    folder = multi_step(
        toml,
        ["a", "b"],
        {
            "steps/a/solution/solve.sh": "write draft.txt d",
            "steps/a/tests/test.sh": "check draft.txt d",
            "steps/b/solution/solve.sh": "write publish/final.txt f\nwrite /tmp/agent-only.txt secret",
            "steps/b/tests/test.sh": "check publish/final.txt f",
        },
    )
    status, world, _, store = run(folder)
    assert status.reward == 1.0 and status.verifier_mode == "mixed"
    verifier = world.sandboxes["pod-a1-v2"].files["main"]
    assert "/app/publish/final.txt" in verifier
    assert "/tmp/agent-only.txt" not in verifier and "/app/draft.txt" not in verifier
    # The agent pod is released before the last separate verifier; the verifier pod after it.
    assert world.released.index("pod-a1") < world.released.index("pod-a1-v2")
    manifest = store.manifests[(1, "b")]
    assert [(m["source"], m["status"], m["origin"]) for m in manifest] == [
        ("/logs/artifacts", "failed", "convention"),
        ("/app/publish", "ok", "step"),
    ]


def test_artifact_manifest_statuses() -> None:
    folder = single_step(
        'artifacts = ["/app/out", { source = "/app/out/x.txt", destination = "app/out/x.txt" }, "/missing"]\n',
        {"solution/solve.sh": "write out/x.txt 1\nwrite /logs/artifacts/.keep k", "tests/test.sh": "reward 1"},
    )
    status, _, _, store = run(folder)
    manifest = store.manifests[(1, "task")]
    assert [(m["source"], m["status"], m["type"]) for m in manifest] == [
        ("/logs/artifacts", "ok", "directory"),
        ("/app/out", "ok", "directory"),
        ("/app/out/x.txt", "skipped", "directory"),
        ("/missing", "failed", "directory"),
    ]
    assert status.turns[0].artifacts is not None
    assert (
        status.turns[0].artifacts.collected,
        status.turns[0].artifacts.skipped,
        status.turns[0].artifacts.failed,
    ) == (2, 1, 1)
    archive = store.artifacts[(1, "task")][1]  # archive N is manifest entry N
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.getnames() == ["app/out/x.txt"]


def test_collect_hooks_run_main_then_sidecars() -> None:
    order: list[str] = []
    world = World(
        hooks={
            ".collect.0": lambda s, spec: order.append(spec.container),
            ".collect.1": lambda s, spec: order.append(spec.container),
        }
    )
    folder = single_step(
        '[[verifier.collect]]\ncommand = "exit 3"\nservice = "api"\n[[verifier.collect]]\ncommand = "exit 0"\n',
        {"environment/docker-compose.yaml": "services:\n  api:\n    image: x\n", "tests/test.sh": "reward 1"},
    )
    status = run(folder, world=world)[0]
    assert order == ["main", "api"]
    assert status.reward == 1.0  # a failing hook is best effort


def test_command_agent_gets_the_instruction_file() -> None:
    captured: dict[str, Any] = {}

    def grab(sandbox: Any, spec: Any) -> None:
        captured.update(spec.env)
        captured["instruction"] = sandbox.files["main"][spec.env["EPISODE_INSTRUCTION_FILE"]]

    world = World(hooks={"t1.agent": grab})
    folder = single_step(files={"tests/test.sh": "reward 1"})
    run(folder, world=world, agent={"kind": "command", "command": "write x y"})
    assert captured["instruction"] == b"Do the thing.\n"
    assert (captured["EPISODE_TURN"], captured["EPISODE_TURN_NAME"], captured["EPISODE_TURNS"]) == ("1", "task", "1")


def test_nop_agent_runs_nothing() -> None:
    status, world, _, _ = run(single_step(files={"tests/test.sh": "reward 0"}), agent={"kind": "nop"})
    assert status.reward == 0.0
    assert not any(".agent" in job for job in world.sandboxes["pod-a1"].starts)


# --- outages and crash safety ------------------------------------------------------------------
def test_lost_pod_starts_a_fresh_attempt_from_turn_one() -> None:
    folder = three_steps(files={"steps/b/solution/solve.sh": "write b.txt x"})
    lost = {"done": False}

    def lose_once(sandbox: Any, spec: Any) -> None:
        if not lost["done"]:
            lost["done"] = True
            sandbox.lost = True

    world = World(hooks={"a1.t2.agent": lose_once})
    status = run(folder, world=world)[0]
    assert status.reward == 1.0 and status.attempt == 2
    assert [a.number for a in status.attempts] == [1, 2]
    assert (status.attempts[0].reason or "").startswith("pod_lost")
    assert world.sandboxes["pod-a2"].starts[:1] == ["a2.t1.agent"]


def test_exhausted_outages_end_ungraded() -> None:
    world = World(fail_creation=5)
    status = run(single_step(), world=world, retries=2)[0]
    assert (status.phase, status.outcome, status.failure_kind) == ("Failed", "Ungraded", "outage:image_pull")
    assert len(status.attempts) == 3 and status.reward is None


def test_keep_pods_on_failure() -> None:
    world = World()
    run(three_steps(files={"steps/a/workdir/setup.sh": "exit 1"}), world=world, keep_pods=True)
    assert world.kept is True and "all" not in world.released


# Every stage the runner publishes, as the stage table declares (runtime/turn/table.py).
SHARED_TURN_STAGES = [stage for stage in Stage if is_published(stage, separate=False)]
SEPARATE_TURN_STAGES = [stage for stage in Stage if is_published(stage, separate=True)]
SEPARATE = 'artifacts = ["/app/runs.txt"]\n[steps.verifier]\nenvironment_mode = "separate"\n'


def crash_and_resume(folder: dict[str, str], crash_stage: str) -> tuple[EpisodeStatus, World]:
    """The operator dies right after publishing turn 2's stage; a new runner resumes from that status."""
    world = World()

    def at_stage(status: EpisodeStatus) -> bool:
        return status.current_turn == 1 and status.turns[1].stage == crash_stage

    dying = FakeSink(crash_when=at_stage)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    last_written = dying.statuses[-1]
    assert last_written.turns[1].stage == crash_stage
    return run(folder, world=world, status=last_written)[0], world


def ledger_steps(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Three steps appending to one ledger; every stage has work, so every stage is published."""
    files = {f"steps/{name}/solution/solve.sh": f"append runs.txt {name}" for name in "abc"}
    files |= {f"steps/{name}/workdir/setup.sh": "exit 0" for name in "abc"}
    return three_steps(extra=extra, files={**files, "steps/c/tests/test.sh": "check runs.txt a\\nb\\nc\\n"})


@pytest.mark.parametrize("crash_stage", SHARED_TURN_STAGES)
def test_restart_resumes_without_running_a_turn_twice(crash_stage: str) -> None:
    status, world = crash_and_resume(ledger_steps(), crash_stage)
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 1)
    pod = world.sandboxes["pod-a1"]
    assert [job for job in pod.starts if job.endswith(".agent")] == ["a1.t1.agent", "a1.t2.agent", "a1.t3.agent"]
    assert pod.files["main"]["/app/runs.txt"] == b"a\nb\nc\n"


@pytest.mark.parametrize("crash_stage", SEPARATE_TURN_STAGES)
def test_restart_resumes_a_separately_verified_turn(crash_stage: str) -> None:
    status, world = crash_and_resume(ledger_steps({name: SEPARATE for name in "abc"}), crash_stage)
    assert (status.phase, status.reward, status.attempt, status.verifier_mode) == ("Succeeded", 1.0, 1, "separate")
    pod = world.sandboxes["pod-a1"]
    assert [job for job in pod.starts if job.endswith(".agent")] == ["a1.t1.agent", "a1.t2.agent", "a1.t3.agent"]
    assert world.sandboxes["pod-a1-v3"].files["main"]["/app/runs.txt"] == b"a\nb\nc\n"


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
@pytest.mark.parametrize("job", ["t2.setup", "t2.agent", "t2.verify"])
def test_restart_after_a_job_started_with_its_inputs(job: str, separate: bool) -> None:
    """The old runner's last exec started a job and placed its inputs (workdir/, the
    solution, the tests), then it died before its next status write: the new runner
    re-attaches without running anything twice or placing the inputs again, and the
    reward test.sh wrote survives."""
    folder = ledger_steps({name: SEPARATE for name in "abc"} if separate else None)
    world = World(crash_after={job})
    dying = FakeSink()
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    assert not world.crash_after
    status = run(folder, world=world, status=dying.statuses[-1])[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 1)
    pods = [world.sandboxes[name] for name in sorted(world.sandboxes)]
    starts = [job for pod in pods for job in pod.starts]
    assert len(starts) == len(set(starts)), starts
    agent_pod = world.sandboxes["pod-a1"]
    assert agent_pod.uploads.count("/app") == 3  # each turn's workdir/ merged once
    assert agent_pod.uploads.count("/solution") == 3
    assert sum(pod.uploads.count("/tests") for pod in pods) == 3
    # Each turn's own reward file was read: a re-cleared /logs/verifier would leave none.
    assert [(turn.reward, turn.reward_valid) for turn in status.turns] == [(1.0, True)] * 3


def test_restart_reattaches_to_a_running_agent_without_touching_its_inputs() -> None:
    """The old runner started turn 2's agent, then died: the new one must not re-place /solution."""
    world = World()
    folder = ledger_steps()

    def agent_started(status: EpisodeStatus) -> bool:
        return status.current_turn == 1 and status.turns[1].stage == "agent"

    dying = FakeSink(crash_when=agent_started)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying)
    pod = world.sandboxes["pod-a1"]
    # What the dead runner did after its last write: placed the solution and started the agent.
    solution = {"solve.sh": "append runs.txt b"}
    asyncio.run(pod.upload(text_tar(solution), "/solution", clear=["/solution/"]))
    key = dying.statuses[-1].attempts[-1].job_key
    assert key is not None
    job_id = keyed_job_id(key, "a1.t2.agent")
    asyncio.run(pod.start_job(JobSpec(id=job_id, command="bash /solution/solve.sh", timeout_sec=60)))
    uploads_before = list(pod.uploads)
    status = run(folder, world=world, status=dying.statuses[-1])[0]
    assert (status.phase, status.reward) == ("Succeeded", 1.0)
    assert [job for job in pod.starts if job.endswith(".agent")] == ["a1.t1.agent", "a1.t2.agent", "a1.t3.agent"]
    resumed_uploads = pod.uploads[len(uploads_before) :]
    assert resumed_uploads[0] == "/tests"  # turn 2 goes straight to verification
    assert pod.files["main"]["/app/runs.txt"] == b"a\nb\nc\n"


def test_deadline_is_a_retryable_failure() -> None:
    world = World()

    def slow_agent(sandbox: Any, spec: Any) -> None:
        world.clock.now += 120.0

    world.hooks["t1.agent"] = slow_agent
    status = run(single_step(), world=world, retries=0, plan_update={"deadline_sec": 60.0})[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "harbor:task_deadline")


def test_phase_network_overrides() -> None:
    """[agent] and [verifier] network overrides hold during their phase only; the baseline otherwise."""
    toml = (
        '[agent]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["10.0.0.1"]\n'
    )
    world = World()
    run(single_step(toml, {"tests/test.sh": "reward 1"}), world=world)
    assert world.networks == ["public", "no-network", "public", "allowlist"]


def test_reward_file_changed_after_test_sh_is_refused() -> None:
    """A process the agent left behind rewrites the reward after test.sh exited, before the
    supervisor noticed the exit and read the file: the turn counts 0."""
    world = World(notice_delay_sec=1.0)
    # The agent runs at 0 (answered at 1); test.sh from 1 to 11 (answered at 12); the leftover writes at 11.5.
    leftover = "later 11.5 write /logs/verifier/reward.txt 1"
    folder = single_step(files={"solution/solve.sh": leftover, "tests/test.sh": "reward 0\nsleep 10"})
    status, _, sink, _ = run(folder, world=world)
    assert (status.reward, status.turns[0].reward_valid) == (0.0, False)
    assert "changed after test.sh exited" in (status.turns[0].message or "")
    assert any(reason == "RewardTampered" for reason, _, _ in sink.events)


def current_turn_stages(sink: FakeSink) -> set[str]:
    """The stages a restart could resume at: the current turn's stage in each write while Running
    (but the ending's write, from which a restart repeats the ending and walks no turn)."""
    return {
        stage
        for status in sink.statuses
        if status.phase == "Running" and status.outcome is None and status.current_turn is not None
        if (stage := status.turns[status.current_turn].stage)
    }


def test_published_stages_are_exactly_those_a_restart_can_meet() -> None:
    sink = FakeSink()
    run(three_steps(files={"steps/b/workdir/setup.sh": "exit 0"}), sink=sink)
    seen = current_turn_stages(sink)
    assert seen == set(SHARED_TURN_STAGES)
    sink = FakeSink()
    run(ledger_steps({"b": SEPARATE}), sink=sink)
    seen = current_turn_stages(sink)
    assert seen == set(SEPARATE_TURN_STAGES)


def test_a_short_job_costs_one_call() -> None:
    """A job's inputs go with its start; output tail and reward files come back with its
    final state: no separate uploads or fetches."""
    world = World()
    run(single_step(files={"tests/test.sh": "reward 1"}), world=world)
    pod = world.sandboxes["pod-a1"]
    assert pod.uploads == ["/solution", "/tests"]  # each with its clear, in its job's start
    assert pod.calls == {"start_job": 2}  # solve.sh (its answer brings /logs/artifacts), test.sh


def test_the_agent_answer_brings_the_artifacts_unless_a_hook_runs_first() -> None:
    """/logs/artifacts rides with the agent job's final answer; a collect hook on main runs
    after the agent and may write there, so then collect downloads it after the hook."""
    solve = {"solution/solve.sh": "write /logs/artifacts/by-agent.txt a", "tests/test.sh": "reward 1"}
    world = World()
    _, _, _, store = run(single_step(files=solve), world=world)
    assert world.sandboxes["pod-a1"].calls == {"start_job": 2}
    with tarfile.open(fileobj=io.BytesIO(store.artifacts[(1, "task")][0])) as tar:
        assert tar.getnames() == ["logs/artifacts/by-agent.txt"]

    hook = '[[verifier.collect]]\ncommand = "true"\n'
    world = World(hooks={".collect.0": lambda pod, spec: pod._write("main", "/logs/artifacts/by-hook.txt", b"h")})
    _, _, _, store = run(single_step(hook, solve), world=world)
    assert world.sandboxes["pod-a1"].calls["download"] == 1
    with tarfile.open(fileobj=io.BytesIO(store.artifacts[(1, "task")][0])) as tar:
        assert sorted(tar.getnames()) == ["logs/artifacts/by-agent.txt", "logs/artifacts/by-hook.txt"]


def test_a_shared_turn_costs_three_execs_and_two_status_writes() -> None:
    """workdir/ + setup.sh, solution + solve.sh (its answer brings /logs/artifacts), tests +
    test.sh; the cleanup rides on the first upload. Writes: the turn's start (with the previous
    turn's end) and the agent's stage; once an episode, its ending before the pods go."""
    world, sink = World(), FakeSink()
    run(ledger_steps(), world=world, sink=sink)
    pod = world.sandboxes["pod-a1"]
    assert pod.calls == {"start_job": 9}
    running = [s for s in sink.statuses if s.phase == "Running" and any(turn.stage for turn in s.turns)]
    assert len([s for s in running if s.outcome is None]) == 2 * 3
    assert len([s for s in running if s.outcome is not None]) == 1
