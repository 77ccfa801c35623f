"""Event manifests: what the operator says about an Episode or EpisodeSet."""

from __future__ import annotations

import time
from typing import Any

from episode_operator.api.vocabulary import API_VERSION, timestamp
from episode_operator.kube.objects.pods import OwnerRef

COMPONENT = "episode-operator"


def event_manifest(owner: OwnerRef, reason: str, message: str, warning: bool) -> dict[str, Any]:
    now = time.time()
    stamp = timestamp(now)
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
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
