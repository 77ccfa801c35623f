"""Group 3, throughput: N trivial one-step Episodes created at once vs. N direct runs at once.

Each batch is created by 10 threads as fast as the API takes them; an Episode's latency is
its create request → the watch event that shows it finished; the batch's span is the first
request → the last finish, and episodes per minute is N / span. The baseline runs the same
N one-step episodes directly (:func:`.direct.run_direct`), one thread and one client each,
all started together. CPU per turn: the operator process's utime+stime over the batch
(``/proc``) vs. the sum of the baseline threads' own CPU time (``RUSAGE_THREAD``).
"""

from __future__ import annotations

import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .cluster import Recorder, connect, create_episode
from .context import Context
from .direct import run_direct
from .profiling import Profiler
from .stats import percentile, ratio, seconds, table
from .tasks import direct_turns, episode_spec, trivial_task

CREATORS = 10


def run(ctx: Context, *, sizes: list[int]) -> None:
    files = trivial_task(1)
    spec = episode_spec(files)
    turns = direct_turns(files)
    results: list[dict[str, Any]] = []
    with ctx.group("throughput") as (namespace, operator), Recorder.episodes(ctx.api, namespace) as episodes:

        def operator_batch(size: int, tag: str) -> dict[str, Any]:
            names = [f"{tag}{size}-{index}" for index in range(size)]
            before = operator.sample()
            with ThreadPoolExecutor(min(CREATORS, size)) as pool:
                times = pool.map(lambda name: create_episode(ctx.api, namespace, name, spec), names)
                sent = dict(zip(names, times, strict=True))
            done = episodes.wait_all(names, lambda v: v.terminal, timeout=300 + 10 * size)
            after = operator.sample()
            failed = sorted(name for name, view in done.items() if view.phase != "Succeeded")
            ctx.settle(namespace)
            latencies = [done[name].seen - sent[name] for name in names]
            span = max(view.seen for view in done.values()) - min(sent.values())
            return {
                "n": size,
                "span_sec": span,
                "latencies_sec": latencies,
                "cpu_sec": after.cpu_sec - before.cpu_sec,
                "failed": failed,
            }

        def baseline_batch(size: int, tag: str) -> dict[str, Any]:
            clients = [connect(ctx.kubeconfig) for _ in range(size)]
            gate = threading.Barrier(size)

            def one(index: int) -> tuple[float, float, float]:
                gate.wait()
                usage = resource.getrusage(resource.RUSAGE_THREAD)
                result = run_direct(clients[index], namespace, f"{tag}{size}-{index}", turns)
                after = resource.getrusage(resource.RUSAGE_THREAD)
                cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
                return result.started, result.finished, cpu

            with ThreadPoolExecutor(size) as pool:
                runs = list(pool.map(one, range(size)))
            ctx.settle(namespace)
            for api in clients:
                api.close()  # type: ignore[no-untyped-call]
            return {
                "n": size,
                "span_sec": max(end for _, end, _ in runs) - min(start for start, _, _ in runs),
                "latencies_sec": [end - start for start, end, _ in runs],
                "cpu_sec": sum(cpu for _, _, cpu in runs),
                "failed": [],
            }

        ctx.say("throughput: warm-up")
        operator_batch(1, "warm-op-")
        baseline_batch(1, "warm-base-")
        for size in sizes:
            started = time.time()
            mine = operator_batch(size, "op-")
            theirs = baseline_batch(size, "base-")
            results.append({"n": size, "operator": mine, "baseline": theirs})
            ctx.say(
                f"throughput: N={size}: operator span {mine['span_sec']:.1f} s, baseline span "
                f"{theirs['span_sec']:.1f} s ({time.time() - started:.0f} s with settling)"
            )
        profile: dict[str, Any] | None = None
        if ctx.profile:
            size = min(10, max(sizes))
            ctx.say(f"throughput: profiling the operator over one more batch of {size} (not counted)")
            with Profiler(operator.pid, ctx.out / "profile-throughput") as profiler:
                operator_batch(size, "profiled-")
            profile = profiler.summary()
    report(ctx, results, turns_per_episode=len(turns))
    if profile:
        ctx.results["throughput_profile"] = profile
        ctx.show(profile["text"])


def report(ctx: Context, results: list[dict[str, Any]], turns_per_episode: int) -> None:
    rows = []
    for entry in results:
        size = entry["n"]
        line: dict[str, dict[str, float]] = {}
        for side in ("operator", "baseline"):
            batch = entry[side]
            line[side] = {
                "per_minute": 60 * size / batch["span_sec"],
                "p50": percentile(batch["latencies_sec"], 0.5),
                "p95": percentile(batch["latencies_sec"], 0.95),
                "cpu_per_turn": batch["cpu_sec"] / (size * turns_per_episode),
            }
            batch["summary"] = line[side]
        mine, theirs = line["operator"], line["baseline"]
        failed = entry["operator"]["failed"]
        rows.append(
            [
                size,
                _pair(f"{mine['per_minute']:.1f}", f"{theirs['per_minute']:.1f}", mine, theirs, "per_minute"),
                _pair(seconds(mine["p50"]), seconds(theirs["p50"]), mine, theirs, "p50"),
                _pair(seconds(mine["p95"]), seconds(theirs["p95"]), mine, theirs, "p95"),
                _pair(
                    f"{mine['cpu_per_turn'] * 1000:.0f}",
                    f"{theirs['cpu_per_turn'] * 1000:.0f} ms",
                    mine,
                    theirs,
                    "cpu_per_turn",
                ),
                len(failed),
            ]
        )
    ctx.show(
        table(
            "3. Throughput — N one-step trivial episodes created at once: operator / baseline (ratio)",
            ["N", "episodes per minute", "p50 latency", "p95 latency", "client CPU per turn", "not Succeeded"],
            rows,
            note="Latency: create → finished (watch) for the operator, pod create → pod delete for the baseline. "
            "CPU per turn: the operator process vs. the sum of the baseline threads (same Python, same machine).",
        )
    )
    ctx.results["throughput"] = results


def _pair(mine_text: str, theirs_text: str, mine: dict[str, float], theirs: dict[str, float], key: str) -> str:
    return f"{mine_text} / {theirs_text} ({ratio(mine[key], theirs[key]):.2f})"
