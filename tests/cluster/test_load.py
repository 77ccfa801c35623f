"""Load: 200 Episodes created at once, an active-episode limit, nothing lost or run twice.

Prints the figures it measured (wall time, peak active, operator peak RSS) with -s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.conftest import delete_namespace_while_watched, namespace_prefix, wait_for_default_service_account
from tests.cluster.harness import EXAMPLES, GROUP, PLURAL, VERSION, OperatorProcess, episode_spec, install_crd

EPISODES = 200
LIMIT = 20
# Generous: a Python operator's footprint is ~100 MB; growing past this would be a leak.
RSS_BOUND_MB = 600


@pytest.fixture
def limited_operator(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> Iterator[tuple[str, OperatorProcess]]:
    install_crd(api_client)
    prefix = f"load-{namespace_prefix()}"
    namespace = f"{prefix}{int(time.time() * 1000) % 10**8:x}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(
        kubeconfig,
        tmp_path / "data",
        tmp_path / "operator.log",
        f"{prefix}*",
        extra_args=("--max-active-episodes", str(LIMIT)),
    )
    try:
        wait_for_default_service_account(core, namespace)
        operator.start()
        yield namespace, operator
    finally:
        delete_namespace_while_watched(core, namespace)
        operator.stop()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_two_hundred_episodes_at_once(
    api_client: client.ApiClient, core: client.CoreV1Api, limited_operator: tuple[str, OperatorProcess]
) -> None:
    namespace, operator = limited_operator
    episodes = client.CustomObjectsApi(api_client)
    # A small task: no CPU or memory requests, so the node's two cores do not bound the run.
    small = '[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\nworkdir = "/app"\n'
    spec = episode_spec(
        EXAMPLES / "hello",
        agent={"kind": "nop"},
        edits={"task.toml": small, "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"},
    )
    started = time.monotonic()
    for number in range(EPISODES):
        episodes.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Episode",
                "metadata": {"name": f"load-{number:03d}"},
                "spec": spec,
            },
        )
    peak_active = 0
    deadline = time.monotonic() + 900
    while True:
        items = episodes.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        phases = [(item.get("status") or {}).get("phase") for item in items]
        peak_active = max(peak_active, phases.count("Running"))
        running_pods = [p for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp]
        assert len(running_pods) <= LIMIT, f"{len(running_pods)} sandbox pods alive with maxActiveEpisodes={LIMIT}"
        if all(phase in ("Succeeded", "Failed") for phase in phases) and len(items) == EPISODES:
            break
        assert time.monotonic() < deadline, f"{phases.count('Succeeded')} done after 900 s\n{operator.log_tail()}"
        time.sleep(0.5)
    wall = time.monotonic() - started
    assert operator.process is not None
    rss = peak_rss_mb(operator.process.pid)
    statuses = [item["status"] for item in items]
    assert sorted(item["metadata"]["name"] for item in items) == [f"load-{n:03d}" for n in range(EPISODES)]
    assert all(
        (s["phase"], s["reward"], s["attempt"], s["progress"]) == ("Succeeded", 1.0, 1, "1/1") for s in statuses
    ), [s for s in statuses if s.get("reward") != 1.0][:3]
    assert 0 < peak_active <= LIMIT
    assert rss < RSS_BOUND_MB, f"operator peak RSS {rss:.0f} MB"
    print(
        f"\n{EPISODES} episodes, maxActiveEpisodes={LIMIT}: {wall:.1f} s wall, "
        f"{EPISODES / wall * 60:.0f} episodes/min, peak active {peak_active}, operator peak RSS {rss:.0f} MB"
    )
