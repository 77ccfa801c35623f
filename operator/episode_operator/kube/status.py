"""Writing an Episode's status and its Kubernetes Events.

With replicas, a driver's writes are fenced by its claim (kube/replicas.py): each status write
carries the claim as a precondition the API server checks, and an Event is named after the
transition it announces (the reason at the attempt and turn the status last showed), so a
second driver — a restarted or another replica — announcing the same transition gets 409 and
posts nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from episode_operator.api.models import EpisodeStatus
from episode_operator.api.vocabulary import is_terminal
from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.events import event_manifest, event_name
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.replicas import Claim


class EpisodeGone(Exception):
    """The Episode was deleted while we were writing to it."""


@dataclass
class KubeStatusSink:
    """The runtime's :class:`~episode_operator.runtime.episode.StatusSink` for one Episode."""

    client: KubeClient
    episode: OwnerRef
    generation: int | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("episode_operator"))
    # This replica's claim on the Episode (None: a sole operator).
    claim: Claim | None = None
    # (attempt, turn) of the status last read or written: where the runner is, for Event names.
    position: tuple[int | None, int | None] = (None, None)

    # The Events still being posted, chained so that they are posted in order.
    _events: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def publish(self, status: EpisodeStatus) -> None:
        if self.claim is not None:
            self.claim.check()
        if is_terminal(status.phase):
            await self.flush()  # the terminal status ends the driver: its Events come first
        # The whole status, conditions included, was computed from the generation the driver runs.
        status.observed_generation = self.generation
        for condition in status.conditions:
            condition.observed_generation = self.generation
        try:
            await self.client.replace_episode_status(
                self.episode.namespace,
                self.episode.name,
                status.to_api(),
                guard=self.claim.guard if self.claim is not None else None,
            )
        except NotFound as error:
            raise EpisodeGone(str(error)) from error
        except KubeError as error:
            if error.status == 422 and self.claim is not None:
                await self.claim.confirm()  # the precondition failed: another replica's claim is Fenced
            raise
        self.position = (status.attempt, status.current_turn)

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event in the background: a turn does not wait for a round trip that
        decides nothing (a lost Event is logged, never fatal)."""
        if self.claim is not None:
            self.claim.check()
        previous = self._events
        name = event_name(self.episode, reason, *self.position)

        async def post() -> None:
            if previous is not None:
                await previous
            await post_event(self.client, self.episode, reason, message, warning=warning, logger=self.logger, name=name)

        self._events = asyncio.create_task(post())

    async def flush(self) -> None:
        """Wait until every Event asked for so far is posted (or given up)."""
        if self._events is not None:
            await self._events


async def post_event(
    client: KubeClient,
    owner: OwnerRef,
    reason: str,
    message: str,
    *,
    warning: bool,
    logger: logging.Logger,
    name: str | None = None,
) -> None:
    """Post an Event on an Episode or EpisodeSet, and log it; losing one is logged, never fatal.

    An Event ``name`` that exists already was posted for the same occasion: nothing to do."""
    try:
        await client.create_event(owner.namespace, event_manifest(owner, reason, message, warning, name=name))
        (logger.warning if warning else logger.info)("%s: %s", reason, message)
    except Conflict:
        logger.debug("event %s (%s) was posted already", name, reason)
    except KubeError as error:
        logger.warning("could not post event %s: %s", reason, error)
    except Exception:  # posted in the background too: nothing may escape unlogged
        logger.exception("could not post event %s", reason)
