"""Group 2, episode startup: create → the first agent command, split; vs. a bare pod in the same run.

The Episode is a one-step task without ``setup.sh`` and a command agent whose first act is
``date +%s.%N``, so the first job in the pod *is* the agent command and it prints when it
started (the node's clock is this machine's, nanosecond resolution; read back from the log
the operator keeps). Every other instant is the arrival time of a watch event: the
Episode's first status write, its ``podName`` (written after the supervisor is placed), its
turn's ``agent`` stage, and the pod's ADDED and all-containers-running events. The bare pod
has the same image and shape; its first command is a ``date +%s.%N`` exec sent as soon as
its watch shows it running.
"""

from __future__ import annotations

from typing import Any

from .cluster import Recorder, connect, create_episode
from .context import Context
from .direct import bare_start
from .stats import Summary, ratio, table
from .tasks import episode_spec, trivial_task

AGENT = {"kind": "command", "command": "date +%s.%N; echo 1 > /app/answer"}


def run(ctx: Context, *, repeats: int = 5) -> None:
    spec = episode_spec(trivial_task(1, setup=False), AGENT)
    exec_api = connect(ctx.kubeconfig)
    operator_runs: list[dict[str, float]] = []
    bare_runs: list[dict[str, float]] = []
    with (
        ctx.group("startup") as (namespace, operator),
        Recorder.episodes(ctx.api, namespace) as episodes,
        Recorder.pods(ctx.api, namespace) as pods,
    ):

        def through_operator(name: str) -> dict[str, float]:
            sent = create_episode(ctx.api, namespace, name, spec)
            done = episodes.wait(lambda v: v.name == name and v.terminal, 300, f"episode {name}")
            if done.phase != "Succeeded":
                raise RuntimeError(f"{name} ended {done.phase} ({done.failure_kind}); see {operator.log_path}")
            views = episodes.of(name)
            first_status = next(v for v in views if v.has_status)
            placed = next(v for v in views if v.pod_name)
            agent = next(v for v in views if v.stages and v.stages[0] in ("agent", "collect", "verify-prepare"))
            pod = placed.pod_name
            added = pods.wait(lambda v: v.name == pod, 30, f"pod {pod}")
            running = pods.wait(lambda v: v.name == pod and v.running, 30, f"pod {pod} running")
            log = operator.agent_log(namespace, name, "s1")
            if not log:
                raise RuntimeError(f"no agent log of {name} in {operator.data_dir}")
            ctx.settle(namespace)
            return {
                "created": sent,
                "first_status": first_status.seen,
                "pod_added": added.seen,
                "pod_running": running.seen,
                "placed": placed.seen,
                "agent_stage": agent.seen,
                "first_command": float(log.split()[0]),
            }

        def bare(name: str) -> dict[str, float]:
            times = bare_start(exec_api, namespace, name)
            times["pod_added"] = pods.wait(lambda v: v.name == name, 30, f"pod {name}").seen
            ctx.settle(namespace)
            return times

        ctx.say("startup: warm-up")
        through_operator("warmup")
        bare("warmup-bare")
        for repeat in range(repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for use_operator in order:
                if use_operator:
                    operator_runs.append(through_operator(f"start-{repeat}"))
                else:
                    bare_runs.append(bare(f"bare-{repeat}"))
            ctx.say(
                f"startup: repeat {repeat + 1}/{repeats}: operator "
                f"{operator_runs[-1]['first_command'] - operator_runs[-1]['created']:.2f} s, bare pod "
                f"{bare_runs[-1]['first_command'] - bare_runs[-1]['created']:.2f} s"
            )
    report(ctx, operator_runs, bare_runs)


def _span(runs: list[dict[str, float]], start: str, end: str) -> Summary:
    return Summary.of([run[end] - run[start] for run in runs])


def report(ctx: Context, operator_runs: list[dict[str, float]], bare_runs: list[dict[str, float]]) -> None:
    splits: list[tuple[str, str, str, bool]] = [
        ("create → first status write (API + operator reaction)", "created", "first_status", False),
        ("create → pod created (ADDED seen)", "created", "pod_added", True),
        ("pod created → containers running (scheduling + start)", "pod_added", "pod_running", True),
        ("running → supervisor placed (status podName seen)", "pod_running", "placed", False),
        ("placed → turn's agent stage seen (seed + stage writes)", "placed", "agent_stage", False),
        ("agent stage → command started (instruction + job start)", "agent_stage", "first_command", False),
        ("running → first command started", "pod_running", "first_command", True),
        ("create → first command started (total)", "created", "first_command", True),
    ]
    rows = []
    figures: dict[str, Any] = {}
    for label, start, end, compared in splits:
        mine = _span(operator_runs, start, end)
        theirs = _span(bare_runs, start, end) if compared else None
        rows.append(
            [
                label,
                mine.render(1000, 0, " ms"),
                theirs.render(1000, 0, " ms") if theirs else "—",
                f"{ratio(mine.median, theirs.median):.2f}" if theirs else "",
            ]
        )
        figures[label] = {"operator_sec": mine.as_dict(), "bare_sec": theirs.as_dict() if theirs else None}
    ctx.show(
        table(
            f"2. Episode startup — create → first agent command, {len(operator_runs)} repeats (median [min–max])",
            ["interval", "operator", "bare pod", "ratio"],
            rows,
            note="Instants: arrival times of watch events (ms resolution, a few ms of delivery latency) and the "
            "first command's own `date +%s.%N` in the pod (same clock). The API's timestamps (creationTimestamp, "
            "conditions, status.turns[].startedAt) have 1 s resolution and are not used.",
        )
    )
    ctx.results["startup"] = {"splits": figures, "operator_runs": operator_runs, "bare_runs": bare_runs}
