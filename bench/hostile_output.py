#!/usr/bin/env python3
"""Issue 23: the operator's memory while agents flood it, against quiet agents, in one run.

    .venv/bin/python bench/hostile_output.py [--gib 2]

Two phases, each with a fresh operator process (the real ``episode-operator run`` through
``tests/cluster/harness.py``, its pid recorded, stopped by pid) watching only that phase's namespace,
three single-turn ``command`` Episodes at once on the cluster (``hack/cluster``):

- **quiet**: three agents that write one small answer;
- **loud**: an agent writing ``--gib`` GiB to its stdout with a ``--gib`` GiB sparse file in
  ``/logs/artifacts``; an agent that replaces its pod's supervisor with one answering every call
  with ``--gib`` GiB (and ends the sessions of the placed one); an agent whose replaced supervisor
  answers its last poll with a download frame of ``--gib`` GiB (the operator spools up to the
  artifact bound, 1 GiB, to its scratch space before refusing it).

The operator's RSS is read from ``/proc/<pid>/status`` every 0.2 s while the phase runs, and its
``VmHWM`` (peak) once every Episode ended. Prints both phases' figures and the loud/quiet ratios,
writes ``bench/out/hostile-output-<date>.json``. Before issue 23 an answer was buffered whole: a
1 GiB sparse artifact cost about 330 MiB per copy and ~330 MiB exhausted a 1 GiB operator.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.suite.cluster import DEFAULT_KUBECONFIG, Namespaces, Operator, connect, create_episode, machine, proc_sample
from bench.suite.stats import table
from tests.cluster.harness import install_crd, read_episode

OUT = Path(__file__).resolve().parent / "out"
SANDBOX = "episode-operator.local/sandbox:bookworm"
TASK_TOML = f"""\
schema_version = "1.4"
[agent]
timeout_sec = 600.0
[verifier]
timeout_sec = 60.0
[environment]
docker_image = "{SANDBOX}"
workdir = "/app"
# No cpus: no CPU request (the node has 2, and other tests run beside these).
memory_mb = 512
"""
FILES = {
    "task.toml": TASK_TOML,
    "instruction.md": "Answer.\n",
    "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
}
# The replaced supervisor's prelude: the placed script kept beside it, its sessions ended after.
TAKE_OVER = (
    "cp /episode-operator/supervisor.sh /episode-operator/real.sh\n"
    "chmod 755 /episode-operator/new.sh && mv /episode-operator/new.sh /episode-operator/supervisor.sh\n"
    "for proc in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $proc/cmdline 2>/dev/null)\" in "
    '"sh /episode-operator/supervisor.sh serve"*) kill -9 "${proc#/proc/}" 2>/dev/null || true ;; esac; done\n'
)


def replaced_by(script: str) -> str:
    """The agent's command installing ``script`` as its pod's supervisor (``serve`` refused, so
    every call after it is an exec of ``script``)."""
    return (
        f"cat > /episode-operator/new.sh <<'SH'\n#!/bin/sh\ncase $1 in serve) exit 1 ;; esac\n{script}\nSH\n{TAKE_OVER}"
    )


# A supervisor answering the agent's last poll honestly, then with a download frame of SIZE bytes.
FRAME = """\
cat > /tmp/frame.py <<'PY'
import subprocess, sys
args = sys.argv[1:]
if '--then-download' not in args:
    sys.exit(subprocess.run(['sh', '/episode-operator/real.sh', *args]).returncode)
at = args.index('--then-download')
honest = subprocess.run(['sh', '/episode-operator/real.sh', *args[:at], *args[at + 2:]], capture_output=True)
sys.stdout.buffer.write(honest.stdout + b'download SIZE\\n')
for _ in range(SIZE >> 20):
    sys.stdout.buffer.write(bytes(1 << 20))
