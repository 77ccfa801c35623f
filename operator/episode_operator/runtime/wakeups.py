"""Wake-ups from watch events, so that a waiter reacts at once and polls only as a fallback.

A watch handler calls :meth:`Wakeups.wake` for the object an event is about; the one task
registered for that object (an EpisodeSet's loop, a driver waiting for its pod to start) is
woken. Nothing depends on a wake-up arriving: every waiter still polls, less often.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class Wakeups:
    """One asyncio Event per registered waiter, found by namespace and a key (a name or label)."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}

    @contextlib.contextmanager
    def registered(self, namespace: str, key: str) -> Iterator[asyncio.Event]:
        event = self._events[(namespace, key)] = asyncio.Event()
        try:
            yield event
        finally:
            if self._events.get((namespace, key)) is event:
                del self._events[(namespace, key)]

    def wake(self, namespace: str, key: str) -> None:
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
