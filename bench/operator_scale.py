#!/usr/bin/env python3
"""Issue 26, item 5: the operator's own cost at fleet scale, with fake sandboxes, each figure beside a baseline.

    .venv/bin/python bench/operator_scale.py [--episodes 10] [--turns 1,5] [--turn-sec 2]
                                             [--burst 300] [--concurrent 1000] [--hold-sec 60] [--phases ...]

The operator is the real one (``bench/fake_sandbox_operator.py``: kopf, its watches, claims, status
writes and Events against the real API server of hack/cluster) with only its pods and execs faked
in process, one replica, a local process whose pid is recorded and stopped by pid. Phases:

- **turns**: ``--episodes`` Episodes of a command agent whose every turn takes ``--turn-sec``, run to
  the end once with each ``--turns`` count (1 and 5). The operator's CPU (``/proc/<pid>/stat``) and its
  API requests (its own counter ``episode_operator_api_requests_total``, scraped from its /metrics,
  each request counted where it leaves for the network, retries included) from before the first is
  created to after the last is terminal, divided by the turns; and the *marginal* turn, the difference
  between the two counts per added turn, which takes out what an Episode costs once (admission, the
  pod, the finish). **Baseline**: a kopf-less loop through the operator's own client
  (``kube/client.py``), one process, making what a turn cannot do without — one status write of the
  turn's result, seen back on one watch of the namespace — for the same Episodes and turns.
- **burst**: ``--burst`` Episodes created at once (16 threads); time from the first create to every
  one's agent job started (the fake provider's timeline), the operator's peak RSS. **Baseline**: the same
  number created and given one status write each by the bench directly (the API server's own pace).
- **concurrent**: ``--concurrent`` Episodes whose one turn outlasts the phase, created 50 at a time,
  on a fresh operator; once every agent job runs: its RSS and peak (``VmRSS``/``VmHWM``), and its CPU
  and requests per second over ``--hold-sec`` while they all wait on their turns. **Baseline**: the
  same process's RSS before the first Episode.

Every figure comes with the 1-minute load average (others share this machine). Prints the tables,
writes bench/out/operator-scale-*.json. Namespaces are deleted while the operator still runs (its
finalizers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.replicas import Replica, task
from bench.suite.cluster import (
    DEFAULT_KUBECONFIG,
    Namespaces,
    Recorder,
    connect,
    create_episode,
    machine,
    metrics_text,
    operator_requests,
    proc_sample,
)
from bench.suite.stats import table
from bench.suite.tasks import episode_spec, trivial_task
from tests.cluster.harness import SIDE_BY_SIDE_CPU_REQUEST_FRACTION, install_crd
from tests.ports import free_port

OUT = Path(__file__).resolve().parent / "out"
# hack/cluster's API server audit log: every write of an Episode, with its client's User-Agent.
AUDIT_LOG = Path("/var/lib/episode-operator/cluster/logs/audit.log")
SPEC_AGENT = {"kind": "command", "command": "sleep"}


class Operator(Replica):
    """One fake-sandbox operator (bench/replicas.py's replica) with its /metrics on a port of its own."""

    def __init__(
        self, options: argparse.Namespace, namespace: str, folder: Path, turn_sec: float, *, real: bool = False
    ) -> None:
        super().__init__(options.kubeconfig, namespace, "r0", folder, folder / "timeline.jsonl", turn_sec)
        if real:  # real pods, execs and sessions; each pod requesting little CPU (the cluster tier's share)
            self.env["BENCH_REAL_SANDBOXES"] = "1"
            self.command += ["--cpu-request-fraction", str(SIDE_BY_SIDE_CPU_REQUEST_FRACTION)]
        self.timeline = folder / "timeline.jsonl"
        self.metrics_port = free_port()
        at = self.command.index("--metrics-port")
        self.command[at + 1] = str(self.metrics_port)
        # Alone: no replica group (no Lease, no claims), as a one-replica install runs.
        at = self.command.index("--lease-namespace")
        del self.command[at : at + 6]
        if options.profile:
            self.env["BENCH_PROFILE"] = str(folder / "operator.prof")

    def requests(self) -> Counter[str]:
        return operator_requests(metrics_text(self.metrics_port))

    def sample(self) -> Any:
        assert self.process is not None
        return proc_sample(self.process.pid)

    def agent_starts(self) -> dict[str, float]:
        """Each Episode's (uid's) first agent job start."""
        first: dict[str, float] = {}
        if self.timeline.exists():
            for line in self.timeline.read_text().splitlines():
                entry = json.loads(line)
                first[entry["uid"]] = min(entry["started"], first.get(entry["uid"], entry["started"]))
        return first


@contextmanager
def operating(
    options: argparse.Namespace, namespaces: Namespaces, label: str, turn_sec: float, *, real: bool = False
) -> Iterator[Operator]:
    """A fresh namespace and an operator of its own; the namespace deleted while the operator runs."""
    namespace = namespaces.create(label)
    folder = Path(tempfile.mkdtemp(prefix=f"operator-scale-{label}-", dir=OUT))
    operator = Operator(options, namespace, folder, turn_sec, real=real)
    operator.start()
    try:
        yield operator
    finally:
        try:
            namespaces.delete(namespace, timeout=1200)
        finally:
            operator.stop()


def create_all(api: Any, namespace: str, names: list[str], spec: dict[str, Any], threads: int = 16) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda name: create_episode(api, namespace, name, spec), names))


