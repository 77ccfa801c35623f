"""The Episode's status sink: Events go in the background, in order, before the terminal status."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.kube.client import Conflict, KubeError
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.status import KubeStatusSink


class SlowApi:
    """Records what reached the API; an Event takes a few loop turns, and some fail."""

    def __init__(self, failing: dict[str, Exception] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failing = failing or {}
        self.event_recorder = EventRecorder(self.create_event, expected_errors=(KubeError,))

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        if event["reason"] in self.failing:
            raise self.failing[event["reason"]]
        self.calls.append(("event", event["reason"]))

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.calls.append(("status", status["phase"]))


def run_sink(api: SlowApi) -> list[tuple[str, str]]:
    async def scenario() -> list[tuple[str, str]]:
        sink = KubeStatusSink(api, OwnerRef("e", "ns", "uid"), logger=logging.getLogger("test"))  # type: ignore[arg-type]
        await sink.event("TurnStarted", "turn 1")
        assert api.calls == []  # the caller did not wait for the round trip
        await sink.event("Broken", "an event the API refuses", warning=True)
        await sink.publish(EpisodeStatus(phase="Running"))
        await sink.event("TurnFinished", "turn 1: reward 1")
        await sink.event("EpisodeFinished", "Graded")
        await sink.publish(EpisodeStatus(phase="Succeeded"))
        return api.calls

    return asyncio.run(scenario())


@pytest.mark.parametrize("failure", [KubeError("forbidden", status=403), RuntimeError("unexpected")])
def test_events_are_posted_in_order_before_the_terminal_status(failure: Exception) -> None:
    calls = run_sink(SlowApi({"Broken": failure}))
    events = [reason for kind, reason in calls if kind == "event"]
    assert events == ["TurnStarted", "TurnFinished", "EpisodeFinished"]  # a failed one loses only itself
    assert calls[-1] == ("status", "Succeeded")
    assert ("status", "Running") in calls


class EventsApi:
    """Events by name as the API server keeps them: a second create of one name is 409."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.guards: list[object] = []
        self.renew_recorder()

    def renew_recorder(self) -> None:
        self.event_recorder = EventRecorder(self.create_event, expected_errors=(KubeError,), already_posted=(Conflict,))

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        if event["metadata"]["name"] in self.events:
            raise Conflict("already exists", status=409)
        self.events[event["metadata"]["name"]] = event

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.guards.append(guard)


def test_a_transition_is_announced_once_whoever_announces_it_again() -> None:
    """A second driver (a restarted or another replica) resumes from the same status and repeats
    the same transitions: their Events keep their names, so each is posted once; the same reason
    at another turn or attempt is another Event."""
    api = EventsApi()

    async def drive(status: EpisodeStatus) -> None:
        api.renew_recorder()  # a token bucket belongs to one event loop, as in one operator process
        sink = KubeStatusSink(
            api,  # type: ignore[arg-type]
            OwnerRef("e", "ns", "uid"),
            logger=logging.getLogger("test"),
            position=(status.attempt, status.current_turn),
        )
        await sink.event("TurnStarted", "turn 1/2 started")
        await sink.event("TurnFinished", "turn 1/2: reward 1")
        await sink.publish(EpisodeStatus(phase="Running", attempt=1, current_turn=1))
        await sink.event("TurnStarted", "turn 2/2 started")
        await sink.flush()

    resumed = EpisodeStatus(phase="Running", attempt=1, current_turn=0)
    asyncio.run(drive(resumed))
    asyncio.run(drive(resumed))
    reasons = sorted(event["reason"] for event in api.events.values())
    assert reasons == ["TurnFinished", "TurnStarted", "TurnStarted"]
    assert api.guards == [None, None]  # a sole operator's writes carry no precondition
    again = EpisodeStatus(phase="Running", attempt=2, current_turn=0)
    asyncio.run(drive(again))
    assert len(api.events) == 5  # attempt 2's own


def test_a_drivers_status_writes_carry_its_claim_and_a_refused_one_fences_it() -> None:
    """With a claim, each status write is conditional on the claim (the API server checks it); when the
    API server refuses one (422) and the claim is another replica's, the driver is Fenced."""
    from episode_operator.kube.client import Guard
    from episode_operator.runtime.fencing import Fenced

    class StubClaim:
        guard = Guard("episode-operator.dev/driver", "r0.abc")
        checks = 0

        def check(self) -> None:
            self.checks += 1

        async def confirm(self) -> None:
            raise Fenced("claimed by r1.def")

    class RefusingApi(EventsApi):
        refuse = False

        async def replace_episode_status(
            self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
        ) -> None:
            self.guards.append(guard)
            if self.refuse:
                raise KubeError("the server rejected our request", status=422)

    api, claim = RefusingApi(), StubClaim()
    sink = KubeStatusSink(api, OwnerRef("e", "ns", "uid"), logger=logging.getLogger("test"), claim=claim)  # type: ignore[arg-type]
    asyncio.run(sink.publish(EpisodeStatus(phase="Running")))
    assert api.guards == [StubClaim.guard] and claim.checks == 1
    api.refuse = True
    with pytest.raises(Fenced):
        asyncio.run(sink.publish(EpisodeStatus(phase="Running")))
