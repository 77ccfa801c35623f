"""Wake-ups from watch events: a waiter reacts to the event, and polls only as a fallback."""

from __future__ import annotations

import asyncio
from typing import Any

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
