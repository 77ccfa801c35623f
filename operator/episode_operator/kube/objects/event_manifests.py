"""Event manifests: what the operator says about an Episode or EpisodeSet."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from episode_operator.api.vocabulary import API_VERSION, timestamp
from episode_operator.kube.objects.pods import OwnerRef

COMPONENT = "episode-operator"
MESSAGE_LIMIT = 1024


def event_name(owner: OwnerRef, *occasion: object) -> str:
    """A name for the Event of one occasion (a transition of the owner): whoever posts it again,
    a restarted or another replica, gets 409 AlreadyExists, so each occasion is posted once."""
    digest = hashlib.sha256("\0".join(map(str, (owner.uid, *occasion))).encode()).hexdigest()[:16]
    return f"{owner.name[:200]}.{digest}"


def event_manifest(
    owner: OwnerRef,
    reason: str,
    message: str,
    warning: bool,
    *,
    name: str | None = None,
    now: float | None = None,
    first_at: float | None = None,
    last_at: float | None = None,
    count: int = 1,
) -> dict[str, Any]:
    """An Event posted at ``now``: ``count`` occurrences, from ``first_at`` to ``last_at`` (one, now, by
    default); without ``name`` a new one each time (by the time)."""
    now = time.time() if now is None else now
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name or f"{owner.name[:200]}.{int(now * 1e6):x}", "namespace": owner.namespace},
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
