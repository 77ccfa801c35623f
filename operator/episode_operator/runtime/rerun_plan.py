"""An EpisodeSet's rerun (``spec.rerun``): which finished children make way for new ones, once per generation (pure).

A rerun is declared: ``spec.rerun.generation`` raised (by ``kubectl episode rerun`` or a commit) asks the
set to re-run, in place, the children finished by then whose outcome and failure kind it names. The set
applies each generation once — its status records every generation seen (``status.reruns``), applied or
refused — so a re-applied manifest or a restarted operator re-runs nothing twice. Applying one moves
each selected child's record into its task's ``replaced`` history (what it was, and the generation
that replaced it) and frees its slot; the controller then creates the slot's child again, named and
labelled with the generation (``<set>-<task>-<attempt>-r<generation>``), while the replaced Episode
stays readable, labelled as replaced. The counts, the mean and pass@k are computed from the records,
so they reflect the re-run children, never the replaced ones.

What may be re-run is a table: an outcome that is no verdict. A Graded child is never re-run, whatever
its reward or failure kind: re-rolling verdicts until they pass would inflate pass@k.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, get_args

from episode_operator.api.episodeset_resource import (
    MAX_REPLACED,
    EpisodeSetSpec,
    EpisodeSetStatus,
    FailurePolicy,
    ReplacedChild,
    RerunOutcome,
    RerunRecord,
    RerunSpec,
    SetChildStatus,
    SetTaskStatus,
)
from episode_operator.api.vocabulary import failure_kind_matches, is_terminal

# The outcomes a rerun may re-run, and why each is no verdict on the agent.
RERUNNABLE: Final[Mapping[RerunOutcome, str]] = {
    "Ungraded": "its outages used up its retries: the agent got no verdict",
    "TerminalFailure": "the task could not start (a refused task, a failed build or first setup): no agent acted",
    "Masked": "the verifier could not start or receive its inputs: no verdict",
}
assert set(RERUNNABLE) == set(get_args(RerunOutcome))
# Why a set stopped, and whether a rerun reopens it: a completed set, or one its failure policy stopped (the
# rerun's replaced children no longer count against it); any other stop is the set's definition's.
REOPENED_BY_RERUN: Final[Mapping[str, bool]] = {
    "Completed": True,
    "FailurePolicy": True,
    "DefinitionChanged": False,
    "DatasetUnavailable": False,
    "DatasetTooLarge": False,
    "InvalidSpec": False,
    "ChildRefused": False,
    "NameConflict": False,
}


def rerun_requested(spec: Mapping[str, Any] | None, status: Mapping[str, Any] | None) -> bool:
    """Whether the set's stored spec asks for a rerun generation its status has not seen (raw objects: what
    kopf's filter and the controller read before any model)."""
    rerun = (spec or {}).get("rerun") or {}
    generation = rerun.get("generation") if isinstance(rerun, Mapping) else None
    if not isinstance(generation, int):
        return False
    seen = [record.get("generation") for record in (status or {}).get("reruns") or [] if isinstance(record, Mapping)]
    return generation > max((value for value in seen if isinstance(value, int)), default=0)


def selected(record: SetChildStatus, rerun: RerunSpec) -> bool:
    """Whether a child's record is one ``rerun`` re-runs: finished, no verdict, its outcome and failure kind named."""
    if not is_terminal(record.phase) or record.outcome not in RERUNNABLE:
        return False
    if rerun.outcomes and record.outcome not in rerun.outcomes:
        return False
    return not rerun.failure_kinds or any(
        failure_kind_matches(kind, record.failure_kind) for kind in rerun.failure_kinds
    )


def selection(tasks: Sequence[SetTaskStatus], rerun: RerunSpec) -> list[tuple[int, SetChildStatus]]:
    """(task index, record) of every child ``rerun`` would re-run now, in task then attempt order."""
    return [(task.index, record) for task in tasks for record in task.children if selected(record, rerun)]


