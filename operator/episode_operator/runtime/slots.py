"""A limit on active episodes, handed out oldest first.

``maxActiveEpisodes`` bounds how many Episodes the operator drives at once; the rest wait
``Pending``. Waiters are served by their Episode's creation time, not by the order kopf
happened to start their daemons in (after a restart that order is arbitrary), so a large
batch runs in the order it was submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass(order=True)
class _Waiter:
    key: tuple[str, ...]
    future: asyncio.Future[None] = field(compare=False)


class FifoSlots:
    """At most ``limit`` holders at a time (no limit when ``limit`` is 0), oldest key first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._waiting: list[_Waiter] = []

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiting if not waiter.future.done())

    def would_wait(self) -> bool:
        return bool(self.limit) and self.active >= self.limit

    @contextlib.asynccontextmanager
    async def slot(self, key: tuple[str, ...]) -> AsyncIterator[None]:
        """Hold a slot for the body; ``key`` orders the waiters (e.g. creation time, namespace, name)."""
        if self.would_wait() or self.waiting:
            waiter = _Waiter(key, asyncio.get_running_loop().create_future())
            heapq.heappush(self._waiting, waiter)
            try:
                await waiter.future
            except asyncio.CancelledError:
                if waiter.future.done() and not waiter.future.cancelled():
                    self._release()  # granted and cancelled at once: pass the slot on
                raise
        else:
            self.active += 1
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            waiter = heapq.heappop(self._waiting)
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes on: active stays the same
                return
        self.active -= 1
