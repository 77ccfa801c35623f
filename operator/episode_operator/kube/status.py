"""Writing an Episode's status and its Kubernetes Events."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from episode_operator.api.models import EpisodeStatus
from episode_operator.api.vocabulary import is_terminal
from episode_operator.kube.client import KubeClient, NotFound
from episode_operator.kube.objects.pods import OwnerRef

# How long a terminal status waits for its Episode's Events (they wait only for the rate limit).
FLUSH_TIMEOUT_SEC = 5.0


class EpisodeGone(Exception):
    """The Episode was deleted while we were writing to it."""


@dataclass
class KubeStatusSink:
    """The runtime's :class:`~episode_operator.runtime.episode.StatusSink` for one Episode."""

    client: KubeClient
    episode: OwnerRef
    generation: int | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("episode_operator"))

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
        record_event(self.client, self.episode, reason, message, warning=warning, logger=self.logger)

    async def flush(self) -> None:
        """Wait until every Event asked for so far is posted (or given up), for a while at most:
        when the operator's Event rate limit holds them back, the status does not wait long."""
        await self.client.event_recorder.flush(self.episode, FLUSH_TIMEOUT_SEC)


def record_event(
    client: KubeClient, owner: OwnerRef, reason: str, message: str, *, warning: bool, logger: logging.Logger
) -> None:
    """Log an Event on an Episode or EpisodeSet and queue it for posting (see :mod:`.events`)."""
    (logger.warning if warning else logger.info)("%s: %s", reason, message)
    client.event_recorder.record(owner, reason, message, warning=warning, logger=logger)
