"""Sampling the operator with py-spy while it works, and reading the samples.

py-spy (``pip install py-spy`` into the venv) attaches to the operator's pid, samples its
Python stacks without pausing it (``--nonblocking``) and writes collapsed stacks
(``--format raw``: ``frame;frame;... count``). Only samples on CPU are kept (no
``--idle``), so the summary says where the operator's CPU time goes. It is stopped by its pid
with SIGINT, on which it writes its file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .stats import table

RATE = 250  # samples per second


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profiler:
    """``py-spy record`` on a pid for the duration of a ``with`` block."""

    def __init__(self, pid: int, stem: Path) -> None:
        self.pid = pid
        self.raw = stem.with_suffix(".collapsed.txt")
        self.svg = stem.with_suffix(".svg")
        self.log = stem.with_suffix(".py-spy.log")
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Profiler:
        binary = py_spy()
        if binary is None:
            raise RuntimeError("--profile needs py-spy: .venv/bin/pip install py-spy")
        common = ["--pid", str(self.pid), "--rate", str(RATE), "--nonblocking"]
        for output, form in ((self.raw, "raw"), (self.svg, "flamegraph")):
            with self.log.open("ab") as log:
                self.processes.append(
                    subprocess.Popen(
                        [binary, "record", *common, "--format", form, "--output", str(output)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        return self

    def __exit__(self, *_: object) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGINT)
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def summary(self, top: int = 18) -> dict[str, Any]:
        return summarize(self.raw, top)


# Activities a sample is charged to: the deepest frame of its stack that names one wins.
ACTIVITIES: list[tuple[str, tuple[str, ...]]] = [
    ("TLS handshakes (a new connection per exec)", ("do_handshake", "_on_handshake_complete", "_start_handshake")),
    ("aiohttp proxy/.netrc lookups per request (trust_env)", ("get_env_proxy_for_url", "netrc_from_env")),
    ("exec: websocket connect, send, receive", ("KubeClient._exec_once",)),
    ("status writes (JSON patch of the whole status)", ("KubeClient.replace_episode_status",)),
    ("Kubernetes Events", ("KubeClient.create_event",)),
    (
        "pod reads, creates, lists, deletes",
        ("KubeClient.read_pod", "KubeClient.create_pod", "KubeClient.list_pods", "KubeClient.delete_pod"),
    ),
    ("kopf: watch streams and per-event processing", ("process_resource_event", "watch_objs", "queueing.worker")),
    ("status model (pydantic dump/validate)", ("to_api", "model_validate", "model_dump")),
    ("task folder read, validate, plan", ("read_task_files", "validate_task", "resolve_plan")),
    ("logs and artifacts written to the data dir", ("BlobStore.put",)),
    ("idle: thread-pool workers waiting for work", ("_worker",)),
    ("idle: event loop waiting in epoll", ("EpollSelector.select",)),
]
# py-spy's idle detection lets some blocked samples through; these are waits, not work.
IDLE = {"idle: thread-pool workers waiting for work", "idle: event loop waiting in epoll"}


def _function(frame: str) -> str:
    """``function (module/path.py:123)`` → ``function (module/path.py)``."""
    function, _, where = frame.partition(" (")
    return f"{function} ({where.rsplit(':', 1)[0].rstrip(')')})" if where else function


def _module(frame: str) -> str:
    where = frame.partition(" (")[2]
    return where.split("/", 1)[0].split(":", 1)[0].removesuffix(".py") or "?"


def _activity(frames: list[str]) -> str:
    for frame in reversed(frames):
        function, _, where = frame.partition(" (")
        qualified = f"{where.split('/')[-1].split('.py')[0]}.{function}" if where else function
        for label, markers in ACTIVITIES:
            if any(marker in function or marker == qualified for marker in markers):
                return label
    return "event loop: TLS reads and writes, socket setup and teardown (no caller on the stack)"


def summarize(raw: Path, top: int = 15) -> dict[str, Any]:
    """Where the operator's CPU samples go: by activity, by module (leaf frames) and by function."""
    if not raw.exists():
        return {"samples": 0, "text": f"(no profile: {raw} missing)"}
    inclusive: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    activities: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for frame in stack.split(";") if frame]
        total += count
        for name in {_function(frame) for frame in frames}:
            inclusive[name] += count
        modules[_module(frames[-1])] += count
        activities[_activity(frames)] += count
    if not total:
        return {"samples": 0, "text": "(no samples)"}

    def share(count: int) -> str:
        return f"{100 * count / total:.1f} %"

    idle = sum(count for name, count in activities.items() if name in IDLE)
    busy = total - idle

    def busy_share(name: str, count: int) -> str:
        return "" if name in IDLE or not busy else f"{100 * count / busy:.1f} %"

    # Frames on (nearly) every stack say nothing: the CLI, kopf's reactor, the event loop.
    branches = [(name, count) for name, count in inclusive.most_common() if count < 0.5 * total][:top]
    text = "\n".join(
        [
            table(
                f"Profile: {total} samples at {RATE} Hz, by activity (deepest matching frame)",
                ["of all", "of busy", "activity"],
                [[share(count), busy_share(name, count), name] for name, count in activities.most_common()],
            ),
            table(
                "Profile: self time by module", ["share", "module"], [[share(c), n] for n, c in modules.most_common(10)]
            ),
            table(
                "Profile: inclusive time by function (frames on more than half of all stacks left out)",
                ["share", "function"],
                [[share(count), name] for name, count in branches],
            ),
        ]
    )
    return {
        "samples": total,
        "rate_hz": RATE,
        "activities": {name: count / total for name, count in activities.most_common()},
        "busy_samples": busy,
        "self_by_module": {name: count / total for name, count in modules.most_common()},
        "inclusive": {name: count / total for name, count in inclusive.most_common(80)},
        "raw": str(raw),
        "text": text,
    }
