"""Fixtures of the offline toolchain tests: the cached images, a network namespace, the model server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import unavailable
from tests.cluster.offline.chroot import PORT, SERVER, load_hack_cluster


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
def model_server(netns: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The scripted server on 127.0.0.1 inside the namespace; yields its record file.

    Its script is the parameter of an indirect parametrization, else the test module's SCRIPT.
    """
    script, record, log = tmp_path / "script.json", tmp_path / "requests.jsonl", tmp_path / "server.log"
    script.write_text(json.dumps(getattr(request, "param", None) or request.module.SCRIPT))
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
