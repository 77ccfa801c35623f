"""NeMo Gym's rollout protocol, served by the operator: what a ``POST /run`` asks for and what it gets back (pure).

Gym's collector (``nemo_gym/rollout_collection.py``) posts one of two bodies to an environment
server's ``/run``:

- the **flat row**: the dataset line itself (``instance_id`` ``"<dataset>::<task>"``, or
  ``task_name``), with ``_ng_task_index``, ``_ng_rollout_index``, ``agent_ref`` and, on a resumed
  run's retry, ``_ng_attempt_index``;
- the **episode request** (a materialized row): ``{"episode_id": {"rollout_id", "attempt"},
  "task": {"task_id": {"taskset", "task_id"}, "task_input"}}``.

Both name a task of a dataset in the operator's catalogue and one try of one rollout of it. The
try is an Episode whose name is derived from the run scope, the rollout's capture key
(``<rollout>[-a<attempt>]``, Gym's own) and the task, so a request sent again (Gym re-sends
``/run`` after a dropped connection) finds the Episode it made the first time. The answer is the
row ``kubectl episode export`` writes, minus the keys Gym's collector writes itself; a failure is
the flat row's ``_ng_failure_*`` sidecar keys, or the episode response's ``failure``.

One side retries outages, never both (``RetryOwner``): ``gym`` runs each try once and answers a
lost sandbox as a failure that is not terminal (Gym dispatches the next attempt); ``operator``
retries within the Episode and answers what is left as terminal.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, median, stdev
from typing import Any, Literal

from episode_operator.api import export
from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.export import (
    ATTEMPT_INDEX_KEY,
    ECHOED_KEYS,
    ROLLOUT_INDEX_KEY,
    TASK_ID_KEY,
    TASK_INDEX_KEY,
    EpisodeEvidence,
)
from episode_operator.api.naming import content_name
from episode_operator.api.vocabulary import FailureKind, is_terminal
from episode_operator.runtime.evaluation import pass_at_k

RetryOwner = Literal["gym", "operator"]
Shape = Literal["flat", "episode"]
# Which of Gym's two captures of a rollout's model calls records them at its model server
# (nemo_gym/token_id_capture/config.py): evaluation keeps requests and answers, training token ids and
# log probabilities. Each is a route of Gym's model server under the rollout's prefix.
ModelCapture = Literal["evaluation", "training"]
CAPTURE_ROUTES: dict[ModelCapture, str] = {"evaluation": "", "training": "/training-token-capture"}
ROLLOUT_PREFIX = "ng-rollout"  # Gym's per-rollout path on its model server (config_types.ROLLOUT_PATH_PREFIX)

# Gym's EpisodeId.rollout_id (episode_types.py): a retry is spelled by `attempt`, never by the id.
ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RETRY_SUFFIX = re.compile(r"-a\d+$")
INSTANCE_SEPARATOR = "::"  # Gym's harbor agent: instance_id = "<dataset alias>::<task name>"
# What Gym's collector refuses in an episode result (rollout_collection.py `_episode_record`).
COLLECTOR_RESERVED = frozenset({"ng_trajectory", "ng_model_call_capture", "ng_perf"})
# Keys the collector writes on every record itself, from the row it sent: not answered.
COLLECTOR_STAMPED = frozenset({export.AGENT_REF_KEY})
IDENTITY_LIMIT = 16 * 1024  # bytes of a try's identity kept on its Episode (an annotation)
FAILURE_REASON_LIMIT = 2000  # EpisodeFailure.failure_reason's max_length


class GymRequestError(ValueError):
    """A ``/run`` body the server cannot run, naming the key."""


@dataclass(frozen=True)
class TaskRef:
    """A task of a dataset in the operator's catalogue."""

    dataset: str
    task: str


@dataclass(frozen=True)
class GymRun:
    """One try of one rollout of a task, as a ``/run`` body names it."""

    shape: Shape
    rollout_id: str
    attempt: int
    task: TaskRef
    task_index: int | None
    rollout_index: int | None
    body: Mapping[str, Any]

    @property
    def capture_key(self) -> str:
        """Gym's capture key (``EpisodeId.capture_key``, ``maybe_rollout_id_from_run_body``)."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"

    @property
    def identity(self) -> dict[str, Any]:
        """Gym's identity keys of the try, kept on its Episode so that its exported rows carry them."""
        keys: dict[str, Any] = {key: self.body[key] for key in ECHOED_KEYS if key in self.body}
        if self.shape == "flat" and isinstance(self.body.get(export.AGENT_REF_KEY), Mapping):
            keys[export.AGENT_REF_KEY] = dict(self.body[export.AGENT_REF_KEY])
        if self.shape == "episode":
            keys[TASK_ID_KEY] = dict(self.body["task"]["task_id"])
        if self.attempt:
            keys[ATTEMPT_INDEX_KEY] = self.attempt
        return keys


