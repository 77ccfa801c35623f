"""Run the groups, print their tables, write the JSON; always remove this run's namespaces."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster.harness import install_crd

from . import api_cost, footprint, memory, startup, throughput, turn_overhead
from .cluster import DEFAULT_KUBECONFIG, Namespaces, connect, machine, other_operators
from .context import Context
from .stats import table

OUT = Path(__file__).resolve().parents[1] / "out"
GROUPS = ("turns", "startup", "throughput", "footprint", "memory", "api")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.py",
        description="Issue 7: what the operator costs per turn, per episode and at scale, each against a "
        "baseline measured in the same run. Needs the cluster (hack/cluster up).",
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats; throughput up to N=10; 300 Episodes")
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)}")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of groups 1 and 2 (default 5, quick 3)")
    parser.add_argument("--steps", type=int, default=5, help="steps of group 1's task (issue 7: 5)")
    parser.add_argument("--sizes", default=None, help="throughput batch sizes (default 1,10,50; quick 1,10)")
    parser.add_argument("--episodes", type=int, default=None, help="finished Episodes for group 4 (1000; quick 300)")
    parser.add_argument("--active", type=int, default=10, help="active Episodes for group 4")
    parser.add_argument(
        "--processed",
        default=None,
        help="group 5's checkpoints: Episodes processed (default 100,1000,5000; quick 100,500)",
    )
    parser.add_argument("--window", type=int, default=50, help="group 5: Episodes in flight at a time")
    parser.add_argument("--present", type=int, default=None, help="group 5: Episodes left present (1000; quick 300)")
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="group 5: environment of its operator process (repeatable), e.g. MALLOC_ARENA_MAX=2",
    )
    parser.add_argument("--profile", action="store_true", help="also sample the operator with py-spy (groups 1, 3)")
    parser.add_argument(
        "--quiet-load",
        type=float,
        default=0.0,
        help="before each group wait until the 1-minute load average is below this (0: do not wait)",
    )
    parser.add_argument("--quiet-wait", type=float, default=600, help="wait at most this many seconds for quiet")
    parser.add_argument("--kubeconfig", type=Path, default=Path(os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG))
    options = parser.parse_args(argv)
    unknown = set(options.groups.split(",")) - set(GROUPS)
    if unknown:
        parser.error(f"unknown group(s): {', '.join(sorted(unknown))}")
    return options


def watches(operator: str, namespace: str) -> bool:
    """Whether an operator described by :func:`other_operators` watches ``namespace``."""
    globs = operator.split("(", 1)[1].rstrip(")")
    return globs == "all namespaces" or any(fnmatch.fnmatchcase(namespace, glob) for glob in globs.split(","))


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = OUT / f"issue7-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    api = connect(options.kubeconfig)
    install_crd(api)
    run_id = f"{int(started) % 100000:05d}"
    context = Context(
        api=api,
        kubeconfig=options.kubeconfig,
        namespaces=Namespaces(api, f"bench-{run_id}-"),
        out=out,
        quick=options.quick,
        profile=options.profile,
        quiet_load=options.quiet_load,
        quiet_wait_sec=options.quiet_wait,
    )
    facts = machine(api)
    others = other_operators()
    facts["other_operators"] = others
    context.say(f"machine: {facts}")
    rivals = [other for other in others if watches(other, f"{context.namespaces.prefix}x")]
    if rivals:
        context.say(f"another operator would drive this run's Episodes too: {rivals}; stop it or run later")
        return 2
    if others:
        context.say(f"WARNING: {len(others)} other operator process(es) share this machine's CPUs: {others}")
    repeats = options.repeats or (3 if options.quick else 5)
    sizes = [int(n) for n in (options.sizes or ("1,10" if options.quick else "1,10,50")).split(",")]
    finished = options.episodes or (300 if options.quick else 1000)
    plan: dict[str, Callable[[], None]] = {
        "turns": lambda: turn_overhead.run(context, steps=options.steps, repeats=repeats),
        "startup": lambda: startup.run(context, repeats=repeats),
        "throughput": lambda: throughput.run(context, sizes=sizes),
        "footprint": lambda: footprint.run(context, finished=finished, active=options.active),
        "memory": lambda: memory.run(
            context,
            checkpoints=tuple(
                int(n) for n in (options.processed or ("100,500" if options.quick else "100,1000,5000")).split(",")
            ),
            window=options.window,
            present=options.present or (300 if options.quick else 1000),
            env=dict(item.split("=", 1) for item in options.operator_env),
        ),
        "api": lambda: api_cost.run(context, repeats=repeats),
    }
    failures: dict[str, str] = {}
    try:
        for group in options.groups.split(","):
            group_started = time.time()
            context.say(f"group {group}: start")
            try:
                plan[group]()
            except Exception as error:  # one failing group must not lose the others' figures
                failures[group] = f"{type(error).__name__}: {error}"
                context.say(f"group {group} FAILED: {failures[group]}")
            context.results.setdefault("durations_sec", {})[group] = time.time() - group_started
    finally:
        for namespace in list(context.namespaces.created):
            try:
                context.namespaces.delete(namespace, timeout=60)
            except Exception as error:  # the API may be down: say what is left behind
                context.say(f"could not delete namespace {namespace}: {type(error).__name__}: {error}")
    duration = time.time() - started
    facts["loadavg_at_end"] = os.getloadavg()
    document: dict[str, Any] = {
        "machine": facts,
        "options": {key: str(value) for key, value in vars(options).items()},
        "duration_sec": duration,
        "failures": failures,
        "disturbances": context.disturbances,
        "load_average_per_group": context.loads,
        **context.results,
    }
    summary = table(
        "Run",
        ["", ""],
        [
            ["date", facts["date"]],
            ["machine", f"{facts['cpus']} CPUs ({facts['cpu_model']}), {facts['memory_gib']} GiB, {facts['kernel']}"],
            ["cluster", f"Kubernetes {facts['kubernetes']}, {facts['container_runtime']}"],
            ["commit", f"{facts['commit']} (operator sources sha256 {facts['operator_sources_sha256']})"],
            [
                "load average (1 min) per group",
                ", ".join(f"{group} {start:.1f}→{end:.1f}" for group, (start, end) in context.loads.items()),
            ],
            ["duration", f"{duration:.0f} s"],
            ["disturbances", "; ".join(context.disturbances) or "none seen"],
            ["output", str(out)],
        ],
    )
    print(summary)
    path = OUT / f"issue7-{stamp}.json"
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    (OUT / "issue7-latest.json").write_text(path.read_text())
    (out / "tables.md").write_text("\n".join([summary, *context.tables]))
    print(f"JSON: {path}")
    if failures:
        print(f"FAILED groups: {failures}")
    return 1 if failures else 0
