"""Episodes per minute through an EpisodeSet, against the same Episodes created directly.

The dataset: 20 tiny oracle task folders × 2 attempts = 40 Episodes (the acceptance test's
shape). Cases, each in a fresh namespace with a fresh operator process, measured in one run:

- ``set pN``: one EpisodeSet with ``parallelism: N``; the set controller keeps N children active;
- ``direct limit N`` (baseline): the same 40 Episodes created at once by this script, the
  operator started with ``--max-active-episodes N``: the same concurrency, no set controller;
- ``direct, no limit`` (baseline): the 40 Episodes at once, every one driven concurrently.

Wall time runs from the first create call to the moment the last Episode is seen finished
(polled every 0.2 s); for a set, to the moment the set says it is complete. Each case also counts
what it cost the operator, per Episode: its CPU (``/proc/<pid>/stat``) and its API requests (its
own counter, ``episode_operator_api_requests_total``, from its /metrics), and for a set its passes
(each reads the set and lists its children). Usage (the cluster up):
``.venv/bin/python bench/episodeset_throughput.py [--parallelism 4 8] [--repeats 1]``.
Prints a table and writes ``bench/out/episodeset_throughput.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the cluster-test harness

from bench.suite.cluster import metrics_text, operator_requests, proc_sample
from kubernetes import client, config
from tests.cluster.harness import GROUP, PLURAL, VERSION, OperatorProcess, install_crd

KUBECONFIG = Path("/var/lib/episode-operator/cluster/kubeconfig")
OUT = Path(__file__).resolve().parent / "out"
IMAGE = "episode-operator.local/sandbox:bookworm"
TERMINAL = ("Succeeded", "Failed")
PREFIX = "bench-eset-"
TASK_TOML = f"""schema_version = "1.4"
[agent]
timeout_sec = 60.0
[verifier]
timeout_sec = 30.0
[environment]
docker_image = "{IMAGE}"
workdir = "/app"
"""


def task_files(index: int) -> dict[str, str]:
    reward = (1.0, 0.0, 0.5)[index % 3]
    return {
        "task.toml": TASK_TOML,
        "instruction.md": f"Task {index}.\n",
        "solution/solve.sh": f"#!/usr/bin/env bash\necho {reward} > /app/earned.txt\n",
        "tests/test.sh": "#!/usr/bin/env bash\ncat /app/earned.txt > /logs/verifier/reward.txt\n",
    }


@contextlib.contextmanager
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    name = f"{PREFIX}{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except client.exceptions.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@contextlib.contextmanager
def operator(root: Path, extra: tuple[str, ...] = ()) -> Iterator[OperatorProcess]:
    # Requests as the operator's default sets them (requests = limits): what the figures measure.
    process = OperatorProcess(
        KUBECONFIG,
        root / "data",
        root / f"operator-{uuid.uuid4().hex[:6]}.log",
        f"{PREFIX}*",
        extra,
        cpu_request_fraction=None,
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@dataclass
class Cost:
    """What a case cost the operator: CPU seconds and API requests by kind."""

    cpu_sec: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)


@contextlib.contextmanager
def cost_of(process: OperatorProcess) -> Iterator[Cost]:
    """The operator's CPU and requests from entering to leaving the block."""
    assert process.process is not None
    pid = process.process.pid

    def requests() -> Counter[str]:
        return operator_requests(metrics_text(process.metrics_port))

    cost = Cost()
    cpu, before = proc_sample(pid).cpu_sec, requests()
    yield cost
    cost.cpu_sec = proc_sample(pid).cpu_sec - cpu
    cost.requests = requests() - before


def wait_all_finished(custom: client.CustomObjectsApi, ns: str, count: int, timeout: float = 900) -> tuple[float, int]:
    """When all ``count`` Episodes of ``ns`` are finished; and the most seen unfinished at once."""
    deadline = time.monotonic() + timeout
    peak = 0
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        finished = sum(1 for item in items if (item.get("status") or {}).get("phase") in TERMINAL)
        peak = max(peak, len(items) - finished)
        if len(items) == count and finished == count:
            return time.time(), peak
        time.sleep(0.2)
    raise TimeoutError(f"{ns}: not all {count} episodes finished in {timeout:.0f} s")


def run_direct(custom: client.CustomObjectsApi, ns: str, tasks: int, attempts: int) -> tuple[float, int]:
    started = time.time()
    for index in range(tasks):
        for attempt in range(1, attempts + 1):
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Episode",
                "metadata": {"name": f"direct-{index}-{attempt}"},
                "spec": {"task": {"inline": {"files": task_files(index)}}, "agent": {"kind": "oracle"}},
            }
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    finished, peak = wait_all_finished(custom, ns, tasks * attempts)
    return finished - started, peak


