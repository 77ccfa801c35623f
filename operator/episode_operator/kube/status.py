"""Writing an Episode's status and its Kubernetes Events."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from episode_operator.api.models import API_VERSION, EpisodeStatus
from episode_operator.kube.client import KubeClient, KubeError, NotFound
from episode_operator.kube.pods import OwnerRef
from episode_operator.runtime.episode import timestamp

COMPONENT = "episode-operator"


class EpisodeGone(Exception):
    """The Episode was deleted while we were writing to it."""


@dataclass
class KubeStatusSink:
    """The runtime's :class:`~episode_operator.runtime.episode.StatusSink` for one Episode."""

    client: KubeClient
    episode: OwnerRef
    generation: int | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("episode_operator"))

    # The Events still being posted, chained so that they are posted in order.
    _events: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def publish(self, status: EpisodeStatus) -> None:
        if status.phase in ("Succeeded", "Failed"):
            await self.flush()  # the terminal status ends the driver: its Events come first
        # The whole status, conditions included, was computed from the generation the driver runs.
        status.observed_generation = self.generation
        for condition in status.conditions:
            condition.observed_generation = self.generation
        try:
            await self.client.replace_episode_status(self.episode.namespace, self.episode.name, status.to_api())
        except NotFound as error:
            raise EpisodeGone(str(error)) from error

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event in the background: a turn does not wait for a round trip that
        decides nothing (a lost Event is logged, never fatal)."""
        previous = self._events

        async def post() -> None:
            if previous is not None:
                await previous
            await post_event(self.client, self.episode, reason, message, warning=warning, logger=self.logger)

        self._events = asyncio.create_task(post())

    async def flush(self) -> None:
        """Wait until every Event asked for so far is posted (or given up)."""
        if self._events is not None:
            await self._events


async def post_event(
    client: KubeClient, owner: OwnerRef, reason: str, message: str, *, warning: bool, logger: logging.Logger
) -> None:
    """Post an Event on an Episode or EpisodeSet, and log it; losing one is logged, never fatal."""
    (logger.warning if warning else logger.info)("%s: %s", reason, message)
    try:
        await client.create_event(owner.namespace, event_manifest(owner, reason, message, warning))
    except KubeError as error:
        logger.warning("could not post event %s: %s", reason, error)
    except Exception:  # posted in the background too: nothing may escape unlogged
        logger.exception("could not post event %s", reason)


def event_manifest(owner: OwnerRef, reason: str, message: str, warning: bool) -> dict[str, Any]:
    now = time.time()
    stamp = timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{owner.name[:200]}.{int(now * 1e6):x}", "namespace": owner.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": owner.kind,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
