"""Listening ports for the processes the tests and benchmarks start (operators, the S3 server, the
data API, the Gym server).

A port is chosen by the test and bound later by another process, sometimes minutes later (a replica
killed and started again on its port). A port the kernel hands out for ``bind(0)`` comes from the
ephemeral range, the range every outgoing connection also takes its local port from, so in between
any connection of the machine may take it and the process dies with "address already in use" (a CI
run lost a replica test that way). These ports come from below that range, where only an explicit
bind takes one, and each pytest-xdist worker draws from a block of its own, so two workers never hand
out the same port; a port something already holds is skipped.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

# Below Linux's default ephemeral range (32768-60999) and Kubernetes' NodePort range (30000-32767).
FIRST_PORT = 20000
LAST_PORT = 29999
BLOCK = 200  # ports per worker: 50 workers before two share a block
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw3`` → 3); 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") else 0


def worker_block(index: int) -> range:
    blocks = (LAST_PORT - FIRST_PORT + 1) // BLOCK
    start = FIRST_PORT + (index % blocks) * BLOCK
    return range(start, start + BLOCK)


def _candidates() -> itertools.cycle[int]:
    block = worker_block(worker_index())
    # A random start: two pytest runs of one worker number (a unit run beside a cluster run) rarely meet.
    offset = random.randrange(len(block))
    return itertools.cycle([*block[offset:], *block[:offset]])


_NEXT = _candidates()


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nothing holds now, below the ephemeral range, not handed out again by this
    process until its block has gone round."""
    for _ in range(BLOCK):
        port = next(_NEXT)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"every port of {worker_block(worker_index())} on {host} is in use")
