"""hack/cluster's images on the node: a name containerd still lists whose content is gone is imported again.

A machine restarted with the cluster's state dir kept (as a fresh-ish CI machine may be) had the
pause image's name in containerd's metadata and not its blobs: `ctr images ls` listed it, the CRI
plugin skipped it at start ("content readiness ... is not ok"), and every pod of a whole CI run
stayed in FailedCreatePodSandBox, the kubelet pulling the pause image from a registry that does
not exist. Here the same state is made on purpose (a manifest blob deleted, containerd restarted):
`up` repairs the pause image it loads, `images` the others.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.conftest import CLUSTER_DIR, HACK_CLUSTER

PAUSE_IMAGE = "episode-operator.local/pause:1"  # hack/cluster's sandbox image
SANDBOX_IMAGE = "episode-operator.local/sandbox:bookworm"


def ctr(*args: str) -> subprocess.CompletedProcess[str]:
    socket = CLUSTER_DIR / "containerd" / "containerd.sock"
    argv = ["ctr", "--address", str(socket), "--namespace", "k8s.io", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def manifest_digest(image: str) -> str:
    for line in ctr("images", "ls").stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == image:
            return fields[2]
    raise AssertionError(f"containerd does not list {image}")


def restart_containerd() -> str:
    """Kill containerd and have `hack/cluster up` start it again; what `up` said."""
    pid = int((CLUSTER_DIR / "pids" / "containerd.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)  # containers outlive it: their shims stay
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "containerd did not stop"
        time.sleep(0.1)
    started = subprocess.run([str(HACK_CLUSTER), "up"], capture_output=True, text=True, timeout=300, check=False)
    assert started.returncode == 0, started.stderr[-3000:]
    return started.stderr


def lose_manifest(image: str) -> None:
    """Delete an image's manifest blob and leave containerd's record of it."""
    algorithm, _, digest = manifest_digest(image).partition(":")
    (CLUSTER_DIR / "containerd" / "root" / "io.containerd.content.v1.content" / "blobs" / algorithm / digest).unlink()


def start_pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    container = client.V1Container(name="c", image=SANDBOX_IMAGE, image_pull_policy="Never", command=["true"])
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(restart_policy="Never", containers=[container], automount_service_account_token=False),
    )
    core.create_namespaced_pod(namespace, pod)


def wait_for(what: str, probe: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def waiting_reason(core: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    statuses = core.read_namespaced_pod(pod, namespace).status.container_statuses or []
    waiting = statuses[0].state.waiting if statuses else None
    return waiting.reason if waiting else None


def phase(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    return str(core.read_namespaced_pod(pod, namespace).status.phase)


@pytest.mark.exclusive("breaks the node's pause and sandbox images: no pod of another test could start meanwhile")
def test_an_image_without_its_content_is_imported_again(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    lose_manifest(PAUSE_IMAGE)
    lose_manifest(SANDBOX_IMAGE)
    said = restart_containerd()  # `up` loads the pause image: every pod needs it
    assert f"importing {PAUSE_IMAGE} into containerd" in said, said
    assert SANDBOX_IMAGE in ctr("images", "ls", "-q").stdout.split(), "the name outlives its content"
    # The control: the sandbox image's name is listed, and the kubelet cannot have it.
    start_pod(core, namespace, "before")
    wait_for("the pod's image to be refused", lambda: waiting_reason(core, namespace, "before") == "ErrImageNeverPull")

    repaired = subprocess.run([str(HACK_CLUSTER), "images"], capture_output=True, text=True, timeout=900, check=False)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert f"importing {SANDBOX_IMAGE} into containerd" in repaired.stderr, repaired.stderr
    start_pod(core, namespace, "after")
    wait_for("the pod to run", lambda: phase(core, namespace, "after") == "Succeeded")
