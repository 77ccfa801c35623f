#!/usr/bin/env python3
"""Issue 14: how many concurrently driven Episodes 1, 2 and 3 operator replicas sustain.

    .venv/bin/python bench/replicas.py [--replicas 1,2,3] [--levels 10,20,40,80] [--turn-sec 60] [--turns 3]
                                       [--window-sec 60] [--resolution 0.1] [--cpu-quota CORES]

The replicas are the real operator (``bench/fake_sandbox_operator.py``: only the pods and their
execs are faked in process, so the operator's and the API server's own cost is what is measured,
at a scale this 2-core machine could never hold as pods), local processes with pids recorded,
stopped by pid. A *level* keeps N Episodes in flight — a command agent whose every turn takes
``--turn-sec`` seconds, ``--turns`` turns; the first N created spread over one turn, then a new one
for each that ends — and measures ``--window-sec`` seconds of that steady state. The measure is the
**per-turn latency**: from one turn's agent job ending to the next turn's agent job starting (the
operator's whole work for a turn: collect, verify, the reward, status writes, Events, the next
turn's preparation and start). A configuration *sustains* N while that latency's p95 stays below
twice the p95 of one replica at the smallest level. For each replica count the levels are tried in
order until one is not sustained, then the gap between the last that was and the first that was not
is halved until it is within ``--resolution``; more replicas start at what fewer sustained. Prints a
table, writes bench/out/replicas-*.json.

``--cpu-quota C`` gives each replica process C cores at most (a CPU cgroup of its own: cgroup v2's
``cpu.max``, else v1's CFS quota), as a replica's ``resources.limits.cpu`` does in a cluster. On a
machine whose cores the API server shares, that is what lets the replicas' own capacity, rather
than the machine's, be what runs out.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.suite.cluster import DEFAULT_KUBECONFIG, Namespaces, Recorder, connect, create_episode, machine
from bench.suite.stats import table
from tests.cluster.harness import install_crd
from tests.ports import free_port

OUT = Path(__file__).resolve().parent / "out"
FAKE = Path(__file__).resolve().parent / "fake_sandbox_operator.py"


def task(turns: int) -> dict[str, str]:
    lines = ['schema_version = "1.4"', "[environment]", 'docker_image = "fake"', 'workdir = "/app"']
    files = {"instruction.md": "Wait.\n"}
    for index in range(1, turns + 1):
        lines += ["[[steps]]", f'name = "s{index}"']
        files[f"steps/s{index}/instruction.md"] = f"Turn {index}.\n"
        files[f"steps/s{index}/tests/test.sh"] = "echo 1 > /logs/verifier/reward.txt\n"
    files["task.toml"] = "\n".join(lines) + "\n"
    return files


class CpuGroup:
    """A CPU cgroup of its own for one process, with a quota of ``cores``; removed by :meth:`remove`."""

    PERIOD_US = 10_000  # a short period: throttling comes in small slices, not in 100 ms stalls

    def __init__(self, name: str, cores: float) -> None:
        quota = max(1000, int(cores * self.PERIOD_US))
        unified = Path("/sys/fs/cgroup/cgroup.controllers")
        if unified.exists() and "cpu" in unified.read_text().split():
            self.path = Path("/sys/fs/cgroup") / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}\n")
        else:
            self.path = Path("/sys/fs/cgroup/cpu") / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.cfs_period_us").write_text(f"{self.PERIOD_US}\n")
            (self.path / "cpu.cfs_quota_us").write_text(f"{quota}\n")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # still busy: a process in it has not exited yet
            self.path.rmdir()


class Replica:
    """One fake-sandbox operator process."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        name: str,
        folder: Path,
        timeline: Path,
        turn_sec: float,
        cpu_quota: float | None = None,
    ):
        self.name, self.log = name, folder / f"{name}.log"
        self.cpu_quota = cpu_quota
        self.group: CpuGroup | None = None
        self.health = free_port()
        self.command = [
            sys.executable, str(FAKE), "run", "--namespace", namespace, "--kubeconfig", str(kubeconfig),
            "--data-dir", str(folder / "data"), "--poll-interval", "30", "--metrics-port", "0",
            "--liveness", f"http://127.0.0.1:{self.health}/healthz",
            "--lease-namespace", namespace, "--replica-group", "bench", "--replica-name", name,
        ]  # fmt: skip
        self.env = {**os.environ, "BENCH_TIMELINE": str(timeline), "BENCH_TURN_SEC": str(turn_sec)}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        if self.cpu_quota:
            self.group = CpuGroup(f"episode-operator-bench-{os.getpid()}-{self.name}", self.cpu_quota)
            self.group.add(self.process.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"replica {self.name} not healthy")

    def cpu_sec(self) -> float:
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.group is not None:
            self.group.remove()


