"""Writing an Episode's status and its Kubernetes Events.

With replicas, a driver's writes are fenced by its claim (kube/replicas.py): each status write
carries the claim as a precondition the API server checks, and an Event is named after the
transition it announces (the reason at the attempt and turn the status last showed), so a
second driver — a restarted or another replica — announcing the same transition gets 409 and
posts nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from episode_operator.api.episode_resource import EpisodeStatus, TaskStatus
from episode_operator.api.vocabulary import Condition, is_terminal, timestamp
from episode_operator.kube.client import KubeClient, KubeError, NotFound
from episode_operator.kube.objects.event_manifests import event_name
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.replicas import Claim
from episode_operator.runtime.admission import Refusal

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
    # This replica's claim on the Episode (None: a sole operator).
    claim: Claim | None = None
    # (attempt, turn) of the status last read or written: where the runner is, for Event names.
    position: tuple[int | None, int | None] = (None, None)

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
        name = event_name(self.episode, reason, *self.position)
        record_event(self.client, self.episode, reason, message, warning=warning, logger=self.logger, name=name)

    async def flush(self) -> None:
        """Wait until every Event asked for so far is posted (or given up), for a while at most:
        when the operator's Event rate limit holds them back, the status does not wait long."""
        await self.client.event_recorder.flush(self.episode, FLUSH_TIMEOUT_SEC)


def record_event(
    client: KubeClient,
    owner: OwnerRef,
    reason: str,
    message: str,
    *,
    warning: bool,
    logger: logging.Logger,
    name: str | None = None,
) -> None:
    """Log an Event on an Episode or EpisodeSet and queue it for posting (see :mod:`.events`); a
    ``name`` (:func:`event_name`) makes it the Event of one occasion, posted once across replicas."""
    (logger.warning if warning else logger.info)("%s: %s", reason, message)
    client.event_recorder.record(owner, reason, message, warning=warning, logger=logger, name=name)


async def refuse(
    sink: KubeStatusSink, status: EpisodeStatus, refusal: Refusal, generation: int | None
) -> EpisodeStatus:
    """End an Episode before any pod: Failed, TerminalFailure, the refusal's failure kind and message."""
    now = timestamp(time.time())
    status.phase = "Failed"
    status.outcome = "TerminalFailure"
    status.failure_kind = refusal.failure_kind
    status.message = refusal.message
    status.started_at = status.started_at or now
    status.finished_at = now
    if refusal.digest:
        status.task = TaskStatus(digest=refusal.digest)
    status.conditions = [
        Condition(
            type="Failed",
            status="True",
            reason="TerminalFailure",
            message=refusal.message[:1024],
            last_transition_time=now,
            observed_generation=generation,
        )
    ]
    await sink.event("EpisodeRefused", refusal.message, warning=True)
    await sink.publish(status)
    return status
