"""The operator's Event recorder: one Event per transition at ordinary load, a bounded rate in a storm."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiolimiter import AsyncLimiter

from episode_operator.kube.client import KubeError
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.runtime.metrics import Metrics

LOGGER = logging.getLogger("test")
REASONS = ("TurnStarted", "TurnFinished", "EpisodeFinished")


class Api:
    """Records the Events that reached the API server; those whose reason is in ``failing`` are refused."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.posted: list[dict[str, Any]] = []
        self.failing = failing

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a round trip: other posters run meanwhile
        if event["reason"] in self.failing:
            raise KubeError("events is forbidden", status=403)
        self.posted.append(event)


class Gate:
    """A token bucket the test fills by hand; it counts who waits for a token."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.waiting = 0
        self.changed = asyncio.Condition()

    def has_capacity(self, amount: float = 1) -> bool:
        return self.tokens >= amount

    async def acquire(self, amount: float = 1) -> None:
        async with self.changed:
            self.waiting += 1
            try:
                await self.changed.wait_for(lambda: self.has_capacity(amount))
            finally:
                self.waiting -= 1
            self.tokens -= int(amount)

    async def add(self, tokens: int) -> None:
        async with self.changed:
            self.tokens += tokens
            self.changed.notify_all()


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (loop turns, not time)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def owners(count: int) -> list[OwnerRef]:
    return [OwnerRef(f"episode-{index}", "ns", f"uid-{index}") for index in range(count)]


def test_at_ordinary_load_every_transition_is_its_own_event_in_order() -> None:
    async def scenario() -> list[dict[str, Any]]:
        api = Api()
        recorder = EventRecorder(api.create_event)
        episode = OwnerRef("e", "ns", "uid")
        for turn in (1, 2):
            recorder.record(episode, "TurnStarted", f"turn {turn} started", warning=False, logger=LOGGER)
            recorder.record(episode, "TurnFinished", f"turn {turn}: reward 1", warning=False, logger=LOGGER)
        recorder.record(episode, "EpisodeFinished", "Graded", warning=False, logger=LOGGER)
        assert await recorder.flush(episode, 5.0)
        assert recorder.pending == 0
        return api.posted

    posted = asyncio.run(scenario())
    assert [(event["reason"], event["message"], event["count"]) for event in posted] == [
        ("TurnStarted", "turn 1 started", 1),
        ("TurnFinished", "turn 1: reward 1", 1),
        ("TurnStarted", "turn 2 started", 1),
        ("TurnFinished", "turn 2: reward 1", 1),
        ("EpisodeFinished", "Graded", 1),
    ]
    assert len({event["metadata"]["name"] for event in posted}) == 5


def test_an_event_storm_is_held_to_the_token_bucket_and_combined_per_object_and_reason() -> None:
    metrics = Metrics()

    async def scenario() -> None:
        api, gate = Api(), Gate(tokens=10)
        recorder = EventRecorder(api.create_event, limiter=gate, metrics=metrics)
        episodes = owners(100)
        for episode in episodes:
            for reason in REASONS:
                recorder.record(episode, reason, f"{reason} 1", warning=False, logger=LOGGER)
        # 300 Events from 100 episodes: 10 tokens, so 10 posts; each other episode waits for one.
        await until(lambda: len(api.posted) == 10 and gate.waiting == 100)
        assert recorder.pending == 290
        # The same transitions again while they wait: counted into the waiting Events, not queued
        # (but for the 10 episodes whose TurnStarted was posted: theirs is queued anew).
        for episode in episodes:
            for reason in REASONS:
                recorder.record(episode, reason, f"{reason} 2", warning=False, logger=LOGGER)
        assert recorder.pending == 300
        await gate.add(1000)
        await until(lambda: recorder.pending == 0 and len(api.posted) == 310)
        # Each transition is in exactly one Event's count; each episode's Events keep their order.
        assert sum(event["count"] for event in api.posted) == 600
        for episode in episodes:
            mine = [event["reason"] for event in api.posted if event["involvedObject"]["uid"] == episode.uid]
            assert mine in (list(REASONS), [*REASONS, "TurnStarted"])
        combined = [event for event in api.posted if event["count"] == 2]
        assert len(combined) == 290
        assert all(event["message"].startswith(f"{event['reason']} 2 (+1 earlier") for event in combined)
        assert all(event["firstTimestamp"] <= event["lastTimestamp"] for event in combined)

    asyncio.run(scenario())
    assert metrics.registry.get_sample_value("episode_operator_events_total", {"result": "posted"}) == 310
    assert metrics.registry.get_sample_value("episode_operator_events_total", {"result": "combined"}) == 290


def test_the_real_token_bucket_posts_no_more_than_its_burst_at_once() -> None:
    async def scenario() -> int:
        api = Api()
        # A burst of 10, then one Event every 1000 s: the test never reaches the second token.
        recorder = EventRecorder(api.create_event, limiter=AsyncLimiter(10, 10_000))
        for episode in owners(50):
            for reason in REASONS:
                recorder.record(episode, reason, reason, warning=False, logger=LOGGER)
        await until(lambda: len(api.posted) == 10)
        for _ in range(1000):  # the storm goes on waiting: nothing more gets through
            await asyncio.sleep(0)
        posted = len(api.posted)
        await recorder.close(0.0)
        return posted

    assert asyncio.run(scenario()) == 10


def test_flush_waits_for_the_episodes_events_but_not_for_ever() -> None:
    async def scenario() -> tuple[bool, bool, int]:
        api, gate = Api(), Gate(tokens=0)
        recorder = EventRecorder(api.create_event, limiter=gate)
        held, free = owners(2)
        recorder.record(held, "TurnStarted", "held back", warning=False, logger=LOGGER)
        gave_up = await recorder.flush(held, 0.01)
        await gate.add(1)
        posted = await recorder.flush(held, 5.0)
        return gave_up, posted and await recorder.flush(free, 0.0), len(api.posted)

    assert asyncio.run(scenario()) == (False, True, 1)


def test_a_refused_event_is_logged_and_loses_only_itself(caplog: Any) -> None:
    metrics = Metrics()

    async def scenario() -> list[str]:
        api = Api(failing=("Broken",))
        recorder = EventRecorder(api.create_event, expected_errors=(KubeError,), metrics=metrics)
        episode = OwnerRef("e", "ns", "uid")
        for reason in ("TurnStarted", "Broken", "TurnFinished"):
            recorder.record(episode, reason, reason, warning=False, logger=LOGGER)
        await recorder.flush(episode, 5.0)
        return [event["reason"] for event in api.posted]

    with caplog.at_level(logging.WARNING, logger="test"):
        assert asyncio.run(scenario()) == ["TurnStarted", "TurnFinished"]
    assert "could not post event Broken: events is forbidden" in caplog.text
    assert metrics.registry.get_sample_value("episode_operator_events_total", {"result": "failed"}) == 1


def test_close_drops_what_the_rate_limit_still_holds() -> None:
    async def scenario() -> tuple[int, int]:
        api, gate = Api(), Gate(tokens=1)
        recorder = EventRecorder(api.create_event, limiter=gate)
        for episode in owners(5):
            recorder.record(episode, "TurnStarted", "started", warning=False, logger=LOGGER)
        await recorder.close(0.0)
        return len(api.posted), gate.waiting

    posted, waiting = asyncio.run(scenario())
    assert posted <= 1
    assert waiting == 0


def test_the_backlog_is_bounded_and_what_finds_it_full_is_dropped_and_said(caplog: Any) -> None:
    """Many objects each posting faster than the rate: without a bound the backlog (and the operator's
    memory) would grow for as long as the storm lasts."""
    metrics = Metrics()

    async def scenario() -> tuple[int, int, int, list[str]]:
        api, gate = Api(), Gate(tokens=0)
        recorder = EventRecorder(api.create_event, limiter=gate, metrics=metrics, max_pending=50)
        episodes = owners(100)
        for episode in episodes:
            recorder.record(episode, "TurnStarted", "started", warning=False, logger=LOGGER)
        full = recorder.pending
        assert metrics.registry.get_sample_value("episode_operator_events_waiting") == full
        # An Event the backlog holds already still takes in its repeats: combined, not dropped.
        recorder.record(episodes[0], "TurnStarted", "started again", warning=False, logger=LOGGER)
        await gate.add(1000)
        await until(lambda: recorder.pending == 0 and len(api.posted) == 50)
        # Room again: nothing is dropped.
        recorder.record(episodes[99], "TurnFinished", "finished", warning=False, logger=LOGGER)
        await recorder.flush(episodes[99], 5.0)
        posted = sorted(event["involvedObject"]["uid"] for event in api.posted)
        return full, len(api.posted), sum(event["count"] for event in api.posted), posted[-1:]

    with caplog.at_level(logging.WARNING, logger="test"):
        full, posted, counted, last = asyncio.run(scenario())
    assert (full, posted, counted, last) == (50, 51, 52, ["uid-99"])
    assert metrics.registry.get_sample_value("episode_operator_events_total", {"result": "dropped"}) == 50
    assert metrics.registry.get_sample_value("episode_operator_events_waiting") == 0
    assert metrics.registry.get_sample_value("episode_operator_events_total", {"result": "combined"}) == 1
    # Said once (a minute has not passed), with how many were dropped until then.
    warnings = [record.getMessage() for record in caplog.records if "dropped" in record.getMessage()]
    assert warnings == [
        "dropped 1 Event(s) (this one: TurnStarted): 50 wait for the operator's Event rate limit already; "
        "the status keeps every transition"
    ]
