"""An EpisodeSet's rerun (spec.rerun): which finished children are re-run in place, once per generation, and
what the set's status, pass@k and history say afterwards (pure), plus `kubectl episode rerun`'s request."""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import random
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from episode_operator.api.episodeset_resource import EpisodeSetSpec, EpisodeSetStatus, RerunSpec, SetChildStatus
from episode_operator.api.vocabulary import SET_REPLACED_LABEL, SET_RERUN_LABEL, failure_kind_matches
from episode_operator.cli.kubectl_episode import cli
from episode_operator.handlers import set_is_open
from episode_operator.kube.client import Conflict
from episode_operator.kube.episodeset_controller import SetSettings, reconcile_episode_set
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.objects.children import child_manifest, child_name, child_view, set_results_selector
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.runtime.evaluation import ChildView, plan_set
from episode_operator.runtime.rerun_plan import RERUNNABLE, rerun_requested, selected
from tests.unit.test_evaluation import DEFINITION, NOW, finished, resolved, set_spec, view

LATER = "2026-01-01T00:01:00.000000Z"


def rerun(**fields: Any) -> RerunSpec:
    return RerunSpec.model_validate({"generation": 1, **fields})


# --- which children --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("record", "asked", "chosen"),
    [
        (finished(1, None, "Ungraded", failure_kind="outage:image_pull"), {"outcomes": ["Ungraded"]}, True),
        (
            finished(1, None, "Ungraded", failure_kind="outage:image_pull"),
            {"failureKinds": ["outage:image_pull"]},
            True,
        ),
        (finished(1, None, "Ungraded", failure_kind="outage:image_pull"), {"failureKinds": ["outage:*"]}, True),
        (finished(1, None, "Ungraded", failure_kind="outage:pod_lost"), {"failureKinds": ["outage:image_pull"]}, False),
        # With both, a child must match both.
        (
            finished(1, None, "Ungraded", failure_kind="outage:pod_lost"),
            {"outcomes": ["Ungraded"], "failureKinds": ["outage:image_pull"]},
            False,
        ),
        (
            finished(1, 0.0, "TerminalFailure", failure_kind="harbor:step_setup_failed"),
            {"outcomes": ["TerminalFailure"]},
            True,
        ),
        (finished(1, None, "Masked", failure_kind="harbor:verifier_error"), {"failureKinds": ["harbor:*"]}, True),
        (finished(1, None, "Masked"), {"outcomes": ["Ungraded", "TerminalFailure"]}, False),
        # A verdict is never re-run: a Graded child, whatever its reward or failure kind.
        (
            finished(1, 0.0, "Graded", failure_kind="agent:broke_sandbox"),
            {"failureKinds": ["agent:broke_sandbox"]},
            False,
        ),
        (finished(1, 0.0, "Graded", failure_kind="harbor:step_setup_failed"), {"failureKinds": ["harbor:*"]}, False),
        # An unfinished child is no candidate.
        (SetChildStatus(attempt=1, name="c-1", phase="Running"), {"outcomes": ["Ungraded"]}, False),
    ],
)
def test_a_rerun_selects_finished_children_without_a_verdict_that_match(
    record: SetChildStatus, asked: dict[str, Any], chosen: bool
) -> None:
    assert selected(record, rerun(**asked)) is chosen


def test_graded_is_no_outcome_a_rerun_may_name_and_unknown_failure_kinds_are_refused() -> None:
    assert "Graded" not in RERUNNABLE
    with pytest.raises(ValidationError, match=r"outcomes\.0"):
        rerun(outcomes=["Graded"])
    with pytest.raises(ValidationError, match=r"outage:imagepull, nope:\*: no such failure kind"):
        rerun(failureKinds=["outage:imagepull", "nope:*"])
    assert failure_kind_matches("outage:*", "outage:image_pull") and not failure_kind_matches("outage:*", "agent:x")
    assert not failure_kind_matches("outage:*", None)


@pytest.mark.parametrize(
    ("spec", "status", "requested"),
    [
        ({"rerun": {"generation": 1}}, {}, True),
        ({"rerun": {"generation": 2}}, {"reruns": [{"generation": 1}]}, True),
        ({"rerun": {"generation": 2}}, {"reruns": [{"generation": 1}, {"generation": 2}]}, False),
        ({"rerun": {"generation": 1}}, {"reruns": [{"generation": 3}]}, False),
        ({}, {}, False),
        ({"rerun": {"generation": "2"}}, {}, False),
    ],
)
def test_a_rerun_is_requested_while_the_set_has_not_seen_its_generation(
    spec: dict[str, Any], status: dict[str, Any], requested: bool
) -> None:
    assert rerun_requested(spec, status) is requested
    complete = {**status, "completionTime": NOW}
    assert set_is_open(status=complete, spec=spec) is requested  # the set's loop runs again for it
    assert set_is_open(status=status, spec=spec) is True


