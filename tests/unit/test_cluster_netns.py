"""hack/cluster makes /run/netns a shared mount point before any pod network is mounted there.

Why: containerd 1.6 mounts each pod's network namespace on a file in /run/netns as it finds the
directory; iproute2's ``ip netns add`` (the offline harness tests run it while the cluster's pods
run) first binds the directory onto itself when it is no mount point of its own. A pod namespace
mounted before that bind is hidden under it: its teardown unmounts the copy the bind carried over,
and removing its file then fails (EBUSY) for as long as the host runs — the kubelet's
``remove netns: … device or resource busy``, a pod Terminating for good.

Each case runs in a mount namespace of its own (``unshare --mount``), where /run/netns is first made
a plain directory again: the host's mounts are not touched. A regular file bind-mounted onto a file
in /run/netns stands for a pod's namespace (containerd bind-mounts /proc/<tid>/ns/net the same way);
``ip netns add`` is the real iproute2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.tools import tool

CASE = r"""
import json, os, subprocess, sys
sys.path.insert(0, {repo!r})
from tests.unit.test_release import load_script

NETNS = "/run/netns"

def mounted_here():
    return any(line.split()[4] == NETNS for line in open("/proc/self/mountinfo"))

os.makedirs(NETNS, exist_ok=True)
while mounted_here():  # this namespace's copy of the host's /run/netns mount(s): gone, here only
    subprocess.run(["umount", "-l", NETNS], check=True)
cluster = load_script("cluster")
if {share}:
    cluster.share_netns_dir()
propagation = cluster.netns_dir_propagation()
pod = os.path.join(NETNS, "cni-pod-{tag}")
open(pod, "w").close()
subprocess.run(["mount", "--bind", {stand_in!r}, pod], check=True)  # the pod's network, as containerd mounts it
added = subprocess.run(["ip", "netns", "add", "epo-test-{tag}"], capture_output=True, text=True)
subprocess.run(["ip", "netns", "delete", "epo-test-{tag}"], capture_output=True)
unmounted = subprocess.run(["umount", pod], capture_output=True, text=True)  # the pod's teardown
try:
    os.unlink(pod)
    removed = "removed"
except OSError as error:
    removed = os.strerror(error.errno)
shared = propagation is not None and "shared:" in propagation
codes = {{"added": added.returncode, "unmounted": unmounted.returncode}}
print(json.dumps({{"shared": shared, **codes, "removed": removed}}))
"""


def teardown_after_ip_netns_add(tmp_path: Path, *, share: bool) -> dict[str, object]:
    stand_in = tmp_path / "network"
    stand_in.write_text("a pod's network namespace\n")
    script = CASE.format(repo=str(REPO), share=share, tag=uuid.uuid4().hex[:8], stand_in=str(stand_in))
    result = subprocess.run(
        [tool("unshare"), "--mount", "--propagation", "private", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    answer: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return answer


@pytest.fixture(autouse=True)
def ip_available() -> None:
    tool("ip")


def test_a_pods_network_is_removed_after_ip_netns_add_once_up_shared_the_directory(tmp_path: Path) -> None:
    assert teardown_after_ip_netns_add(tmp_path, share=True) == {
        "shared": True,
        "added": 0,
        "unmounted": 0,
        "removed": "removed",
    }


def test_without_it_ip_netns_add_hides_the_pods_network_and_its_file_stays(tmp_path: Path) -> None:
    """The control: the hazard is real on this kernel and iproute2, so the case above can fail."""
    assert teardown_after_ip_netns_add(tmp_path, share=False) == {
        "shared": False,
        "added": 0,
        "unmounted": 0,
        "removed": "Device or resource busy",
    }
