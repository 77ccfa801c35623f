"""How the operator reads a sandbox pod (the API's JSON): ready, lost, or waiting and why."""

from __future__ import annotations

from typing import Any

import pytest

from episode_operator.kube.objects.pod_state import PodVerdict, pod_verdict


def pod(phase: str, *containers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "containerStatuses": list(containers)}
    status.update(extra.pop("status", {}))
    return {"metadata": {"name": "e-a1", **extra.pop("metadata", {})}, "status": status, **extra}


def container(name: str, state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    return {"name": name, "ready": ready, "state": state}


RUNNING = {"running": {"startedAt": "2026-11-30T00:00:00Z"}}


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (pod("Running", container("main", RUNNING)), PodVerdict(True, False, None, "running")),
        (  # a sidecar must be ready too (its readiness probe is its healthcheck)
            pod("Running", container("main", RUNNING), container("db", RUNNING)),
            PodVerdict(False, False, None, "phase Running"),
        ),
        (
            pod("Running", container("main", RUNNING), container("db", RUNNING, ready=True)),
            PodVerdict(True, False, None, "running"),
        ),
        (
            pod("Running", container("main", RUNNING, ready=True), metadata={"deletionTimestamp": "2026"}),
            PodVerdict(False, True, None, "is being deleted"),
        ),
        (
            pod("Failed", status={"reason": "Evicted", "message": "low on memory"}),
            PodVerdict(False, True, None, "Evicted: low on memory"),
        ),
        (
            pod("Running", container("main", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})),
            PodVerdict(False, True, None, "container main exited with 137 (OOMKilled): "),
        ),
        (
            pod("Pending", container("main", {"waiting": {"reason": "ErrImagePull", "message": "not found"}})),
            PodVerdict(False, False, "ErrImagePull", "container main: ErrImagePull: not found"),
        ),
        (
            pod("Pending", container("main", {"waiting": {"reason": "ContainerCreating"}})),
            PodVerdict(False, False, None, "phase Pending"),
        ),
        (
            pod(
                "Pending",
                status={
                    "conditions": [{"type": "PodScheduled", "status": "False", "message": "0/1 nodes are available"}]
                },
            ),
            PodVerdict(False, False, None, "not scheduled: 0/1 nodes are available"),
        ),
        ({"metadata": {"name": "e-a1"}}, PodVerdict(False, False, None, "phase None")),  # no status yet
    ],
)
def test_pod_verdict(manifest: dict[str, Any], expected: PodVerdict) -> None:
    assert pod_verdict(manifest) == expected
