"""What an EpisodeSet does next, and what its children add up to (pure).

The set controller (``kube/episodeset_controller.py``) reads the set and its children from the API
server and hands them to :func:`plan_set`, which decides everything: the new status
(records of every child, counts, the mean, pass@k, the phase) and which children to
create, suspend or resume. No I/O happens here, so every rule is a table-driven unit test.

Scoring follows Gym: the mean reward is over *graded* children only; masked children,
terminal failures and outages (``Ungraded``) are counted apart and left out of it. pass@k is
the unbiased estimator of Chen et al. (2021), ``1 − C(n−c, k) / C(n, k)`` per task with ``c``
successes (reward ≥ ``successThreshold``) among ``n`` attempts, averaged over the tasks with
``n ≥ k``. An ``Ungraded`` attempt (its outages used up: the agent got no verdict) is among the
``n`` as a miss, and each row says how many there are: dropped, a task whose attempts keep
failing under the agent would leave the table silently and flatter it. Masked attempts and
terminal failures (the task's, not the agent's) are no samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from math import comb
from typing import Any

from episode_operator.api.episode_resource import ImageStatus
from episode_operator.api.episodeset_resource import (
    EpisodeSetSpec,
    EpisodeSetStatus,
    FailurePolicy,
    OutcomeCounts,
    PassAtK,
    PhaseCounts,
    SetChildStatus,
    SetTaskStatus,
)
from episode_operator.api.naming import document_digest
from episode_operator.api.vocabulary import ConditionStatus, Outcome, Phase, is_terminal, set_condition
from episode_operator.runtime.rerun_plan import apply_rerun

DEFINITION_FIELDS = ("dataset", "attempts", "agent", "template")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: ``n`` samples, ``c`` of them successes, ``1 ≤ k ≤ n``.

    The probability that ``k`` samples drawn without replacement from the ``n`` include
    a success, computed exactly with integers.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, not n={n} c={c} k={k}")
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


def definition_digest(spec: Mapping[str, Any]) -> str:
    """sha256 of what a set evaluates (dataset, attempts, agent, template) in the stored spec."""
    document = {key: spec.get(key) for key in DEFINITION_FIELDS}
    return document_digest(document)


@dataclass(frozen=True)
class ChildView:
    """A child Episode of the set, as listed from the API server."""

    index: int
    attempt: int
    name: str
    phase: Phase | None = None
    outcome: Outcome | None = None
    reward: float | None = None
    failure_kind: str | None = None
    created_at: str | None = None
    finished_at: str | None = None
    suspended: bool = False
    suspended_by_set: bool = False
    deleting: bool = False
    rerun: int = 0  # the spec.rerun generation that made it (0: the set's first run of its slot)
    marked_replaced: bool = False  # labelled as replaced by a rerun
    image: ImageStatus | None = None  # the image its agent sandbox started from, and why (its status.image)

    @property
    def terminal(self) -> bool:
        return is_terminal(self.phase)


@dataclass
class SetPlan:
    """What the controller writes and does after one look at the set and its children."""

    status: EpisodeSetStatus
    create: list[tuple[int, int]] = field(default_factory=list)
    suspend: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    # Replaced children (a rerun made way for them) still without their replaced label: (name, generation).
    mark_replaced: list[tuple[str, int]] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)


def record_children(
    tasks: Sequence[SetTaskStatus], children: Sequence[ChildView], now: str
) -> tuple[list[SetTaskStatus], list[str]]:
    """The tasks with their child records brought up to date; and the children lost unfinished.

    A finished record is final: the child may since have been deleted (a TTL, a person), and
    it is neither replaced nor re-read. An unfinished record whose child is gone is dropped,
    so the child is created again. ``now`` stamps the children first seen finished.
    """
    by_task: dict[int, dict[int, ChildView]] = {}
    for view in children:
        by_task.setdefault(view.index, {})[view.attempt] = view
    updated: list[SetTaskStatus] = []
    lost: list[str] = []
    for task in tasks:
        listed = by_task.get(task.index, {})
        records = {record.attempt: record for record in task.children}
        for attempt, view in listed.items():
            records.setdefault(attempt, SetChildStatus(attempt=attempt, name=view.name))
        kept: list[SetChildStatus] = []
        for attempt, record in sorted(records.items()):
            if is_terminal(record.phase):
                kept.append(record)
                continue
            child = listed.get(attempt)
            if child is None:
                lost.append(record.name)
                continue
            kept.append(
                SetChildStatus(
                    attempt=attempt,
                    name=child.name,
                    phase=child.phase,
                    outcome=child.outcome if child.terminal else None,
                    reward=child.reward if child.terminal else None,
                    failure_kind=child.failure_kind if child.terminal else None,
                    created_at=child.created_at,
                    image=child.image,
                    finished_at=child.finished_at if child.terminal else None,
                    observed_finished_at=now if child.terminal else None,
                )
            )
        updated.append(task.model_copy(update={"children": kept}))
    return updated, lost


def summarize_task(task: SetTaskStatus, threshold: float) -> SetTaskStatus:
    """A task with its counts, mean reward and pass@k over its graded attempts."""
    finished = [record for record in task.children if is_terminal(record.phase)]
    rewards = [record.reward for record in finished if record.outcome == "Graded" and record.reward is not None]
    ungraded = sum(1 for record in finished if record.outcome == "Ungraded")
    successes = sum(1 for reward in rewards if reward >= threshold)
    samples = len(rewards) + ungraded
    return task.model_copy(
        update={
            "finished": len(finished),
            "graded": len(rewards),
            "ungraded": ungraded,
            "successes": successes,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "pass_at_k": [pass_at_k(samples, successes, k) for k in range(1, samples + 1)],
        }
    )


def aggregate(tasks: Sequence[SetTaskStatus], attempts: int) -> tuple[float | None, list[PassAtK]]:
    """Mean reward over every graded child, and pass@k (k = 1 … attempts) over the tasks with n ≥ k
    (n: graded and ungraded attempts)."""
    rewards = [
        record.reward
        for task in tasks
        for record in task.children
        if is_terminal(record.phase) and record.outcome == "Graded" and record.reward is not None
    ]
    mean = sum(rewards) / len(rewards) if rewards else None
    table = []
    for k in range(1, attempts + 1):
        covered = [task for task in tasks if len(task.pass_at_k) >= k]
        values = [task.pass_at_k[k - 1] for task in covered]
        value = sum(values) / len(values) if values else None
        table.append(PassAtK(k=k, value=value, tasks=len(values), ungraded=sum(task.ungraded for task in covered)))
    return mean, table


def count(tasks: Sequence[SetTaskStatus]) -> tuple[PhaseCounts, OutcomeCounts]:
    """Children by phase (a created child not yet Running is Pending), and finished ones by outcome."""
    phases, outcomes = PhaseCounts(), OutcomeCounts()
    fields = {"Graded": "graded", "Masked": "masked", "TerminalFailure": "terminal_failure", "Ungraded": "ungraded"}
    for record in (record for task in tasks for record in task.children):
        phase = (record.phase or "Pending").lower()
        setattr(phases, phase, getattr(phases, phase) + 1)
        if is_terminal(record.phase) and record.outcome is not None:
            name = fields[record.outcome]
            setattr(outcomes, name, getattr(outcomes, name) + 1)
    return phases, outcomes


def selection_status(
    tasks: Sequence[tuple[str, Sequence[ChildView]]], threshold: float, *, now: str
) -> EpisodeSetStatus:
    """The status a set of these Episodes would have (``kubectl episode view -l``): per task ID its
    Episodes as attempts, in the order given, scored as a set's children are (graded mean, pass@k with
    Ungraded attempts as misses, outcome and phase counts). Each view's ``index`` and ``attempt`` are
    ignored: a task's position and an Episode's place in its task's list decide them."""
    records = [SetTaskStatus(index=index, name=name) for index, (name, _episodes) in enumerate(tasks)]
    views = [
        dataclasses.replace(view, index=index, attempt=attempt)
        for index, (_name, episodes) in enumerate(tasks)
        for attempt, view in enumerate(episodes, start=1)
    ]
    recorded, _lost = record_children(records, views, now)
    summarized = [summarize_task(task, threshold) for task in recorded]
    attempts = max((len(episodes) for _name, episodes in tasks), default=0)
    mean, table = aggregate(summarized, attempts)
    phases, outcomes = count(summarized)
    finished = phases.succeeded + phases.failed
    return EpisodeSetStatus(
        phase="Succeeded" if views and finished == len(views) else ("Running" if views else "Pending"),
        total=len(views),
        created=len(views),
        active=len(views) - finished,
        finished=finished,
        progress=f"{finished}/{len(views)}",
        phases=phases,
        outcomes=outcomes,
        mean_reward=mean,
        pass_at_k=table,
        tasks=summarized,
    )


