"""What a pod's state means for the operator: ready to work, lost, or waiting — and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from episode_operator.runtime.sandbox import MAIN_CONTAINER


@dataclass(frozen=True)
class PodVerdict:
    ready: bool
    lost: bool
    waiting: str | None
    message: str


def pod_verdict(pod: Mapping[str, Any]) -> PodVerdict:
    """Read a pod's state (the API's JSON): ready to work, lost, or waiting (and why)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return PodVerdict(False, True, None, "is being deleted")
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason") or phase
        return PodVerdict(False, True, None, f"{reason}: {status.get('message') or 'a container exited'}")
    statuses = list(status.get("containerStatuses") or [])
    for container in statuses:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            return PodVerdict(
                False,
                True,
                None,
                f"container {container.get('name')} exited with {terminated.get('exitCode')} "
                f"({terminated.get('reason')}): {(terminated.get('message') or '').strip()[:300]}",
            )
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting is not None and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return PodVerdict(
                False,
                False,
                waiting.get("reason"),
                f"container {container.get('name')}: {waiting.get('reason')}: {waiting.get('message') or ''}",
            )
    if (
        phase == "Running"
        and statuses
        and all(
            c.get("ready") or (c.get("name") == MAIN_CONTAINER and (c.get("state") or {}).get("running") is not None)
            for c in statuses
        )
    ):
        return PodVerdict(True, False, None, "running")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return PodVerdict(
                False, False, None, f"not scheduled: {condition.get('message') or condition.get('reason')}"
            )
    return PodVerdict(False, False, None, f"phase {phase}")
