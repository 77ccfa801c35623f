"""A regrade: a finished Episode's kept artifacts verified again with new tests, its agent skipped — what can be
regraded (pure planning), and the runner against the in-memory sandbox: no agent pod, a fresh verifier pod per
turn, the original's artifacts, crash-safe at every published stage."""

from __future__ import annotations

import asyncio
import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from episode_operator.api.episode_resource import (
    AgentSpec,
    EpisodeSpec,
    EpisodeStatus,
    RegradeStatus,
    RetryPolicy,
    TurnStatus,
)
from episode_operator.api.vocabulary import Stage
from episode_operator.cli.cluster import Cluster
from episode_operator.cli.kubectl_episode import cli
from episode_operator.kube.client import NotFound
from episode_operator.kube.driver import DriverSettings
from episode_operator.kube.regrade_driver import decide_regrade
from episode_operator.runtime.admission import Refusal, admit_task
from episode_operator.runtime.episode import EpisodeConfig
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.regrade import RegradeRefused, RegradeRunner, RegradeStore, plan_regrade, turn_action
from episode_operator.runtime.turn.table import is_published
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from tests.unit.episodes import run
from tests.unit.fake_sandbox import Crash, FakeProvider, FakeSink, MemoryStore, World
from tests.unit.test_runtime import SEPARATE, ledger_steps

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"

# The stages a regrade's turn walks, each published for a separate turn.
STAGES = [Stage.VERIFY_PREPARE, Stage.VERIFY, Stage.DONE]
assert all(is_published(stage, separate=True) for stage in STAGES)
GATE = "min_reward = 1.0\n"


def original(extra: dict[str, str] | None = None, **options: Any) -> tuple[dict[str, str], EpisodeStatus, MemoryStore]:
    """The three-step ledger verified separately at every step, run by the oracle: its folder, status and store."""
    folder = ledger_steps(extra or {name: SEPARATE for name in "abc"})
    status, _, _, store = run(folder, **options)
    return folder, status, store


def with_tests(folder: dict[str, str], tests: dict[str, str]) -> dict[str, str]:
    """The folder with each step's test.sh replaced (``tests``: step → script)."""
    return {**folder, **{f"steps/{step}/tests/test.sh": script for step, script in tests.items()}}


def regrade(
    folder: dict[str, str],
    of: EpisodeStatus,
    kept: MemoryStore,
    *,
    world: World | None = None,
    status: EpisodeStatus | None = None,
    sink: FakeSink | None = None,
    own: MemoryStore | None = None,
) -> tuple[EpisodeStatus, World, MemoryStore]:
    """Run the regrade of ``of`` (whose store is ``kept``) with the tests of ``folder``."""
    world = world or World()
    own = own or MemoryStore()
    files = TaskFiles.from_mapping(folder)
    plan = resolve_plan(load_task(files))
    recorded = status.regrade if status is not None and status.regrade is not None else None
    decided = recorded or plan_regrade("ledger", "uid-1", of, plan)
    config = EpisodeConfig(
        plan=plan,
        files=files,
        agent=AgentSpec(kind="oracle"),
        digest=files.digest(),
        retries=RetryPolicy(outages=2),
        limits=world.limits,
    )
    runner = RegradeRunner(
        config,
        FakeProvider(world),
        sink or FakeSink(),
        RegradeStore(own, kept, decided.attempt),
        regrade=decided,
        original_turns=of.turns if recorded is None else (),
        clock=world.clock.time,
        monotonic=world.clock.monotonic,
        sleep=world.clock.sleep,
    )
    return asyncio.run(runner.run(status)), world, own


