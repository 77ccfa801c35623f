"""``episode-operator run`` with its sandboxes faked in process, for the replica-scaling benchmark.

This machine cannot hold hundreds of real pods, so the pods and their execs are replaced — and
nothing else: the operator runs as it ships (kopf, its watches, claims, status writes and Events
against the real API server), only ``kube.running.KubeProvider`` is swapped for :class:`FakeProvider`.
A turn's agent job (``a<attempt>.t<turn>.agent``, keyed or not: runtime/turn/context.py) takes
``$BENCH_TURN_SEC`` seconds; every other job ends at once;
a verifier's reward file says 1. Each agent job's start and end are appended, one JSON line each,
to ``$BENCH_TIMELINE`` (one file shared by the replicas: short appends are atomic).

    python bench/fake_sandbox_operator.py run --namespace NS ...   # the operator's own flags

tests/unit/test_fake_sandbox_bench.py runs an Episode through the runner with this provider, so a
change of the sandbox protocol (runtime/sandbox_protocol.py) that this file misses fails there, not
in the middle of a benchmark.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from episode_operator.api.vocabulary import Stage
from episode_operator.cli.operator_main import main
from episode_operator.kube import running
from episode_operator.runtime.sandbox_protocol import (
    MAIN_CONTAINER,
    ArchiveFile,
    FileContent,
    JobSpec,
    JobState,
    SandboxError,
    Upload,
    WaitingReport,
)
from episode_operator.runtime.turn.context import REWARD_TXT_PATH

TURN_SEC = float(os.environ.get("BENCH_TURN_SEC", "60"))
TIMELINE = Path(os.environ.get("BENCH_TIMELINE", "/dev/null"))
AGENT_JOB = re.compile(rf"a\d+\.t\d+\.{Stage.AGENT}(\.[0-9a-f]+)?")
EMPTY_TAR = io.BytesIO()
tarfile.open(fileobj=EMPTY_TAR, mode="w").close()


def record(**fields: Any) -> None:
    with TIMELINE.open("a") as stream:
        stream.write(json.dumps(fields) + "\n")


class FakeSandbox:
    """One pod's jobs, in memory: started once by id, ended by the clock."""

    def __init__(self, name: str, uid: str, episode: str) -> None:
        self.name, self.uid, self.workdir, self.episode = name, uid, "/app", episode
        self.jobs: dict[str, tuple[float, float]] = {}

    def _state(self, spec: JobSpec) -> JobState:
        started, ends = self.jobs[spec.id]
        if time.time() < ends:
            return JobState(spec.id, "running", started_at=started)
        files = {path: FileContent(b"1\n" if path == REWARD_TXT_PATH else None, ends - 0.5) for path in spec.read_after}
        archive = ArchiveFile.of_bytes(EMPTY_TAR.getvalue()) if spec.download_after is not None else None
        return JobState(
            spec.id, "exited", 0, started_at=started, finished_at=ends, output=b"", files=files, archive=archive
        )

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        if spec.id not in self.jobs:
            now = time.time()
            duration = TURN_SEC if AGENT_JOB.fullmatch(spec.id) else 0.0
            self.jobs[spec.id] = (now, now + duration)
            if duration:
                record(uid=self.episode, job=spec.id, started=now, ends=now + duration, pid=os.getpid())
        return await self.wait_job(spec, max_wait_sec=wait_sec)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        remaining = self.jobs[spec.id][1] - time.time()
        if remaining > 0:
            await asyncio.sleep(min(remaining, max_wait_sec))
        return self._state(spec)

    async def job_output(self, job_id: str, *, container: str = MAIN_CONTAINER, limit: int) -> bytes:
        return b""

    async def upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        *,
        container: str = MAIN_CONTAINER,
        clear: Sequence[str] = (),
    ) -> None:
        pass

    async def download(
        self, paths: Sequence[str], *, container: str = MAIN_CONTAINER, exclude: Sequence[str] = ()
    ) -> ArchiveFile:
        return ArchiveFile.of_bytes(EMPTY_TAR.getvalue())

    async def read_files(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> dict[str, FileContent]:
        return {path: FileContent(None) for path in paths}

    async def clear(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> None:
        pass

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        pass


# Every replica process keeps its own pods: a handover would find none (the benchmark makes none).
PODS: dict[str, FakeSandbox] = {}


class FakeProvider:
    def __init__(self, client: Any, episode: Any, *_: Any, **__: Any) -> None:
        self.episode = episode

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None) -> FakeSandbox:
        name = f"{self.episode.namespace}/{self.episode.name}-a{attempt}"
        if uid is not None and (name not in PODS or PODS[name].uid != uid):
            raise SandboxError(f"pod {name} is gone", kind="pod_lost")  # as KubeProvider: never made again
        return PODS.setdefault(name, FakeSandbox(name, f"{self.episode.uid}-a{attempt}", self.episode.uid))

    async def verifier(
        self, attempt: int, turn: int, plan: Any, *, waiting: WaitingReport | None = None, uid: str | None = None
    ) -> FakeSandbox:
        return await self.agent(attempt, uid=uid)

    def pin_images(self, pins: Any) -> None:
        pass

    async def apply_network(self, attempt: int, policy: Any) -> None:
        pass

    async def release_verifier(self, attempt: int, turn: int) -> None:
        pass

    async def release_agent(self, attempt: int) -> None:
        pass

    async def release_all(self, *, keep: bool) -> None:
        prefix = f"{self.episode.namespace}/{self.episode.name}-a"
        for name in [name for name in PODS if name.startswith(prefix)]:
            del PODS[name]


def profiled(path: str) -> None:
    """``$BENCH_PROFILE``: cProfile the operator into ``path`` (pstats) at exit — the main thread, where
    kopf's event loop and the drivers run (aiohttp's and the store's worker threads are not in it)."""
    import atexit
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    atexit.register(profile.dump_stats, path)


if __name__ == "__main__":
    if not os.environ.get("BENCH_REAL_SANDBOXES"):  # set: the operator as it ships, for a comparison
        running.KubeProvider = FakeProvider  # type: ignore[assignment,misc]
    if os.environ.get("BENCH_PROFILE"):
        profiled(os.environ["BENCH_PROFILE"])
    main()