def _int(body: Mapping[str, Any], key: str, *, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GymRequestError(f"{where}{key}: a non-negative integer, not {value!r}")
    return value


def _rollout_id(value: Any, key: str) -> str:
    if not isinstance(value, str) or not ROLLOUT_ID.match(value) or RETRY_SUFFIX.search(value):
        raise GymRequestError(
            f"{key}: letters, digits, '.', '_' and '-', starting with a letter or digit, not ending in "
            f"-a<N> (a retry is its attempt), not {value!r}"
        )
    return value


def _task_ref(name: Any, key: str, dataset: str | None, default_dataset: str | None) -> TaskRef:
    if not isinstance(name, str) or not name:
        raise GymRequestError(f"{key}: a task name, not {name!r}")
    if INSTANCE_SEPARATOR in name:
        dataset, _, name = name.partition(INSTANCE_SEPARATOR)
    dataset = dataset or default_dataset
    if not dataset or not name:
        raise GymRequestError(
            f"{key}: {name!r} names no dataset: use '<dataset>::<task>' or set the server's default dataset"
        )
    return TaskRef(dataset, name)


def parse_run(body: Any, default_dataset: str | None = None) -> GymRun:
    """The try a ``/run`` body asks for; :class:`GymRequestError` names what is wrong."""
    if not isinstance(body, Mapping):
        raise GymRequestError("the body: a JSON object (a flat row or an episode request)")
    if isinstance(body.get("episode_id"), Mapping) and isinstance(body.get("task"), Mapping):
        run = _parse_episode(body, default_dataset)
    else:
        run = _parse_flat(body, default_dataset)
    if len(json.dumps(run.identity)) > IDENTITY_LIMIT:
        raise GymRequestError(
            f"{', '.join(sorted(run.identity))}: more than {IDENTITY_LIMIT} bytes of the try's identity"
        )
    return run


def _parse_flat(body: Mapping[str, Any], default_dataset: str | None) -> GymRun:
    if export.AGENT_REF_KEY in body and not isinstance(body[export.AGENT_REF_KEY], Mapping):
        raise GymRequestError(f"agent_ref: an object such as {{'name': 'harbor_agent'}}, not {body['agent_ref']!r}")
    task_index = _int(body, TASK_INDEX_KEY)
    rollout_index = _int(body, ROLLOUT_INDEX_KEY)
    if "_ng_rollout_id" in body:
        rollout_id = _rollout_id(body["_ng_rollout_id"], "_ng_rollout_id")
    elif task_index is not None and rollout_index is not None:
        rollout_id = f"{task_index}-{rollout_index}"
    else:
        raise GymRequestError("_ng_task_index and _ng_rollout_index (or _ng_rollout_id): needed to name the rollout")
    key = next((key for key in ("task_name", "instance_id") if key in body), None)
    if key is None:
        raise GymRequestError("instance_id ('<dataset>::<task>') or task_name: which task to run")
    return GymRun(
        shape="flat",
        rollout_id=rollout_id,
        attempt=_int(body, ATTEMPT_INDEX_KEY) or 0,
        task=_task_ref(body[key], key, None, default_dataset),
        task_index=task_index,
        rollout_index=rollout_index,
        body=body,
    )


def _parse_episode(body: Mapping[str, Any], default_dataset: str | None) -> GymRun:
    episode_id, task = body["episode_id"], body["task"]
    task_id = task.get("task_id")
    if not isinstance(task_id, Mapping):
        raise GymRequestError("task.task_id: {taskset, task_id}")
    taskset = task_id.get("taskset")
    if taskset is not None and not isinstance(taskset, str):
        raise GymRequestError(f"task.task_id.taskset: a dataset name, not {taskset!r}")
    task_input = task.get("task_input")
    if not isinstance(task_input, Mapping):
        raise GymRequestError("task.task_input: an object")
    return GymRun(
        shape="episode",
        rollout_id=_rollout_id(episode_id.get("rollout_id"), "episode_id.rollout_id"),
        attempt=_int(episode_id, "attempt", where="episode_id.") or 0,
        task=_task_ref(task_id.get("task_id"), "task.task_id.task_id", taskset, default_dataset),
        task_index=_int(task_input, TASK_INDEX_KEY, where="task.task_input."),
        rollout_index=_int(task_input, ROLLOUT_INDEX_KEY, where="task.task_input."),
        body=body,
    )


def model_base_url(model_server: str, capture_key: str, capture: ModelCapture) -> str:
    """A try's model base URL through Gym's model server, as Gym's own agents make it
    (``resolve_model_base_url``: the server, ``/ng-rollout/<capture key>`` and the capture's route, ``/v1``)."""
    return f"{model_server.rstrip('/')}/{ROLLOUT_PREFIX}/{capture_key}{CAPTURE_ROUTES[capture]}/v1"


def episode_name(scope: str, run: GymRun) -> str:
    """The Episode of a try: the same scope, capture key and task always give the same name."""
    identity = {"scope": scope, "capture_key": run.capture_key, "dataset": run.task.dataset, "task": run.task.task}
    return content_name(f"gym-{run.capture_key}", identity, fallback="gym")


# --- answers ------------------------------------------------------------------------------------------------
def failure_terminal(outcome: str | None, retry_owner: RetryOwner) -> bool:
    """Whether Gym must not dispatch the rollout again: after a terminal failure always; after an
    outage (``Ungraded``) only when the operator already retried it."""
    return outcome == "TerminalFailure" or retry_owner == "operator"


def answer(
    run: GymRun, episode: Mapping[str, Any], evidence: EpisodeEvidence, retry_owner: RetryOwner
) -> dict[str, Any]:
    """What ``/run`` returns for the finished Episode of a try."""
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    if not is_terminal(status.phase):
        raise ValueError(f"{export.episode_name(episode['metadata'])} has not finished")
    rollouts, failures = export.rows(episode, evidence)
    terminal = failure_terminal(status.outcome, retry_owner)
    if run.shape == "flat":
        echoed = {key: run.body[key] for key in ECHOED_KEYS if key in run.body}
        if rollouts:
            return {
                key: value
                for key, value in rollouts[0].items()
                if not key.startswith("_ng_") and key not in COLLECTOR_STAMPED
            } | echoed
        final = failures[-1]
        kept = {key: value for key, value in final.items() if key.startswith("_ng_failure_")}
        extra = {"failure_kind": final.get("failure_kind"), "episode": final.get("episode")}
        return kept | {"_ng_failure_terminal": terminal} | extra | echoed
    ids = {"episode_id": dict(run.body["episode_id"]), "task_id": dict(run.body["task"]["task_id"])}
    if rollouts:
        result = {
            key: value
            for key, value in rollouts[0].items()
            if not key.startswith("_ng_") and key not in COLLECTOR_RESERVED | COLLECTOR_STAMPED
        }
        return ids | {"result": result, "failure": None}
    final = failures[-1]
    failure: dict[str, Any] = {
        "failure_reason": str(final.get("_ng_failure_message") or status.outcome)[:FAILURE_REASON_LIMIT],
        "terminal": terminal,
    }
    if final.get("failure_kind"):
        failure["failure_kind"] = final["failure_kind"]
    if final.get("_ng_failure_stage"):
        failure["stage"] = final["_ng_failure_stage"]
    return ids | {"result": None, "failure": failure}


def failure_answer(
    run: GymRun, reason: str, *, terminal: bool, failure_kind: str, stage: export.FailureStage | None = None
) -> dict[str, Any]:
    """A failure the server answers itself (no Episode row): in the request's shape."""
    reason = reason[:FAILURE_REASON_LIMIT]
    if run.shape == "episode":
        failure: dict[str, Any] = {"failure_reason": reason, "terminal": terminal, "failure_kind": failure_kind}
        if stage:
            failure["stage"] = stage
        ids = {"episode_id": dict(run.body["episode_id"]), "task_id": dict(run.body["task"]["task_id"])}
        return ids | {"result": None, "failure": failure}
    row: dict[str, Any] = {
        "_ng_failure_class": export.FAILURE_CLASS,
        "_ng_failure_terminal": terminal,
        "_ng_failure_message": reason,
        "failure_kind": failure_kind,
    }
    if stage:
        row["_ng_failure_stage"] = stage
    return row


def cancelled_answer(run: GymRun, reason: str) -> dict[str, Any]:
    """A try that ended without a verdict (the server is stopping, its Episode was deleted): Gym may
    dispatch it again."""
    return failure_answer(run, reason, terminal=False, failure_kind="cancelled")


def refused_answer(run: GymRun, reason: str, failure_kind: FailureKind) -> dict[str, Any]:
    """A try that cannot run (no such task, the API server refuses its Episode): running it again
    would fail the same way."""
    return failure_answer(run, reason, terminal=True, failure_kind=failure_kind, stage="admission")


# --- /aggregate_metrics -------------------------------------------------------------------------------------
STATS: dict[str, Callable[[list[float]], float]] = {"mean": fmean, "max": max, "min": min, "median": median}


def numeric_fields(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers Gym's RewardProfiler profiles: top-level bool/int/float keys not starting with
    ``_``, and the response's usage counts."""
    usage = (row.get("response") or {}).get("usage") or {}
    merged = {**row, **usage} if isinstance(usage, Mapping) else dict(row)
    return {
        key: float(value)
        for key, value in merged.items()
        if not key.startswith("_") and isinstance(value, bool | int | float)
    }


def describe(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``<stat>/<field>`` over the rows, as pandas' ``describe`` gives Gym (sample std; 0 for one row)."""
    columns: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in numeric_fields(row).items():
            columns[key].append(value)
    out: dict[str, float] = {}
    for key, values in sorted(columns.items()):
        for stat, function in STATS.items():
            out[f"{stat}/{key}"] = float(function(values))
        out[f"std/{key}"] = stdev(values) if len(values) > 1 else 0.0
    return out


def pass_metrics(tasks: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, float]:
    """Gym's ``compute_pass_majority_metrics`` with its harbor agent's score (``accuracy`` = the reward;
    a row without a reward is no score): ``pass@k`` and ``pass@1[avg-of-k]``, percentages."""
    scores = [[float(row["reward"]) for row in rollouts if row.get("reward") is not None] for rollouts in tasks]
    max_k = max((len(rollouts) for rollouts in tasks), default=0)
    metrics: dict[str, float] = {}
    for k in range(1, max_k + 1):
        passes = []
        for values in scores:
            if not values or k > len(values):
                continue
            if all(value in (0.0, 1.0) for value in values):
                passes.append(pass_at_k(len(values), sum(1 for value in values if value), k))
            else:
                passes.append(max(values[:k]))
        if passes:
            metrics[f"pass@{k}/accuracy"] = 100.0 * sum(passes) / len(passes)
        averages = [sum(values[:k]) / len(values[:k]) for values in scores if values[:k]]
        if averages:
            metrics[f"pass@1[avg-of-{k}]/accuracy"] = 100.0 * sum(averages) / len(averages)
    return metrics


def aggregate_metrics(verify_responses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Gym's ``AggregateMetrics`` of the rows its collector kept: per task and over all rollouts.

    Masked rows (``mask_sample``) are left out of the scores, as Gym's collector leaves them out.
    """
    for number, row in enumerate(verify_responses):
        if not isinstance(row, Mapping) or not isinstance(row.get(TASK_INDEX_KEY), int):
            raise GymRequestError(f"verify_responses[{number}]: an object with an integer {TASK_INDEX_KEY}")
    measured = [row for row in verify_responses if not row.get("mask_sample")]
    by_task: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for row in measured:
        by_task[int(row[TASK_INDEX_KEY])].append(row)
    tasks = [sorted(rows, key=lambda row: int(row.get(ROLLOUT_INDEX_KEY) or 0)) for _, rows in sorted(by_task.items())]
    agent_metrics: dict[str, Any] = describe(measured) | pass_metrics(tasks)
    agent_metrics["num_repeats"] = len({row.get(ROLLOUT_INDEX_KEY) for row in measured})
    group_level = [
        {TASK_INDEX_KEY: index, **describe(rows), "num_rollouts": len(rows)} for index, rows in sorted(by_task.items())
    ]
    key_metrics = {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}
    longest = max((len(rollouts) for rollouts in tasks), default=0)
    highest = max((k for k in range(1, longest + 1) if f"pass@{k}/accuracy" in agent_metrics), default=0)
    if highest:
        key_metrics[f"pass@{highest}/accuracy"] = agent_metrics[f"pass@{highest}/accuracy"]
        key_metrics[f"pass@1[avg-of-{highest}]/accuracy"] = agent_metrics[f"pass@1[avg-of-{highest}]/accuracy"]
    return {"group_level_metrics": group_level, "agent_metrics": agent_metrics, "key_metrics": key_metrics}