def run_set(custom: client.CustomObjectsApi, ns: str, tasks: int, attempts: int, parallelism: int) -> tuple[float, int]:
    spec = {
        "dataset": {"tasks": [{"name": f"task-{i:02d}", "inline": {"files": task_files(i)}} for i in range(tasks)]},
        "agent": {"kind": "oracle"},
        "attempts": attempts,
        "parallelism": parallelism,
    }
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EpisodeSet", "metadata": {"name": "bench"}, "spec": spec}
    started = time.time()
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "episodesets", body)
    _, peak = wait_all_finished(custom, ns, tasks * attempts)
    deadline = time.monotonic() + 120
    while True:  # the set's own word that it is done: what a user waits for
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "episodesets", "bench").get("status") or {}
        if status.get("completionTime"):
            break
        assert time.monotonic() < deadline, f"the set did not complete: {status.get('progress')}"
        time.sleep(0.2)
    completed = time.time()
    assert status["progress"] == f"{tasks * attempts}/{tasks * attempts}", status["progress"]
    return completed - started, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    options = parser.parse_args()
    api = config.new_client_from_config(config_file=str(KUBECONFIG))  # type: ignore[no-untyped-call]
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    install_crd(api)
    count = options.tasks * options.attempts
    results: dict[str, list[tuple[float, int]]] = {}
    costs: dict[str, list[Cost]] = {}

    def record(case: str, measured: tuple[float, int], cost: Cost) -> None:
        results.setdefault(case, []).append(measured)
        costs.setdefault(case, []).append(cost)
        seconds, peak = measured
        rate = count / seconds * 60
        print(
            f"  {case:22} {seconds:7.1f} s  {rate:6.1f} episodes/min  peak unfinished {peak}  "
            f"operator {cost.cpu_sec / count * 1000:.0f} ms and {cost.requests.total() / count:.1f} requests "
            f"per Episode",
            flush=True,
        )

    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        for _ in range(options.repeats):
            with operator(root) as unlimited:
                with namespace(core) as ns, cost_of(unlimited) as cost:
                    measured = run_direct(custom, ns, options.tasks, options.attempts)
                record("direct, no limit", measured, cost)
                for parallelism in options.parallelism:
                    with namespace(core) as ns, cost_of(unlimited) as cost:
                        measured = run_set(custom, ns, options.tasks, options.attempts, parallelism)
                    record(f"set p{parallelism}", measured, cost)
            for parallelism in options.parallelism:
                limit = ("--max-active-episodes", str(parallelism))
                with operator(root, limit) as limited, namespace(core) as ns, cost_of(limited) as cost:
                    measured = run_direct(custom, ns, options.tasks, options.attempts)
                record(f"direct limit {parallelism}", measured, cost)

    def rate(case: str) -> float:
        return count / statistics.median(seconds for seconds, _ in results[case]) * 60

    print(
        f"\n{options.tasks} tasks × {options.attempts} attempts = {count} Episodes; median of {options.repeats} run(s)"
    )
    print(
        f"{'case':22} {'episodes/min':>13} {'peak unfinished':>16} {'÷ direct same limit':>20} {'÷ no limit':>11} "
        f"{'CPU/Episode':>12} {'requests/Episode':>17} {'set passes':>11}"
    )
    report: dict[str, Any] = {"tasks": options.tasks, "attempts": options.attempts, "cases": {}}
    for case in results:
        peak = max(peak for _, peak in results[case])
        cpu_ms = statistics.median(cost.cpu_sec for cost in costs[case]) / count * 1000
        requests = statistics.median(cost.requests.total() for cost in costs[case]) / count
        passes = statistics.median(cost.requests["LIST episodes"] for cost in costs[case]) if "set" in case else None
        row = {
            "episodes_per_min": rate(case),
            "peak_unfinished": peak,
            "runs_s": [s for s, _ in results[case]],
            "operator_cpu_ms_per_episode": cpu_ms,
            "operator_requests_per_episode": requests,
            "set_passes": passes,
            "requests_by_kind": [dict(cost.requests) for cost in costs[case]],
        }
        ratios = ["", ""]
        if case.startswith("set p"):
            parallelism = case.removeprefix("set p")
            row["ratio_to_direct_same_limit"] = rate(case) / rate(f"direct limit {parallelism}")
            row["ratio_to_direct_no_limit"] = rate(case) / rate("direct, no limit")
            ratios = [f"{row['ratio_to_direct_same_limit']:.2f}", f"{row['ratio_to_direct_no_limit']:.2f}"]
        report["cases"][case] = row
        shown_passes = "" if passes is None else f"{passes:.0f}"
        print(
            f"{case:22} {row['episodes_per_min']:13.1f} {peak:16d} {ratios[0]:>20} {ratios[1]:>11} "
            f"{cpu_ms:9.0f} ms {requests:17.1f} {shown_passes:>11}"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "episodeset_throughput.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