def spec_of(turns: int, *, real: bool = False) -> dict[str, Any]:
    if real:  # the oracle on bench/suite's trivial task: a real pod, every command a supervised job
        return episode_spec(trivial_task(turns, setup=False))
    return {"task": {"inline": {"files": task(turns)}}, "agent": SPEC_AGENT}


def kopf_writes(namespace: str) -> Counter[str]:
    """kopf's own writes of this namespace's Episodes (its finalizer, added and removed), which the operator's
    counter does not see (kopf has a client of its own), from the API server's audit log. kopf's other
    requests are its watches: one per resource for the process, none per turn."""
    counts: Counter[str] = Counter()
    marker = f'"namespace":"{namespace}"'
    for path in sorted(AUDIT_LOG.parent.glob(AUDIT_LOG.name + "*")):
        with path.open(errors="replace") as lines:
            for line in lines:
                if marker in line and '"userAgent":"kopf/' in line:
                    entry = json.loads(line)
                    reference = entry.get("objectRef") or {}
                    resource = reference.get("resource", "") + (
                        "/" + reference["subresource"] if reference.get("subresource") else ""
                    )
                    counts[f"{entry['verb'].upper()} {resource} (kopf)"] += 1
    return counts


def per_request_kind(delta: Counter[str], turns: int) -> dict[str, float]:
    return {kind: round(count / turns, 2) for kind, count in sorted(delta.items()) if count}


# Phase: turns ----------------------------------------------------------------------------------------------
def turns_phase(
    options: argparse.Namespace, api: Any, namespaces: Namespaces, turns: int, *, real: bool = False
) -> dict[str, Any]:
    names = [f"e{index}" for index in range(options.real_episodes if real else options.episodes)]
    label = f"{'real' if real else 't'}{turns}"
    with operating(options, namespaces, label, options.turn_sec, real=real) as operator:
        namespace = operator.command[operator.command.index("--namespace") + 1]
        with Recorder.episodes(api, namespace) as episodes:
            before, requests_before, started = operator.sample(), operator.requests(), time.time()
            create_all(api, namespace, names, spec_of(turns, real=real))
            views = episodes.wait_all(names, lambda view: view.terminal, timeout=turns * options.turn_sec * 4 + 600)
            after, requests_after = operator.sample(), operator.requests()
    failed = sorted(name for name, view in views.items() if view.phase != "Succeeded")
    assert not failed, f"not Succeeded: {failed[:5]}"
    delta = requests_after - requests_before + kopf_writes(namespace)
    count = len(names) * turns
    return {
        "turns_per_episode": turns,
        "turns": count,
        "wall_sec": time.time() - started,
        "cpu_sec": after.cpu_sec - before.cpu_sec,
        "requests": sum(delta.values()),
        "requests_by_kind": dict(delta),
        "cpu_per_turn_ms": (after.cpu_sec - before.cpu_sec) / count * 1000,
        "requests_per_turn": sum(delta.values()) / count,
        "requests_per_turn_by_kind": per_request_kind(delta, count),
        "load_average": os.getloadavg()[0],
    }