def level(options: argparse.Namespace, api: Any, namespaces: Namespaces, replicas: int, count: int) -> dict[str, Any]:
    """``count`` Episodes in flight at once, kept so for ``--window-sec``: a new one for each that ends."""
    namespace = namespaces.create(f"r{replicas}-n{count}")
    folder = Path(tempfile.mkdtemp(prefix=f"replicas-r{replicas}-n{count}-", dir=options.out))
    timeline = folder / "timeline.jsonl"
    group = [
        Replica(options.kubeconfig, namespace, f"r{i}", folder, timeline, options.turn_sec, options.cpu_quota)
        for i in range(replicas)
    ]
    spec = {"task": {"inline": {"files": task(options.turns)}}, "agent": {"kind": "command", "command": "sleep"}}
    try:
        for replica in group:
            replica.start()
        time.sleep(options.retry_settle)  # every replica has seen the others before the Episodes arrive
        with Recorder.episodes(api, namespace) as episodes:
            started = time.time()
            # The first ones spread over one turn, as a steady load's are (their turns end evenly, not all at
            # once); from then on `count` are in flight, and the window measures that steady state.
            window = (started + options.turn_sec, started + options.turn_sec + options.window_sec)

            def create(index: int) -> None:
                time.sleep(max(0.0, started + options.turn_sec * index / count - time.time()))
                create_episode(api, namespace, f"e{index}", spec)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(create, range(count)))
            cpu_at, created, ended, cursor = {}, count, set(), 0
            while time.time() < window[1]:
                if "start" not in cpu_at and time.time() >= window[0]:
                    cpu_at["start"] = sum(replica.cpu_sec() for replica in group)
                try:
                    views, cursor = episodes.since(cursor, timeout=1.0)
                except TimeoutError:
                    continue
                for view in views:
                    if view.terminal and view.name not in ended:
                        ended.add(view.name)
                        create_episode(api, namespace, f"e{created}", spec)
                        created += 1
            cpu_at["end"] = sum(replica.cpu_sec() for replica in group)
            names = [f"e{index}" for index in range(created)]
            episodes.wait_all(names, lambda view: view.terminal, timeout=options.turns * options.turn_sec * 4 + 300)
    finally:
        try:
            namespaces.delete(namespace, timeout=600)  # while a replica runs: the finalizers need one
        finally:
            for replica in group:
                replica.stop()
    jobs: dict[str, list[dict[str, Any]]] = {}
    for line in timeline.read_text().splitlines():
        entry = json.loads(line)
        jobs.setdefault(entry["uid"], []).append(entry)
    gaps, starts_in_window = [], 0
    for entries in jobs.values():
        entries.sort(key=lambda entry: entry["started"])
        starts_in_window += sum(1 for entry in entries if window[0] <= entry["started"] < window[1])
        gaps += [
            after["started"] - before["ends"]
            for before, after in itertools.pairwise(entries)
            if window[0] <= before["ends"] < window[1]
        ]
    assert len(jobs) == created, (len(jobs), created)
    assert len(gaps) >= 10, f"{len(gaps)} turns in the window: make --window-sec longer"
    quantiles = statistics.quantiles(gaps, n=100)
    cpu = cpu_at["end"] - cpu_at["start"]
    return {
        "replicas": replicas,
        "episodes": count,
        "created": created,
        "turns_measured": len(gaps),
        "turn_latency_p50_sec": statistics.median(gaps),
        "turn_latency_p95_sec": quantiles[94],
        "turn_latency_max_sec": max(gaps),
        "operator_cpu_sec": cpu,
        "cpu_per_turn_ms": cpu / max(1, starts_in_window) * 1000,
        "load_average": os.getloadavg()[0],
    }


