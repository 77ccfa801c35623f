"""Each toolchain image runs its harness with no libc, no runtime and no network but the model's.

The strictest task image there is: the toolchain image's own root filesystem (a static busybox
and the tree, no glibc, no Python, no Node), chrooted into a network namespace that has only
loopback, where the scripted model server listens. strace records every connect/send of the
harness and its children: the only peer allowed is the model. This is the toolchain's promise
("self-contained, offline") checked without Kubernetes in the way; the cluster tests check the
same harnesses in a sandbox pod, as root; here the harness runs as an unprivileged user, as a
task's agent user may be.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.cluster.conftest import unavailable
from tests.cluster.toolchains import API_KEY, HARNESSES, Harness

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "scripted_model" / "server.py"
MODEL = "scripted-m1"
PORT = 18080
INSTRUCTION = "Offline toolchain check: write the marker file."
AGENT_UID = 1000  # no entry in the image's /etc/passwd: harnesses must not need one
HOME = "/home/agent"
MARKER = f"{HOME}/marker.txt"
SCRIPT = {
    "rules": [
        {
            "name": "offline",
            "when": {"prompt": INSTRUCTION, "tools": True},
            "steps": [{"run": f"echo offline-ok > {MARKER}"}, {"finish": "Done."}],
        }
    ]
}
# A network syscall's peer, as strace prints it.
PEER = re.compile(
    r'sin6?_port=htons\((\d+)\), (?:sin_addr=inet_addr\("([^"]+)"\)|sin6_addr=inet_pton\(AF_INET6, "([^"]+)"\))'
)


def load_hack_cluster() -> ModuleType:
    """hack/cluster as a module (it is a script): its ImageSpecs know where each image is cached."""
    loader = importlib.machinery.SourceFileLoader("hack_cluster", str(REPO / "hack" / "cluster"))
    spec = importlib.util.spec_from_loader("hack_cluster", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hack_cluster"] = module  # its dataclasses look their module up while being defined
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image_archives() -> dict[str, Path]:
    """The cached docker-archive of every toolchain image, by toolchain name."""
    if os.geteuid() != 0:
        unavailable("the offline toolchain tests need root (network namespaces, chroot)")
    missing = [tool for tool in ("ip", "unshare", "chroot", "strace") if shutil.which(tool) is None]
    if missing:
        unavailable(f"missing {', '.join(missing)} (hack/cluster images installs them)")
    cluster = load_hack_cluster()
    archives = {}
    for spec in cluster.toolchain_image_specs():
        name = spec.name.removeprefix("episode-operator.local/toolchain-").split(":")[0]
        archives[name] = spec.cache_path()
    absent = [str(path) for path in archives.values() if not path.exists()]
    if absent:
        unavailable(f"toolchain images not built ({', '.join(absent)}); run `hack/cluster images`")
    return archives


def unpack_image(archive: Path, rootfs: Path) -> None:
    """The image's root filesystem: the single layer of our docker-archive."""
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        [layer_name] = manifest[0]["Layers"]
        layer = outer.extractfile(layer_name)
        assert layer is not None
        with tarfile.open(fileobj=layer, mode="r|") as inner:
            inner.extractall(rootfs, filter="fully_trusted")


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"epo-offline-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.fixture
def model_server(netns: str, tmp_path: Path) -> Iterator[Path]:
    """The scripted server on 127.0.0.1 inside the namespace; yields its record file."""
    script, record, log = tmp_path / "script.json", tmp_path / "requests.jsonl", tmp_path / "server.log"
    script.write_text(json.dumps(SCRIPT))
    argv = [
        sys.executable,
        str(SERVER),
        "--script",
        str(script),
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        "--record",
        str(record),
    ]
    with log.open("w") as output:
        server = subprocess.Popen(["ip", "netns", "exec", netns, *argv], stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert server.poll() is None, f"scripted server exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, "scripted server did not start"
            time.sleep(0.1)
        yield record
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_chrooted(netns: str, rootfs: Path, harness: Harness, trace: Path) -> subprocess.CompletedProcess[str]:
    """The harness's command in the chroot, in the namespace, under strace; proc and dev mounted privately."""
    base_url = f"http://127.0.0.1:{PORT}"
    env = {"PATH": "/bin", "HOME": HOME, **harness.environment(MODEL, base_url)}
    command = [
        "/bin/busybox",  # the image's only tools: busybox applets, `env` among them but not linked
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        *harness.command(INSTRUCTION, MODEL, base_url, False),
    ]
    inner = 'mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev" && exec "$@"'
    trace_argv = ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=connect,sendto,sendmsg,sendmmsg"]
    argv = [
        "ip",
        "netns",
        "exec",
        netns,
        "unshare",
        "--mount",
        "--fork",
        "sh",
        "-c",
        inner,
        str(rootfs),
        *trace_argv,
        "chroot",
        f"--userspec={AGENT_UID}:{AGENT_UID}",
        str(rootfs),
        *command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)


def foreign_peers(trace: Path) -> list[str]:
    """Every network peer in the trace other than the model server (DNS included)."""
    foreign = []
    for line in trace.read_text().splitlines():
        for port, ipv4, ipv6 in PEER.findall(line):
            if (ipv4 or ipv6, int(port)) != ("127.0.0.1", PORT):
                foreign.append(line.strip())
    return foreign


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_toolchain_runs_in_an_empty_root_with_only_the_model_reachable(
    name: str, image_archives: dict[str, Path], netns: str, model_server: Path, tmp_path: Path
) -> None:
    harness = HARNESSES[name]
    rootfs = tmp_path / "rootfs"
    unpack_image(image_archives[name], rootfs)
    assert not list(rootfs.glob("lib*")) and not (rootfs / "usr").exists(), "the image must hold no libc of its own"
    for directory in (HOME, "/logs/agent"):
        (rootfs / directory.lstrip("/")).mkdir(parents=True)
        os.chown(rootfs / directory.lstrip("/"), AGENT_UID, AGENT_UID)

    trace = tmp_path / "network.strace"
    result = run_chrooted(netns, rootfs, harness, trace)

    assert result.returncode == 0, (
        f"{name} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    assert (rootfs / MARKER.lstrip("/")).read_text() == "offline-ok\n"
    records = [json.loads(line) for line in model_server.read_text().splitlines()]
    assert [r["step"] for r in records if r["rule"] == "offline"] == [0, 1]
    assert {r["api_key"] for r in records} == {API_KEY}
    assert foreign_peers(trace) == [], "the harness reached for something other than the model"
