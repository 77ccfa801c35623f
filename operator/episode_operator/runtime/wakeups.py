"""Wake-ups from watch events, so that a waiter reacts at once and polls only as a fallback.

A watch handler calls :meth:`Wakeups.wake` for the object an event is about; the one task
registered for that object (an EpisodeSet's loop, a driver waiting for its pod to start) is
woken. Nothing depends on a wake-up arriving: every waiter still polls, less often.

A waiter that writes its own object (an EpisodeSet's loop, its status) names the version it wrote
(:meth:`Wakeups.wrote`): that version's event, its own write coming back on the watch, wakes no one.
Had it woken the loop, the next pass would read the set and list its children for nothing new: a set of
40 children at parallelism 4 wrote its status 98 to 115 times and passed 145 to 184 times, 130 with its
own writes ignored (bench/RESULTS.md). An event that comes back before the writer has named its version
still wakes it (one pass more, as before): a lost optimisation, never a lost wake.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class Wakeups:
    """One asyncio Event per registered waiter, found by namespace and a key (a name or label)."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self._written: dict[tuple[str, str], str] = {}  # the version each waiter wrote last

    @contextlib.contextmanager
    def registered(self, namespace: str, key: str) -> Iterator[asyncio.Event]:
        event = self._events[(namespace, key)] = asyncio.Event()
        try:
            yield event
        finally:
            if self._events.get((namespace, key)) is event:
                del self._events[(namespace, key)]
                self._written.pop((namespace, key), None)

    def wrote(self, namespace: str, key: str, version: str) -> None:
        """The registered waiter wrote ``version`` of its object: that version's event is no news to it."""
        if (namespace, key) in self._events:
            self._written[(namespace, key)] = version

    def wake(self, namespace: str, key: str, version: str | None = None) -> None:
        """Wake the waiter, unless ``version`` (of the object the event is about) is the one it wrote."""
        if version is not None and self._written.get((namespace, key)) == version:
            return
        event = self._events.get((namespace, key))
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        """Every registered waiter (what they wait for may have changed for all: e.g. the replicas)."""
        for event in self._events.values():
            event.set()


async def nap(wakeup: asyncio.Event | None, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``wakeup`` is (or gets) set; the waiter clears it."""
    if wakeup is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wakeup.wait(), seconds)
