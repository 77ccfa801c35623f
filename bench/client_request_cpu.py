#!/usr/bin/env python3
"""The operator's client's own CPU per request (kube/client.py): N status writes of one Episode, then N Events.

    PYTHONPATH=CHECKOUT/operator .venv/bin/python bench/client_request_cpu.py NAMESPACE [N]

No operator runs: the Episode is created in ``NAMESPACE`` (which must exist; the Episode ``client-cpu`` is
deleted at the end). Run it with two checkouts' ``operator`` on PYTHONPATH, alternately, to compare their
clients: the CPU is this process's (``getrusage``), so the API server's load moves it little. Prints JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
import time

from episode_operator.kube.client import KubeClient, NotFound


def cpu_sec() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(kubeconfig: str | None, namespace: str, count: int) -> dict[str, float]:
    client = await KubeClient.connect(kubeconfig)
    name = "client-cpu"
    try:
        await client.create_episode(
            {"apiVersion": "episode-operator.dev/v1alpha1", "kind": "Episode",
             "metadata": {"name": name, "namespace": namespace},
             "spec": {"task": {"inline": {"files": {"task.toml": "x"}}}, "agent": {"kind": "oracle"}}}
        )  # fmt: skip
        await client.replace_episode_status(namespace, name, {"phase": "Running", "currentTurn": 0})  # warm
        started = cpu_sec()
        for turn in range(count):
            await client.replace_episode_status(namespace, name, {"phase": "Running", "currentTurn": turn})
        status_ms = (cpu_sec() - started) / count * 1000
        started = cpu_sec()
        for index in range(count):
            await client.create_event(namespace, {
                "metadata": {"name": f"{name}.{index}.{time.time_ns()}", "namespace": namespace},
                "involvedObject": {"kind": "Episode", "name": name, "namespace": namespace},
                "reason": "Bench", "message": "client CPU", "type": "Normal",
            })  # fmt: skip
        event_ms = (cpu_sec() - started) / count * 1000
    finally:
        with contextlib.suppress(NotFound):
            await client.delete_episode(namespace, name)
        await client.close()
    return {"status_write_cpu_ms": status_ms, "event_cpu_ms": event_ms, "load_average": os.getloadavg()[0]}


if __name__ == "__main__":
    target = sys.argv[1]
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    print(json.dumps(asyncio.run(measure(os.environ.get("KUBECONFIG"), target, requests))))