# --- the runner -------------------------------------------------------------------------------------------
def test_a_regrade_verifies_the_kept_artifacts_with_new_tests_in_fresh_pods_and_runs_no_agent() -> None:
    folder, first, kept = original()
    assert (first.outcome, first.reward) == ("Graded", 1.0)
    before = first.model_dump()
    # The new tests: turn b now wants three lines, which its agent had not written by then.
    stricter = with_tests(folder, {"a": "check runs.txt a\\n", "b": "check runs.txt a\\nb\\nc\\n"})
    status, world, own = regrade(stricter, first, kept)
    # A measured 0 without a gate does not stop the episode (Gym): turn c is verified as before.
    assert (status.phase, status.outcome, status.stopped_after_turn) == ("Succeeded", "Graded", None)
    assert [(turn.reward, turn.phase) for turn in status.turns] == [
        (1.0, "Succeeded"),
        (0.0, "Succeeded"),
        (1.0, "Succeeded"),
    ]
    assert status.regrade is not None and [turn.action for turn in status.regrade.turns] == ["verify"] * 3
    assert (status.regrade.episode, status.regrade.attempt, status.regrade.original_reward) == ("ledger", 1, 1.0)
    # No agent pod, nothing but test.sh: each verifier pod got the original's artifacts of its own turn.
    assert sorted(world.sandboxes) == ["pod-a1-v1", "pod-a1-v2", "pod-a1-v3"]
    assert world.sandboxes["pod-a1-v1"].files["main"]["/app/runs.txt"] == b"a\n"
    assert world.sandboxes["pod-a1-v2"].files["main"]["/app/runs.txt"] == b"a\nb\n"
    starts = [job for pod in world.sandboxes.values() for job in pod.starts]
    assert starts == ["a1.t1.verify", "a1.t2.verify", "a1.t3.verify"]
    assert set(own.logs) == {(1, name, "verifier") for name in "abc"} and not own.artifacts
    assert first.model_dump() == before  # the original's record is not touched


def test_new_verdicts_that_pass_where_the_original_stopped_leave_the_regrade_incomplete() -> None:
    folder, first, kept = original_stopped_at_b()
    assert (first.outcome, first.stopped_after_turn, first.turns[2].stage) == ("Graded", "b", None)
    fixed = with_tests(folder, {"b": "reward 1"})
    status, _, _ = regrade(fixed, first, kept)
    assert (status.outcome, status.failure_kind) == ("Masked", "episode:regrade_incomplete")
    assert "no agent ran turn c" in (status.message or "")
    assert [turn.reward for turn in status.turns] == [1.0, 1.0, None]
    assert status.regrade is not None and [turn.action for turn in status.regrade.turns] == [
        "verify",
        "verify",
        "skipped",
    ]


def test_a_new_verdict_that_misses_a_gate_stops_the_regrade_there() -> None:
    folder, first, kept = original({"a": GATE + SEPARATE, "b": SEPARATE, "c": SEPARATE})
    assert (first.reward, first.stopped_after_turn) == (1.0, None)
    status, world, _ = regrade(with_tests(folder, {"a": "reward 0.5"}), first, kept)
    assert (status.outcome, status.stopped_after_turn, status.turns[0].gate) == ("Graded", "a", "missed")
    assert [turn.phase for turn in status.turns] == ["Succeeded", "Skipped", "Skipped"]
    assert sorted(world.sandboxes) == ["pod-a1-v1"]


def original_stopped_at_b() -> tuple[dict[str, str], EpisodeStatus, MemoryStore]:
    folder = ledger_steps({"a": SEPARATE, "b": GATE + SEPARATE, "c": SEPARATE})
    folder = with_tests(folder, {"b": "reward 0"})
    status, _, _, store = run(folder)
    return folder, status, store


@pytest.mark.parametrize("stage", STAGES)
def test_a_regrade_killed_at_any_published_stage_resumes_without_verifying_twice(stage: Stage) -> None:
    folder, first, kept = original()
    world, own = World(), MemoryStore()

    def at_stage(status: EpisodeStatus) -> bool:
        return status.current_turn == 1 and status.turns[1].stage == stage

    dying = FakeSink(crash_when=at_stage)
    with pytest.raises(Crash):
        regrade(folder, first, kept, world=world, sink=dying, own=own)
    written = dying.statuses[-1]
    assert written.regrade is not None  # the decision is in the first status, before any pod
    status, world, _ = regrade(folder, first, kept, world=world, status=written, own=own)
    assert (status.outcome, status.reward, status.attempt) == ("Graded", 1.0, 1)
    starts = [job for pod in world.sandboxes.values() for job in pod.starts]
    assert sorted(starts) == ["a1.t1.verify", "a1.t2.verify", "a1.t3.verify"], starts
    assert "pod-a1" not in world.sandboxes


def test_an_outage_verifies_again_in_a_new_attempt_and_keeps_the_carried_turns() -> None:
    folder, first, kept = original()
    lost = {"done": False}

    def lose_once(sandbox: Any, spec: Any) -> None:
        if not lost["done"]:
            lost["done"] = True
            sandbox.lost = True

    world = World(hooks={"a1.t2.verify": lose_once})
    status, world, _ = regrade(folder, first, kept, world=world)
    assert (status.outcome, status.reward, status.attempt) == ("Graded", 1.0, 2)
    assert [job for job in world.sandboxes["pod-a2-v1"].starts] == ["a2.t1.verify"]
    assert "pod-a2" not in world.sandboxes


