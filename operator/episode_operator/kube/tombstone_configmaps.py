"""Keeping tombstones (:mod:`episode_operator.runtime.tombstones`) in a ConfigMap per namespace, and the
two hooks that use them: the TTL's deletion (:func:`expire_episode`) and the start of a driver
(:func:`answer_from_tombstone`).

The ConfigMap ``episode-operator-tombstones`` holds one entry per Episode name (the tombstone as JSON);
writes are compare-and-swap on its resourceVersion, so Episodes expiring together lose none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.vocabulary import timestamp
from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.status import KubeStatusSink
from episode_operator.runtime.tombstones import (
    CONDITION,
    answer,
    answered,
    read_tombstone,
    runs_once,
    tombstone_of,
    with_tombstone,
)

CONFIG_MAP = "episode-operator-tombstones"
LABELS = {"app.kubernetes.io/managed-by": "episode-operator", "app.kubernetes.io/component": "tombstones"}
# The operator writes it; a GitOps tool that happens to track it must neither diff nor prune it.
ANNOTATIONS = {"argocd.argoproj.io/compare-options": "IgnoreExtraneous"}
WRITE_ATTEMPTS = 8


async def expire_episode(client: KubeClient, body: Mapping[str, Any]) -> None:
    """Delete a finished Episode whose ``ttlSecondsAfterFinished`` passed (the TTL's hook).

    A run-once Episode leaves its tombstone first (a crash in between leaves a tombstone of an Episode
    that still exists: the next expiry writes the same one again). One answered from a tombstone stays.
    """
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    if answered(EpisodeStatus.model_validate(body.get("status") or {})):
        return
    tombstone = tombstone_of(body, timestamp(time.time()))
    if tombstone is not None:
        for _ in range(WRITE_ATTEMPTS):
            try:
                current = await client.get_config_map(namespace, CONFIG_MAP)
            except NotFound:
                current = None
            entries = with_tombstone((current.data or {}) if current is not None else {}, name, tombstone)
            kept: dict[str, Any] = {"name": CONFIG_MAP, "namespace": namespace, "labels": LABELS}
            kept["annotations"] = ANNOTATIONS
            if current is not None:
                kept["resourceVersion"] = current.metadata.resource_version  # compare-and-swap
            manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": kept, "data": entries}
            try:
                if current is None:
                    await client.create_config_map(manifest)
                else:
                    await client.replace_config_map(manifest)
                break
            except Conflict:
                continue  # another Episode's tombstone came first: read it again
        else:
            raise KubeError(f"configmap {namespace}/{CONFIG_MAP}: still changing after {WRITE_ATTEMPTS} attempts")
    await client.delete_episode(namespace, name)


async def answer_from_tombstone(
    client: KubeClient, body: Mapping[str, Any], logger: logging.Logger
) -> EpisodeStatus | None:
    """The finished status of a re-created run-once Episode, written from its tombstone; None: run it
    (the driver's hook, before anything else)."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    if not runs_once(metadata):
        return None  # no need to read anything
    try:
        kept = await client.get_config_map(namespace, CONFIG_MAP)
    except NotFound:
        return None
    status = answer(
        body,
        read_tombstone(kept.data or {}, name),
        timestamp(time.time()),
        f"configmap {namespace}/{CONFIG_MAP}",
    )
    if status is None:
        return None
    sink = KubeStatusSink(client, OwnerRef(name, namespace, metadata["uid"]), metadata.get("generation"), logger)
    message = next(condition.message for condition in status.conditions if condition.type == CONDITION)
    await sink.event(CONDITION, message)
    await sink.publish(status)
    return status
