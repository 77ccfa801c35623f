"""What a pod's state means for the operator: ready to work, lost, or waiting — and why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episode_operator.runtime.sandbox_protocol import MAIN_CONTAINER

# Container waiting reasons that only say "not yet", without a cause.
STARTING = (None, "ContainerCreating", "PodInitializing")
# Normal Events that say why a pod is not running yet (warnings do, but for the ones below).
EXPLAINING_EVENTS = frozenset({"Pulling"})
# Warnings the kubelet posts for every pod of some clusters, which explain no wait.
INFORMATIONAL_WARNINGS = frozenset({"MissingClusterDNS", "DNSConfigForming"})


@dataclass(frozen=True)
class PodVerdict:
    """``waiting``: a container's waiting reason that names a cause (``ErrImagePull``…);
    ``unscheduled``: the scheduler cannot place the pod; ``reason``: why it does not run yet, for
    the Episode's status (None: nothing to say yet)."""

    ready: bool
    lost: bool
    waiting: str | None
    message: str
    unscheduled: bool = False
    reason: str | None = None


def pod_verdict(pod: Mapping[str, Any]) -> PodVerdict:
    """Read a pod's state (the API's JSON): ready to work, lost, or waiting (and why)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return PodVerdict(False, True, None, "is being deleted")
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason") or phase
        # A failed init container (one filling the compose volumes, a toolchain's copier) fails the
        # pod with no message of its own: what it said is the cause.
        failed_init = [_exited(c) for c in status.get("initContainerStatuses") or [] if _exit_code(c) not in (None, 0)]
        message = status.get("message") or (f"init {failed_init[0]}" if failed_init else "a container exited")
        return PodVerdict(False, True, None, f"{reason}: {message}")
    statuses = list(status.get("containerStatuses") or [])
    for container in statuses:
        if _exit_code(container) is not None:
            return PodVerdict(False, True, None, _exited(container))
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting is not None and waiting.get("reason") not in STARTING:
            reason = waiting.get("reason")
            return PodVerdict(
                False,
                False,
                reason,
                f"container {container.get('name')}: {reason}: {waiting.get('message') or ''}",
                reason=reason,
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
                False,
                False,
                None,
                f"not scheduled: {condition.get('message') or condition.get('reason')}",
                unscheduled=True,
                reason=condition.get("reason") or "Unschedulable",
            )
    if any((c.get("state") or {}).get("waiting") is not None for c in statuses):
        return PodVerdict(False, False, None, "containers are being created", reason="ContainerCreating")
    return PodVerdict(False, False, None, f"phase {phase}")


def _exit_code(container: Mapping[str, Any]) -> int | None:
    """A terminated container's exit code; None while it has not terminated."""
    terminated = (container.get("state") or {}).get("terminated")
    return None if terminated is None else int(terminated.get("exitCode") or 0)


def _exited(container: Mapping[str, Any]) -> str:
    terminated = (container.get("state") or {}).get("terminated") or {}
    return (
        f"container {container.get('name')} exited with {terminated.get('exitCode')} "
        f"({terminated.get('reason')}): {(terminated.get('message') or '').strip()[:300]}"
    )


def latest_event(events: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """Why a pod waits, from its latest Event: a warning (a failed mount, a failed pull…) or an image
    still pulling; None when the latest Event is progress that explains nothing (Scheduled, Pulled…)."""

    def when(event: Mapping[str, Any]) -> str:
        return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")

    telling = [event for event in events if event.get("reason") not in INFORMATIONAL_WARNINGS]
    if not telling:
        return None
    latest = max(telling, key=when)
    if latest.get("type") != "Warning" and latest.get("reason") not in EXPLAINING_EVENTS:
        return None
    return str(latest.get("reason") or "Waiting"), str(latest.get("message") or "").strip()
