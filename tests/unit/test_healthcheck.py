"""The healthcheck polling algorithm (docs/task-format.md §3.4.3, §5.9) against a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from episode_operator.taskfolder.healthcheck import poll_healthcheck
from episode_operator.taskfolder.task_toml import Healthcheck


class FakeSandbox:
    """A command that passes from ``healthy_from`` on and takes ``duration`` seconds per attempt."""

    def __init__(self, healthy_from: float, duration: float = 0.0) -> None:
        self.now = 0.0
        self.healthy_from = healthy_from
        self.duration = duration
        self.attempt_times: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def attempt(self, timeout: float) -> bool:
        self.attempt_times.append(self.now)
        started = self.now
        self.now += min(self.duration, timeout)
        return self.duration <= timeout and started >= self.healthy_from


def poll(check: Healthcheck, sandbox: FakeSandbox) -> bool:
    return asyncio.run(poll_healthcheck(check, sandbox.attempt, sandbox.clock, sandbox.sleep))


TIMING = {"command": "probe", "start_period_sec": 5, "start_interval_sec": 2, "interval_sec": 2}


def test_retries_zero_fails_at_the_first_counted_attempt() -> None:
    """§5.9: attempts at 0, 2, 4 s are grace; the one at 6 s fails and reaches max(0, 1)."""
    sandbox = FakeSandbox(healthy_from=7)
    assert poll(Healthcheck(**TIMING, retries=0), sandbox) is False
    assert sandbox.attempt_times == [0, 2, 4, 6]


def test_retries_two_passes_after_one_counted_failure() -> None:
    """§5.9: the 6 s failure counts 1, the 8 s attempt passes."""
    sandbox = FakeSandbox(healthy_from=7)
    assert poll(Healthcheck(**TIMING, retries=2), sandbox) is True
    assert sandbox.attempt_times == [0, 2, 4, 6, 8]


def test_an_attempt_past_its_timeout_is_a_failure() -> None:
    sandbox = FakeSandbox(healthy_from=0, duration=3)
    assert poll(Healthcheck(command="slow", timeout_sec=2, retries=2, interval_sec=1), sandbox) is False
    assert len(sandbox.attempt_times) == 2


@pytest.mark.parametrize("retries", [1, 3, 5])
def test_consecutive_counted_failures_reach_retries(retries: int) -> None:
    sandbox = FakeSandbox(healthy_from=10_000)
    assert poll(Healthcheck(command="never", retries=retries, interval_sec=1), sandbox) is False
    assert len(sandbox.attempt_times) == retries


def test_immediate_pass() -> None:
    sandbox = FakeSandbox(healthy_from=0)
    assert poll(Healthcheck(command="ok"), sandbox) is True
    assert sandbox.attempt_times == [0]


def test_worst_case_bound_covers_the_slowest_failure() -> None:
    check = Healthcheck(command="x", start_period_sec=5, start_interval_sec=2, interval_sec=3, timeout_sec=4, retries=2)
    sandbox = FakeSandbox(healthy_from=10_000, duration=10)  # every attempt times out
    assert poll(check, sandbox) is False
    assert sandbox.now <= check.worst_case_sec()