@dataclass
class RerunResult:
    """The status with a rerun generation applied (or refused), and the Events that say so."""

    status: EpisodeSetStatus
    events: list[tuple[str, str, bool]] = field(default_factory=list)


def _refusal(
    spec: EpisodeSetSpec,
    previous: EpisodeSetStatus,
    chosen: Sequence[tuple[int, SetChildStatus]],
    policy_stops: str | None,
) -> str | None:
    """Why this rerun cannot be applied (the set goes on as it was), or None."""
    rerun = spec.rerun
    assert rerun is not None
    if not rerun.outcomes and not rerun.failure_kinds:
        return "it names no outcomes and no failureKinds: name what to re-run"
    reason = previous.reason or ""
    if previous.phase == "Failed" and not REOPENED_BY_RERUN.get(reason, False):
        return f"the set stopped for good ({reason}: {previous.message}); a rerun re-runs children, create a new set"
    kept = sum(len(task.replaced) for task in previous.tasks)
    if kept + len(chosen) > MAX_REPLACED:
        return (
            f"it would replace {len(chosen)} children where the status keeps {kept} already, more than the "
            f"{MAX_REPLACED} replaced children a set's status holds; create a new set"
        )
    if policy_stops is not None:
        return (
            f"the failure policy would stop the set again at once ({policy_stops}) and the replaced children would "
            "never re-run; raise spec.failurePolicy, or re-run those children too"
        )
    return None


def apply_rerun(
    spec: EpisodeSetSpec,
    previous: EpisodeSetStatus,
    now: str,
    policy_stops: Callable[[Sequence[SetTaskStatus], FailurePolicy], str | None],
) -> RerunResult:
    """``previous`` with the requested rerun generation applied once: the selected records moved to their tasks'
    ``replaced``, a stopped set reopened; or the generation recorded as refused. Unchanged when there is no new
    generation. ``policy_stops``: why the set's failure policy would stop a set of these tasks (the set's own
    rule, runtime/evaluation.py), or None."""
    rerun = spec.rerun
    if rerun is None or rerun.generation <= previous.rerun_generation:
        return RerunResult(previous)
    status = previous.model_copy(deep=True)
    chosen = selection(status.tasks, rerun)
    names = {(index, record.attempt) for index, record in chosen}
    remaining = [
        task.model_copy(update={"children": [r for r in task.children if (task.index, r.attempt) not in names]})
        for task in status.tasks
    ]
    stops = policy_stops(remaining, spec.failure_policy) if previous.reason == "FailurePolicy" else None
    record = RerunRecord(
        generation=rerun.generation,
        outcomes=list(rerun.outcomes),
        failure_kinds=list(rerun.failure_kinds),
        applied_at=now,
    )
    refusal = _refusal(spec, previous, chosen, stops)
    if refusal is not None:
        record.message = refusal
        status.reruns.append(record)
        return RerunResult(status, [("RerunRefused", f"rerun generation {rerun.generation}: {refusal}", True)])
    by_index = {task.index: task for task in remaining}
    for index, child in chosen:
        by_index[index].replaced.append(
            ReplacedChild(
                attempt=child.attempt,
                name=child.name,
                outcome=child.outcome,
                failure_kind=child.failure_kind,
                finished_at=child.finished_at,
                rerun=rerun.generation,
            )
        )
    record.replaced = len(chosen)
    status.tasks = remaining
    status.reruns.append(record)
    if chosen or previous.phase == "Failed":
        # Reopened: the controller creates the freed slots' children (and, for a set its policy stopped, the
        # ones never started) and recomputes the phase from the records.
        status.phase, status.reason, status.message, status.completion_time = "Running", None, None, None
    listed = ", ".join(child.name for _, child in chosen[:20]) + (" …" if len(chosen) > 20 else "")
    message = f"rerun generation {rerun.generation}: re-running {len(chosen)} children" + (
        f" ({listed})" if chosen else ""
    )
    return RerunResult(status, [("RerunStarted", message, False)])
