"""The children of an EpisodeSet: their names, labels and manifests, and how a listed child is read."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import ValidationError

from episode_operator.api.episode_resource import ImageStatus, TaskSource, episode_manifest
from episode_operator.api.episodeset_resource import (
    CREATED_AT_ANNOTATION,
    SET_TASK_NAME_ANNOTATION,
    SUSPENDED_BY_SET_ANNOTATION,
    EpisodeSetSpec,
    SetTaskStatus,
    child_spec,
)
from episode_operator.api.vocabulary import (
    MANAGED_BY,
    PREPULL_ANNOTATION,
    QUEUE_LABEL,
    SET_ATTEMPT_LABEL,
    SET_LABEL,
    SET_REPLACED_LABEL,
    SET_RERUN_LABEL,
    SET_TASK_INDEX_LABEL,
    TASK_LABEL,
    WARM_POOL_ANNOTATION,
    Phase,
)
from episode_operator.kube.objects.pods import NAME_LIMIT, OwnerRef, label_value, short_name
from episode_operator.runtime.evaluation import ChildView


def child_name(set_name: str, index: int, attempt: int, rerun: int = 0) -> str:
    """``<set>-<task index>-<attempt>`` (``…-r<generation>`` for a rerun's): a DNS-safe name, 63 characters at most."""
    return short_name(set_name, f"{index}-{attempt}" + (f"-r{rerun}" if rerun else ""))


def set_selector(set_name: str) -> str:
    """The label selector of every child of a set, replaced ones included (the controller's)."""
    return f"{SET_LABEL}={label_value(set_name)}"


def set_results_selector(set_name: str) -> str:
    """The label selector of a set's children that count: none a rerun replaced (what exports read)."""
    return f"{set_selector(set_name)},!{SET_REPLACED_LABEL}"


def task_label_value(task: str) -> str:
    """A task ID as a label value: other characters become '-', long ones keep a hash."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", task).strip("-._")
    if len(cleaned) > NAME_LIMIT or cleaned != task:
        digest = hashlib.sha256(task.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[: NAME_LIMIT - 9].rstrip('-._')}-{digest}".lstrip("-")
    return cleaned


def task_source(spec: EpisodeSetSpec, task: SetTaskStatus) -> TaskSource:
    """Where a task's files come from: its entry of ``spec.dataset.tasks``, or its selected ConfigMap."""
    if task.index < len(spec.dataset.tasks):
        return TaskSource.model_validate(spec.dataset.tasks[task.index].to_api())
    assert task.config_map is not None
    return TaskSource.model_validate({"configMap": {"name": task.config_map}})


def child_manifest(
    ref: OwnerRef, spec: EpisodeSetSpec, task: SetTaskStatus, attempt: int, created_at: str
) -> dict[str, Any]:
    """A child Episode: owned by the set, named and labelled by task and attempt."""
    rerun = task.rerun_generation(attempt)
    env = {
        "EPISODE_SET": ref.name,
        "EPISODE_SET_TASK": task.name,
        "EPISODE_SET_TASK_INDEX": str(task.index),
        "EPISODE_SET_ATTEMPT": str(attempt),
        **({"EPISODE_SET_RERUN": str(rerun)} if rerun else {}),
    }
    labels = {
        **MANAGED_BY,
        SET_LABEL: label_value(ref.name),
        TASK_LABEL: task_label_value(task.name),
        SET_TASK_INDEX_LABEL: str(task.index),
        SET_ATTEMPT_LABEL: str(attempt),
    }
    if spec.queue_name:
        labels[QUEUE_LABEL] = spec.queue_name
    if rerun:
        labels[SET_RERUN_LABEL] = str(rerun)
    manifest = episode_manifest(
        ref.namespace,
        child_spec(spec, task_source(spec, task), env),
        name=child_name(ref.name, task.index, attempt, rerun),
        labels=labels,
    )
    manifest["metadata"]["annotations"] = {SET_TASK_NAME_ANNOTATION: task.name, CREATED_AT_ANNOTATION: created_at}
    if spec.warm_pool is not None:  # its attempts look in the set's pool before making a pod (docs/warm-pools.md)
        manifest["metadata"]["annotations"][WARM_POOL_ANNOTATION] = "true"
    if spec.pre_pull is not None:  # its agent pods prefer the nodes holding their images (docs/prepull.md)
        manifest["metadata"]["annotations"][PREPULL_ANNOTATION] = "true"
    manifest["metadata"]["ownerReferences"] = [ref.owner_reference()]
    return manifest


def child_view(item: Mapping[str, Any]) -> ChildView:
    metadata = item["metadata"]
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    status = item.get("status") or {}
    try:
        index, attempt = int(labels[SET_TASK_INDEX_LABEL]), int(labels[SET_ATTEMPT_LABEL])
    except (KeyError, ValueError):
        index, attempt = -1, -1  # not one of ours after all: counted active, never matched to a task
    phase = status.get("phase")
    return ChildView(
        index=index,
        attempt=attempt,
        name=metadata["name"],
        phase=phase if phase in get_args(Phase) else None,
        outcome=status.get("outcome"),
        reward=status.get("reward"),
        failure_kind=status.get("failureKind"),
        created_at=annotations.get(CREATED_AT_ANNOTATION) or metadata.get("creationTimestamp"),
        finished_at=status.get("finishedAt"),
        suspended=bool((item.get("spec") or {}).get("suspend")),
        suspended_by_set=annotations.get(SUSPENDED_BY_SET_ANNOTATION) == "true",
        deleting=bool(metadata.get("deletionTimestamp")),
        rerun=_generation(labels.get(SET_RERUN_LABEL)),
        marked_replaced=SET_REPLACED_LABEL in labels,
        image=_image(status.get("image")),
    )


def _image(value: Any) -> ImageStatus | None:
    """The child's status.image, when it is one (a status we cannot read says nothing)."""
    if not isinstance(value, dict):
        return None
    try:
        return ImageStatus.model_validate(value)
    except ValidationError:
        return None


def _generation(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def replaced_patch(generation: int) -> dict[str, Any]:
    """The merge patch that labels a child as replaced by rerun ``generation``."""
    return {"metadata": {"labels": {SET_REPLACED_LABEL: str(generation)}}}
