"""An S3-compatible server for the tests: moto's (``moto_server``, from ``moto[server]`` on PyPI).

It runs as a process of its own, its pid recorded and stopped by pid, on an address of this
machine: the loopback for unit tests, the node's address for cluster tests (pods reach it there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

# What the tests give the store (moto accepts any; a real server is given them by a Secret).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret", "AWS_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    pid: int

    def create_bucket(self, bucket: str) -> None:
        """PUT /<bucket> (moto accepts unsigned requests)."""
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


@contextlib.contextmanager
def s3_server(log: Path, host: str = "127.0.0.1") -> Iterator[S3Server]:
    port = free_port(host)
    binary = Path(sys.executable).parent / "moto_server"
    with log.open("ab") as output:
        process = subprocess.Popen([str(binary), "-H", host, "-p", str(port)], stdout=output, stderr=subprocess.STDOUT)
    endpoint = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"moto_server exited: {log.read_text()[-2000:]}"
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                break
            assert time.monotonic() < deadline, f"moto_server did not answer: {log.read_text()[-2000:]}"
            time.sleep(0.1)
        yield S3Server(endpoint, process.pid)
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