# --- what the set does ---------------------------------------------------------------------------------
def done(index: int, attempt: int, outcome: str = "Graded", reward: float | None = 1.0, **extra: Any) -> ChildView:
    phase = "Succeeded" if outcome == "Graded" else "Failed"
    return view(index, attempt, phase, outcome=outcome, reward=reward, **extra)


def completed_set() -> tuple[EpisodeSetSpec, EpisodeSetStatus, list[ChildView]]:
    """Three tasks × 2 attempts, finished: task 1's attempt 2 and task 2's attempt 1 lost to outages."""
    spec = set_spec(attempts=2, parallelism=4)
    children = [
        done(0, 1),
        done(0, 2, reward=0.0),
        done(1, 1, reward=0.0),
        done(1, 2, "Ungraded", None, failure_kind="outage:image_pull"),
        done(2, 1, "Ungraded", None, failure_kind="outage:pod_lost"),
        done(2, 2, "TerminalFailure", None, failure_kind="harbor:step_setup_failed"),
    ]
    plan = plan_set(spec, resolved(3), children, definition=DEFINITION, now=NOW)
    assert plan.status.phase == "Succeeded" and plan.status.completion_time == NOW
    return spec, plan.status, children


def test_a_rerun_reopens_the_set_and_re_runs_only_the_matching_children_in_place() -> None:
    spec, status, children = completed_set()
    assert [row.value for row in status.pass_at_k] == [pytest.approx(1 / 6), pytest.approx(0.5)]
    asked = spec.model_copy(update={"rerun": rerun(outcomes=["Ungraded"], failureKinds=["outage:image_pull"])})
    plan = plan_set(asked, status, children, definition=DEFINITION, now=LATER)
    after = plan.status
    # Only task 1's attempt 2 matched: its slot is free and created again; nothing else moved.
    assert plan.create == [(1, 2)]
    assert (after.phase, after.completion_time, after.progress) == ("Running", None, "5/6")
    assert [record.attempt for record in after.tasks[1].children] == [1]
    replaced = after.tasks[1].replaced
    assert [(r.attempt, r.name, r.outcome, r.failure_kind, r.rerun) for r in replaced] == [
        (2, "s-1-2", "Ungraded", "outage:image_pull", 1)
    ]
    assert [(r.generation, r.replaced, r.applied_at) for r in after.reruns] == [(1, 1, LATER)]
    assert after.outcomes.ungraded == 1  # task 2's pod_lost child still counts; task 1's no longer
    assert [event[0] for event in plan.events] == ["RerunStarted"]
    assert {c.type: c.status for c in after.conditions}["Complete"] == "False"
    # The replaced child, still listed, is labelled so and counts nowhere; its slot's new child is `-r1`.
    assert plan.mark_replaced == [("s-1-2", 1)]
    packed = after.tasks[1].model_copy(update={"config_map": "task-b"})  # a selected task (the spec lists one)
    manifest = child_manifest(OwnerRef("s", "ns", "uid"), asked, packed, 2, LATER)
    assert manifest["metadata"]["name"] == child_name("s", 1, 2, 1) == "s-1-2-r1"
    assert manifest["metadata"]["labels"][SET_RERUN_LABEL] == "1"
    env = {entry["name"]: entry["value"] for entry in manifest["spec"]["agent"]["env"]}
    assert (env["EPISODE_SET_ATTEMPT"], env["EPISODE_SET_RERUN"]) == ("2", "1")
    # The re-run child succeeds: the set completes again, its pass@k the new child's.
    rerun_child = ChildView(
        index=1, attempt=2, name="s-1-2-r1", phase="Succeeded", outcome="Graded", reward=1.0, rerun=1
    )
    listed = [*children, rerun_child]
    final = plan_set(asked, after, listed, definition=DEFINITION, now="2026-01-01T00:02:00.000000Z").status
    assert (final.phase, final.progress, final.outcomes.ungraded, final.outcomes.graded) == ("Succeeded", "6/6", 1, 4)
    assert final.tasks[1].pass_at_k == [pytest.approx(0.5), pytest.approx(1.0)]
    assert [row.value for row in final.pass_at_k] == [pytest.approx(1 / 3), pytest.approx(1.0)]
    assert final.tasks[1].replaced == replaced  # the history stays
    # Seen again (a restart, a re-applied manifest): the generation is not applied twice.
    again = plan_set(asked, final, listed, definition=DEFINITION, now="2026-01-01T00:03:00.000000Z")
    assert again.create == [] and again.status.to_api() == final.to_api()


