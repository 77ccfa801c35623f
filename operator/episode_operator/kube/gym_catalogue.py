"""The Gym environment server's view of the cluster: its catalogue, its Episodes, their kept records.

``start_gym_server`` (called once at startup when ``--gym-port`` is set) serves
:mod:`episode_operator.runtime.gym_server` with :class:`KubeRollouts`:

- the **catalogue** is the task ConfigMaps of the server's namespace labelled with a dataset
  (``kubectl episode pack --dataset NAME``), each annotated with its task name;
- a try's Episode is created in the server's namespace and followed with a watch of that one name
  until it is terminal or deleted;
- its evidence (instructions, captured model calls, trajectories) comes from the operator's store,
  as ``kubectl episode export`` reads it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from aiohttp import web

from episode_operator.api.episode_resource import PLURAL, EpisodeSpec
from episode_operator.api.export import NO_EVIDENCE, EpisodeEvidence, evidence_of
from episode_operator.api.vocabulary import DATASET_LABEL, TASK_NAME_ANNOTATION, is_terminal
from episode_operator.kube.client import Conflict, Gone, KubeClient, KubeError
from episode_operator.runtime.episode_store import BlobStore, turn_records
from episode_operator.runtime.gym_protocol import TaskRef
from episode_operator.runtime.gym_server import EpisodeGone, GymServer, GymSettings, RolloutRefused, serve

LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
RETRY_PAUSE_SEC = 1.0  # after a failed list or watch of a try's Episode, before the next


class KubeRollouts:
    """:class:`~episode_operator.runtime.gym_server.Rollouts` on the API server and the operator's store."""

    def __init__(self, client: KubeClient, store: BlobStore, namespace: str, logger: logging.Logger) -> None:
        self.client = client
        self.store = store
        self.namespace = namespace
        self.logger = logger

    async def task_source(self, task: TaskRef) -> dict[str, Any] | None:
        if not LABEL_VALUE.match(task.dataset):
            return None  # no ConfigMap can carry that dataset label
        for config_map in await self.client.list_config_maps(self.namespace, f"{DATASET_LABEL}={task.dataset}"):
            annotations = config_map.metadata.annotations or {}
            if annotations.get(TASK_NAME_ANNOTATION) == task.task:
                return {"configMap": {"name": config_map.metadata.name}}
        return None

    async def create(self, manifest: dict[str, Any]) -> None:
        """Create the try's Episode, or join the one an earlier /run of the same try created.

        An Episode of that name being deleted is a cancelled try (Gym closed its /run): the try sent
        again is run afresh once that one is gone, not answered with its cancellation.
        """
        name = manifest["metadata"]["name"]
        while True:
            try:
                await self.client.create_episode(manifest)
                return
            except Conflict:
                if await self._there(name):
                    return  # the same try, created by an earlier /run
                self.logger.info(
                    "episode %s/%s of a cancelled try is being deleted: the try runs again", self.namespace, name
                )
                await self._gone(name)
            except KubeError as error:
                if 400 <= error.status < 500:  # invalid, forbidden, an admission webhook's no
                    raise RolloutRefused(str(error)) from error
                raise

    async def _there(self, name: str) -> bool:
        """Whether the Episode of this name is there and not being deleted (gone since the create's
        conflict counts as being deleted)."""
        items, _ = await self.client.list_objects_at(PLURAL, self.namespace, fields=f"metadata.name={name}")
        return bool(items) and not items[0]["metadata"].get("deletionTimestamp")

    async def _gone(self, name: str) -> None:
        async with aclosing(self._follow(self.namespace, name)) as events:
            async for kind, episode in events:
                if episode is None or kind == "DELETED":
                    return

    async def finished(self, namespace: str, name: str) -> Mapping[str, Any]:
        async with aclosing(self._follow(namespace, name)) as events:  # closes the watch when done
            async for kind, episode in events:
                if episode is None or kind == "DELETED":
                    raise EpisodeGone(name)
                if is_terminal((episode.get("status") or {}).get("phase")):
                    return episode
        raise AssertionError("unreachable: _follow never ends")

    async def _follow(self, namespace: str, name: str) -> AsyncGenerator[tuple[str, Mapping[str, Any] | None]]:
        """The Episode as it is (``LISTED``, None when there is none), then as it changes; listed again
        after a watch ends or expires, and after an API error (logged) and a pause."""
        fields = f"metadata.name={name}"
        while True:
            try:
                items, version = await self.client.list_objects_at(PLURAL, namespace, fields=fields)
                yield "LISTED", (items[0] if items else None)
                async for kind, episode in self.client.watch_objects(PLURAL, namespace, None, version, fields=fields):
                    yield kind, episode
            except Gone:
                continue
            except KubeError as error:
                self.logger.warning("following episode %s/%s: %s", namespace, name, error)
                await asyncio.sleep(RETRY_PAUSE_SEC)

    async def delete(self, namespace: str, name: str) -> None:
        try:
            await self.client.delete_episode(namespace, name)
        except KubeError as error:
            self.logger.warning("episode %s/%s of a cancelled try stays: %s", namespace, name, error)

    async def evidence(self, episode: Mapping[str, Any]) -> EpisodeEvidence:
        spec = EpisodeSpec.model_validate(episode["spec"])
        if spec.agent.model is None:
            return NO_EVIDENCE
        metadata = episode["metadata"]
        blobs = self.store.episode(metadata["namespace"], metadata["name"], metadata["uid"])
        return evidence_of(spec, await turn_records(blobs))


async def start_gym_server(
    client: KubeClient,
    store: BlobStore,
    settings: GymSettings,
    host: str,
    port: int,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> web.AppRunner:
    """Serve Gym's /run and /aggregate_metrics on ``host:port``; the caller cleans the runner up."""
    rollouts = KubeRollouts(client, store, settings.namespace, logging.getLogger("episode_operator.gym"))
    runner = await serve(GymServer(settings, rollouts), host, port)
    logger.info(
        "serving Gym's rollout protocol on port %d: Episodes in namespace %s, retries owned by %s",
        port,
        settings.namespace,
        settings.retry_owner,
    )
    return runner
