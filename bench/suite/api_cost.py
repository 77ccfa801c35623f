"""Group 6, API cost: the requests a 1-step and a 5-step episode send, per turn and per episode.

Real pods, one episode at a time. The operator's own client counts every request it sends
(``episode_operator_api_requests_total``, read from its /metrics before and after each
episode), so its figures are exact whatever else uses the shared API server. The API
server's counters (``apiserver_request_total``) add kopf's requests (its watches, the
finalizer and its annotations) but also every other client's, so they are shown for the
resources an episode touches only, beside the same counters over the baseline — the same
turns done directly (:mod:`.direct`: one pod, one exec per operation, no status, no Event).
The API server's and etcd's CPU time (``/proc`` of the pids hack/cluster records) over each
run is given per 1,000 turns.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

from .cluster import (
    Recorder,
    api_requests,
    connect,
    create_episode,
    daemon_cpu_sec,
    operator_requests,
    request_delta,
)
from .context import Context
from .direct import run_direct
from .stats import ratio, table
from .tasks import DirectTurn, direct_turns, episode_spec, trivial_task

DAEMONS = ("kube-apiserver", "etcd")
EPISODE_RESOURCES = ("pods/exec", "episodes/status", "episodes", "events", "pods", "configmaps")


def cpu_now() -> dict[str, float]:
    return {name: daemon_cpu_sec(name) or 0.0 for name in DAEMONS}


def measured(work: Callable[[], None], operator_metrics: Callable[[], str] | None, api: Any) -> dict[str, Any]:
    """Requests (the operator's own, if given, and every client's) and daemon CPU over ``work``."""
    own_before = operator_requests(operator_metrics()) if operator_metrics is not None else None
    every_before, cpu_before = api_requests(api), cpu_now()
    work()
    cpu_after, every_after = cpu_now(), api_requests(api)
    own = {}
    if operator_metrics is not None and own_before is not None:
        own = request_delta(own_before, operator_requests(operator_metrics()))
    return {
        "own": own,
        "every": {
            key: value
            for key, value in request_delta(every_before, every_after).items()
            if key.split()[1] in EPISODE_RESOURCES
        },
        "cpu_sec": {name: cpu_after[name] - cpu_before[name] for name in DAEMONS},
    }


def run(ctx: Context, *, step_counts: tuple[int, ...] = (1, 5), repeats: int = 3) -> None:
    exec_api = connect(ctx.kubeconfig)
    figures: dict[str, Any] = {}
    with ctx.group("api") as (namespace, operator), Recorder.episodes(ctx.api, namespace) as episodes:

        def through_operator(name: str, spec: dict[str, Any]) -> None:
            create_episode(ctx.api, namespace, name, spec)
            done = episodes.wait(lambda v: v.name == name and v.terminal, 300, f"episode {name}")
            if done.phase != "Succeeded":
                raise RuntimeError(f"{name} ended {done.phase} ({done.failure_kind}); see {operator.log_path}")
            ctx.settle(namespace)  # its pod's deletion is part of its cost

        def directly(name: str, turns: list[DirectTurn]) -> None:
            result = run_direct(exec_api, namespace, name, turns)
            if result.rewards != ["1"] * len(turns):
                raise RuntimeError(f"baseline {name} rewards {result.rewards}")
            ctx.settle(namespace)

        for steps in step_counts:
            files = trivial_task(steps)
            spec, turns = episode_spec(files), direct_turns(files)
            through_operator(f"warmup-{steps}", spec)
            directly(f"warmup-base-{steps}", turns)
            runs: dict[str, list[dict[str, Any]]] = {"operator": [], "baseline": []}
            for repeat in range(repeats):
                name = f"api-{steps}-{repeat}"
                runs["operator"].append(measured(partial(through_operator, name, spec), operator.metrics, ctx.api))
                runs["baseline"].append(measured(partial(directly, f"{name}-base", turns), None, ctx.api))
                own = sum(runs["operator"][-1]["own"].values())
                ctx.say(f"api: {steps}-step repeat {repeat + 1}/{repeats}: {own} requests from the operator's client")
            figures[f"{steps}-step"] = {"steps": steps, **runs}
    report(ctx, figures)


def median_of(runs: list[dict[str, Any]], part: str, key: str) -> float:
    return statistics.median([run[part].get(key, 0) for run in runs])


def report(ctx: Context, figures: dict[str, Any]) -> None:
    for label, task in figures.items():
        steps = task["steps"]
        operator_runs, baseline_runs = task["operator"], task["baseline"]
        keys = sorted(
            {key for run in operator_runs for key in run["own"]}
            | {key for run in operator_runs + baseline_runs for key in run["every"]},
            key=lambda key: (EPISODE_RESOURCES.index(key.split()[1]), key),
        )
        rows = []
        for key in keys:
            own = median_of(operator_runs, "own", key)
            every = median_of(operator_runs, "every", key)
            base = median_of(baseline_runs, "every", key)
            rows.append([key, f"{own:.0f}", f"{own / steps:.1f}", f"{every / steps:.1f}", f"{base / steps:.1f}"])
        own_total = statistics.median([sum(run["own"].values()) for run in operator_runs])
        every_total = statistics.median([sum(run["every"].values()) for run in operator_runs])
        base_total = statistics.median([sum(run["every"].values()) for run in baseline_runs])
        rows.append(
            [
                "all",
                f"{own_total:.0f}",
                f"{own_total / steps:.1f}",
                f"{every_total / steps:.1f} ({ratio(every_total, base_total):.2f}× the baseline)",
                f"{base_total / steps:.1f}",
            ]
        )
        per_1000 = 1000 / steps
        cpu = {
            who: {name: statistics.median([run["cpu_sec"][name] for run in runs]) * per_1000 for name in DAEMONS}
            for who, runs in (("operator", operator_runs), ("baseline", baseline_runs))
        }
        ctx.show(
            table(
                f"6. API requests of a {label} trivial episode (real pods; median of {len(operator_runs)})",
                ["request", "operator's client, per episode", "per turn", "all clients, per turn", "baseline"],
                rows,
                note=(
                    "All clients: apiserver_request_total over the run (kopf's watches, finalizer and annotations, "
                    "kubelet's pod status writes and Events, and any other session's requests to these resources). "
                    "Per 1,000 turns: API server CPU "
                    f"{cpu['operator']['kube-apiserver']:.0f} s through the operator vs "
                    f"{cpu['baseline']['kube-apiserver']:.0f} s directly "
                    f"({ratio(cpu['operator']['kube-apiserver'], cpu['baseline']['kube-apiserver']):.2f}×); "
                    f"etcd {cpu['operator']['etcd']:.0f} s vs {cpu['baseline']['etcd']:.0f} s."
                ),
            )
        )
        task["cpu_per_1000_turns_sec"] = cpu
    ctx.results["api_cost"] = figures
