"""The tests' listening ports (tests/ports.py): from below the ephemeral range, a block per worker."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests import ports

ROOT = Path(__file__).resolve().parents[2]


def test_ports_are_below_the_range_outgoing_connections_take_theirs_from() -> None:
    first, _ = (int(bound) for bound in ports.EPHEMERAL_RANGE.read_text().split())
    handed = [ports.free_port() for _ in range(ports.BLOCK // 4)]
    assert max(handed) < first
    assert max(handed) < 30000  # nor among Kubernetes' NodePorts
    # None handed twice before its block has gone round (a port another process holds is skipped).
    assert len(set(handed)) == len(handed)


def test_two_workers_never_hand_out_the_same_port() -> None:
    def drawn(worker: str) -> set[int]:
        program = "from tests.ports import free_port\nprint(*(free_port() for _ in range(50)))"
        env = {"PYTEST_XDIST_WORKER": worker, "PATH": "/usr/bin:/bin"}
        printed = subprocess.run(
            [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout
        return {int(port) for port in printed.split()}

    gw3, gw4 = drawn("gw3"), drawn("gw4")
    assert gw3 <= set(ports.worker_block(3)) and gw4 <= set(ports.worker_block(4))
    assert not gw3 & gw4


def test_a_port_something_holds_is_never_handed_out() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.free_port()))
        holder.listen()
        held = holder.getsockname()[1]
        assert held not in {ports.free_port() for _ in range(2 * ports.BLOCK)}