def current_children(
    tasks: Sequence[SetTaskStatus], children: Sequence[ChildView]
) -> tuple[list[ChildView], list[tuple[ChildView, int]]]:
    """The children of each slot's current rerun generation; and the others, which a rerun replaced (with the
    generation that did): they stay, finished and readable, but count nowhere."""
    generations = {task.index: task for task in tasks}
    current: list[ChildView] = []
    replaced: list[tuple[ChildView, int]] = []
    for child in children:
        task = generations.get(child.index)
        expected = task.rerun_generation(child.attempt) if task is not None else 0
        if child.rerun >= expected:
            current.append(child)
        else:
            assert task is not None
            by = next((record.rerun for record in task.replaced if record.name == child.name), expected)
            replaced.append((child, by))
    return current, replaced


def policy_verdict(outcomes: OutcomeCounts, policy: FailurePolicy) -> str | None:
    """Why the failure policy stops the set, or None."""
    if policy.max_outages is not None and outcomes.ungraded > policy.max_outages:
        return (
            f"{outcomes.ungraded} children ended Ungraded (outages), more than "
            f"failurePolicy.maxOutages={policy.max_outages}"
        )
    if policy.max_terminal_failures is not None and outcomes.terminal_failure > policy.max_terminal_failures:
        return (
            f"{outcomes.terminal_failure} children ended TerminalFailure, more than "
            f"failurePolicy.maxTerminalFailures={policy.max_terminal_failures}"
        )
    return None


