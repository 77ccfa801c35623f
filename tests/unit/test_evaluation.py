"""EpisodeSet semantics (pure): pass@k, the roll-up, and what the controller does next."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction
from typing import Any

import pytest
from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeSpec, TaskSource
from episode_operator.api.episodeset_resource import (
    EpisodeSetSpec,
    EpisodeSetStatus,
    EpisodeTemplate,
    FailurePolicy,
    OutcomeCounts,
    SetChildStatus,
    SetTaskStatus,
    child_spec,
)
from episode_operator.api.vocabulary import parse_timestamp, precise_timestamp
from episode_operator.runtime.evaluation import (
    ChildView,
    aggregate,
    definition_digest,
    next_children,
    pass_at_k,
    plan_set,
    policy_verdict,
    record_children,
    summarize_task,
)

NOW = "2026-01-01T00:00:10.000000Z"
DEFINITION = "sha256:d"


# --- pass@k ---------------------------------------------------------------------------------------
def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The share of all k-subsets of n samples (the first c successes) holding a success."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(1 for subset in subsets if any(sample < c for sample in subset)), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_unbiased_estimator(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (2, 1, 1, 0.5),
        (2, 1, 2, 1.0),
        (10, 3, 1, 0.3),
        (10, 0, 5, 0.0),
        (5, 1, 2, 0.4),  # 1 - C(4,2)/C(5,2) = 1 - 6/10
        (200, 1, 100, 0.5),  # large n stays exact
    ],
)
def test_pass_at_k_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(2, 3, 1), (2, 1, 0), (2, 1, 3), (0, 0, 1), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


# --- the roll-up ----------------------------------------------------------------------------------
def finished(attempt: int, reward: float | None, outcome: str = "Graded", **extra: Any) -> SetChildStatus:
    phase = "Succeeded" if outcome == "Graded" else "Failed"
    return SetChildStatus.model_validate(
        {"attempt": attempt, "name": f"c-{attempt}", "phase": phase, "outcome": outcome, "reward": reward, **extra}
    )


def task(index: int, *children: SetChildStatus) -> SetTaskStatus:
    return SetTaskStatus(index=index, name=f"task-{index}", children=list(children))


@pytest.mark.parametrize(
    ("children", "threshold", "graded", "successes", "mean", "passes"),
    [
        ([], 1.0, 0, 0, None, []),
        ([finished(1, 1.0), finished(2, 0.0)], 1.0, 2, 1, 0.5, [0.5, 1.0]),
        ([finished(1, 0.5), finished(2, 0.5)], 1.0, 2, 0, 0.5, [0.0, 0.0]),
        ([finished(1, 0.5), finished(2, 0.5)], 0.5, 2, 2, 0.5, [1.0, 1.0]),  # the threshold is inclusive
        ([finished(1, 1.5), finished(2, 0.99)], 1.0, 2, 1, 1.245, [0.5, 1.0]),
        # An Ungraded attempt (outages used up) is a sample of pass@k, a miss; not of the mean.
        ([finished(1, None, "Ungraded"), finished(2, 1.0)], 1.0, 1, 1, 1.0, [0.5, 1.0]),
        ([finished(1, None, "Ungraded"), finished(2, None, "Ungraded")], 1.0, 0, 0, None, [0.0, 0.0]),
        # Terminal failures and masked attempts (the task's, not the agent's) are no samples.
        ([finished(1, 0.0, "TerminalFailure"), finished(2, None, "Masked"), finished(3, 0.0)], 1.0, 1, 0, 0.0, [0.0]),
        # An attempt still running is not a sample yet.
        ([finished(1, 1.0), SetChildStatus(attempt=2, name="c-2", phase="Running")], 1.0, 1, 1, 1.0, [1.0]),
    ],
)
def test_task_summary(
    children: list[SetChildStatus],
    threshold: float,
    graded: int,
    successes: int,
    mean: float | None,
    passes: list[float],
) -> None:
    summary = summarize_task(task(0, *children), threshold)
    assert (summary.graded, summary.successes, summary.pass_at_k) == (graded, successes, pytest.approx(passes))
    assert summary.mean_reward == (None if mean is None else pytest.approx(mean))
    assert summary.finished == sum(1 for child in children if child.phase in ("Succeeded", "Failed"))


def test_aggregate_means_over_graded_children_and_pass_at_k_over_tasks_with_enough_samples() -> None:
    tasks = [
        summarize_task(task(0, finished(1, 1.0), finished(2, 0.0)), 1.0),  # pass@1 .5, pass@2 1
        summarize_task(task(1, finished(1, 0.0), finished(2, 0.0)), 1.0),  # 0, 0
        summarize_task(task(2, finished(1, 1.0), finished(2, None, "Ungraded")), 1.0),  # a miss: .5, 1
        summarize_task(task(3, finished(1, None, "Ungraded"), finished(2, None, "Ungraded")), 1.0),  # 0, 0
        summarize_task(task(4, finished(1, None, "Masked")), 1.0),  # no sample
    ]
    mean, table = aggregate(tasks, attempts=2)
    assert mean == pytest.approx((1.0 + 0.0 + 0.0 + 0.0 + 1.0) / 5)  # the mean: graded children only
    assert [(row.k, row.value, row.tasks, row.ungraded) for row in table] == [
        (1, pytest.approx((0.5 + 0.0 + 0.5 + 0.0) / 4), 4, 3),
        (2, pytest.approx((1.0 + 0.0 + 1.0 + 0.0) / 4), 4, 3),
    ]
    assert aggregate([], attempts=1) == (None, [aggregate([], attempts=1)[1][0]])
    assert aggregate([], attempts=1)[1][0].value is None


@pytest.mark.parametrize(
    ("outcomes", "policy", "stops"),
    [
        (OutcomeCounts(ungraded=2), FailurePolicy(), None),
        (OutcomeCounts(ungraded=2), FailurePolicy(max_outages=2), None),
        (OutcomeCounts(ungraded=3), FailurePolicy(max_outages=2), "maxOutages=2"),
        (OutcomeCounts(ungraded=1), FailurePolicy(max_outages=0), "maxOutages=0"),
        (OutcomeCounts(terminal_failure=1), FailurePolicy(max_terminal_failures=0), "maxTerminalFailures=0"),
        (OutcomeCounts(masked=9, graded=9), FailurePolicy(max_outages=0, max_terminal_failures=0), None),
    ],
)
def test_failure_policy(outcomes: OutcomeCounts, policy: FailurePolicy, stops: str | None) -> None:
    verdict = policy_verdict(outcomes, policy)
    assert (verdict is None) == (stops is None)
    if stops is not None:
        assert verdict is not None and stops in verdict


# --- records of children --------------------------------------------------------------------------
def view(index: int, attempt: int, phase: str | None = "Running", **extra: Any) -> ChildView:
    return ChildView(index=index, attempt=attempt, name=f"s-{index}-{attempt}", phase=phase, **extra)  # type: ignore[arg-type]


def test_records_follow_children_and_a_finished_record_is_final() -> None:
    tasks = [task(0), task(1, finished(1, 1.0, finished_at="x", observed_finished_at="earlier"))]
    children = [
        view(0, 1, created_at="t0"),
        view(0, 2, "Succeeded", outcome="Graded", reward=0.5, finished_at="t9"),
        view(1, 1, "Succeeded", outcome="Graded", reward=0.0),  # recorded as 1.0 already: the record wins
    ]
    updated, lost = record_children(tasks, children, NOW)
    assert lost == []
    first, second = updated
    assert [(r.attempt, r.phase, r.reward, r.created_at, r.observed_finished_at) for r in first.children] == [
        (1, "Running", None, "t0", None),
        (2, "Succeeded", 0.5, None, NOW),
    ]
    assert second.children == tasks[1].children
    # The same child seen again keeps the time it was first seen finished.
    again, _ = record_children(updated, children, "2026-01-01T00:01:00.000000Z")
    assert again[0].children[1].observed_finished_at == NOW


def test_a_child_gone_unfinished_is_dropped_and_a_finished_one_kept() -> None:
    tasks = [task(0, SetChildStatus(attempt=1, name="s-0-1", phase="Running"), finished(2, 1.0))]
    updated, lost = record_children(tasks, [], NOW)
    assert lost == ["s-0-1"]
    assert [record.attempt for record in updated[0].children] == [2]


@pytest.mark.parametrize(
    ("records", "listed", "room", "expected"),
    [
        ({}, [], 0, []),
        ({}, [], 4, [(0, 1), (1, 1), (2, 1), (0, 2)]),  # attempt 1 of every task first
        ({}, [(0, 1), (1, 1)], 3, [(2, 1), (0, 2), (1, 2)]),
        ({(0, 1): "Succeeded", (1, 1): "Failed"}, [], 2, [(2, 1), (0, 2)]),  # finished: never again
        ({(0, 1): "Succeeded"}, [(1, 1), (2, 1), (0, 2), (1, 2), (2, 2)], 5, []),
        ({}, [], 100, [(i, a) for a in (1, 2) for i in range(3)]),
    ],
)
def test_next_children(
    records: dict[tuple[int, int], str], listed: list[tuple[int, int]], room: int, expected: list[tuple[int, int]]
) -> None:
    tasks = [task(index, *(finished(attempt, 1.0) for (i, attempt) in records if i == index)) for index in range(3)]
    children = [view(index, attempt) for index, attempt in listed]
    assert next_children(tasks, 2, children, room) == expected


# --- plan_set -------------------------------------------------------------------------------------
def set_spec(**extra: Any) -> EpisodeSetSpec:
    return EpisodeSetSpec.model_validate(
        {"dataset": {"tasks": [{"inline": {"files": {}}}]}, "agent": {"kind": "oracle"}, **extra}
    )


def resolved(tasks: int, **extra: Any) -> EpisodeSetStatus:
    return EpisodeSetStatus(
        phase="Running",
        tasks=[task(index) for index in range(tasks)],
        definition=DEFINITION,
        start_time="2026-01-01T00:00:00.000000Z",
        **extra,
    )


def test_plan_fills_free_slots_up_to_parallelism() -> None:
    spec = set_spec(attempts=2, parallelism=3)
    plan = plan_set(spec, resolved(10), [view(0, 1)], definition=DEFINITION, now=NOW)
    assert plan.create == [(1, 1), (2, 1)]
    assert (plan.status.phase, plan.status.active, plan.status.total, plan.status.progress) == (
        "Running",
        1,
        20,
        "0/20",
    )
    full = plan_set(spec, resolved(10), [view(0, 1), view(1, 1), view(2, 1)], definition=DEFINITION, now=NOW)
    assert full.create == []


def test_plan_counts_unfinished_children_being_deleted_and_foreign_labels_as_active() -> None:
    spec = set_spec(parallelism=2)
    children = [view(0, 1, deleting=True), view(-1, -1)]
    assert plan_set(spec, resolved(5), children, definition=DEFINITION, now=NOW).create == []


def test_plan_completes_when_every_child_finished() -> None:
    spec = set_spec(attempts=1, parallelism=2)
    children = [
        view(0, 1, "Succeeded", outcome="Graded", reward=1.0),
        view(1, 1, "Failed", outcome="Ungraded", failure_kind="outage:image_pull"),
    ]
    plan = plan_set(spec, resolved(2), children, definition=DEFINITION, now=NOW)
    status = plan.status
    assert (status.phase, status.reason, status.completion_time, status.mean_reward) == (
        "Succeeded",
        "Completed",
        NOW,
        1.0,
    )
    assert (status.outcomes.graded, status.outcomes.ungraded, status.phases.failed) == (1, 1, 1)
    assert {c.type: c.status for c in status.conditions} == {
        "Suspended": "False",
        "Complete": "True",
        "Failed": "False",
    }
    assert all(c.message for c in status.conditions)  # a 1.20 API server refuses empty strings
    assert [event[0] for event in plan.events] == ["SetFinished"]


def test_failure_policy_stops_new_children_and_completes_once_the_active_ones_finish() -> None:
    spec = set_spec(parallelism=3, failurePolicy={"maxOutages": 0})
    children = [view(0, 1, "Failed", outcome="Ungraded"), view(1, 1)]
    plan = plan_set(spec, resolved(5), children, definition=DEFINITION, now=NOW)
    assert (plan.create, plan.status.phase, plan.status.reason, plan.status.completion_time) == (
        [],
        "Failed",
        "FailurePolicy",
        None,
    )
    assert "maxOutages=0" in (plan.status.message or "")
    later = plan_set(
        spec,
        plan.status,
        [*children[:1], view(1, 1, "Succeeded", outcome="Graded", reward=1.0)],
        definition=DEFINITION,
        now="2026-01-01T00:00:20.000000Z",
    )
    assert (later.create, later.status.phase, later.status.completion_time) == (
        [],
        "Failed",
        "2026-01-01T00:00:20.000000Z",
    )
    assert later.status.mean_reward == 1.0  # results of children finishing after the stop still count


def test_a_changed_definition_stops_the_set() -> None:
    plan = plan_set(set_spec(parallelism=2), resolved(3), [], definition="sha256:other", now=NOW)
    assert (plan.create, plan.status.phase, plan.status.reason) == ([], "Failed", "DefinitionChanged")
    assert plan.status.completion_time == NOW


def test_suspend_holds_new_children_and_suspends_active_ones_resume_only_its_own() -> None:
    children = [
        view(0, 1),
        view(1, 1, suspended=True),  # suspended by someone else (e.g. Kueue)
        view(2, 1, "Succeeded", outcome="Graded", reward=1.0),
    ]
    plan = plan_set(set_spec(parallelism=5, suspend=True), resolved(4), children, definition=DEFINITION, now=NOW)
    assert (plan.create, plan.suspend, plan.resume) == ([], ["s-0-1"], [])
    assert (plan.status.phase, plan.status.reason) == ("Running", "Suspended")
    resumed = [
        view(0, 1, suspended=True, suspended_by_set=True),
        view(1, 1, suspended=True),
        children[2],
    ]
    plan = plan_set(set_spec(parallelism=5), resolved(4), resumed, definition=DEFINITION, now=NOW)
    assert (plan.resume, plan.create) == (["s-0-1"], [(3, 1)])
    never_started = plan_set(set_spec(suspend=True), resolved(2), [], definition=DEFINITION, now=NOW)
    assert (never_started.status.phase, never_started.create) == ("Pending", [])


def test_an_unchanged_look_changes_nothing() -> None:
    spec = set_spec(attempts=2, parallelism=2)
    children = [view(0, 1, created_at="t"), view(0, 2, "Succeeded", outcome="Graded", reward=1.0)]
    first = plan_set(spec, resolved(2), children, definition=DEFINITION, now=NOW)
    second = plan_set(spec, first.status, children, definition=DEFINITION, now="2026-01-01T00:09:00.000000Z")
    assert second.status.to_api() == first.status.to_api()


@pytest.mark.parametrize("seed", range(25))
def test_simulated_runs_with_crashes_never_exceed_parallelism_nor_duplicate(seed: int) -> None:
    """The controller against a simulated cluster: children finish in random order, finished ones
    the set has recorded get deleted (a TTL), the operator "crashes" at random (a pass's status
    write or some of its creates are lost), and still no more than ``parallelism`` children are
    ever active, each slot is created once, and all finish."""
    rng = random.Random(seed)
    tasks, attempts, parallelism = rng.randint(1, 12), rng.randint(1, 3), rng.randint(1, 5)
    spec = set_spec(attempts=attempts, parallelism=parallelism)
    stored = resolved(tasks)
    cluster: dict[tuple[int, int], str] = {}  # slot -> phase
    created: list[tuple[int, int]] = []
    for step in itertools.count():
        assert step < 10_000
        children = [
            view(i, a, phase, outcome="Graded" if phase == "Succeeded" else None, reward=float(i % 2))
            for (i, a), phase in cluster.items()
        ]
        plan = plan_set(spec, stored, children, definition=DEFINITION, now=f"2026-01-01T00:00:{step % 60:02d}Z")
        crash = rng.random() < 0.2
        if not crash:
            stored = plan.status
        for slot in plan.create:
            if crash and rng.random() < 0.5:
                break  # the operator died before this create
            assert slot not in created, f"{slot} created twice"
            cluster[slot] = "Running"
            created.append(slot)
            assert sum(1 for phase in cluster.values() if phase == "Running") <= parallelism
        if stored.completion_time:
            break
        running = [slot for slot, phase in cluster.items() if phase == "Running"]
        for slot in rng.sample(running, rng.randint(0, len(running))):
            cluster[slot] = "Succeeded"
        recorded = {(t.index, r.attempt) for t in stored.tasks for r in t.children if r.phase == "Succeeded"}
        for slot in [slot for slot in recorded if slot in cluster and rng.random() < 0.3]:
            del cluster[slot]
    assert sorted(created) == sorted(set(created)) == sorted(itertools.product(range(tasks), range(1, attempts + 1)))
    assert stored.phase == "Succeeded" and stored.finished == tasks * attempts


# --- models -------------------------------------------------------------------------------------
def test_the_template_is_episode_spec_without_task_agent_and_regrade() -> None:
    assert set(EpisodeTemplate.model_fields) == set(EpisodeSpec.model_fields) - {"task", "agent", "regrade"}
    for name, field in EpisodeTemplate.model_fields.items():
        assert field.description == EpisodeSpec.model_fields[name].description, name


def test_child_spec_takes_the_template_the_task_and_the_agent_with_set_env_first() -> None:
    spec = EpisodeSetSpec.model_validate(
        {
            "dataset": {"tasks": [{"configMap": {"name": "task-a"}}]},
            "agent": {"kind": "command", "command": "run", "env": [{"name": "EPISODE_SET_ATTEMPT", "value": "mine"}]},
            "template": {"timeoutMultiplier": 2, "retries": {"outages": 0}, "suspend": True},
        }
    )
    child = child_spec(spec, TaskSource.model_validate({"configMap": {"name": "task-a"}}), {"EPISODE_SET_ATTEMPT": "2"})
    assert (child.timeout_multiplier, child.retries.outages, child.suspend) == (2.0, 0, True)
    assert child.debug.keep_pods is False  # unset in the template: the Episode default
    assert child.agent.env == [
        {"name": "EPISODE_SET_ATTEMPT", "value": "2"},
        {"name": "EPISODE_SET_ATTEMPT", "value": "mine"},  # later wins in Kubernetes: the user's
    ]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"dataset": {}}, "spec.dataset is empty"),
        ({"dataset": {"tasks": []}}, "spec.dataset is empty"),
        ({"dataset": {"tasks": [{"name": "x"}]}}, "exactly one of inline, configMap or oci"),
        ({"dataset": {"selector": {}}}, "empty selector"),
        ({"dataset": {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}}, "needs values"),
        ({"parallelism": 0}, "greater than or equal to 1"),
        ({"attempts": 0}, "greater than or equal to 1"),
        ({"failurePolicy": {"maxOutages": -1}}, "greater than or equal to 0"),
        ({"template": {"timeoutMultiplier": 0}}, "greater than 0"),
    ],
)
def test_invalid_set_specs(change: dict[str, Any], fragment: str) -> None:
    document = {"dataset": {"tasks": [{"inline": {"files": {}}}]}, "agent": {"kind": "oracle"}, **change}
    with pytest.raises(ValidationError) as error:
        EpisodeSetSpec.model_validate(document)
    assert fragment in str(error.value)


def test_selector_renders_as_a_label_selector() -> None:
    spec = EpisodeSetSpec.model_validate(
        {
            "agent": {"kind": "nop"},
            "dataset": {
                "selector": {
                    "matchLabels": {"b": "2", "a": "1"},
                    "matchExpressions": [
                        {"key": "c", "operator": "In", "values": ["x", "y"]},
                        {"key": "d", "operator": "NotIn", "values": ["z"]},
                        {"key": "e", "operator": "Exists"},
                        {"key": "f", "operator": "DoesNotExist"},
                    ],
                }
            },
        }
    )
    assert spec.dataset.selector is not None
    assert spec.dataset.selector.render() == "a=1,b=2,c in (x,y),d notin (z),e,!f"


def test_definition_digest_covers_what_is_evaluated_only() -> None:
    base = {"dataset": {"tasks": []}, "agent": {"kind": "nop"}, "attempts": 2, "parallelism": 1}
    assert definition_digest(base) == definition_digest({**base, "parallelism": 8, "suspend": True})
    assert definition_digest(base) != definition_digest({**base, "attempts": 3})
    assert definition_digest(base) != definition_digest({**base, "template": {"image": "x"}})


def test_precise_timestamps_round_trip() -> None:
    assert precise_timestamp(1767225600.25) == "2026-01-01T00:00:00.250000Z"
    assert parse_timestamp("2026-01-01T00:00:00.250000Z") == 1767225600.25
    assert parse_timestamp("2026-01-01T00:00:00Z") == 1767225600.0


def test_every_condition_of_a_set_carries_the_generation_it_was_computed_from() -> None:
    spec = set_spec(parallelism=2)
    first = plan_set(spec, resolved(3), [view(0, 1)], definition=DEFINITION, now=NOW, generation=4)
    assert {c.type: c.observed_generation for c in first.status.conditions} == {
        "Suspended": 4,
        "Complete": 4,
        "Failed": 4,
    }
    later = plan_set(spec, first.status, [view(0, 1)], definition=DEFINITION, now="2026-01-01T00:09:00Z", generation=5)
    # Re-evaluated at generation 5 with the same status: the generation moves, the transition time stays.
    assert {(c.observed_generation, c.last_transition_time) for c in later.status.conditions} == {(5, NOW)}
