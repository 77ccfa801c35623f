"""Nothing of a finished Episode stays in the operator: objects and traced memory return to their baseline.

Issue 14 measured RSS growing with every Episode processed. This drives many Episodes in one
process through the operator's per-Episode path — the slot (handlers), the driver, the runner
with the in-memory sandbox, the status sink, the Event recorder, the data directory, the
metrics — and checks, after a warm-up, that more Episodes leave no object type grown by one
per Episode (``gc``) and no allocation site of the operator's own code holding a block per
Episode (``tracemalloc``). RSS itself is the benchmark's (bench/suite/memory.py): it also holds the
allocator's high-water marks, which no test can read without flaking.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import episode_operator
from episode_operator import handlers
from episode_operator.kube import running
from episode_operator.kube.driver import DriverSettings
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.fencing import NoFence
from episode_operator.runtime.metrics import Metrics
from episode_operator.runtime.slots import FifoSlots
from episode_operator.runtime.wakeups import Wakeups
from tests.unit.fake_sandbox import FakeProvider, World
from tests.unit.folders import multi_step, steps_toml

EPISODES = 30  # per round
ROUNDS = 3
AT_ONCE = 10
WARM_UP = 20
FRAMES = 8
OPERATOR_CODE = str(Path(episode_operator.__file__).parent)


class Api:
    """Stands in for KubeClient where the sandbox is in memory: status writes and Events only."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.statuses: Counter[str] = Counter()
        self.event_recorder = EventRecorder(self.create_event, metrics=metrics)

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.statuses[str(status.get("phase"))] += 1

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        await asyncio.sleep(0)


# Two steps, each with a solution and its own test; scripts in the in-memory sandbox's line language.
FILES = multi_step(
    steps_toml("one", "two"),
    ["one", "two"],
    {
        "steps/one/solution/solve.sh": "write answer 1\n",
        "steps/one/tests/test.sh": "check answer 1\n",
        "steps/two/solution/solve.sh": "write answer 2\n",
        "steps/two/tests/test.sh": "check answer 2\n",
    },
)


def body(index: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"e-{index}",
            "namespace": "ns",
            "uid": f"uid-{index}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"task": {"inline": {"files": FILES}}, "agent": {"kind": "oracle"}},
    }


def object_counts() -> Counter[str]:
    gc.collect()
    return Counter(type(thing).__qualname__ for thing in gc.get_objects())


def operator_allocations() -> tracemalloc.Snapshot:
    """The traced memory blocks still held that the operator's own code allocated (anywhere in the stack)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    return snapshot.filter_traces([tracemalloc.Filter(True, f"{OPERATOR_CODE}/*", all_frames=True)])


@pytest.fixture
def fake_sandboxes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(running, "KubeProvider", lambda *_, **__: FakeProvider(World()))


@pytest.mark.usefixtures("fake_sandboxes")
def test_a_processed_episode_leaves_nothing_behind(tmp_path: Path) -> None:
    metrics = Metrics()
    api = Api(metrics)
    memo = SimpleNamespace(
        client=api,
        metrics=metrics,
        slots=FifoSlots(AT_ONCE // 2),  # some wait for a slot too
        settings=DriverSettings(store=BlobStore.local(tmp_path), pod_wakeups=Wakeups()),
    )
    logger = logging.getLogger("test.memory")

    async def process(first: int, count: int) -> None:
        for start in range(first, first + count, AT_ONCE):
            batch = range(start, min(start + AT_ONCE, first + count))
            await asyncio.gather(*(handlers._drive_in_a_slot(body(index), memo, logger, NoFence()) for index in batch))
        for index in range(first, first + count):  # as the terminal status does: Events are out
            await api.event_recorder.flush(SimpleNamespace(uid=f"uid-{index}"), 5.0)  # type: ignore[arg-type]

    async def scenario() -> tuple[Counter[str], Counter[str], list[tracemalloc.StatisticDiff]]:
        await process(0, WARM_UP)
        tracemalloc.start(FRAMES)
        try:
            # Three equal rounds, all traced: what an Episode leaves behind grows by EPISODES in each
            # round after the first, while one-time warm-ups and the interpreter's caches (free lists
            # hold a few dozen blocks at some sites) do not keep growing.
            await process(WARM_UP, EPISODES)
            objects_before, blocks_before = object_counts(), operator_allocations()
            for later in range(1, ROUNDS):
                await process(WARM_UP + later * EPISODES, EPISODES)
            objects_after, blocks_after = object_counts(), operator_allocations()
        finally:
            tracemalloc.stop()
        return objects_before, objects_after, blocks_after.compare_to(blocks_before, "traceback")

    before, after, blocks = asyncio.run(scenario())
    assert api.statuses["Succeeded"] == WARM_UP + ROUNDS * EPISODES  # they all ran to the end
    more = (ROUNDS - 1) * EPISODES
    grown = {kind: after[kind] - before[kind] for kind in after if after[kind] - before[kind] >= more // 2}
    assert grown == {}, f"object types that grew with {more} more Episodes: {grown}"
    # Strings and bytes are not in gc's view: an allocation site holding a block per Episode is a leak.
    kept = [f"{stat.count_diff} blocks at {stat.traceback.format()}" for stat in blocks if stat.count_diff >= more]
    assert kept == [], f"allocation sites that kept a block per Episode: {kept}"
    assert api.event_recorder.pending == 0
    assert memo.slots.active == 0
