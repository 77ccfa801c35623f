"""What one operation costs on this cluster: a plain exec vs. the supervisor verbs the operator sends.

The supervisor is placed with the operator's own command builders
(:mod:`episode_operator.runtime.supervisor`), so every verb is exactly what the operator
execs; the exec itself is the baseline's synchronous client, the same for every row, so
the rows differ only by what runs in the pod. "in-pod" rows time the same verb inside one
exec (``date +%s%N`` before and after), i.e. without the exec round trip.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from episode_operator.kube.client import KubeClient
from episode_operator.runtime import supervisor
from episode_operator.runtime.sandbox_protocol import JobSpec

from .direct import UPLOAD, DirectPod
from .stats import millis, table

IN_POD = 'a=$(date +%s%N); sh "$@" >/dev/null; b=$(date +%s%N); echo $((b - a))'


def measure(pod: DirectPod, repeats: int) -> list[dict[str, Any]]:
    place = supervisor.placement()
    code, _, stderr = pod.exec(place.argv, place.stdin)
    if code != 0:
        raise RuntimeError(f"placement failed: {stderr!r}")
    archive = b"\0" * 10240
    counter = iter(range(10**6))

    def job(command: str = "true") -> JobSpec:
        return JobSpec(id=f"bench.{next(counter)}", command=command, timeout_sec=60)

    def start_argv() -> list[str]:
        return supervisor.start(job(), wait_sec=30).argv

    rows: list[tuple[str, Callable[[], tuple[list[str], bytes | None]]]] = [
        ("exec `true` (round trip only)", lambda: (["true"], None)),
        ("exec `bash -c true`", lambda: (["bash", "-c", "true"], None)),
        (
            "exec upload 10 KiB: head -c | tar x (baseline)",
            lambda: (["sh", "-c", UPLOAD, "sh", "/tmp/u", "10240"], archive),
        ),
        ("supervisor upload 10 KiB", lambda: (supervisor.upload(archive, "/tmp/u").argv, archive)),
        ("supervisor start --wait (job `true`)", lambda: (start_argv(), None)),
        ("supervisor output (job log)", lambda: (supervisor.output("bench.0", 1 << 20).argv, None)),
        ("supervisor read (2 reward files)", lambda: (supervisor.read_files(["/tmp/r.json", "/tmp/r.txt"]).argv, None)),
        ("supervisor clear (3 paths)", lambda: (supervisor.clear(["/tmp/t/", "/tmp/l/", "/tmp/x.json"]).argv, None)),
        ("supervisor download (/logs/artifacts)", lambda: (supervisor.download(["/logs/artifacts"]).argv, None)),
    ]
    in_pod: list[tuple[str, Callable[[], list[str]]]] = [
        ("in-pod: supervisor start --wait (job `true`)", lambda: start_argv()[1:]),
        ("in-pod: supervisor output", lambda: supervisor.output("bench.0", 1 << 20).argv[1:]),
    ]
    results: list[dict[str, Any]] = []
    for label, build in rows:
        results.append(_timed(label, repeats, functools.partial(_round_trip, pod, build)))
    for label, argv_of in in_pod:
        results.append(_timed(label, repeats, functools.partial(_in_pod, pod, argv_of)))
    return results


def _round_trip(pod: DirectPod, build: Callable[[], tuple[list[str], bytes | None]]) -> float:
    argv, stdin = build()
    started = time.perf_counter()
    code, _, stderr = pod.exec(argv, stdin)
    if code != 0:
        raise RuntimeError(f"exit {code}: {stderr.decode(errors='replace')[:200]}")
    return time.perf_counter() - started


def _in_pod(pod: DirectPod, argv_of: Callable[[], list[str]]) -> float:
    code, stdout, stderr = pod.exec(["sh", "-c", IN_POD, "sh", *argv_of()])
    if code != 0:
        raise RuntimeError(f"exit {code}: {stderr.decode(errors='replace')[:200]}")
    return int(stdout.decode().strip()) / 1e9


def _timed(label: str, repeats: int, once: Callable[[], float]) -> dict[str, Any]:
    """Median and minimum of ``repeats`` runs; a verb this version of the supervisor lacks is reported, not fatal."""
    try:
        times = [once() for _ in range(repeats)]
    except Exception as error:
        return {"operation": label, "error": f"{type(error).__name__}: {error}"}
    return {"operation": label, "median_sec": statistics.median(times), "min_sec": min(times)}


def operator_client(kubeconfig: Path, pod: DirectPod, repeats: int) -> list[dict[str, Any]]:
    """The operator's own exec path (``KubeClient.exec``: kubernetes_asyncio, aiohttp, retries), in this process."""

    async def rounds(argv: list[str], stdin: bytes | None) -> list[float]:
        kube = await KubeClient.connect(str(kubeconfig))
        try:
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                result = await kube.exec(pod.namespace, pod.name, "main", argv, stdin=stdin)
                times.append(time.perf_counter() - started)
                if result.exit_code != 0:
                    raise RuntimeError(f"exit {result.exit_code}: {result.stderr[:200]!r}")
            return times
        finally:
            await kube.close()

    archive = b"\0" * 10240
    rows = [
        ("operator KubeClient.exec `true`", ["true"], None),
        ("operator KubeClient.exec upload 10 KiB (supervisor)", supervisor.upload(archive, "/tmp/v").argv, archive),
    ]
    results: list[dict[str, Any]] = []
    for label, argv, stdin in rows:
        try:
            times = asyncio.run(rounds(argv, stdin))
        except Exception as error:
            results.append({"operation": label, "error": f"{type(error).__name__}: {error}"})
            continue
        results.append({"operation": label, "median_sec": statistics.median(times), "min_sec": min(times)})
    return results


def run(api: client.ApiClient, namespace: str, kubeconfig: Path, repeats: int = 10) -> tuple[list[dict[str, Any]], str]:
    pod = DirectPod(api, namespace, "primitives")
    pod.create()
    pod.wait_running()
    try:
        results = measure(pod, repeats)
        results += operator_client(kubeconfig, pod, repeats)
    finally:
        pod.delete()
    text = table(
        f"1c. One operation on this cluster (median of {repeats}; the baseline's exec client unless the row "
        "says operator)",
        ["operation", "median", "min"],
        [
            [row["operation"], millis(row["median_sec"]), millis(row["min_sec"])]
            if "error" not in row
            else [row["operation"], "n/a", row["error"][:60]]
            for row in results
        ],
    )
    return results, text