# --- what can be regraded -------------------------------------------------------------------------------------
def plan_of(folder: dict[str, str]) -> Any:
    return resolve_plan(load_task(TaskFiles.from_mapping(folder)))


def finished(*turns: TurnStatus, outcome: str = "Graded", **extra: Any) -> EpisodeStatus:
    return EpisodeStatus.model_validate(
        {"phase": "Succeeded" if outcome == "Graded" else "Failed", "outcome": outcome, "attempt": 1, **extra}
    ).model_copy(update={"turns": list(turns)})


def turn(name: str, stage: Stage | None = Stage.DONE, mode: str | None = "separate", **extra: Any) -> TurnStatus:
    return TurnStatus.model_validate({"name": name, "stage": stage, "verifierMode": mode, "reward": 1.0, **extra})


SEPARATE_ABC = plan_of(ledger_steps({name: SEPARATE for name in "abc"}))


@pytest.mark.parametrize(
    ("record", "action"),
    [
        (turn("a"), "verify"),
        (turn("a", Stage.VERIFY), "verify"),  # masked while it verified: its artifacts were kept
        (turn("a", Stage.VERIFY_PREPARE), "verify"),
        (turn("a", failureKind="harbor:step_setup_failed"), "carried"),  # its verifier never ran
        (turn("a", failureKind="agent:output_limit"), "carried"),
        (turn("a", Stage.AGENT), "skipped"),
        (turn("a", None), "skipped"),
    ],
)
def test_what_a_regrade_does_with_each_turn(record: TurnStatus, action: str) -> None:
    assert turn_action(record) == action


@pytest.mark.parametrize(
    ("status", "plan", "message"),
    [
        (
            finished(turn("a", mode="shared"), turn("b"), turn("c", mode="shared")),
            SEPARATE_ABC,
            "turn 1 (a), 3 (c) of episode ledger was verified in the agent's own sandbox (a shared verifier), "
            "which is gone",
        ),
        (finished(turn("a"), turn("b"), turn("c"), outcome="Ungraded"), SEPARATE_ABC, "ended Ungraded: its outages"),
        (finished(turn("a"), turn("b"), outcome="TerminalFailure"), SEPARATE_ABC, "ended TerminalFailure"),
        (
            EpisodeStatus(phase="Running", turns=[turn("a")]),
            SEPARATE_ABC,
            "episode ledger is Running: only a finished Episode is regraded",
        ),
        (finished(turn("a"), turn("x"), turn("c")), SEPARATE_ABC, "the new task's turns (a, b, c) are not"),
        (
            finished(turn("a"), turn("b"), turn("c")),
            plan_of(ledger_steps({"a": SEPARATE, "c": SEPARATE})),
            "turn 2 (b) verifies in the agent's sandbox under the new task",
        ),
        (
            finished(turn("a", Stage.AGENT), turn("b", None), turn("c", None), outcome="Masked"),
            SEPARATE_ABC,
            "no turn of episode ledger reached its verifier",
        ),
        (
            finished(
                turn("a"),
                turn("b"),
                turn("c"),
                regrade=RegradeStatus(episode="first", uid="u", attempt=1).model_dump(by_alias=True),
            ),
            SEPARATE_ABC,
            "episode ledger is itself a regrade of first: regrade that one",
        ),
    ],
)
def test_a_regrade_is_refused_naming_why_and_the_turns(status: EpisodeStatus, plan: Any, message: str) -> None:
    with pytest.raises(RegradeRefused) as refused:
        plan_regrade("ledger", "uid-1", status, plan)
    assert message in str(refused.value)


def test_a_masked_original_is_regraded_from_the_turn_its_verifier_could_not_run() -> None:
    status = finished(turn("a"), turn("b", Stage.VERIFY, reward=None), turn("c", None), outcome="Masked")
    decided = plan_regrade("ledger", "uid-1", status, SEPARATE_ABC)
    assert [(t.name, t.action, t.original_reward) for t in decided.turns] == [
        ("a", "verify", 1.0),
        ("b", "verify", None),
        ("c", "skipped", 1.0),
    ]
    assert (decided.original_outcome, decided.uid, decided.attempt) == ("Masked", "uid-1", 1)


