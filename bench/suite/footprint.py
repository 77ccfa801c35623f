"""Group 4, operator footprint: memory, CPU and reaction time with 1,000 Episodes present.

A fresh operator process first runs with its namespace empty (the baseline: idle RSS and
CPU, and its reaction to a new Episode). Then ``finished`` Episodes are created that end at
once without a pod: their task folder is invalid (``task.toml`` has a number for
``docker_image``), so the operator reads, refuses and marks each ``Failed``
(``harbor:invalid_task``) — a finished Episode as any other, through the same status write.
Then ``active`` Episodes whose command agent sleeps keep a pod and a driver each. In that
state the same figures are taken again. Reaction: create → the first watch event carrying a
status (the operator's first status write). Memory: ``VmRSS`` and the peak ``VmHWM`` from
``/proc/<pid>/status``; CPU: utime+stime from ``/proc/<pid>/stat`` over a quiet window. Last,
the operator is restarted in that state: how long until it is healthy and reacts again.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .cluster import EpisodeView, Operator, ProcSample, Recorder, create_episode, delete_episode, wait_pods_gone
from .context import Context
from .stats import Summary, millis, ratio, table
from .tasks import episode_spec, invalid_task, trivial_task

CREATORS = 10


def cpu_share(operator: Operator, window: float) -> float:
    """The operator's CPU use over ``window`` seconds as a fraction of one core."""
    before = operator.sample()
    time.sleep(window)
    after = operator.sample()
    return (after.cpu_sec - before.cpu_sec) / (after.at - before.at)


def run(ctx: Context, *, finished: int = 1000, active: int = 10, probes: int = 5) -> None:
    window = 10.0 if ctx.quick else 30.0
    probe_spec = episode_spec(trivial_task(1))
    refused_spec = episode_spec(invalid_task())
    sleeper_spec = episode_spec(trivial_task(1, setup=False), {"kind": "command", "command": "sleep 3600"})
    figures: dict[str, Any] = {"finished": finished, "active": active, "window_sec": window}
    with ctx.group("footprint") as (namespace, operator), Recorder.episodes(ctx.api, namespace) as episodes:

        def probe(name: str) -> dict[str, float]:
            sent = create_episode(ctx.api, namespace, name, probe_spec)
            first = episodes.wait(lambda v: v.name == name and v.has_status, 120, f"first status of {name}")
            done = episodes.wait(lambda v: v.name == name and v.terminal, 300, f"end of {name}")
            wait_pods_gone(ctx.api, namespace, name)
            return {"reaction_sec": first.seen - sent, "episode_sec": done.seen - sent}

        def probes_of(label: str) -> list[dict[str, float]]:
            return [probe(f"probe-{label}-{index}") for index in range(probes)]

        def memory(sample: ProcSample) -> dict[str, float]:
            return {"rss_mib": sample.rss_kib / 1024, "hwm_mib": sample.hwm_kib / 1024}

        time.sleep(3)
        ctx.say(f"footprint: idle baseline ({window:.0f} s)")
        figures["idle_memory"] = memory(operator.sample())
        figures["idle_cpu_share"] = cpu_share(operator, window)
        figures["probes_empty"] = probes_of("empty")
        figures["after_probes_memory"] = memory(operator.sample())

        ctx.say(f"footprint: creating {finished} Episodes the operator refuses at once")
        names = [f"done-{index:05d}" for index in range(finished)]
        before = operator.sample()
        started = time.time()
        with ThreadPoolExecutor(CREATORS) as pool:
            list(pool.map(lambda name: create_episode(ctx.api, namespace, name, refused_spec), names))
        created = time.time()
        ended = episodes.wait_all(names, lambda v: v.terminal, timeout=600 + finished)
        after = operator.sample()
        kinds = {view.failure_kind for view in ended.values()}
        figures["bulk"] = {
            "create_sec": created - started,
            "all_finished_sec": max(view.seen for view in ended.values()) - started,
            "operator_cpu_sec": after.cpu_sec - before.cpu_sec,
            "failure_kinds": sorted(str(kind) for kind in kinds),
        }

        ctx.say(f"footprint: starting {active} active Episodes")
        actives = [f"active-{index:02d}" for index in range(active)]
        for name in actives:
            create_episode(ctx.api, namespace, name, sleeper_spec)
        episodes.wait_all(actives, _agent_running, timeout=300 + 10 * active)
        time.sleep(3)
        ctx.say(f"footprint: loaded ({window:.0f} s)")
        figures["loaded_memory"] = memory(operator.sample())
        figures["loaded_cpu_share"] = cpu_share(operator, window)
        figures["probes_loaded"] = probes_of("loaded")
        figures["final_memory"] = memory(operator.sample())

        ctx.say("footprint: restarting the operator with every Episode present")
        operator.process.stop()
        restart_started = time.time()
        operator.process.start()
        healthy = time.time() - restart_started
        first_sample = operator.sample()
        restart_probe = probe("probe-restarted")
        time.sleep(max(0.0, 20 - (time.time() - restart_started)))
        settled = operator.sample()
        figures["restart"] = {
            "healthy_sec": healthy,
            "probe": restart_probe,
            "cpu_first_20s_sec": settled.cpu_sec - first_sample.cpu_sec,
            "memory_after_20s": memory(settled),
        }
        for name in actives:
            delete_episode(ctx.api, namespace, name)
        episodes.wait_all(actives, lambda v: v.event == "DELETED", timeout=120)
    report(ctx, figures)