def next_children(
    tasks: Sequence[SetTaskStatus], attempts: int, children: Sequence[ChildView], room: int
) -> list[tuple[int, int]]:
    """Up to ``room`` (task index, attempt) slots with no child and no record, attempt by attempt.

    Attempt 1 of every task comes before attempt 2 of any, so pass@1 covers the whole
    dataset early.
    """
    if room <= 0:
        return []
    taken = {(child.index, child.attempt) for child in children}
    taken |= {(task.index, record.attempt) for task in tasks for record in task.children}
    chosen: list[tuple[int, int]] = []
    for attempt in range(1, attempts + 1):
        for task in tasks:
            if (task.index, attempt) not in taken:
                chosen.append((task.index, attempt))
                if len(chosen) == room:
                    return chosen
    return chosen


def _truth(value: bool) -> ConditionStatus:
    return "True" if value else "False"


def plan_set(
    spec: EpisodeSetSpec,
    previous: EpisodeSetStatus,
    children: Sequence[ChildView],
    *,
    definition: str,
    now: str,
    generation: int | None = None,
) -> SetPlan:
    """The next status of a resolved set (``previous.tasks`` filled) and what to do now."""
    rerun = apply_rerun(spec, previous, now, lambda tasks, policy: policy_verdict(count(tasks)[1], policy))
    previous = rerun.status
    children, replaced = current_children(previous.tasks, children)
    tasks, lost = record_children(previous.tasks, children, now)
    tasks = [summarize_task(task, spec.success_threshold) for task in tasks]
    mean, table = aggregate(tasks, spec.attempts)
    phases, outcomes = count(tasks)
    total = len(tasks) * spec.attempts
    finished = phases.succeeded + phases.failed
    active = [child for child in children if not child.terminal]
    status = previous.model_copy(
        update={
            "tasks": tasks,
            "total": total,
            "created": sum(len(task.children) for task in tasks),
            "active": len(active),
            "finished": finished,
            "progress": f"{finished}/{total}",
            "phases": phases,
            "outcomes": outcomes,
            "mean_reward": mean,
            "pass_at_k": table,
            "observed_generation": generation,
        }
    )
    plan = SetPlan(status=status, lost=lost, events=list(rerun.events))
    plan.mark_replaced = [(child.name, generation) for child, generation in replaced if not child.marked_replaced]
    for name in lost:
        plan.events.append(("ChildLost", f"episode {name} is gone before it finished; it is created again", True))

    stopped = previous.phase == "Failed"
    if not stopped and previous.definition != definition:
        stopped = True
        status.phase, status.reason = "Failed", "DefinitionChanged"
        status.message = (
            "spec.dataset, attempts, agent or template changed after the set started; a set evaluates one "
            "definition: create a new EpisodeSet (running children finish, none start)"
        )
        plan.events.append(("DefinitionChanged", status.message, True))
    verdict = None if stopped else policy_verdict(outcomes, spec.failure_policy)
    if verdict is not None:
        stopped = True
        status.phase, status.reason = "Failed", "FailurePolicy"
        status.message = verdict + "; running children finish, no more start"
        plan.events.append(("FailurePolicy", status.message, True))

    if spec.suspend:
        plan.suspend = [c.name for c in active if not c.suspended and not c.deleting]
    else:
        plan.resume = [c.name for c in active if c.suspended and c.suspended_by_set and not c.deleting]
    if not stopped and not spec.suspend:
        plan.create = next_children(tasks, spec.attempts, children, spec.parallelism - len(active))

    if not stopped:
        if finished == total:
            status.phase, status.reason = "Succeeded", "Completed"
            status.message = f"{finished} children finished"
        elif spec.suspend:
            status.phase = "Running" if status.created else "Pending"
            status.reason = "Suspended"
            status.message = f"suspended (spec.suspend): {len(active)} active children held, none start"
        else:
            status.phase, status.reason = "Running", None
            status.message = None
    # Every message is non-empty: a 1.20 API server refuses an empty string in a status.
    failed = status.phase == "Failed"
    conditions = [condition.model_copy() for condition in previous.conditions]
    set_condition(
        conditions,
        "Suspended",
        _truth(spec.suspend),
        "SpecSuspend" if spec.suspend else "NotSuspended",
        "spec.suspend is true: no child starts" if spec.suspend else "not suspended",
        now=now,
        generation=generation,
    )
    set_condition(
        conditions,
        "Complete",
        _truth(status.phase == "Succeeded"),
        "Completed" if status.phase == "Succeeded" else "InProgress",
        f"{finished}/{total} children finished",
        now=now,
        generation=generation,
    )
    set_condition(
        conditions,
        "Failed",
        _truth(failed),
        (status.reason or "Failed") if failed else "NotFailed",
        (status.message or "failed") if failed else "not failed",
        now=now,
        generation=generation,
    )
    status.conditions = conditions
    if is_terminal(status.phase) and not active and not plan.create and status.completion_time is None:
        status.completion_time = now
        plan.events.append(
            (
                "SetFinished",
                f"{status.phase}: {finished}/{total} finished, mean reward " + ("-" if mean is None else f"{mean:.4g}"),
                status.phase == "Failed",
            )
        )
    return plan