# --- kubectl episode regrade ------------------------------------------------------------------------------------
class EpisodeApi:
    """The original Episode and the ConfigMaps the CLI reads."""

    def __init__(self, episode: dict[str, Any], config_maps: dict[str, Any] | None = None) -> None:
        self.episode, self.config_maps = episode, config_maps or {}
        self.created: list[dict[str, Any]] = []

    async def get_episode(self, namespace: str, name: str) -> dict[str, Any]:
        if name != self.episode["metadata"]["name"]:
            raise NotFound(name, status=404)
        return self.episode

    async def get_config_map(self, namespace: str, name: str) -> Any:
        if name not in self.config_maps:
            raise NotFound(name, status=404)
        return self.config_maps[name]


def finished_episode(folder: Path, status: EpisodeStatus) -> dict[str, Any]:
    files = {str(path.relative_to(folder)): path.read_text() for path in folder.rglob("*") if path.is_file()}
    spec = {"task": {"inline": {"files": files}}, "agent": {"kind": "oracle"}, "ttlSecondsAfterFinished": 60}
    return {
        "metadata": {"name": "report", "namespace": "evals", "uid": "uid-7"},
        "spec": spec,
        "status": status.to_api(),
    }


def graded(*turns: TurnStatus) -> EpisodeStatus:
    return finished(*turns, reward=1.0)


@pytest.fixture
def cluster_of(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(api: EpisodeApi) -> EpisodeApi:
        monkeypatch.setattr(Cluster, "run", lambda self, action: asyncio.run(action(api)))
        return api

    return install


def test_regrade_prints_the_original_spec_with_new_tests_and_makes_nothing_else(
    cluster_of: Any, tmp_path: Path
) -> None:
    cluster_of(EpisodeApi(finished_episode(EXAMPLES / "report-artifact", graded(turn("task")))))
    (tmp_path / "stricter").mkdir()
    (tmp_path / "stricter" / "test.sh").write_text("grep -qx 'total: 9' /app/out/report.txt\n")
    result = CliRunner().invoke(
        cli, ["regrade", "report", "-n", "evals", "--tests", str(tmp_path / "stricter"), "-o", "yaml"]
    )
    assert result.exit_code == 0, result.output
    config_map, manifest = yaml.safe_load_all(result.stdout)
    spec = EpisodeSpec.model_validate(manifest["spec"])
    assert spec.regrade is not None and (spec.regrade.episode, spec.regrade.uid) == ("report", "uid-7")
    assert spec.agent.kind == "oracle" and spec.ttl_seconds_after_finished == 60  # the original's spec
    assert spec.task.config_map is not None and spec.task.config_map.name == config_map["metadata"]["name"]
    assert manifest["metadata"]["labels"] == {"episode-operator.dev/regrade-of": "report"}
    packed = TaskFiles.from_tar(base64.b64decode(config_map["binaryData"]["task.tar.gz"]))
    assert packed["tests/test.sh"].data == b"grep -qx 'total: 9' /app/out/report.txt\n"
    assert packed["instruction.md"].data == (EXAMPLES / "report-artifact" / "instruction.md").read_bytes()
    # Without --tests, the original's own task (and tests) verify again.
    again = CliRunner().invoke(cli, ["regrade", "report", "-n", "evals", "-o", "yaml"])
    [only] = list(yaml.safe_load_all(again.stdout))
    assert only["kind"] == "Episode" and "inline" in only["spec"]["task"]


@pytest.mark.parametrize(
    ("example", "status", "arguments", "message"),
    [
        (
            "separate-verifier-handoff",
            graded(turn("01-draft", mode="shared"), turn("02-publish")),
            [],
            "turn 1 (01-draft) of episode report was verified in the agent's own sandbox (a shared verifier), which is "
            "gone",
        ),
        ("report-artifact", finished(turn("task"), outcome="Ungraded"), [], "episode report ended Ungraded"),
        ("report-artifact", graded(turn("task")), ["--tests", "NOTESTS"], "holds no tests"),
        ("report-artifact", graded(turn("task")), ["--tests", "configmap/nope"], "configmap evals/nope not found"),
        (
            "report-artifact",
            graded(turn("task")),
            ["--tests", "TWOSTEPS"],
            "steps/01-draft/tests: the task has no step",
        ),
    ],
)
def test_regrade_refuses_what_cannot_be_regraded_naming_it_and_creates_nothing(
    cluster_of: Any, tmp_path: Path, example: str, status: EpisodeStatus, arguments: list[str], message: str
) -> None:
    api = cluster_of(EpisodeApi(finished_episode(EXAMPLES / example, status)))
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "README").write_text("no tests here\n")
    shutil.copytree(EXAMPLES / "separate-verifier-handoff", tmp_path / "two")
    arguments = [
        a.replace("NOTESTS", str(tmp_path / "none")).replace("TWOSTEPS", str(tmp_path / "two")) for a in arguments
    ]
    result = CliRunner().invoke(cli, ["regrade", "report", "-n", "evals", *arguments])
    assert result.exit_code == 1, result.output
    assert message in result.stderr, result.stderr
    assert api.created == [] and result.stdout == ""


