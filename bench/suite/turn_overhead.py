"""Group 1, turn overhead: a trivial episode (5 steps by default) through the operator vs. the same work done directly.

Operator wall: the Episode's create request → the first watch event that shows it
``Succeeded``. Baseline wall: the pod's create request → its delete request returned
(:mod:`.direct`): the baseline issue 14 names, an exec per job, and the same jobs over one
exec held open (what the operator's sessions do). Runs rotate (each goes first in turn) so
drift on a shared machine hits all alike; one warm-up of each is discarded. The operator's time is split by
the status writes its watch shows: the stages it publishes (for a shared verifier, a turn's
start and its agent stage), so the time from one state to the next is the work between two
writes plus one write.
"""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any

from . import primitives
from .cluster import EpisodeView, Recorder, api_requests, connect, create_episode, phase_means, request_delta
from .context import Context
from .direct import DirectRun, run_direct, run_direct_shell
from .profiling import Profiler
from .stats import Summary, millis, ratio, table
from .tasks import direct_turns, episode_spec, trivial_task

TARGET_RATIO = 1.25
STARTUP_STATES = ("react", "pod", "seed")
STARTUP_OPERATIONS = ("pod-create", "pod-running")
COUNTED_REQUESTS = [
    "GET pods/exec",
    "POST pods/exec",
    "PATCH episodes/status",
    "PATCH episodes",
    "GET episodes",
    "POST events",
    "PATCH events",
    "POST pods",
    "GET pods",
    "LIST pods",
    "WATCH pods",
    "DELETE pods",
]
TARGET_TURN_OVERHEAD_SEC = 0.300

# How the operator's states and the baseline's operations line up, row by row.
ROWS: list[tuple[str, tuple[str, ...], tuple[str, ...], bool]] = [
    # (work, operator states, baseline operations, per episode rather than per turn)
    ("create → first status write", ("react",), (), True),
    ("pod create → running → supervisor placed", ("pod",), ("pod-create", "pod-running"), True),
    ("seed (status: ready)", ("seed",), (), True),
    # The operator publishes a shared turn's start and its agent stage only (a restart redoes
    # or re-attaches to the rest), so its per-turn work reads in two spans.
    (
        "turn start → agent: event, workdir/ + setup.sh (one exec), healthcheck (none)",
        ("cleanup", "workdir", "setup", "healthcheck"),
        ("workdir + setup.sh", "workdir"),
        False,
    ),
    (
        "agent → reward: solution + solve.sh, /logs/artifacts, tests + test.sh + reward",
        ("agent", "collect", "verify-prepare", "verify"),
        ("solution + solve.sh", "tests + test.sh + reward"),
        False,
    ),
    ("turn end (event)", ("turn-gap",), (), False),
    ("finish: release pod, final status", ("finish",), ("pod-delete",), True),
]


def state_of(view: EpisodeView) -> str:
    """What the operator is doing while the Episode looks like ``view``."""
    if view.terminal:
        return "terminal"
    if not view.has_status:
        return "react"
    if not view.pod_name:
        return "pod"
    if not view.ready:
        return "seed"
    for stage in view.stages:
        if stage != "done":
            return stage or "turn-gap"
    return "finish"


def segments(views: Sequence[EpisodeView], sent: float) -> list[tuple[str, float]]:
    """``(state, seconds)`` for each state the watch showed, in order, from the create request."""
    marks: list[tuple[str, float]] = [("react", sent)]
    for view in views:
        state = state_of(view)
        if state != marks[-1][0]:
            marks.append((state, view.seen))
    return [(state, end - start) for (state, start), (_, end) in itertools.pairwise(marks)]


def thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def run(ctx: Context, *, steps: int = 5, repeats: int = 5) -> None:
    files = trivial_task(steps)
    spec = episode_spec(files)
    turns = direct_turns(files)
    exec_api = connect(ctx.kubeconfig)
    operator_runs: list[dict[str, Any]] = []
    baseline_runs: list[dict[str, Any]] = []
    shell_runs: list[dict[str, Any]] = []
    with ctx.group("turns") as (namespace, operator), Recorder.episodes(ctx.api, namespace) as episodes:

        def through_operator(name: str) -> dict[str, Any]:
            requests = api_requests(ctx.api)
            before = operator.sample()
            sent = create_episode(ctx.api, namespace, name, spec)
            done = episodes.wait(lambda v: v.name == name and v.terminal, 300, f"episode {name}")
            after = operator.sample()
            views = episodes.of(name)
            if done.phase != "Succeeded":
                raise RuntimeError(f"{name} ended {done.phase} ({done.failure_kind}); see {operator.log_path}")
            ctx.settle(namespace)
            return {
                "name": name,
                "requests": request_delta(requests, api_requests(ctx.api)),
                "wall": done.seen - sent,
                "cpu_sec": after.cpu_sec - before.cpu_sec,
                "segments": segments(views, sent),
                "watch_events": len(views),
            }

        def directly(name: str, way: Any = run_direct) -> dict[str, Any]:
            requests = api_requests(ctx.api)
            cpu = thread_cpu()
            result: DirectRun = way(exec_api, namespace, name, turns)
            cpu = thread_cpu() - cpu
            if result.rewards != ["1"] * steps:
                raise RuntimeError(f"baseline {name} rewards {result.rewards}")
            ctx.settle(namespace)
            return {
                "name": name,
                "requests": request_delta(requests, api_requests(ctx.api)),
                "wall": result.wall,
                "cpu_sec": cpu,
                "timings": result.timings,
            }

        ctx.say("turns: warm-up")
        through_operator("warmup")
        directly("warmup-base")
        directly("warmup-shell", run_direct_shell)
        ways = ["operator", "baseline", "one exec"]
        for repeat in range(repeats):
            for way in ways[repeat % 3 :] + ways[: repeat % 3]:
                if way == "operator":
                    operator_runs.append(through_operator(f"turns-{repeat}"))
                elif way == "baseline":
                    baseline_runs.append(directly(f"base-{repeat}"))
                else:
                    shell_runs.append(directly(f"shell-{repeat}", run_direct_shell))
            ctx.say(
                f"turns: repeat {repeat + 1}/{repeats}: operator {operator_runs[-1]['wall']:.2f} s, "
                f"baseline {baseline_runs[-1]['wall']:.2f} s, over one exec {shell_runs[-1]['wall']:.2f} s"
            )
        phases = phase_means(operator.metrics())
        ctx.say("turns: timing single operations")
        operations, operations_text = primitives.run(exec_api, namespace, ctx.kubeconfig)
        profile: dict[str, Any] | None = None
        if ctx.profile:
            ctx.say("turns: profiling the operator over 3 more episodes (not counted)")
            with Profiler(operator.pid, ctx.out / "profile-turns") as profiler:
                for index in range(3):
                    through_operator(f"profiled-{index}")
            profile = profiler.summary()
    report(ctx, steps, operator_runs, baseline_runs, shell_runs, phases, profile)
    ctx.show(operations_text)
    ctx.results["turn_overhead"]["operations"] = operations