def sustained_level(
    measure: Callable[[int], dict[str, Any]],
    levels: list[int],
    bound: Callable[[dict[str, Any]], bool],
    resolution: float,
) -> tuple[int | None, bool]:
    """The largest level within ``bound``: the ``levels`` in order until one is not, then halving the gap
    between the last that was and the first that was not until it is within ``resolution`` (a fraction);
    and whether the levels ran out first (the largest one was within: there may be more)."""
    good: int | None = None
    bad: int | None = None
    for count in levels:
        if bound(measure(count)):
            good = count
        else:
            bad = count
            break
    if good is None or bad is None:
        return good, bad is None
    while bad - good > max(1, round(good * resolution)):
        middle = (good + bad) // 2
        if bound(measure(middle)):
            good = middle
        else:
            bad = middle
    return good, False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--levels", default="25,50,100,200", help="Episodes at once, ascending")
    parser.add_argument("--turn-sec", type=float, default=60.0, help="each agent turn's duration (issue 14: 60)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--window-sec", type=float, default=60.0, help="how long each level is measured in steady state"
    )
    parser.add_argument(
        "--resolution", type=float, default=0.1, help="bisect until the bounds are this close (a fraction)"
    )
    parser.add_argument("--retry-settle", type=float, default=5.0)
    parser.add_argument("--cpu-quota", type=float, default=None, help="cores per replica (a CPU cgroup each)")
    parser.add_argument("--kubeconfig", type=Path, default=Path(os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG))
    options = parser.parse_args()
    options.out = OUT
    OUT.mkdir(parents=True, exist_ok=True)
    api = connect(options.kubeconfig)
    install_crd(api)
    namespaces = Namespaces(api, f"bench-rep-{int(time.time()) % 100000:05d}-")
    levels = [int(n) for n in options.levels.split(",")]
    results: list[dict[str, Any]] = []
    baseline: float | None = None
    sustained: dict[int, int] = {}
    at_least: set[int] = set()  # the largest level was sustained: the search stopped there
    try:
        for replicas in [int(r) for r in options.replicas.split(",")]:

            def measure(count: int, replicas: int = replicas) -> dict[str, Any]:
                nonlocal baseline
                result = level(options, api, namespaces, replicas, count)
                results.append(result)
                baseline = baseline or result["turn_latency_p95_sec"]
                print(
                    f"[{time.strftime('%H:%M:%S')}] {replicas} replica(s), {count} Episodes: per-turn p95 "
                    f"{result['turn_latency_p95_sec'] * 1000:.0f} ms (baseline {baseline * 1000:.0f} ms) of "
                    f"{result['turns_measured']} turns, CPU {result['cpu_per_turn_ms']:.0f} ms/turn, "
                    f"load {result['load_average']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
                return result

            def within(result: dict[str, Any]) -> bool:
                assert baseline is not None
                return bool(result["turn_latency_p95_sec"] < 2 * baseline)

            # More replicas start at what fewer sustained: below it they sustain at least as much.
            fewer = max(sustained.values(), default=0)
            start = ([fewer] if fewer else []) + [n for n in levels if n > fewer]
            found, capped = sustained_level(measure, start, within, options.resolution)
            if found is not None:
                sustained[replicas] = found
            if capped:
                at_least.add(replicas)
    finally:
        for namespace in list(namespaces.created):
            namespaces.delete(namespace, timeout=60)
    assert baseline is not None
    one = sustained.get(1)
    rows = [
        [
            str(r["replicas"]),
            str(r["episodes"]),
            f"{r['turn_latency_p50_sec'] * 1000:.0f} ms",
            f"{r['turn_latency_p95_sec'] * 1000:.0f} ms",
            f"{r['turn_latency_p95_sec'] / baseline:.2f}",
            f"{r['cpu_per_turn_ms']:.0f} ms",
            str(r["turns_measured"]),
            f"{r['load_average']:.1f}",
        ]
        for r in results
    ]
    summary = [
        [str(r), f"≥ {n}" if r in at_least else str(n), f"{n / one:.2f}" if one else "—"]
        for r, n in sorted(sustained.items())
    ]
    print(
        table(
            f"Per-turn latency (agent job end → next agent job start), {options.turns} turns of {options.turn_sec:g} s",
            [
                "replicas",
                "Episodes in flight",
                "p50",
                "p95",
                "p95 / baseline",
                "CPU per turn (all replicas)",
                "turns",
                "load",
            ],
            rows,
            note=f"Baseline: p95 of 1 replica at {levels[0]} Episodes, {baseline * 1000:.0f} ms; a level is "
            f"sustained while its p95 stays below twice that. Each level: {options.window_sec:g} s of steady state.",
        )
    )
    print(table("Sustained Episodes", ["replicas", "Episodes (largest level sustained)", "× one replica"], summary))
    path = OUT / f"replicas-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record = {
        "machine": machine(api),
        "options": vars(options),
        "levels": results,
        "sustained": sustained,
        "at_least": sorted(at_least),
    }
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