PY
"""


def loud_agents(gib: int) -> dict[str, str]:
    size = gib << 30
    return {
        "stdout-and-sparse": (
            f"head -c {size} /dev/zero | tr '\\0' x; mkdir -p /logs/artifacts; truncate -s {gib}G /logs/artifacts/hole"
        ),
        "endless-answers": replaced_by(f"exec head -c {size} /dev/zero"),
        "endless-download": FRAME.replace("SIZE", str(size)) + replaced_by('exec python3 /tmp/frame.py "$@"'),
    }


QUIET_AGENTS = {f"quiet-{n}": "mkdir -p /logs/artifacts && echo 42 > /logs/artifacts/answer.txt" for n in range(3)}


def phase(api: Any, namespaces: Namespaces, root: Path, label: str, agents: dict[str, str]) -> dict[str, Any]:
    namespace = namespaces.create(label)
    scratch = root / f"scratch-{label}"
    scratch.mkdir(parents=True)
    with Operator(DEFAULT_KUBECONFIG, root, namespace, label, env={"TMPDIR": str(scratch)}) as operator:
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(proc_sample(operator.pid).rss_kib)
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        idle = proc_sample(operator.pid)
        started = time.monotonic()
        for name, command in agents.items():
            spec = {"task": {"inline": {"files": FILES}}, "agent": {"kind": "command", "command": command}}
            create_episode(api, namespace, name, spec)
        results: dict[str, Any] = {}
        deadline = time.monotonic() + 1200
        while len(results) < len(agents):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: not all Episodes ended: {sorted(set(agents) - set(results))}")
            for name in agents:
                status = read_episode(api, namespace, name).get("status") or {}
                if name not in results and status.get("phase") in ("Succeeded", "Failed"):
                    turn = (status.get("turns") or [{}])[0]
                    results[name] = {
                        "outcome": status.get("outcome"),
                        "reward": status.get("reward"),
                        "failure_kind": turn.get("failureKind"),
                        "message": turn.get("message"),
                    }
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        done.set()
        sampler.join()
        end = operator.sample()
        alive = operator.process.process is not None and operator.process.process.poll() is None
    namespaces.delete(namespace)
    return {
        "episodes": results,
        "seconds": round(elapsed, 1),
        "idle_rss_mib": round(idle.rss_kib / 1024, 1),
        "peak_rss_sampled_mib": round(max(samples) / 1024, 1),
        "hwm_mib": round(end.hwm_kib / 1024, 1),
        "rss_after_mib": round(end.rss_kib / 1024, 1),
        "cpu_sec": round(end.cpu_sec, 1),
        "alive": alive,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--gib", type=int, default=2, help="how many GiB each loud agent sends")
    options = parser.parse_args()
    api = connect(DEFAULT_KUBECONFIG)
    install_crd(api)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(tempfile.mkdtemp(prefix=f"hostile-output-{stamp}-", dir=OUT if OUT.is_dir() else None))
    namespaces = Namespaces(api, f"bench-hostile-{uuid.uuid4().hex[:6]}-")
    try:
        quiet = phase(api, namespaces, root, "quiet", QUIET_AGENTS)
        loud = phase(api, namespaces, root, "loud", loud_agents(options.gib))
    finally:
        for name in list(namespaces.created):
            namespaces.delete(name)
    rows = [
        [label, f"{len(figures['episodes'])}", f"{figures['idle_rss_mib']}", f"{figures['peak_rss_sampled_mib']}",
         f"{figures['hwm_mib']}", f"{figures['cpu_sec']}", f"{figures['seconds']}", "yes" if figures["alive"] else "NO"]
        for label, figures in (("quiet", quiet), ("loud", loud))
    ]  # fmt: skip
    rows.append(
        [
            "loud / quiet",
            "",
            "",
            f"{loud['peak_rss_sampled_mib'] / quiet['peak_rss_sampled_mib']:.2f}x",
            f"{loud['hwm_mib'] / quiet['hwm_mib']:.2f}x",
            f"{loud['cpu_sec'] / max(quiet['cpu_sec'], 0.1):.2f}x",
            "",
            "",
        ]
    )
    result = {"machine": machine(api), "gib": options.gib, "quiet": quiet, "loud": loud}
    OUT.mkdir(exist_ok=True)
    path = OUT / f"hostile-output-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    header = ["phase", "episodes", "idle RSS MiB", "peak RSS MiB (sampled)", "VmHWM MiB", "CPU s", "wall s", "alive"]
    print(table(f"Operator memory, quiet agents against agents sending {options.gib} GiB", header, rows))
    for name, result in {**quiet["episodes"], **loud["episodes"]}.items():
        said = f"{result['failure_kind'] or ''} {result['message'] or ''}".strip()
        print(f"  {name}: {result['outcome']} reward={result['reward']} {said}")
    print(f"wrote {path}; operator logs in {root}", file=sys.stderr)
    return 0 if quiet["alive"] and loud["alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
