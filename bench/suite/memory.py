"""Group 5, memory and API cost at scale: thousands of Episodes through one operator process.

Issue 14: RSS after 100, 1,000 and 5,000 Episodes *processed* (created, driven to the end,
deleted — at most ``window`` at a time, as an EpisodeSet's parallelism would), then with
1,000 *present* (created ``window`` at a time and left finished), against a fresh operator
process holding the same 1,000 (the operator restarted and quiet: what the objects themselves
cost), and last with 1,000 created at once (the burst of a ``kubectl apply`` of a folder). Thousands of
real pods are too slow on one machine, so the operator runs with an in-memory sandbox
(:mod:`.fake_operator`): everything else — kopf, the driver, the runner, its status writes,
Events, data directory, kopf's own requests — is the real operator against the real API
server. That is what this group measures: the operator's RSS (``/proc/<pid>/status``), its
CPU, its requests (its own counter, ``episode_operator_api_requests_total``, and every
client's, ``apiserver_request_total``), and the API server's and etcd's CPU per 1,000 turns
(``/proc`` of the pids hack/cluster records). Memory is read ``SETTLE_SEC`` after the last
Episode of a checkpoint is gone, longer than aiohttp keeps an idle connection (15 s), and once
the operator has posted the Events of the Episodes processed: at 8–9 Episodes a second they come
faster than its Event rate limit (20 a second) and up to 1,000 wait (``episode_operator_events_waiting``),
a backlog that drains in up to 50 s; a reading during the drain would count work still being done.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.cluster.harness import GROUP, PLURAL, VERSION

from .cluster import (
    TERMINAL,
    EpisodeView,
    Operator,
    ProcSample,
    Recorder,
    api_requests,
    create_episode,
    daemon_cpu_sec,
    delete_episode,
    operator_requests,
    request_delta,
)
from .context import Context
from .stats import ratio, table
from .tasks import FAKE, episode_spec, trivial_task

RECONCILE_SEC = 30.0  # no watch event for this long: list instead
STALL_SEC = 300.0
FAKE_OPERATOR = (sys.executable, str(Path(__file__).resolve().with_name("fake_operator.py")))
SETTLE_SEC = 20.0
CREATORS = 10
TARGET_GROWTH = 1.2  # RSS after the last checkpoint / after the first
TARGET_PRESENT_MIB = 150.0
DAEMONS = ("kube-apiserver", "etcd")
EPISODE_RESOURCES = {"episodes", "episodes/status", "events", "pods", "pods/exec", "configmaps"}


class Pipeline:
    """Keeps ``window`` Episodes in flight: each one that ends is deleted and replaced by a new one."""

    def __init__(self, ctx: Context, namespace: str, episodes: Recorder[EpisodeView], spec: dict[str, Any]) -> None:
        self.ctx, self.namespace, self.episodes, self.spec = ctx, namespace, episodes, spec
        self.created = 0
        self.processed = 0
        self.outcomes: Counter[str] = Counter()
        self.in_flight: set[str] = set()
        self.deleting: set[str] = set()
        self.cursor = 0
        self.last_progress = time.monotonic()

    def process_until(self, target: int, window: int) -> None:
        while self.processed < target:
            while len(self.in_flight) < window and self.created < target:
                name = f"m-{self.created:05d}"
                create_episode(self.ctx.api, self.namespace, name, self.spec)
                self.in_flight.add(name)
                self.created += 1
            self._follow()
        while self.deleting:  # the checkpoint: every processed Episode is gone
            self._follow()

    def _follow(self) -> None:
        try:
            views, self.cursor = self.episodes.since(self.cursor, timeout=RECONCILE_SEC)
        except TimeoutError:
            self._reconcile()  # the watch may have lost events (it resumes after a 410 from "now")
            return
        for view in views:
            if view.name in self.in_flight and view.terminal:
                self._ended(view.name, view.phase, view.failure_kind)
            elif view.event == "DELETED" and view.name in self.deleting:
                self.deleting.discard(view.name)
                self.last_progress = time.monotonic()

    def _ended(self, name: str, phase: str | None, failure_kind: str | None) -> None:
        self.in_flight.remove(name)
        self.last_progress = time.monotonic()
        self.processed += 1
        self.outcomes[f"{phase} {failure_kind or ''}".strip()] += 1
        delete_episode(self.ctx.api, self.namespace, name)
        self.deleting.add(name)

    def _reconcile(self) -> None:
        """What a list says: in-flight Episodes that ended, deleted ones that are gone."""
        listing: Any = client.CustomObjectsApi(self.ctx.api).list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL
        )
        present = {item["metadata"]["name"]: item.get("status") or {} for item in listing["items"]}
        if time.monotonic() - self.last_progress > STALL_SEC:
            raise TimeoutError(f"no Episode ended or went away for {STALL_SEC:.0f} s")
        for name in sorted(self.in_flight):
            status = present.get(name, {})
            if status.get("phase") in TERMINAL:
                self._ended(name, status.get("phase"), status.get("failureKind"))
        self.deleting &= set(present)


def wait_all_ended(ctx: Context, namespace: str, names: list[str], timeout: float) -> None:
    """Until every one of ``names`` is Succeeded or Failed (listed: a watch may lose events)."""
    deadline = time.monotonic() + timeout
    custom = client.CustomObjectsApi(ctx.api)
    while True:
        listing: Any = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        ended = {
            item["metadata"]["name"] for item in listing["items"] if (item.get("status") or {}).get("phase") in TERMINAL
        }
        if ended >= set(names):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(set(names) - ended)} of {len(names)} not ended after {timeout:.0f} s")
        time.sleep(2)


def wait_all_gone(ctx: Context, namespace: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    custom = client.CustomObjectsApi(ctx.api)
    while True:
        listing: Any = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, limit=1)
        if not listing["items"]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Episodes still in {namespace} after {timeout:.0f} s")
        time.sleep(2)


def wait_quiet(operator: Operator, *, window: float = 5.0, share: float = 0.05, timeout: float = 300.0) -> None:
    """Until the operator used less than ``share`` of a core over ``window`` seconds (it has caught up)."""
    deadline = time.monotonic() + timeout
    before = operator.sample()
    while time.monotonic() < deadline:
        time.sleep(window)
        after = operator.sample()
        if (after.cpu_sec - before.cpu_sec) / (after.at - before.at) < share:
            return
        before = after
    raise TimeoutError(f"the operator was still busy after {timeout:.0f} s")


def events_waiting(operator: Operator) -> float:
    """The operator's Events waiting for its rate limit (``episode_operator_events_waiting``)."""
    for line in operator.metrics().splitlines():
        if line.startswith("episode_operator_events_waiting "):
            return float(line.split()[1])
    raise LookupError("the operator exports no episode_operator_events_waiting")


