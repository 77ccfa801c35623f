"""Kubernetes Events: posted in the background, at a bounded rate, combined when they come faster.

Every Event is a write to the API server and to etcd. Ten thousand episodes posting
``TurnStarted``, ``TurnFinished`` and ``EpisodeFinished`` would be hundreds of writes a second
that nobody reads at that rate; client-go guards kubelets and controllers the same way with
its EventCorrelator (aggregation, and a token bucket). One :class:`EventRecorder` per operator
posts every Event through one token bucket (``rate_per_sec``, ``burst`` at once). While an
Event waits for its token, a later one of the same object, type and reason is combined into
it: ``count`` goes up, the message becomes the latest one. So each real transition is counted
exactly once — in an Event of its own whenever the API server keeps up (always, at ordinary
load), in a combined Event's ``count`` when it does not — the backlog holds at most one Event
per object, type and reason, and an object's Events are posted in the order they happened.

Combining bounds the backlog per object, not in all: Episodes that each post a few Events, faster
than the rate (a benchmark processed 8.5 one-turn Episodes a second, 25 Events a second against a
rate of 20), would queue without end — 2,300 Events and 34 MiB after 5,000 Episodes. So the backlog
holds ``max_pending`` Events at most, and an Event that finds it full is dropped (counted, and logged
once a minute), as client-go's broadcaster drops what finds its queue of 1,000 full. Events are
notices; the Episode's status keeps every transition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiolimiter import AsyncLimiter

from episode_operator.kube.objects.event_manifests import MESSAGE_LIMIT, event_manifest
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.runtime.metrics import Metrics

# client-go's kubelet default is 50 Events a second with bursts of 100 per node; one operator
# drives many nodes' worth of episodes but writes far fewer Events per episode.
DEFAULT_RATE_PER_SEC = 20.0
DEFAULT_BURST = 100
# Events waiting for the rate limit, at most (client-go's maxQueuedEvents): a minute of the default rate.
DEFAULT_MAX_PENDING = 1000
DROPPED_WARNING_INTERVAL_SEC = 60.0


class Limiter(Protocol):
    """A token bucket (``aiolimiter.AsyncLimiter``): :meth:`acquire` returns once a token is taken."""

    def has_capacity(self, amount: float = 1) -> bool: ...

    async def acquire(self, amount: float = 1) -> None: ...


@dataclass
class _Pending:
    """An Event waiting for its token, with what was combined into it."""

    owner: OwnerRef
    reason: str
    message: str
    warning: bool
    logger: logging.Logger
    first_at: float
    last_at: float
    count: int = 1
    # The Event's name when it stands for one occasion (see ``event_name``): posted once by whoever posts it.
    name: str | None = None


class EventRecorder:
    """The operator's Events, posted through ``post`` (``KubeClient.create_event``) at a bounded rate.

    ``expected_errors`` are failures logged as one line (an API refusal); anything else is
    logged with its traceback. A lost Event is never fatal.
    """

    def __init__(
        self,
        post: Callable[[str, dict[str, Any]], Awaitable[None]],
        *,
        rate_per_sec: float = DEFAULT_RATE_PER_SEC,
        burst: int = DEFAULT_BURST,
        max_pending: int = DEFAULT_MAX_PENDING,
        limiter: Limiter | None = None,
        expected_errors: tuple[type[Exception], ...] = (),
        already_posted: tuple[type[Exception], ...] = (),
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._post = post
        self._limiter: Limiter = limiter or AsyncLimiter(burst, burst / rate_per_sec)
        self._expected_errors = expected_errors
        self._already_posted = already_posted
        self._metrics = metrics
        self._clock = clock
        self._max_pending = max_pending
        self._queues: dict[str, deque[_Pending]] = {}
        self._pending = 0
        self._posters: dict[str, asyncio.Task[None]] = {}
        self._dropped_since_warning = 0
        self._last_drop_warning: float | None = None

    @property
    def pending(self) -> int:
        """Events recorded and not posted yet."""
        return self._pending

    def record(
        self,
        owner: OwnerRef,
        reason: str,
        message: str,
        *,
        warning: bool,
        logger: logging.Logger,
        name: str | None = None,
    ) -> None:
        """Queue an Event on ``owner`` (returns at once; the caller logs it). A ``name`` makes it the
        Event of one occasion: if it exists already (another replica, or this one before a restart,
        posted it), nothing is posted again."""
        now = self._clock()
        queue = self._queues.get(owner.uid)
        waiting = None
        if queue and not self._limiter.has_capacity():  # the rate limit holds Events back: combine rather than queue
            waiting = next((p for p in queue if p.reason == reason and p.warning == warning), None)
        if waiting is not None:
            waiting.count += 1
            waiting.message = message
            waiting.last_at = now
            self._count("combined")
            return
        if self._pending >= self._max_pending:
            self._drop(reason, logger, now)
            return
        self._queues.setdefault(owner.uid, deque()).append(
            _Pending(owner, reason, message, warning, logger, now, now, name=name)
        )
        self._waiting(+1)
        if owner.uid not in self._posters:
            self._posters[owner.uid] = asyncio.create_task(self._post_queue(owner.uid))

    async def flush(self, owner: OwnerRef, timeout_sec: float) -> bool:
        """Wait until ``owner``'s Events are posted (or given up); False if ``timeout_sec`` passed first."""
        poster = self._posters.get(owner.uid)
        if poster is None:
            return True
        done, _ = await asyncio.wait({poster}, timeout=timeout_sec)
        return bool(done)

    async def close(self, timeout_sec: float) -> None:
        """Post what is queued within ``timeout_sec``, then drop the rest (the operator is exiting)."""
        posters = list(self._posters.values())
        if posters:
            _, late = await asyncio.wait(posters, timeout=timeout_sec)
            for poster in late:
                poster.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _post_queue(self, uid: str) -> None:
        """Post one object's Events in order, each once a token is free; ends when none is left."""
        queue = self._queues[uid]
        try:
            while queue:
                await self._limiter.acquire()
                pending = queue.popleft()  # from now on nothing is combined into it
                self._waiting(-1)
                await self._post_one(pending)
        finally:
            del self._posters[uid]
            if not queue:
                del self._queues[uid]

    async def _post_one(self, pending: _Pending) -> None:
        try:
            await self._post(pending.owner.namespace, self._manifest(pending))
        except self._already_posted:
            pending.logger.debug("event %s (%s) was posted already", pending.name, pending.reason)
            self._count("duplicate")
        except self._expected_errors as error:
            pending.logger.warning("could not post event %s: %s", pending.reason, error)
            self._count("failed")
        except Exception:  # posted in the background: nothing may escape unlogged
            pending.logger.exception("could not post event %s", pending.reason)
            self._count("failed")
        else:
            self._count("posted")

    def _manifest(self, pending: _Pending) -> dict[str, Any]:
        combined = ""
        if pending.count > 1:
            combined = f" (+{pending.count - 1} earlier {pending.reason}, combined: the operator's Event rate limit)"
        return event_manifest(
            pending.owner,
            pending.reason,
            pending.message[: MESSAGE_LIMIT - len(combined)] + combined,
            pending.warning,
            name=pending.name,
            now=self._clock(),
            first_at=pending.first_at,
            last_at=pending.last_at,
            count=pending.count,
        )

    def _waiting(self, change: int) -> None:
        self._pending += change
        if self._metrics is not None:
            self._metrics.events_waiting.inc(change)

    def _drop(self, reason: str, logger: logging.Logger, now: float) -> None:
        """An Event that found the backlog full: counted, and said once a minute at most."""
        self._count("dropped")
        self._dropped_since_warning += 1
        if self._last_drop_warning is None or now - self._last_drop_warning >= DROPPED_WARNING_INTERVAL_SEC:
            logger.warning(
                "dropped %d Event(s) (this one: %s): %d wait for the operator's Event rate limit already; "
                "the status keeps every transition",
                self._dropped_since_warning,
                reason,
                self._pending,
            )
            self._last_drop_warning, self._dropped_since_warning = now, 0

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.events.labels(result).inc()