def test_regrade_of_a_task_from_an_oci_artifact_is_refused_naming_it(cluster_of: Any) -> None:
    episode = finished_episode(EXAMPLES / "report-artifact", graded(turn("task")))
    reference = f"198.18.255.1:5000/tasks/report@sha256:{'a' * 64}"
    episode["spec"]["task"] = {"oci": {"reference": reference}}
    api = cluster_of(EpisodeApi(episode))
    result = CliRunner().invoke(cli, ["regrade", "report", "-n", "evals"])
    assert result.exit_code == 1, result.output
    assert f"its task is an OCI artifact (spec.task.oci {reference})" in result.stderr, result.stderr
    assert api.created == [] and "Traceback" not in result.output


# --- the operator's first look --------------------------------------------------------------------------------------
def decide(api: EpisodeApi, blobs: BlobStore, uid: str | None = "uid-7") -> Any:
    folder = EXAMPLES / "report-artifact"
    files = TaskFiles.from_path(folder)
    spec = EpisodeSpec.model_validate(
        {"task": {"inline": {"files": {}}}, "agent": {"kind": "oracle"}, "regrade": {"episode": "report", "uid": uid}}
    )
    admission = admit_task(spec, files)
    assert not isinstance(admission, Refusal)
    settings = DriverSettings(store=blobs)
    return asyncio.run(decide_regrade(api, settings, "evals", spec.regrade, admission))  # type: ignore[arg-type]


def test_the_operator_regrades_only_a_run_whose_artifacts_it_kept() -> None:
    episode = finished_episode(EXAMPLES / "report-artifact", graded(turn("task")))
    blobs = BlobStore.memory()
    refusal = decide(EpisodeApi(episode), blobs)
    assert isinstance(refusal, Refusal) and refusal.failure_kind == "episode:regrade_refused"
    assert "the operator kept no artifacts of turn task of episode report (attempt 1) in memory" in refusal.message
    kept = blobs.episode("evals", "report", "uid-7")
    asyncio.run(kept.save_manifest(1, "task", []))
    regrade, turns = decide(EpisodeApi(episode), blobs)
    assert (regrade.episode, regrade.uid, regrade.attempt, [t.name for t in turns]) == ("report", "uid-7", 1, ["task"])
    other = decide(EpisodeApi(episode), blobs, uid="uid-6")
    assert isinstance(other, Refusal) and "is another Episode now (uid uid-7, not uid-6)" in other.message
    gone = decide(EpisodeApi({**episode, "metadata": {**episode["metadata"], "name": "else"}}), blobs)
    assert isinstance(gone, Refusal) and "episode evals/report not found" in gone.message


def test_an_export_leaves_regrades_out(cluster_of: Any, tmp_path: Path) -> None:
    """A regrade's verdict is on its original's rollout: exported, it would be a second rollout of the same run."""
    original = finished_episode(EXAMPLES / "report-artifact", graded(turn("task")))
    regraded = {
        **original,
        "metadata": {"name": "report-regrade-x", "namespace": "evals", "uid": "uid-8"},
        "spec": {**original["spec"], "regrade": {"episode": "report", "uid": "uid-7"}},
    }

    class Listing(EpisodeApi):
        async def list_episodes(self, namespace: str | None, selector: str | None = None) -> list[dict[str, Any]]:
            return [original, regraded]

    cluster_of(Listing(original))
    result = CliRunner().invoke(cli, ["export", "-n", "evals", "--output-dir", str(tmp_path), "--no-captures"])
    assert result.exit_code == 0, result.output
    assert "skipped 1 regrade(s)" in result.stderr
    rows = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(rows) == 1 and '"reward": 1.0' in rows[0]
