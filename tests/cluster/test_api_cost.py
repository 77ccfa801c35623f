"""What one episode costs the API server: the operator's request counter against a scripted episode.

The driver runs in this process against the real API server (no kopf: kopf's own requests are
the benchmark's), in a namespace no operator watches, and its client's counter
(``episode_operator_api_requests_total``) must equal what the episode needs — no more.
With the in-memory sandbox that is the status writes and the Events alone; with a real pod
every exec is counted too. The Events the API server holds are one per transition.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from episode_operator.kube import running
from episode_operator.kube.client import KubeClient
from episode_operator.kube.driver import DriverSettings, drive_episode
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.metrics import Metrics
from tests.cluster.harness import GROUP, PLURAL, VERSION, read_episode
from tests.unit.fake_sandbox import FakeProvider, World

STEPS = ("one", "two")
# Per episode: running, pod placed, the ending (outcome and reward while the pods are still there,
# runtime/episode.py's _end), terminal; per turn: its start and its agent stage, but the first turn,
# which prepares nothing, is written once, at its agent stage, and carries the attempt's readiness
# (docs/runtime.md, "The turn": a quiet first turn). Events: TurnStarted and TurnFinished per turn, EpisodeFinished.
STATUS_WRITES = 4 + 2 * len(STEPS) - 1


def two_steps(solve: str, test: str) -> dict[str, str]:
    """Two steps, each with its own solution and test; ``solve`` and ``test`` take the step's number."""
    toml = "".join(f'\n[[steps]]\nname = "{step}"\n' for step in STEPS)
    files = {"task.toml": f'{toml}\n[environment]\ndocker_image = "IMAGE"\nworkdir = "/app"\n'}
    for number, step in enumerate(STEPS, 1):
        files[f"steps/{step}/instruction.md"] = f"Write {number}.\n"
        files[f"steps/{step}/solution/solve.sh"] = solve.format(number=number)
        files[f"steps/{step}/tests/test.sh"] = test.format(number=number)
    return files


def drive(kubeconfig: Path, api: client.ApiClient, namespace: str, files: dict[str, str], data: Path) -> Counter[str]:
    """Create the Episode, drive it here to its end; the requests the driver's client sent."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Episode",
        "metadata": {"name": "counted"},
        "spec": {"task": {"inline": {"files": files}}, "agent": {"kind": "oracle"}},
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    metrics = Metrics()

    async def scenario() -> None:
        kube = await KubeClient.connect(str(kubeconfig), metrics=metrics)
        try:
            episode = await kube.get_episode(namespace, "counted")
            status = await drive_episode(
                kube, episode, DriverSettings(store=BlobStore.local(data)), logging.getLogger("test")
            )
            assert (status.phase, status.reward) == ("Succeeded", 1.0), status.message
        finally:
            await kube.close()

    asyncio.run(scenario())
    counted: Counter[str] = Counter()
    for sample in next(iter(metrics.api_requests.collect())).samples:
        if sample.name.endswith("_total"):
            counted[f"{sample.labels['verb']} {sample.labels['resource']}"] += int(sample.value)
    counted["GET episodes"] -= 1  # the test's own read of the Episode above
    for sample in next(iter(metrics.sandbox_calls.collect())).samples:
        if sample.name.endswith("_total"):
            counted[f"sandbox calls by {sample.labels['transport']}"] += int(sample.value)
    return +counted


def events_of(core: client.CoreV1Api, namespace: str) -> list[tuple[str, int]]:
    events: Any = core.list_namespaced_event(namespace, field_selector="involvedObject.name=counted")
    return sorted((event.reason, event.count) for event in events.items)


def test_the_status_writes_and_events_are_all_an_episode_sends_besides_its_sandbox(
    kubeconfig: Path,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    quiet_namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(running, "KubeProvider", lambda *_, **__: FakeProvider(World()))
    files = two_steps("write answer {number}\n", "check answer {number}\n")  # the in-memory sandbox's scripts
    counted = drive(kubeconfig, api_client, quiet_namespace, files, tmp_path)
    assert counted == {"PATCH episodes/status": STATUS_WRITES, "POST events": 2 * len(STEPS) + 1}
    one_each = [("EpisodeFinished", 1), *[("TurnFinished", 1)] * len(STEPS), *[("TurnStarted", 1)] * len(STEPS)]
    assert events_of(core, quiet_namespace) == one_each
    assert read_episode(api_client, quiet_namespace, "counted")["status"]["phase"] == "Succeeded"


def test_a_real_pod_episode_makes_one_call_per_job_on_one_session_and_nothing_else(
    kubeconfig: Path,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    quiet_namespace: str,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    files = two_steps(
        "echo {number} > /app/answer\n",
        'if [ "$(cat /app/answer)" = {number} ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n',
    )
    files["task.toml"] = files["task.toml"].replace("IMAGE", sandbox_image)
    counted = drive(kubeconfig, api_client, quiet_namespace, files, tmp_path)
    # How often the starting pod is read depends on when the kubelet reports it: at least once; a pod
    # that waits long without saying why is asked for its Events too (a loaded node).
    reads = counted.pop("GET pods")
    assert reads >= 1
    counted.pop("LIST events", None)
    assert counted == {
        "POST pods": 1,  # the agent pod, after one read found none (counted above)
        # The supervisor's placement, then the session that carries every call after it.
        "GET pods/exec": 2,
        "PATCH episodes/status": STATUS_WRITES,
        "POST events": 2 * len(STEPS) + 1,
        "LIST pods": 1,  # releasing the episode's pods
        "DELETE pods": 1,
        # Per turn: the agent job (with its solution; its answer brings the artifacts) and the test job
        # (with its tests; its answer brings the reward), on the session.
        "sandbox calls by exec": 1,
        "sandbox calls by session": 2 * len(STEPS),
    }