def wait_events_posted(operator: Operator, timeout: float = 300.0) -> float:
    """Until the operator has no Event waiting; the seconds that took."""
    started = time.monotonic()
    while events_waiting(operator) > 0:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"the operator's Events still waiting after {timeout:.0f} s")
        time.sleep(1.0)
    return time.monotonic() - started


def memory(sample: ProcSample) -> dict[str, float]:
    return {"rss_mib": sample.rss_kib / 1024, "hwm_mib": sample.hwm_kib / 1024}


def daemons_cpu() -> dict[str, float | None]:
    return {name: daemon_cpu_sec(name) for name in DAEMONS}


def run(
    ctx: Context,
    *,
    checkpoints: tuple[int, ...] = (100, 1000, 5000),
    window: int = 50,
    present: int = 1000,
    steps: int = 1,
    env: dict[str, str] | None = None,
) -> None:
    spec = episode_spec(trivial_task(steps, scripts=FAKE, name="bench/fake"))
    figures: dict[str, Any] = {
        "window": window,
        "steps": steps,
        "env": env or {},
        "checkpoints": [],
        "present_count": present,
    }
    with (
        ctx.group("memory", program=FAKE_OPERATOR, env=env) as (namespace, operator),
        Recorder.episodes(ctx.api, namespace) as episodes,
    ):
        time.sleep(3)
        figures["idle"] = memory(operator.sample())
        pipeline = Pipeline(ctx, namespace, episodes, spec)
        cpu_before, requests_before = daemons_cpu(), api_requests(ctx.api)
        own_before = operator_requests(operator.metrics())
        operator_before = operator.sample()
        started = time.time()
        previous = 0
        for checkpoint in checkpoints:
            segment_started, segment_cpu = time.time(), operator.sample().cpu_sec
            pipeline.process_until(checkpoint, window)
            elapsed = time.time() - segment_started
            drained = wait_events_posted(operator)
            time.sleep(SETTLE_SEC)
            sample = operator.sample()
            figures["checkpoints"].append(
                {
                    "processed": checkpoint,
                    "events_drained_sec": drained,
                    **memory(sample),
                    "episodes_per_sec": (checkpoint - previous) / elapsed,
                    "operator_cpu_sec": sample.cpu_sec - segment_cpu,
                }
            )
            previous = checkpoint
            ctx.say(
                f"memory: {checkpoint} processed: RSS {sample.rss_kib / 1024:.1f} MiB "
                f"(peak {sample.hwm_kib / 1024:.1f}), {dict(pipeline.outcomes)}, Events posted {drained:.0f} s after"
            )
        duration = time.time() - started
        cpu_after, requests_after = daemons_cpu(), api_requests(ctx.api)
        own_after = operator_requests(operator.metrics())
        operator_after = operator.sample()
        turns = pipeline.processed * steps
        figures["processed"] = {
            "episodes": pipeline.processed,
            "turns": turns,
            "outcomes": dict(pipeline.outcomes),
            "duration_sec": duration,
            "operator_cpu_sec": operator_after.cpu_sec - operator_before.cpu_sec,
            "daemon_cpu_sec": {
                name: (cpu_after[name] or 0) - (cpu_before[name] or 0)
                for name in DAEMONS
                if cpu_before[name] is not None and cpu_after[name] is not None
            },
            "requests_operator": request_delta(own_before, own_after),
            "requests_all_clients": request_delta(requests_before, requests_after),
        }

        ctx.say(f"memory: creating {present} Episodes, {window} at a time, and leaving them finished")
        names = [f"p-{index:05d}" for index in range(present)]
        for start in range(0, present, window):
            batch = names[start : start + window]
            for name in batch:
                create_episode(ctx.api, namespace, name, spec)
            wait_all_ended(ctx, namespace, batch, timeout=600)
        wait_quiet(operator)
        time.sleep(SETTLE_SEC)
        figures["present"] = memory(operator.sample())
        ctx.say("memory: restarting the operator with them present")
        operator.process.stop()
        operator.process.start()
        wait_quiet(operator)  # kopf has listed them all and looked at each
        time.sleep(SETTLE_SEC)
        figures["fresh_with_present"] = memory(operator.sample())
        ctx.say(f"memory: deleting them, then creating {present} at once")
        for name in names:
            delete_episode(ctx.api, namespace, name)
        wait_all_gone(ctx, namespace)
        burst = [f"b-{index:05d}" for index in range(present)]
        with ThreadPoolExecutor(CREATORS) as pool:
            list(pool.map(lambda name: create_episode(ctx.api, namespace, name, spec), burst))
        wait_all_ended(ctx, namespace, burst, timeout=600 + present)
        wait_quiet(operator)
        time.sleep(SETTLE_SEC)
        figures["present_burst"] = memory(operator.sample())
    report(ctx, figures)


