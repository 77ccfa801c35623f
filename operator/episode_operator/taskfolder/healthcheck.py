"""The healthcheck polling algorithm shared by ``[environment.healthcheck]`` and ``[steps.healthcheck]``.

docs/task-format.md §3.4.3 (Harbor's ``run_healthcheck``, which Gym follows): attempts during
the start period do not count; after it, ``max(retries, 1)`` consecutive failures fail the
check; an attempt past ``timeout_sec`` is a failure. The clock, the sleep and the attempt
are injected, so the timing rules are tested without waiting and the runtime supplies
real ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from episode_operator.taskfolder.task_toml import Healthcheck


@dataclass
class HealthcheckPoll:
    """The state of one polling loop; ``started_at`` is t0 (for a step: the end of setup.sh)."""

    check: Healthcheck
    started_at: float
    counted_failures: int = 0
    attempts: int = 0

    def after_failure(self, now: float) -> float | None:
        """Record a failed attempt that ended at ``now``; seconds to sleep, or None once failed."""
        self.attempts += 1
        if now < self.started_at + self.check.start_period_sec:
            return self.check.start_interval_sec
        self.counted_failures += 1
        if self.counted_failures >= max(self.check.retries, 1):
            return None
        return self.check.interval_sec


async def poll_healthcheck(
    check: Healthcheck,
    attempt: Callable[[float], Awaitable[bool]],
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> bool:
    """Poll until the check passes (True) or fails (False).

    ``attempt(timeout_sec)`` runs the command once and returns True only for exit 0
    within the timeout.
    """
    poll = HealthcheckPoll(check, clock())
    while True:
        if await attempt(check.timeout_sec):
            return True
        pause = poll.after_failure(clock())
        if pause is None:
            return False
        await sleep(pause)