def report(
    ctx: Context,
    steps: int,
    operator_runs: list[dict[str, Any]],
    baseline_runs: list[dict[str, Any]],
    shell_runs: list[dict[str, Any]],
    phases: dict[str, dict[str, float]],
    profile: dict[str, Any] | None,
) -> None:
    operator_wall = Summary.of([run["wall"] for run in operator_runs])
    baseline_wall = Summary.of([run["wall"] for run in baseline_runs])
    pairs = list(zip(operator_runs, baseline_runs, strict=True))
    per_turn = Summary.of([(op["wall"] - base["wall"]) / steps for op, base in pairs])
    ratios = Summary.of([ratio(op["wall"], base["wall"]) for op, base in pairs])
    # The same without the pod's start, whose spread (kubelet, containerd) hides the turns' cost.
    op_turns = [op["wall"] - sum(s for state, s in op["segments"] if state in STARTUP_STATES) for op in operator_runs]
    base_turns = [
        base["wall"] - sum(s for label, s in base["timings"] if label in STARTUP_OPERATIONS) for base in baseline_runs
    ]
    turns_wall = Summary.of(op_turns), Summary.of(base_turns)
    turns_ratio = Summary.of([ratio(a, b) for a, b in zip(op_turns, base_turns, strict=True)])
    turns_overhead = Summary.of([(a - b) / steps for a, b in zip(op_turns, base_turns, strict=True)])
    operator_cpu = Summary.of([run["cpu_sec"] / steps for run in operator_runs])
    baseline_cpu = Summary.of([run["cpu_sec"] / steps for run in baseline_runs])
    # The same against the jobs over one open exec.
    shell_wall = Summary.of([run["wall"] for run in shell_runs])
    shell_ratios = Summary.of([ratio(op["wall"], sh["wall"]) for op, sh in zip(operator_runs, shell_runs, strict=True)])
    shell_turns = [
        sh["wall"] - sum(s for label, s in sh["timings"] if label in (*STARTUP_OPERATIONS, "shell-open"))
        for sh in shell_runs
    ]
    shell_turns_ratio = Summary.of([ratio(a, b) for a, b in zip(op_turns, shell_turns, strict=True)])
    shell_cpu = Summary.of([run["cpu_sec"] / steps for run in shell_runs])
    ratio_met = ratios.median <= TARGET_RATIO
    overhead_met = per_turn.median < TARGET_TURN_OVERHEAD_SEC
    ctx.show(
        table(
            f"1. Turn overhead — {steps}-step trivial task, {len(pairs)} repeats (median [min–max])",
            [
                "measure",
                "operator",
                "baseline: an exec per job",
                "operator/baseline",
                "direct over one open exec",
                "operator/that",
            ],
            [
                [
                    "episode wall (create → Succeeded)",
                    operator_wall.render(unit=" s"),
                    baseline_wall.render(unit=" s"),
                    ratios.render(digits=2),
                    shell_wall.render(unit=" s"),
                    shell_ratios.render(digits=2),
                ],
                ["per-turn overhead (op − base)/turns", per_turn.render(1000, 0, " ms"), "", "", "", ""],
                [
                    "turns only (pod ready → Succeeded)",
                    turns_wall[0].render(unit=" s"),
                    turns_wall[1].render(unit=" s"),
                    turns_ratio.render(digits=2),
                    Summary.of(shell_turns).render(unit=" s"),
                    shell_turns_ratio.render(digits=2),
                ],
                ["per-turn overhead, turns only", turns_overhead.render(1000, 0, " ms"), "", "", "", ""],
                [
                    "client CPU per turn",
                    operator_cpu.render(1000, 0, " ms"),
                    baseline_cpu.render(1000, 0, " ms"),
                    f"{ratio(operator_cpu.median, baseline_cpu.median):.2f}",
                    shell_cpu.render(1000, 0, " ms"),
                    f"{ratio(operator_cpu.median, shell_cpu.median):.2f}",
                ],
                [
                    "watch events per episode",
                    Summary.of([r["watch_events"] for r in operator_runs]).render(digits=0),
                    "",
                    "",
                    "",
                    "",
                ],
            ],
            note=(
                f"Targets: ratio ≤ {TARGET_RATIO} — {'MET' if ratio_met else 'MISSED'} "
                f"(median {ratios.median:.2f}); per-turn overhead < {TARGET_TURN_OVERHEAD_SEC * 1000:.0f} ms — "
                f"{'MET' if overhead_met else 'MISSED'} (median {per_turn.median * 1000:.0f} ms). Against the "
                f"jobs over one open exec: {shell_ratios.median:.2f}.\n"
                "Client CPU: the operator process (utime+stime from /proc) vs. the baseline's own thread "
                "(getrusage RUSAGE_THREAD)."
            ),
        )
    )
    rows = []
    breakdown = []
    for work, states, operations, per_episode in ROWS:
        divisor = 1 if per_episode else steps
        op_values = [sum(s for state, s in run["segments"] if state in states) / divisor for run in operator_runs]
        base_values = [sum(s for label, s in run["timings"] if label in operations) / divisor for run in baseline_runs]
        op_median = statistics.median(op_values)
        base_median = statistics.median(base_values) if operations else 0.0
        breakdown.append(
            {
                "work": work,
                "per": "episode" if per_episode else "turn",
                "operator_sec": op_median,
                "baseline_sec": base_median,
            }
        )
        rows.append(
            [
                work,
                "episode" if per_episode else "turn",
                millis(op_median),
                millis(base_median) if operations else "—",
                millis(op_median - base_median),
            ]
        )
    ctx.show(
        table(
            "1b. Where the time goes (median; states from the Episode's watch, baseline per operation)",
            ["work", "per", "operator", "baseline", "difference"],
            rows,
            note="Each operator state lasts from the status write that announces it to the next one, so it "
            "includes that write; a stage the operator does not publish is counted in the one before it. "
            "Operator phase means from its own /metrics: "
            + ", ".join(f"{phase} {values['mean_ms']:.0f} ms" for phase, values in sorted(phases.items())),
        )
    )
    # The API server's counters are server-wide; the baseline's own exec count is known exactly, so it
    # tells whether another client was busy at the same time.
    known_execs = statistics.median(
        [sum(1 for label, _ in run["timings"] if not label.startswith("pod-")) for run in baseline_runs]
    )
    counted_execs = statistics.median([run["requests"].get("GET pods/exec", 0) for run in baseline_runs])
    clean = abs(counted_execs - known_execs) <= 0.05 * known_execs
    keys = sorted(
        {key for run in operator_runs + baseline_runs for key in run["requests"] if key in COUNTED_REQUESTS},
        key=COUNTED_REQUESTS.index,
    )
    request_rows = []
    for key in keys:
        op_count = statistics.median([run["requests"].get(key, 0) for run in operator_runs]) / steps
        base_count = statistics.median([run["requests"].get(key, 0) for run in baseline_runs]) / steps
        request_rows.append([key, f"{op_count:.1f}", f"{base_count:.1f}"])
    title = "1d. API requests per turn (median; the API server's apiserver_request_total, before → after a run)"
    if clean:
        ctx.show(table(title, ["request", "operator", "baseline"], request_rows))
    else:
        ctx.show(
            f"### {title}\n\nNot shown: other clients used the API server during the runs (the baseline's "
            f"{known_execs:.0f} execs per episode were counted as {counted_execs:.0f}); the counts are in the JSON.\n"
        )
    ctx.results["turn_overhead"] = {
        "steps": steps,
        "operator_wall_sec": operator_wall.as_dict(),
        "baseline_wall_sec": baseline_wall.as_dict(),
        "per_turn_overhead_sec": per_turn.as_dict(),
        "ratio": ratios.as_dict(),
        "turns_only_operator_sec": turns_wall[0].as_dict(),
        "turns_only_baseline_sec": turns_wall[1].as_dict(),
        "turns_only_ratio": turns_ratio.as_dict(),
        "turns_only_per_turn_overhead_sec": turns_overhead.as_dict(),
        "operator_cpu_per_turn_sec": operator_cpu.as_dict(),
        "baseline_cpu_per_turn_sec": baseline_cpu.as_dict(),
        "one_exec_wall_sec": shell_wall.as_dict(),
        "one_exec_ratio": shell_ratios.as_dict(),
        "one_exec_turns_only_ratio": shell_turns_ratio.as_dict(),
        "one_exec_cpu_per_turn_sec": shell_cpu.as_dict(),
        "one_exec_runs": shell_runs,
        "targets": {
            "ratio_max": TARGET_RATIO,
            "ratio_met": ratio_met,
            "per_turn_overhead_max_sec": TARGET_TURN_OVERHEAD_SEC,
            "per_turn_overhead_met": overhead_met,
        },
        "breakdown": breakdown,
        "operator_phase_means": phases,
        "api_requests_clean": clean,
        "operator_runs": operator_runs,
        "baseline_runs": baseline_runs,
        "profile": profile,
        "measured_at": time.time(),
    }
    if profile:
        ctx.show(profile["text"])
