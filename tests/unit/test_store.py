"""The kept logs of an Episode: what `kubectl episode logs` prints, in the order the turns ran."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from episode_operator.runtime.store import FileStore, stored_logs


def listing(root: Path, **filters: object) -> list[tuple[int, str, str]]:
    return [(log.attempt, log.turn, log.name) for log in stored_logs(root, **filters)]  # type: ignore[arg-type]


def test_logs_are_listed_in_the_order_the_turns_ran(tmp_path: Path) -> None:
    """Turn names sort differently from the run order ("one", "three", "two"; "10" before "2"),
    and logs saved within one clock tick have equal modification times."""
    store = FileStore(tmp_path)
    ran = [
        (1, "seed", "agent-setup"),
        (1, "one", "setup"),
        (1, "one", "agent"),
        (1, "one", "verifier"),
        (1, "two", "agent"),
        (1, "two", "verifier"),
        (1, "three", "agent"),
        (1, "three", "collect-0"),
        (1, "three", "verifier"),
        (2, "one", "agent"),
    ]

    async def save_all() -> None:
        for attempt, turn, name in ran:
            await store.save_log(attempt, turn, name, f"{turn} {name}\n".encode())
        await store.save_log(1, "one", "agent", b"saved again by a restarted runner\n")

    asyncio.run(save_all())
    for log in (tmp_path / "attempt-1").glob("*/logs/*.txt"):
        os.utime(log, ns=(0, 0))  # no help from the clock
    assert listing(tmp_path) == ran
    assert listing(tmp_path, turn="two") == [(1, "two", "agent"), (1, "two", "verifier")]
    assert listing(tmp_path, attempt=2) == [(2, "one", "agent")]


def test_logs_kept_before_the_order_was_recorded_follow_their_times(tmp_path: Path) -> None:
    for age, (turn, name) in enumerate([("b", "verifier"), ("b", "agent"), ("a", "agent")]):
        log = tmp_path / "attempt-1" / turn / "logs" / f"{name}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("old\n")
        os.utime(log, ns=(10 - age, 10 - age))
    assert listing(tmp_path) == [(1, "a", "agent"), (1, "b", "agent"), (1, "b", "verifier")]