def baseline_child(kubeconfig: str, namespace: str, episodes: int, turns: int) -> None:
    """The kopf-less floor (run in a process of its own, ``--baseline-child``): per turn, one status write
    of each Episode through kube/client.py, every write seen back on one watch; prints its CPU and requests."""
    from episode_operator.kube.client import KubeClient
    from episode_operator.runtime.metrics import Metrics

    async def run() -> dict[str, Any]:
        metrics = Metrics()
        client = await KubeClient.connect(kubeconfig, metrics=metrics)
        names = [f"b{index}" for index in range(episodes)]
        for name in names:  # not measured: the Episodes exist before their first turn
            await client.create_episode(
                {"apiVersion": "episode-operator.dev/v1alpha1", "kind": "Episode", "metadata": {"name": name,
                 "namespace": namespace}, "spec": spec_of(turns)}
            )  # fmt: skip
        seen: Counter[str] = Counter()
        target = episodes * turns

        _, version = await client.list_episodes_at(namespace)  # not measured either: where the watch starts

        async def watch() -> None:
            async for kind, body in client.watch_episodes(namespace, None, version):
                turn = (body.get("status") or {}).get("currentTurn")
                if kind == "MODIFIED" and turn is not None and turn > seen[body["metadata"]["name"]]:
                    seen[body["metadata"]["name"]] = turn
                if sum(seen.values()) >= target:
                    return

        def counted() -> Counter[str]:
            samples = next(iter(metrics.api_requests.collect())).samples
            return Counter(
                {
                    f"{s.labels['verb']} {s.labels['resource']}": int(s.value)
                    for s in samples
                    if s.name.endswith("_total")
                }
            )

        requests_before = counted()
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        watcher = asyncio.create_task(watch())
        for turn in range(1, turns + 1):
            await asyncio.gather(
                *(
                    client.replace_episode_status(namespace, name, {"phase": "Running", "currentTurn": turn})
                    for name in names
                )
            )
        await asyncio.wait_for(watcher, 120)
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        delta = counted() - requests_before
        await client.close()
        cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
        return {"cpu_sec": cpu, "requests_by_kind": dict(delta), "events_seen": sum(seen.values())}

    print(json.dumps(asyncio.run(run())))


def baseline_turns(options: argparse.Namespace, namespaces: Namespaces, turns: int) -> dict[str, Any]:
    namespace = namespaces.create(f"b{turns}")
    command = [
        sys.executable, __file__, "--baseline-child", str(options.kubeconfig), namespace,
        str(options.episodes), str(turns),
    ]  # fmt: skip
    child = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    namespaces.delete(namespace, timeout=300)  # no operator: these Episodes carry no finalizer
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.splitlines()[-1])
    count = options.episodes * turns
    result["requests_by_kind"] = Counter(result["requests_by_kind"])
    requests = sum(result["requests_by_kind"].values())
    return {
        "turns_per_episode": turns,
        "turns": count,
        "cpu_per_turn_ms": result["cpu_sec"] / count * 1000,
        "requests_per_turn": requests / count,
        "requests_per_turn_by_kind": per_request_kind(result["requests_by_kind"], count),
        "load_average": os.getloadavg()[0],
        **result,
    }


