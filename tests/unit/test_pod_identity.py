"""The kube provider never makes again a pod the attempt recorded: gone or replaced, it is lost.

A pod deleted while the operator was away, made again under its name (by an older operator, a
user, a GitOps tool), must not be taken for the attempt's: what the attempt did in it is gone.
Against a client that answers as the API server does (its uids, NotFound), not a cluster.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.kube.client import NotFound
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.runtime.sandbox_protocol import SandboxError
from tests.unit.folders import plan_of, single_step

PROBE = b"version=1\nworkdir=/app\nuser=root\nuid=0\n"


class Pods:
    """Pods by name as the API server keeps them: each creation gets a new uid; they run at once."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.creations = 0

    def make(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.creations += 1
        pod = copy.deepcopy(manifest)
        pod["metadata"]["uid"] = f"uid-{self.creations}"
        main = {"name": "main", "ready": True, "state": {"running": {"startedAt": "2026-12-03T00:00:00Z"}}}
        pod["status"] = {"phase": "Running", "containerStatuses": [main]}
        self.pods[pod["metadata"]["name"]] = pod
        return copy.deepcopy(pod)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.pods:
            raise NotFound(f"pod {namespace}/{name} not found", status=404)
        return copy.deepcopy(self.pods[name])

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.make(manifest)

    async def apply_network_policy(self, manifest: dict[str, Any]) -> None:
        pass

    async def exec(self, namespace: str, pod: str, container: str, argv: Any, *, stdout: Any, **_: Any) -> int:
        stdout.write(PROBE)
        return 0


def provider(pods: Pods) -> KubeProvider:
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": {}}}, "agent": {"kind": "oracle"}})
    return KubeProvider(pods, OwnerRef("e", "ns", "uid-e"), spec, plan_of(single_step()), "image", {})  # type: ignore[arg-type]


def test_a_pod_not_recorded_yet_is_made_and_its_uid_given() -> None:
    pods = Pods()
    sandbox = asyncio.run(provider(pods).agent(1))
    assert (sandbox.name, sandbox.uid, pods.creations) == ("e-a1", "uid-1", 1)
    again = asyncio.run(provider(pods).agent(1))  # a restart before the uid was written: the same pod
    assert (again.uid, pods.creations) == ("uid-1", 1)


@pytest.mark.parametrize("made_again", [False, True], ids=["gone", "replaced"])
def test_a_recorded_pod_that_is_gone_or_replaced_is_lost_and_not_made_again(made_again: bool) -> None:
    pods = Pods()
    recorded = asyncio.run(provider(pods).agent(1)).uid
    del pods.pods["e-a1"]
    if made_again:
        pods.make({"metadata": {"name": "e-a1"}})
    with pytest.raises(SandboxError) as lost:
        asyncio.run(provider(pods).agent(1, uid=recorded))
    assert lost.value.kind == "pod_lost"
    assert pods.creations == (2 if made_again else 1)
    assert ("replaced" if made_again else "is gone") in str(lost.value)


def test_the_recorded_pod_is_re_attached() -> None:
    pods = Pods()
    recorded = asyncio.run(provider(pods).agent(1)).uid
    assert asyncio.run(provider(pods).agent(1, uid=recorded)).uid == recorded
    assert pods.creations == 1
