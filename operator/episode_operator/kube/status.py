"""Writing an Episode's status and its Kubernetes Events."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from episode_operator.api.models import EpisodeStatus
from episode_operator.api.vocabulary import is_terminal
from episode_operator.kube.client import KubeClient, KubeError, NotFound
from episode_operator.kube.objects.events import event_manifest
from episode_operator.kube.objects.pods import OwnerRef


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
        if is_terminal(status.phase):
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