def test_each_generation_runs_once_and_a_later_one_replaces_a_re_run_child_again() -> None:
    spec, status, children = completed_set()
    first = spec.model_copy(update={"rerun": rerun(outcomes=["Ungraded"])})
    plan = plan_set(first, status, children, definition=DEFINITION, now=LATER)
    assert sorted(plan.create) == [(1, 2), (2, 1)]
    lost_again = [
        *children,
        done(1, 2, "Ungraded", None, failure_kind="outage:image_pull", rerun=1),
        done(2, 1, reward=1.0, rerun=1),
    ]
    for child in lost_again[-2:]:
        object.__setattr__(child, "name", f"{child.name}-r1")
    after = plan_set(first, plan.status, lost_again, definition=DEFINITION, now=LATER).status
    assert after.phase == "Succeeded" and after.outcomes.ungraded == 1
    second = spec.model_copy(update={"rerun": rerun(generation=2, outcomes=["Ungraded"])})
    plan = plan_set(second, after, lost_again, definition=DEFINITION, now=LATER)
    assert plan.create == [(1, 2)]
    assert [(r.name, r.rerun) for r in plan.status.tasks[1].replaced] == [("s-1-2", 1), ("s-1-2-r1", 2)]
    packed = plan.status.tasks[1].model_copy(update={"config_map": "task-b"})
    assert child_manifest(OwnerRef("s", "ns", "u"), second, packed, 2, LATER)["metadata"]["name"] == "s-1-2-r2"
    # Each replaced child is labelled with the generation that replaced it (here none was labelled yet).
    assert plan.mark_replaced == [("s-1-2", 1), ("s-2-1", 1), ("s-1-2-r1", 2)]


def test_a_rerun_that_matches_nothing_is_recorded_and_the_finished_set_stays_finished() -> None:
    spec, status, children = completed_set()
    asked = spec.model_copy(update={"rerun": rerun(outcomes=["Masked"])})
    plan = plan_set(asked, status, children, definition=DEFINITION, now=LATER)
    assert plan.create == [] and plan.status.completion_time == NOW and plan.status.phase == "Succeeded"
    assert [(r.generation, r.replaced, r.message) for r in plan.status.reruns] == [(1, 0, None)]


def test_a_rerun_reopens_a_set_its_failure_policy_stopped_only_when_the_policy_would_let_it_run() -> None:
    spec = set_spec(attempts=1, parallelism=1, failurePolicy={"maxOutages": 0})
    children = [done(0, 1, "Ungraded", None, failure_kind="outage:image_pull")]
    stopped = plan_set(spec, resolved(3), children, definition=DEFINITION, now=NOW).status
    assert (stopped.phase, stopped.reason, stopped.completion_time) == ("Failed", "FailurePolicy", NOW)
    asked = spec.model_copy(update={"rerun": rerun(outcomes=["Ungraded"])})
    plan = plan_set(asked, stopped, children, definition=DEFINITION, now=LATER)
    # Reopened: the replaced outage no longer counts, and the children never started start too.
    assert (plan.status.phase, plan.status.reason, plan.create) == ("Running", None, [(0, 1)])
    # A rerun of other children leaves the outage counted: the policy would stop the set at once, so it is refused.
    other = spec.model_copy(update={"rerun": rerun(outcomes=["Masked"])})
    refused = plan_set(other, stopped, children, definition=DEFINITION, now=LATER)
    assert (refused.status.phase, refused.status.reason, refused.create) == ("Failed", "FailurePolicy", [])
    assert "the failure policy would stop the set again at once" in (refused.status.reruns[0].message or "")
    assert [event[0] for event in refused.events] == ["RerunRefused"]


def test_a_rerun_of_a_set_stopped_for_its_definition_is_refused() -> None:
    spec, status, children = completed_set()
    changed = plan_set(
        spec, status.model_copy(update={"completion_time": None}), children, definition="sha256:x", now=NOW
    )
    assert changed.status.reason == "DefinitionChanged"
    asked = spec.model_copy(update={"rerun": rerun(outcomes=["Ungraded"])})
    plan = plan_set(asked, changed.status, children, definition="sha256:x", now=LATER)
    assert plan.create == [] and plan.status.phase == "Failed"
    assert "stopped for good (DefinitionChanged" in (plan.status.reruns[0].message or "")


