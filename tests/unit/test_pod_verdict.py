"""How the operator reads a sandbox pod (the API's JSON): ready, lost, or waiting and why."""

from __future__ import annotations

from typing import Any

import pytest

from episode_operator.kube.objects.pod_state import PodVerdict, latest_event, pod_verdict


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
            # An init container that failed (the compose volumes' filler in an image without tar) says why.
            pod(
                "Failed",
                container("main", {"waiting": {"reason": "PodInitializing"}}),
                status={
                    "initContainerStatuses": [
                        container("toolchain-x", {"terminated": {"exitCode": 0, "reason": "Completed"}}),
                        container(
                            "episode-operator-volumes",
                            {"terminated": {"exitCode": 127, "reason": "Error", "message": "sh: tar: not found\n"}},
                        ),
                    ]
                },
            ),
            PodVerdict(
                False,
                True,
                None,
                "Failed: init container episode-operator-volumes exited with 127 (Error): sh: tar: not found",
            ),
        ),
        (
            pod("Running", container("main", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})),
            PodVerdict(False, True, None, "container main exited with 137 (OOMKilled): "),
        ),
        (
            pod("Pending", container("main", {"waiting": {"reason": "ErrImagePull", "message": "not found"}})),
            PodVerdict(False, False, "ErrImagePull", "container main: ErrImagePull: not found", reason="ErrImagePull"),
        ),
        (
            pod("Pending", container("main", {"waiting": {"reason": "ContainerCreating"}})),
            PodVerdict(False, False, None, "containers are being created", reason="ContainerCreating"),
        ),
        (
            pod(
                "Pending",
                status={
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 Insufficient cpu.",
                        }
                    ]
                },
            ),
            PodVerdict(
                False,
                False,
                None,
                "not scheduled: 0/1 nodes are available: 1 Insufficient cpu.",
                unscheduled=True,
                reason="Unschedulable",
            ),
        ),
        ({"metadata": {"name": "e-a1"}}, PodVerdict(False, False, None, "phase None")),  # no status yet
    ],
)
def test_pod_verdict(manifest: dict[str, Any], expected: PodVerdict) -> None:
    assert pod_verdict(manifest) == expected


def test_a_pods_latest_event_says_why_it_waits() -> None:
    events = [
        {"type": "Normal", "reason": "Scheduled", "message": "assigned", "lastTimestamp": "2026-01-01T00:00:01Z"},
        {"type": "Warning", "reason": "FailedMount", "message": " no volume ", "lastTimestamp": "2026-01-01T00:00:03Z"},
        {"type": "Normal", "reason": "Pulling", "message": "pulling", "eventTime": "2026-01-01T00:00:02.000000Z"},
    ]
    assert latest_event(events) == ("FailedMount", "no volume")
    assert latest_event(events[:1] + events[2:]) == ("Pulling", "pulling")
    # Progress explains no wait: an old warning is not repeated once the pod moved on.
    scheduled = {
        "type": "Normal",
        "reason": "Scheduled",
        "message": "assigned",
        "lastTimestamp": "2026-01-01T00:00:09Z",
    }
    assert latest_event([*events, scheduled]) is None
    # A warning every pod of a cluster without DNS gets explains nothing either.
    dns = {
        "type": "Warning",
        "reason": "MissingClusterDNS",
        "message": "no DNS",
        "lastTimestamp": "2026-01-01T00:00:09Z",
    }
    assert latest_event([*events, dns]) == ("FailedMount", "no volume")
    assert latest_event([]) is None