def marginal(results: list[dict[str, Any]]) -> dict[str, float] | None:
    """Per added turn: the difference between the runs with the fewest and the most turns per Episode."""
    if len(results) < 2:
        return None
    low, high = min(results, key=lambda r: r["turns"]), max(results, key=lambda r: r["turns"])
    added = high["turns"] - low["turns"]
    if added <= 0:
        return None
    key = "cpu_sec" if "cpu_sec" in low else None
    assert key
    requests_low = sum(Counter(low["requests_by_kind"]).values())
    requests_high = sum(Counter(high["requests_by_kind"]).values())
    kinds = Counter(high["requests_by_kind"])
    kinds.subtract(Counter(low["requests_by_kind"]))
    return {
        "cpu_per_turn_ms": (high["cpu_sec"] - low["cpu_sec"]) / added * 1000,
        "requests_per_turn": (requests_high - requests_low) / added,
        "requests_per_turn_by_kind": {kind: round(count / added, 2) for kind, count in sorted(kinds.items()) if count},
    }


# Phase: burst ----------------------------------------------------------------------------------------------
def burst_phase(options: argparse.Namespace, api: Any, namespaces: Namespaces) -> dict[str, Any]:
    names = [f"e{index}" for index in range(options.burst)]
    hold = 3600.0  # the agent job outlasts the phase: the measure is their start
    with operating(options, namespaces, f"burst{options.burst}", hold) as operator:
        namespace = operator.command[operator.command.index("--namespace") + 1]
        idle = operator.sample()
        cpu_before = idle.cpu_sec
        started = time.time()
        create_all(api, namespace, names, spec_of(1))
        created = time.time()
        deadline = time.monotonic() + 1200
        while len(starts := operator.agent_starts()) < len(names):
            assert time.monotonic() < deadline, f"{len(starts)} of {len(names)} running after 1200 s"
            time.sleep(0.5)
        after = operator.sample()
    times = sorted(start - started for start in starts.values())
    return {
        "episodes": len(names),
        "create_sec": created - started,
        "all_running_sec": times[-1],
        "p50_running_sec": times[len(times) // 2],
        "cpu_sec": after.cpu_sec - cpu_before,
        "rss_idle_mib": idle.rss_kib / 1024,
        "rss_peak_mib": after.hwm_kib / 1024,
        "load_average": os.getloadavg()[0],
    }


def burst_baseline(options: argparse.Namespace, api: Any, namespaces: Namespaces) -> dict[str, Any]:
    """The same number of Episodes created and given one status write each, by the bench, no operator."""
    from kubernetes import client

    namespace = namespaces.create(f"bb{options.burst}")
    custom = client.CustomObjectsApi(api)

    def one(name: str) -> None:
        create_episode(api, namespace, name, spec_of(1))
        custom.patch_namespaced_custom_object_status(
            "episode-operator.dev", "v1alpha1", namespace, "episodes", name, {"status": {"phase": "Running"}}
        )

    started = time.time()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, [f"b{index}" for index in range(options.burst)]))
    elapsed = time.time() - started
    namespaces.delete(namespace, timeout=600)
    return {"episodes": options.burst, "all_running_sec": elapsed, "load_average": os.getloadavg()[0]}