def report(ctx: Context, figures: dict[str, Any]) -> None:
    idle = figures["idle"]
    points = figures["checkpoints"]
    first, last = points[0], points[-1]
    rows = [["idle (no Episode yet)", f"{idle['rss_mib']:.1f} MiB", f"{idle['hwm_mib']:.1f} MiB", "", ""]]
    for point in points:
        rows.append(
            [
                f"after {point['processed']} processed",
                f"{point['rss_mib']:.1f} MiB",
                f"{point['hwm_mib']:.1f} MiB",
                f"{ratio(point['rss_mib'], first['rss_mib']):.2f}",
                f"{point['episodes_per_sec']:.1f}",
            ]
        )
    present, fresh, burst = figures["present"], figures["fresh_with_present"], figures["present_burst"]
    count = figures["present_count"]
    for label, sample in (
        (f"with {count} present (created {figures['window']} at a time)", present),
        (f"restarted with the same {count} present", fresh),
        (f"with {count} present (all created at once, after the restart)", burst),
    ):
        rows.append([label, f"{sample['rss_mib']:.1f} MiB", f"{sample['hwm_mib']:.1f} MiB", "", ""])
    growth = ratio(last["rss_mib"], first["rss_mib"])
    processed = figures["processed"]
    drains = ", ".join(f"{point.get('events_drained_sec', 0):.0f} s" for point in figures["checkpoints"])
    ctx.show(
        table(
            f"5. Operator memory — Episodes processed ({figures['steps']}-step, in-memory sandbox, "
            f"{figures['window']} at a time, each deleted when it ends), then present",
            ["state", "RSS (VmRSS)", "peak (VmHWM)", f"RSS / after {first['processed']}", "episodes per second"],
            rows,
            note=(
                f"Targets (issue 14): RSS after {last['processed']} processed ≤ {TARGET_GROWTH}× after "
                f"{first['processed']} — {'MET' if growth <= TARGET_GROWTH else 'NOT MET'} ({growth:.2f}); "
                f"≤ {TARGET_PRESENT_MIB:.0f} MiB with {count} present — "
                f"{'MET' if present['rss_mib'] <= TARGET_PRESENT_MIB else 'NOT MET'} ({present['rss_mib']:.1f} MiB; "
                f"{ratio(present['rss_mib'], fresh['rss_mib']):.2f}× a fresh process holding the same objects); "
                f"created at once: {'MET' if burst['rss_mib'] <= TARGET_PRESENT_MIB else 'NOT MET'} "
                f"({burst['rss_mib']:.1f} MiB, {ratio(burst['rss_mib'], fresh['rss_mib']):.2f}×). "
                f"Outcomes: {processed['outcomes']}. Memory read {SETTLE_SEC:.0f} s after each checkpoint's last "
                f"Episode was gone and the operator's Events were posted (waited for: "
                f"{drains}). "
                f"Operator environment: {figures['env'] or 'as is'}."
            ),
        )
    )
    report_costs(ctx, figures)
    ctx.results["memory"] = figures