def _agent_running(view: EpisodeView) -> bool:
    return bool(view.stages) and view.stages[0] == "agent"


def report(ctx: Context, figures: dict[str, Any]) -> None:
    empty = Summary.of([probe["reaction_sec"] for probe in figures["probes_empty"]])
    loaded = Summary.of([probe["reaction_sec"] for probe in figures["probes_loaded"]])
    empty_episode = Summary.of([probe["episode_sec"] for probe in figures["probes_empty"]])
    loaded_episode = Summary.of([probe["episode_sec"] for probe in figures["probes_loaded"]])
    idle, full = figures["idle_memory"], figures["final_memory"]
    count = figures["finished"] + figures["active"]
    bulk = figures["bulk"]
    restart = figures["restart"]
    rows = [
        [
            "RSS (VmRSS)",
            f"{idle['rss_mib']:.1f} MiB",
            f"{full['rss_mib']:.1f} MiB",
            f"{ratio(full['rss_mib'], idle['rss_mib']):.2f}",
        ],
        [
            "peak RSS (VmHWM)",
            f"{idle['hwm_mib']:.1f} MiB",
            f"{full['hwm_mib']:.1f} MiB",
            f"{ratio(full['hwm_mib'], idle['hwm_mib']):.2f}",
        ],
        ["RSS per Episode present", "", f"{(full['rss_mib'] - idle['rss_mib']) * 1024 / count:.1f} KiB", ""],
        [
            "CPU while quiet (share of one core)",
            f"{figures['idle_cpu_share'] * 100:.2f} %",
            f"{figures['loaded_cpu_share'] * 100:.2f} %",
            "",
        ],
        [
            "reaction: create → first status write",
            empty.render(1000, 0, " ms"),
            loaded.render(1000, 0, " ms"),
            f"{ratio(loaded.median, empty.median):.2f}",
        ],
        [
            "probe episode (1 step) create → Succeeded",
            empty_episode.render(unit=" s"),
            loaded_episode.render(unit=" s"),
            f"{ratio(loaded_episode.median, empty_episode.median):.2f}",
        ],
    ]
    ctx.show(
        table(
            f"4. Operator footprint — empty namespace (baseline) vs. {figures['finished']} finished + "
            f"{figures['active']} active Episodes",
            ["measure", "empty", "loaded", "loaded/empty"],
            rows,
            note=(
                f"Finished Episodes: invalid task folders the operator refused ({', '.join(bulk['failure_kinds'])}); "
                f"{figures['finished']} created in {bulk['create_sec']:.1f} s, all Failed after "
                f"{bulk['all_finished_sec']:.1f} s, operator CPU {bulk['operator_cpu_sec']:.1f} s "
                f"({1000 * bulk['operator_cpu_sec'] / figures['finished']:.1f} ms per refused Episode). "
                f"Active: command agents sleeping in their pods. CPU window {figures['window_sec']:.0f} s.\n"
                f"Restart in the loaded state: healthy after {restart['healthy_sec']:.1f} s; a new Episode's "
                f"first status write {millis(restart['probe']['reaction_sec'])} after its create; operator CPU in "
                f"its first 20 s {restart['cpu_first_20s_sec']:.1f} s; RSS then "
                f"{restart['memory_after_20s']['rss_mib']:.1f} MiB."
            ),
        )
    )
    figures["reaction_empty_sec"] = empty.as_dict()
    figures["reaction_loaded_sec"] = loaded.as_dict()
    figures["reaction_ratio"] = ratio(loaded.median, empty.median)
    figures["rss_ratio"] = ratio(full["rss_mib"], idle["rss_mib"])
    figures["median_probe_episode_sec"] = {
        "empty": statistics.median(p["episode_sec"] for p in figures["probes_empty"]),
        "loaded": statistics.median(p["episode_sec"] for p in figures["probes_loaded"]),
    }
    ctx.results["footprint"] = figures