def test_a_rerun_naming_nothing_is_refused_and_the_set_goes_on() -> None:
    spec, status, children = completed_set()
    empty = RerunSpec.model_construct(generation=1, outcomes=[], failure_kinds=[])
    plan = plan_set(spec.model_copy(update={"rerun": empty}), status, children, definition=DEFINITION, now=LATER)
    assert plan.status.reruns[0].message == "it names no outcomes and no failureKinds: name what to re-run"
    assert plan.status.phase == "Succeeded"


def test_a_child_reads_its_rerun_generation_and_replaced_label() -> None:
    item = {
        "metadata": {
            "name": "s-1-2-r1",
            "labels": {
                "episode-operator.dev/task-index": "1",
                "episode-operator.dev/set-attempt": "2",
                SET_RERUN_LABEL: "1",
                SET_REPLACED_LABEL: "2",
            },
        },
        "status": {"phase": "Succeeded"},
    }
    child = child_view(item)
    assert (child.index, child.attempt, child.rerun, child.marked_replaced) == (1, 2, 1, True)
    assert set_results_selector("s") == "episode-operator.dev/set=s,!episode-operator.dev/set-replaced"


@pytest.mark.parametrize("seed", range(20))
def test_simulated_reruns_with_crashes_create_each_slots_generation_once(seed: int) -> None:
    """A set whose children end Graded or Ungraded at random, re-run generation after generation while the
    operator "crashes" (a pass's status write lost, or some creates after it): each slot's child of each
    generation is created once, and the final counts are those of the current children only."""
    rng = random.Random(seed)
    tasks, attempts = rng.randint(1, 6), rng.randint(1, 3)
    spec = set_spec(attempts=attempts, parallelism=rng.randint(1, 4))
    stored = resolved(tasks)
    cluster: dict[str, ChildView] = {}
    created: list[str] = []
    for generation in range(0, 4):
        if generation:
            spec = spec.model_copy(update={"rerun": rerun(generation=generation, outcomes=["Ungraded"])})
        for step in itertools.count():
            assert step < 5000
            plan = plan_set(
                spec, stored, list(cluster.values()), definition=DEFINITION, now=f"2026-01-01T00:{step % 60:02d}:00Z"
            )
            # The status is written before any create: a crash loses the write (and so every create), or
            # comes after it, losing some creates.
            crash = rng.choice(["none", "none", "none", "write", "creates"])
            if crash == "write":
                continue
            stored = plan.status
            by_index = {t.index: t for t in plan.status.tasks}
            for index, attempt in plan.create:
                if crash == "creates" and rng.random() < 0.5:
                    break
                current = by_index[index].rerun_generation(attempt)
                name = child_name("s", index, attempt, current)
                assert name not in created, f"{name} created twice"
                created.append(name)
                cluster[name] = ChildView(index=index, attempt=attempt, name=name, phase="Running", rerun=current)
            if stored.completion_time:
                break
            for name, child in list(cluster.items()):
                if child.phase == "Running" and rng.random() < 0.5:
                    ungraded = rng.random() < 0.4
                    cluster[name] = ChildView(
                        index=child.index,
                        attempt=child.attempt,
                        name=name,
                        phase="Failed" if ungraded else "Succeeded",
                        outcome="Ungraded" if ungraded else "Graded",
                        reward=None if ungraded else 1.0,
                        rerun=child.rerun,
                    )
    current = {(t.index, r.attempt): r for t in stored.tasks for r in t.children}
    assert len(current) == tasks * attempts and stored.finished == tasks * attempts
    latest = {(c.index, c.attempt): c for c in sorted(cluster.values(), key=lambda c: c.rerun)}
    assert {slot: (r.name, r.outcome) for slot, r in current.items()} == {
        slot: (c.name, c.outcome) for slot, c in latest.items()
    }
    assert stored.outcomes.ungraded == sum(1 for c in latest.values() if c.outcome == "Ungraded")
    replaced = [r.name for t in stored.tasks for r in t.replaced]
    assert sorted(replaced + [r.name for r in current.values()]) == sorted(created)