# Phase: concurrent long turns ------------------------------------------------------------------------------
def concurrent_phase(options: argparse.Namespace, api: Any, namespaces: Namespaces) -> dict[str, Any]:
    names = [f"e{index}" for index in range(options.concurrent)]
    with operating(options, namespaces, f"c{options.concurrent}", 24 * 3600.0) as operator:
        namespace = operator.command[operator.command.index("--namespace") + 1]
        idle = operator.sample()
        started = time.time()
        for at in range(0, len(names), 50):
            create_all(api, namespace, names[at : at + 50], spec_of(1), threads=8)
        deadline = time.monotonic() + 1800
        while len(starts := operator.agent_starts()) < len(names):
            assert time.monotonic() < deadline, f"{len(starts)} of {len(names)} running after 1800 s"
            time.sleep(1.0)
        running = time.time()
        settled = operator.sample()
        requests_before = operator.requests()
        time.sleep(options.hold_sec)  # the measured window: every Episode in its long turn
        held, requests_after = operator.sample(), operator.requests()
        delta = requests_after - requests_before
    return {
        "episodes": len(names),
        "all_running_sec": running - started,
        "rss_idle_mib": idle.rss_kib / 1024,
        "rss_running_mib": held.rss_kib / 1024,
        "rss_peak_mib": held.hwm_kib / 1024,
        "held_sec": held.at - settled.at,
        "cpu_per_sec_held_ms": (held.cpu_sec - settled.cpu_sec) / (held.at - settled.at) * 1000,
        "requests_per_sec_held": sum(delta.values()) / (held.at - settled.at),
        "requests_held_by_kind": dict(delta),
        "load_average": os.getloadavg()[0],
    }


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--baseline-child":
        baseline_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", default="turns,real-turns,burst,concurrent")
    parser.add_argument("--episodes", type=int, default=10, help="Episodes of the turns phase")
    parser.add_argument("--turns", default="1,5", help="turns per Episode, one run each")
    parser.add_argument("--turn-sec", type=float, default=2.0)
    parser.add_argument("--real-episodes", type=int, default=4, help="Episodes of the real-turns phase (real pods)")
    parser.add_argument("--burst", type=int, default=300)
    parser.add_argument("--concurrent", type=int, default=1000)
    parser.add_argument("--hold-sec", type=float, default=60.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the operator (bench/out/…/operator.prof)")
    parser.add_argument("--kubeconfig", type=Path, default=Path(os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG))
    options = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    api = connect(options.kubeconfig)
    install_crd(api)
    namespaces = Namespaces(api, f"bench-scale-{int(time.time()) % 100000:05d}-")
    phases = options.phases.split(",")
    record: dict[str, Any] = {"machine": machine(api), "options": {k: str(v) for k, v in vars(options).items()}}
    try:
        if "turns" in phases:
            runs, floors = [], []
            for turns in [int(t) for t in options.turns.split(",")]:
                runs.append(turns_phase(options, api, namespaces, turns))
                floors.append(baseline_turns(options, namespaces, turns))
                for who, result in (("operator", runs[-1]), ("baseline", floors[-1])):
                    cpu, requests = result["cpu_per_turn_ms"], result["requests_per_turn"]
                    say(f"{who}, {turns} turn(s): {cpu:.1f} ms, {requests:.2f} req/turn")
            record["turns"] = {
                "operator": runs,
                "baseline": floors,
                "marginal": marginal(runs),
                "baseline_marginal": marginal(floors),
            }
        if "real-turns" in phases:
            real = [turns_phase(options, api, namespaces, t, real=True) for t in map(int, options.turns.split(","))]
            record["real_turns"] = {"operator": real, "marginal": marginal(real)}
            say(f"real sandboxes: {record['real_turns']['marginal']}")
        if "burst" in phases:
            record["burst"] = {
                "operator": burst_phase(options, api, namespaces),
                "baseline": burst_baseline(options, api, namespaces),
            }
            say(f"burst: {record['burst']}")
        if "concurrent" in phases:
            record["concurrent"] = concurrent_phase(options, api, namespaces)
            say(f"concurrent: {record['concurrent']}")
    finally:
        for namespace in list(namespaces.created):
            namespaces.delete(namespace, timeout=60)
    report(record)
    path = OUT / f"operator-scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"JSON: {path}")
    return 0


def report(record: dict[str, Any]) -> None:
    if "turns" in record:
        rows = []
        for operator, floor in zip(record["turns"]["operator"], record["turns"]["baseline"], strict=True):
            rows.append([
                f"{operator['turns_per_episode']} ({operator['turns']} turns)",
                f"{operator['cpu_per_turn_ms']:.1f} ms", f"{floor['cpu_per_turn_ms']:.2f} ms",
                f"{operator['cpu_per_turn_ms'] / floor['cpu_per_turn_ms']:.1f}",
                f"{operator['requests_per_turn']:.2f}", f"{floor['requests_per_turn']:.2f}",
                f"{operator['load_average']:.1f}",
            ])  # fmt: skip
        extra, floor_extra = record["turns"]["marginal"], record["turns"]["baseline_marginal"]
        if extra and floor_extra:
            rows.append([
                "marginal turn", f"{extra['cpu_per_turn_ms']:.1f} ms", f"{floor_extra['cpu_per_turn_ms']:.2f} ms",
                f"{extra['cpu_per_turn_ms'] / floor_extra['cpu_per_turn_ms']:.1f}",
                f"{extra['requests_per_turn']:.2f}", f"{floor_extra['requests_per_turn']:.2f}", "",
            ])  # fmt: skip
        print(table(
            "Per turn: operator CPU and API requests (its own counter), against a kopf-less loop",
            ["turns per Episode", "operator CPU", "baseline CPU", "×", "operator requests", "baseline req.", "load"],
            rows,
        ))  # fmt: skip
        for operator in record["turns"]["operator"]:
            kinds = operator["requests_per_turn_by_kind"]
            print(f"requests per turn by kind, {operator['turns_per_episode']} turn(s): {kinds}")
    if "real_turns" in record:
        rows = []
        for run in record["real_turns"]["operator"]:
            rows.append([f"{run['turns_per_episode']} ({run['turns']} turns)", f"{run['cpu_per_turn_ms']:.1f} ms",
                         f"{run['requests_per_turn']:.2f}", f"{run['load_average']:.1f}"])  # fmt: skip
        extra = record["real_turns"]["marginal"]
        if extra:
            rows.append(
                ["marginal turn", f"{extra['cpu_per_turn_ms']:.1f} ms", f"{extra['requests_per_turn']:.2f}", ""]
            )
        print(table("Per turn with real pods (execs, sessions): the oracle on a trivial task",
                    ["turns per Episode", "operator CPU", "operator requests", "load"], rows))  # fmt: skip
        for run in record["real_turns"]["operator"]:
            kinds = run["requests_per_turn_by_kind"]
            print(f"requests per turn by kind, real, {run['turns_per_episode']} turn(s): {kinds}")
    if "burst" in record:
        burst, floor = record["burst"]["operator"], record["burst"]["baseline"]
        print(table(
            f"Burst of {burst['episodes']} Episodes: create → every agent job started",
            ["", "all running", "p50", "× baseline", "RSS idle → peak", "CPU", "load"],
            [
                ["operator", f"{burst['all_running_sec']:.1f} s", f"{burst['p50_running_sec']:.1f} s",
                 f"{burst['all_running_sec'] / floor['all_running_sec']:.2f}",
                 f"{burst['rss_idle_mib']:.0f} → {burst['rss_peak_mib']:.0f} MiB", f"{burst['cpu_sec']:.0f} s",
                 f"{burst['load_average']:.1f}"],
                ["baseline: create + one status write each", f"{floor['all_running_sec']:.1f} s", "", "1.00", "", "",
                 f"{floor['load_average']:.1f}"],
            ],
        ))  # fmt: skip
    if "concurrent" in record:
        c = record["concurrent"]
        print(table(
            f"{c['episodes']} concurrent long-turn Episodes, one replica",
            ["all running after", "RSS idle (baseline)", "RSS running", "RSS peak", "peak / idle",
             "CPU while held", "requests while held", "load"],
            [[f"{c['all_running_sec']:.0f} s", f"{c['rss_idle_mib']:.0f} MiB", f"{c['rss_running_mib']:.0f} MiB",
              f"{c['rss_peak_mib']:.0f} MiB", f"{c['rss_peak_mib'] / c['rss_idle_mib']:.2f}",
              f"{c['cpu_per_sec_held_ms']:.0f} ms/s", f"{c['requests_per_sec_held']:.2f}/s",
              f"{c['load_average']:.1f}"]],
        ))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
