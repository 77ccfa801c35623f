"""Event manifests: what the operator says about an Episode or EpisodeSet."""

from __future__ import annotations

import time
from typing import Any

from episode_operator.api.vocabulary import API_VERSION, timestamp
from episode_operator.kube.objects.pods import OwnerRef

COMPONENT = "episode-operator"
MESSAGE_LIMIT = 1024


def event_manifest(
    owner: OwnerRef,
    reason: str,
    message: str,
    warning: bool,
    *,
    now: float | None = None,
    first_at: float | None = None,
    last_at: float | None = None,
    count: int = 1,
) -> dict[str, Any]:
    """An Event posted at ``now``: ``count`` occurrences, from ``first_at`` to ``last_at`` (one, now, by default)."""
    now = time.time() if now is None else now
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{owner.name[:200]}.{int(now * 1e6):x}", "namespace": owner.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": owner.kind,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
        },
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": timestamp(now if first_at is None else first_at),
        "lastTimestamp": timestamp(now if last_at is None else last_at),
        "count": count,
    }
