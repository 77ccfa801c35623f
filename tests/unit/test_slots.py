"""FifoSlots: the active-episode limit, oldest first."""

from __future__ import annotations

import asyncio

from episode_operator.runtime.slots import FifoSlots


async def arrived(slots: FifoSlots, holders: int) -> None:
    """Until ``holders`` tasks hold or wait for a slot (loop turns, no clock)."""
    while slots.active + slots.waiting < holders:
        await asyncio.sleep(0)


def test_limit_and_order_by_key() -> None:
    async def scenario() -> list[str]:
        slots = FifoSlots(2)
        order: list[str] = []
        release = asyncio.Event()
        peak = 0

        async def episode(key: str) -> None:
            nonlocal peak
            async with slots.slot((key,)):
                peak = max(peak, slots.active)
                order.append(key)
                await release.wait()

        tasks = []
        for key in ("a", "b", "e", "c", "d"):  # arriving in this order, one after the other
            tasks.append(asyncio.create_task(episode(key)))
            await arrived(slots, len(tasks))
        assert order == ["a", "b"] and slots.waiting == 3 and slots.active == 2
        release.set()
        await asyncio.gather(*tasks)
        assert peak == 2 and slots.active == 0
        return order

    # e came first among the waiters but c and d are older keys.
    assert asyncio.run(scenario()) == ["a", "b", "c", "d", "e"]


def test_no_limit() -> None:
    async def scenario() -> int:
        slots = FifoSlots(0)
        async with slots.slot(("a",)), slots.slot(("b",)), slots.slot(("c",)):
            return slots.active

    assert asyncio.run(scenario()) == 3


def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    async def scenario() -> int:
        slots = FifoSlots(1)
        held = asyncio.Event()
        done = asyncio.Event()

        async def holder() -> None:
            async with slots.slot(("a",)):
                held.set()
                await done.wait()

        first = asyncio.create_task(holder())
        await held.wait()
        waiter = asyncio.create_task(slots.slot(("b",)).__aenter__())
        await arrived(slots, 2)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        done.set()
        await first
        async with slots.slot(("c",)):
            return slots.active

    assert asyncio.run(scenario()) == 1
