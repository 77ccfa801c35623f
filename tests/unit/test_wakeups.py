"""Wake-ups from watch events: a waiter reacts to the event, and polls only as a fallback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import kopf

from episode_operator.api.episodeset_resource import EpisodeSetStatus
from episode_operator.kube.episodeset_controller import SetWriter
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.runtime.wakeups import Wakeups, nap

HOUR = 3600.0


def test_a_wake_ends_the_nap_of_the_registered_waiter_only() -> None:
    async def scenario() -> None:
        wakeups = Wakeups()
        with wakeups.registered("ns", "a") as a, wakeups.registered("ns", "b") as b:
            napping = asyncio.create_task(nap(a, HOUR))
            wakeups.wake("ns", "a")
            wakeups.wake("other", "b")  # another namespace's object of the same name
            wakeups.wake("ns", "nobody")  # no waiter: nothing happens
            await asyncio.wait_for(napping, 10)
            assert a.is_set() and not b.is_set()
        wakeups.wake("ns", "a")  # after the waiter left: nothing to wake, no error
        with wakeups.registered("ns", "a") as again:
            assert again is not a and not again.is_set()  # a wake-up is never kept for a later waiter
        await nap(None, 0)  # without wake-ups a nap is a sleep

    asyncio.run(scenario())


def test_a_later_registration_replaces_and_outlives_an_earlier_one() -> None:
    wakeups = Wakeups()
    with wakeups.registered("ns", "a") as first:
        with wakeups.registered("ns", "a") as second:
            wakeups.wake("ns", "a")
            assert second.is_set() and not first.is_set()
        second.clear()
        wakeups.wake("ns", "a")  # the replaced registration's exit removed the key
        assert not first.is_set()


POD_UID = "uid-e-a1"


def _pod(ready: bool) -> dict[str, Any]:
    state = (
        {"running": {"startedAt": "2026-11-30T00:00:00Z"}} if ready else {"waiting": {"reason": "ContainerCreating"}}
    )
    return {
        "metadata": {"name": "e-a1", "uid": POD_UID},
        "status": {
            "phase": "Running" if ready else "Pending",
            "containerStatuses": [{"name": "main", "ready": ready, "state": state}],
        },
    }


class StartingPod:
    """read_pod answers a pod that is starting until ``started`` is set."""

    def __init__(self) -> None:
        self.started = False
        self.reads = 0

    async def read_pod(self, namespace: str, name: str) -> Any:
        self.reads += 1
        return _pod(self.started)


def test_a_starting_pod_is_read_when_it_changes_not_at_the_next_poll() -> None:
    async def scenario() -> int:
        api = StartingPod()
        wakeups = Wakeups()
        provider = KubeProvider(
            api,  # type: ignore[arg-type]
            OwnerRef("e", "ns", "uid"),
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            "image",
            {},
            wakeups=wakeups,
            watched_poll_first_sec=HOUR,
            watched_poll_max_sec=HOUR,
        )
        with wakeups.registered("ns", "e-a1") as changed:
            waiting = asyncio.create_task(provider._wait_running("e-a1", "agent", HOUR, changed, None, POD_UID))
            while api.reads == 0:
                await asyncio.sleep(0)
            api.started = True
            wakeups.wake("ns", "e-a1")  # what the pod watch's handler does
            await asyncio.wait_for(waiting, 10)  # an hour's poll otherwise
        return api.reads

    assert asyncio.run(scenario()) == 2


def test_a_waiter_is_not_woken_by_the_version_it_wrote_itself() -> None:
    """An EpisodeSet's loop names each status version it writes: that version's watch event is its own write
    coming back, and wakes it not; any other version, or an event without one, does."""
    wakeups = Wakeups()
    wakeups.wrote("ns", "s", "6")  # no waiter yet: nothing kept
    with wakeups.registered("ns", "s") as waiter:
        wakeups.wake("ns", "s", "6")
        assert waiter.is_set()
        waiter.clear()
        wakeups.wrote("ns", "s", "7")
        wakeups.wake("ns", "s", "7")
        wakeups.wrote("other", "s", "8")  # another namespace's set of the same name has no waiter
        assert not waiter.is_set()
        wakeups.wake("ns", "s", "8")  # someone else's change, after the loop's write
        assert waiter.is_set()
        waiter.clear()
        wakeups.wake("ns", "s")  # a child's event carries no version of the set
        assert waiter.is_set()
    with wakeups.registered("ns", "s") as again:  # a version written by an earlier waiter is forgotten with it
        wakeups.wake("ns", "s", "7")
        assert again.is_set()


def test_the_set_loop_names_each_status_version_it_writes() -> None:
    """A pass that changes the set's status hands the version the write returned to ``wrote``; a pass that
    writes nothing hands none."""
    written: list[str] = []

    class Sets:
        async def replace_episodeset_status(self, namespace: str, name: str, status: Any, **_: Any) -> str:
            return "42"

    writer = SetWriter(cast(Any, Sets()), OwnerRef("s", "ns", "u"), logging.getLogger("t"), None, written.append)
    asyncio.run(writer.status(EpisodeSetStatus(), EpisodeSetStatus(phase="Running")))
    asyncio.run(writer.status(EpisodeSetStatus(phase="Running"), EpisodeSetStatus(phase="Running")))
    assert written == ["42"]


def test_the_set_events_handler_passes_the_sets_version() -> None:
    """kopf's event of a set carries its resourceVersion to the wake-up, so the loop's own write is recognised."""
    from episode_operator import handlers
    from episode_operator.kube.replicas import Replicas

    memo = kopf.Memo(replicas=Replicas(cast(Any, None), None, logging.getLogger("t")), set_wakeups=Wakeups())
    body = kopf.Body(cast(kopf.RawBody, {"metadata": {"name": "s", "namespace": "ns", "resourceVersion": "9"}}))
    with memo.set_wakeups.registered("ns", "s") as waiter:
        memo.set_wakeups.wrote("ns", "s", "9")
        asyncio.run(handlers.wake_set(body=body, memo=memo, type="MODIFIED"))
        assert not waiter.is_set()
        memo.set_wakeups.wrote("ns", "s", "8")
        asyncio.run(handlers.wake_set(body=body, memo=memo, type="MODIFIED"))
        assert waiter.is_set()