def report_costs(ctx: Context, figures: dict[str, Any]) -> None:
    processed = figures["processed"]
    episodes, turns = processed["episodes"], processed["turns"]
    own: dict[str, int] = processed["requests_operator"]
    every: dict[str, int] = processed["requests_all_clients"]
    # Other sessions share the API server: of every client's requests, only the resources an Episode touches.
    every = {key: value for key, value in every.items() if key.split()[1] in EPISODE_RESOURCES}
    rows = [
        [key, f"{own.get(key, 0) / episodes:.2f}", f"{every.get(key, 0) / episodes:.2f}"]
        for key in sorted(set(own) | set(every))
    ]
    rows.append(["all", f"{sum(own.values()) / episodes:.2f}", f"{sum(every.values()) / episodes:.2f}"])
    per_1000 = 1000 / turns if turns else 0.0
    cpu = processed["daemon_cpu_sec"]
    ctx.show(
        table(
            f"5b. API requests per Episode ({figures['steps']}-step, in-memory sandbox: no pod, no exec) "
            f"over {episodes} Episodes",
            ["request", "operator's client", "all clients (API server)"],
            rows,
            note=(
                "All clients: apiserver_request_total for the resources an Episode touches, so it includes kopf "
                "(watches, finalizers, annotations), this benchmark (one POST and one DELETE of each Episode, its "
                "watch) and other sessions sharing the API server. "
                f"CPU per 1,000 turns: operator {processed['operator_cpu_sec'] * per_1000:.1f} s, "
                + ", ".join(f"{name} {seconds * per_1000:.1f} s" for name, seconds in cpu.items())
                + f" ({turns} turns in {processed['duration_sec']:.0f} s)."
            ),
        )
    )
