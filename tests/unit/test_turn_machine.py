"""The turn's declared state machine: the table's shape, and that what it declares holds.

The restart column is checked by killing the runner inside every stage of a turn (before its
step does anything) and resuming from the status it last wrote: the resumed runner must start
at the stage the table says (:func:`resumes_at`), run no job twice, place no input twice and
score every turn as an uninterrupted run does.
"""

from __future__ import annotations

from typing import Any

import pytest

from episode_operator.api.vocabulary import Stage
from episode_operator.runtime import episode as episode_module
from episode_operator.runtime.turn.table import TURN, Published, StageRow, is_published, resumes_at
from tests.unit.fake_sandbox import Crash, FakeSink, MemoryStore, World
from tests.unit.test_runtime import SEPARATE, ledger_steps, run, three_steps


def test_every_stage_has_one_row_and_the_rows_chain_to_done() -> None:
    assert list(TURN) == list(Stage)
    chain, stage = [], Stage.CLEANUP
    while stage is not None:
        chain.append(stage)
        stage = TURN[stage].next
    assert chain == list(Stage)


def test_unpublished_rows_say_where_a_restart_resumes() -> None:
    for stage in TURN:
        for separate in (False, True):
            if not is_published(stage, separate):
                assert resumes_at(stage, separate) != stage
    assert all(row.restart for row in TURN.values())
    assert [stage for stage, row in TURN.items() if row.published is Published.NEVER] == [
        Stage.WORKDIR,
        Stage.SETUP,
        Stage.HEALTHCHECK,
        Stage.TRAJECTORY,
        Stage.COLLECT,
    ]


def crash_inside(monkeypatch: pytest.MonkeyPatch, stage: Stage, turn: int) -> None:
    """The runner dies as ``stage`` of turn ``turn`` (0-based) begins, once."""
    original = TURN[stage]
    fired = {"done": False}

    async def dying_step(run_: Any) -> None:
        if run_.index == turn and not fired["done"]:
            fired["done"] = True
            raise Crash(f"the operator died in {stage} of turn {turn + 1}")
        await original.step(run_)

    table = dict(TURN)
    table[stage] = StageRow(dying_step, original.next, original.published, original.network, original.restart)
    monkeypatch.setattr(episode_module, "TURN", table)


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
@pytest.mark.parametrize("turn", [1, 2], ids=["middle-turn", "last-turn"])
@pytest.mark.parametrize("stage", list(Stage))
def test_a_restart_inside_any_stage_resumes_where_the_table_says(
    monkeypatch: pytest.MonkeyPatch, stage: Stage, turn: int, separate: bool
) -> None:
    folder = ledger_steps({name: SEPARATE for name in "abc"} if separate else None)
    world, store, dying = World(), MemoryStore(), FakeSink()
    crash_inside(monkeypatch, stage, turn)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying, store=store)
    monkeypatch.undo()
    last_written = dying.statuses[-1]
    assert last_written.turns[turn].stage == resumes_at(stage, separate)
    status = run(folder, world=world, status=last_written, store=store)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 1)
    assert [(t.reward, t.reward_valid, t.stage) for t in status.turns] == [(1.0, True, Stage.DONE)] * 3
    pods = [world.sandboxes[name] for name in sorted(world.sandboxes)]
    starts = [job for pod in pods for job in pod.starts]
    assert len(starts) == len(set(starts)), starts
    agent_pod = world.sandboxes["pod-a1"]
    assert [job for job in agent_pod.starts if job.endswith(".agent")] == ["a1.t1.agent", "a1.t2.agent", "a1.t3.agent"]
    assert agent_pod.uploads.count("/solution") == 3
    assert sum(pod.uploads.count("/tests") for pod in pods) == 3
    ledger = world.sandboxes["pod-a1-v3" if separate else "pod-a1"].files["main"]["/app/runs.txt"]
    assert ledger == b"a\nb\nc\n"


def test_the_gate_is_decided_once_and_recorded() -> None:
    folder = three_steps(extra={"a": "min_reward = 0.5\n", "b": "min_reward = 0.5\n"}, rewards=("1", "0.25", "1"))
    status = run(folder)[0]
    assert [t.gate for t in status.turns] == ["passed", "missed", None]
    assert status.stopped_after_turn == "b"


def test_a_restart_after_a_missed_gate_reads_the_recorded_gate() -> None:
    """Resumed at turn 2's ``done``, the runner stops on the gate recorded in the status, not a new one."""
    folder = three_steps(extra={"b": "min_reward = 0.5\n"}, rewards=("1", "0.25", "1"))
    status, world = run(folder)[:2]
    resumed = status.model_copy(deep=True)
    resumed.phase, resumed.outcome, resumed.current_turn, resumed.stopped_after_turn = "Running", None, 1, None
    resumed.turns[2].phase = "Pending"
    # A status written by a runner that recorded a pass (e.g. an older gate): the record decides.
    resumed.turns[1].gate = "passed"
    world.gone.clear()  # the pods, as the runner that wrote this status left them
    again = run(folder, world=world, status=resumed)[0]
    assert again.stopped_after_turn is None and again.turns[2].stage == Stage.DONE


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_a_verifier_that_cannot_receive_its_tests_masks_the_episode(separate: bool) -> None:
    """docs/task-format.md §3.3: no tar (or another tool test.sh needs) in the verifier: masked, not retried."""
    folder = ledger_steps({name: SEPARATE for name in "abc"} if separate else None)
    world = World(broken_uploads={"/tests"})
    status = run(folder, world=world, retries=2)[0]
    assert (status.phase, status.outcome, status.failure_kind) == ("Failed", "Masked", "harbor:verifier_error")
    assert status.attempt == 1 and "cannot start test.sh" in (status.message or "")