# --- kubectl episode rerun ----------------------------------------------------------------------------------
def test_rerun_needs_something_to_re_run_and_known_failure_kinds() -> None:
    result = CliRunner().invoke(cli, ["rerun", "nightly"])
    assert result.exit_code == 2 and "name what to re-run: --outcome, --failure-kind, or both" in result.output
    result = CliRunner().invoke(cli, ["rerun", "nightly", "--outcome", "Graded"])
    assert result.exit_code == 2 and "'Graded' is not one of 'Ungraded', 'TerminalFailure', 'Masked'" in result.output
    result = CliRunner().invoke(cli, ["rerun", "nightly", "--failure-kind", "outage:imagepull"])
    assert result.exit_code == 2 and "outage:imagepull: no such failure kind" in result.output


# --- the controller against a fake API -----------------------------------------------------------------------
class SetApi:
    """One EpisodeSet and its child Episodes as the API server keeps them (labels, merge patches)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.set: dict[str, Any] = {
            "metadata": {"name": "s", "namespace": "ns", "uid": "set-uid", "generation": 1},
            "spec": spec,
        }
        self.episodes: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.event_recorder = EventRecorder(self.create_event)
        self.events: list[str] = []

    async def get_episodeset(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.set)

    async def replace_episodeset_status(self, namespace: str, name: str, status: dict[str, Any], **_: Any) -> None:
        self.set["status"] = copy.deepcopy(status)

    async def list_episodes(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(item) for item in self.episodes.values()]

    async def create_episode(self, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        if name in self.episodes:
            raise Conflict(name, status=409)
        self.episodes[name] = copy.deepcopy(manifest)
        self.created.append(name)
        return manifest

    async def patch_episode(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        labels = patch.get("metadata", {}).get("labels", {})
        self.episodes[name]["metadata"]["labels"].update(labels)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.events.append(event["reason"])

    def finish(self, name: str, outcome: str, reward: float | None = None, failure_kind: str | None = None) -> None:
        phase = "Succeeded" if outcome == "Graded" else "Failed"
        self.episodes[name]["status"] = {
            "phase": phase,
            "outcome": outcome,
            "reward": reward,
            "failureKind": failure_kind,
        }


async def reconcile(api: SetApi) -> float | None:
    return await reconcile_episode_set(api, "ns", "s", logging.getLogger("test"), SetSettings())  # type: ignore[arg-type]


def test_the_controller_reopens_a_finished_set_for_a_rerun_and_labels_what_it_replaced() -> None:
    asyncio.run(reopened_by_a_rerun())


async def reopened_by_a_rerun() -> None:
    tasks = [{"name": name, "inline": {"files": {"task.toml": ""}}} for name in ("a", "b")]
    api = SetApi({"dataset": {"tasks": tasks}, "agent": {"kind": "oracle"}, "parallelism": 2})
    assert await reconcile(api) is not None  # resolved
    await reconcile(api)
    assert api.created == ["s-0-1", "s-1-1"]
    api.finish("s-0-1", "Graded", 1.0)
    api.finish("s-1-1", "Ungraded", failure_kind="outage:image_pull")
    assert await reconcile(api) is None and api.set["status"]["completionTime"]
    assert await reconcile(api) is None  # complete: nothing to do

    api.set["spec"]["rerun"] = {"generation": 1, "outcomes": ["Ungraded"]}
    assert set_is_open(status=api.set["status"], spec=api.set["spec"])
    assert await reconcile(api) is not None  # reopened
    status = EpisodeSetStatus.model_validate(api.set["status"])
    assert (status.phase, status.completion_time, status.reruns[0].replaced) == ("Running", None, 1)
    assert api.created == ["s-0-1", "s-1-1", "s-1-1-r1"]
    assert api.episodes["s-1-1"]["metadata"]["labels"][SET_REPLACED_LABEL] == "1"
    assert api.episodes["s-1-1-r1"]["metadata"]["labels"][SET_RERUN_LABEL] == "1"
    await reconcile(api)
    assert api.created == ["s-0-1", "s-1-1", "s-1-1-r1"]  # nothing twice
    api.finish("s-1-1-r1", "Graded", 1.0)
    assert await reconcile(api) is None
    status = EpisodeSetStatus.model_validate(api.set["status"])
    assert (status.phase, status.outcomes.ungraded, status.mean_reward, status.pass_at_k[0].value) == (
        "Succeeded",
        0,
        1.0,
        1.0,
    )
    assert [(child.name, child.outcome) for child in status.tasks[1].replaced] == [("s-1-1", "Ungraded")]
    assert not set_is_open(status=api.set["status"], spec=api.set["spec"])