def test_a_separate_verifier_that_cannot_receive_the_artifacts_masks_the_episode() -> None:
    folder = ledger_steps({name: SEPARATE for name in "abc"})
    world = World(broken_uploads={"/"})
    status = run(folder, world=world, retries=2)[0]
    assert (status.outcome, status.failure_kind, status.attempt) == ("Masked", "harbor:verifier_error", 1)
    assert "cannot place the artifacts in the verifier's sandbox" in (status.message or "")


def test_stage_timings_are_observed_per_stage() -> None:
    seen: list[str] = []

    class Observer:
        def phase_finished(self, phase: str, seconds: float) -> None:
            seen.append(phase)

        def turn_finished(self, result: str, failure_kind: str | None) -> None: ...

        def outage(self, kind: str) -> None: ...

        def episode_finished(self, outcome: str, failure_kind: str | None, reward: float | None) -> None: ...

    status = run(three_steps(), observer=Observer())[0]
    assert status.reward == 1.0
    assert seen[:3] == ["seed-images", "pod_start", "seed-sandbox"]
    assert [phase for phase in seen if phase in ("agent", "verify")] == ["agent", "verify"] * 3


class WatchingSink(FakeSink):
    """A sink that records, with each status write, the jobs and uploads the agent's pod had seen by then."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.ran: list[list[str]] = []

    async def publish(self, status: Any) -> None:
        pod = self.world.sandboxes.get("pod-a1")
        self.ran.append([*pod.starts, *pod.uploads] if pod else [])
        await super().publish(status)


def first_turn_writes(folder: dict[str, str]) -> tuple[WatchingSink, Any]:
    world = World()
    sink = WatchingSink(world)
    status = run(folder, world=world, sink=sink)[0]
    return sink, status


def test_a_first_turn_with_nothing_to_prepare_is_written_once_before_its_agent() -> None:
    """No setup.sh, workdir/, user or healthcheck: the pod's record, then one write, the agent's stage,
    carrying the attempt's readiness and the turn's start; nothing of the turn ran in the pod before it."""
    sink, status = first_turn_writes(three_steps())
    assert status.reward == 1.0
    stages = [written.turns[0].stage for written in sink.statuses]
    assert Stage.CLEANUP not in stages
    agent = stages.index(Stage.AGENT)
    before = sink.statuses[agent - 1].attempts[0]
    assert before.pods and before.ready_at is None  # the pod's record: the write before
    written = sink.statuses[agent]
    assert written.attempts[0].ready_at is not None and written.attempts[0].deadline_at is not None
    assert written.turns[0].phase == "Running" and written.turns[0].started_at is not None
    assert not [done for done in sink.ran[agent] if "t1." in done or done == "/solution"], sink.ran[agent]
    # Later turns start as before: their cleanup written (it carries a shared turn's done).
    assert Stage.CLEANUP in [written.turns[1].stage for written in sink.statuses]


def test_a_first_turn_with_a_setup_is_written_before_its_setup_runs() -> None:
    """The control: a setup.sh runs in the pod before the agent, so the turn's start (with the attempt's
    readiness) is written first, at its cleanup."""
    sink, status = first_turn_writes(three_steps(files={"steps/a/workdir/setup.sh": "exit 0"}))
    assert status.reward == 1.0
    stages = [written.turns[0].stage for written in sink.statuses]
    cleanup = stages.index(Stage.CLEANUP)
    assert sink.statuses[cleanup].attempts[0].ready_at is not None
    assert "a1.t1.setup" not in sink.ran[cleanup]
    assert "a1.t1.setup" in sink.ran[stages.index(Stage.AGENT)]


@pytest.mark.parametrize("stage", [Stage.CLEANUP, Stage.WORKDIR, Stage.SETUP, Stage.HEALTHCHECK, Stage.AGENT])
def test_a_restart_before_a_quiet_first_turns_agent_resumes_in_the_same_pod(
    monkeypatch: pytest.MonkeyPatch, stage: Stage
) -> None:
    """Killed before the one write of a quiet first turn: the status shows the pod's record only, and the
    restarted runner takes the same pod again, runs each job once and scores as an uninterrupted run."""
    folder = three_steps()
    world, store, dying = World(), MemoryStore(), FakeSink()
    crash_inside(monkeypatch, stage, 0)
    with pytest.raises(Crash):
        run(folder, world=world, sink=dying, store=store)
    monkeypatch.undo()
    last_written = dying.statuses[-1]
    assert last_written.attempts[0].pods
    if stage is not Stage.AGENT:
        assert (last_written.turns[0].stage, last_written.attempts[0].ready_at) == (None, None)
    status = run(folder, world=world, status=last_written, store=store)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 1)
    assert sorted(world.sandboxes) == ["pod-a1"]
    starts = world.sandboxes["pod-a1"].starts
    assert len(starts) == len(set(starts)), starts
    assert [job for job in starts if job.endswith(".agent")] == ["a1.t1.agent", "a1.t2.agent", "a1.t3.agent"]
