"""The EpisodeSet controller: child Episodes for a dataset × attempts, at most ``parallelism`` active.

One loop per open set (a kopf daemon runs :func:`run_episode_set`), woken when the set or
one of its children changes and every ``resync_sec`` regardless. Each pass is level-based:
it reads the set and *lists its children from the API server* (a quorum read, never a
cache that may lag behind our own creates), lets :func:`~episode_operator.runtime.evaluation.plan_set`
decide, writes the status, then acts. So a restarted operator carries on from what exists:

- child names are deterministic (``<set>-<task index>-<attempt>``), so a create is
  idempotent; 409 Conflict means the child exists (ours, or reported as a conflict);
- the dataset is resolved once and recorded in the status before the first child exists;
- a child first seen finished is recorded (with the time it was seen) *before* any child
  that takes its slot is created, and a recorded finished child is never created again.

For the record of how many children were active at once, each child carries the time the
controller created it (annotation ``episode-operator.dev/created-at``, stamped before the
create call) and the set's status carries when each child was first seen finished (stamped
after the listing that showed it). ``[createdAt, observedFinishedAt]`` contains the child's
whole active life, so counting overlaps of these intervals bounds the true concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from episode_operator.api.episode_resource import DEFAULT_TASK_ARCHIVE_KEY, validation_message
from episode_operator.api.episodeset_resource import (
    MAX_CHILDREN,
    SET_KIND,
    SUSPENDED_BY_SET_ANNOTATION,
    EpisodeSetSpec,
    EpisodeSetStatus,
    PrePullStatus,
    SetTaskStatus,
)
from episode_operator.api.vocabulary import TASK_LABEL, is_terminal, parse_timestamp, precise_timestamp
from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.children import child_manifest, child_view, replaced_patch, set_selector
from episode_operator.kube.objects.event_manifests import event_name
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.objects.prepull_plan import done as prepull_done
from episode_operator.kube.objects.prepull_plan import failing_images as prepull_failing
from episode_operator.kube.objects.prepull_plan import holds as prepull_holds
from episode_operator.kube.prepull import PrePullSettings, reconcile_prepull, release_prepull
from episode_operator.kube.replicas import Claim
from episode_operator.kube.status import record_event
from episode_operator.kube.warm_pool import PoolSettings, reconcile_pool, release_pool
from episode_operator.runtime.evaluation import definition_digest, plan_set
from episode_operator.runtime.rerun_plan import apply_rerun, rerun_requested
from episode_operator.runtime.timing import DEFAULT_TIMING
from episode_operator.runtime.wakeups import nap

MESSAGE_LIMIT = 2000


@dataclass(frozen=True)
class SetSettings:
    """How the set loop paces itself."""

    source_wait_sec: float = DEFAULT_TIMING.source_wait_sec
    resync_sec: float = 30.0
    debounce_sec: float = 0.05  # coalesce a burst of child changes into one pass
    error_backoff_sec: float = 5.0
    # How a warm pool's pods are built (the operator's pod settings), and how often a pool not yet full is looked at.
    pool: PoolSettings = field(default_factory=PoolSettings)
    pool_poll_sec: float = 2.0
    # How the children's images are found (the operator's image settings), and how often a pre-pull still
    # pulling is looked at (its DaemonSet's pods are not watched).
    prepull: PrePullSettings = field(default_factory=PrePullSettings)
    prepull_poll_sec: float = 2.0


class SetGone(Exception):
    """The set was deleted."""


class DatasetError(Exception):
    """The dataset cannot be resolved; ``waitable`` when what is missing may still appear."""

    def __init__(self, message: str, *, waitable: bool = False) -> None:
        super().__init__(message)
        self.waitable = waitable


# --- the loop -----------------------------------------------------------------------------------
async def run_episode_set(
    client: KubeClient,
    namespace: str,
    name: str,
    wakeup: asyncio.Event,
    stopped: Callable[[], bool],
    logger: logging.Logger,
    settings: SetSettings | None = None,
    *,
    claim: Claim | None = None,
) -> None:
    """Reconcile the set until it is complete (or deleted, or the loop is stopped).

    ``claim``: this replica's claim on the set (kube/replicas.py), checked before each pass and
    carried by every status write; a pass that finds it gone stops the loop (:class:`Fenced`)."""
    settings = settings or SetSettings()
    while not stopped():
        wakeup.clear()
        try:
            delay = await reconcile_episode_set(client, namespace, name, logger, settings, claim=claim)
        except SetGone:
            return
        except KubeError as error:
            logger.warning(
                "episodeset %s/%s: %s; retrying in %.0f s", namespace, name, error, settings.error_backoff_sec
            )
            delay = settings.error_backoff_sec
        if delay is None:
            return
        await nap(wakeup, delay)
        await asyncio.sleep(settings.debounce_sec)


async def reconcile_episode_set(
    client: KubeClient,
    namespace: str,
    name: str,
    logger: logging.Logger,
    settings: SetSettings,
    *,
    claim: Claim | None = None,
) -> float | None:
    """One pass over the set; the seconds until the next one, or None when the set is complete."""
    if claim is not None:
        claim.check()
    try:
        body = await client.get_episodeset(namespace, name)
    except NotFound:
        raise SetGone(name) from None
    metadata = body["metadata"]
    if metadata.get("deletionTimestamp"):
        return None
    ref = OwnerRef(name, namespace, metadata["uid"], kind=SET_KIND)
    try:
        previous = EpisodeSetStatus.model_validate(body.get("status") or {})
    except ValidationError:
        previous = EpisodeSetStatus()  # not ours: start over (children are found again by label)
    reopening = rerun_requested(body.get("spec"), body.get("status"))
    if previous.completion_time and not reopening:
        if (body.get("spec") or {}).get("warmPool"):  # e.g. stopped by its failure policy: no child claims any more
            await release_pool(client, ref)
        if (body.get("spec") or {}).get("prePull"):
            await release_prepull(client, ref)
        return None
    events = SetWriter(client, ref, logger, claim)
    try:
        spec = EpisodeSetSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        if previous.completion_time:
            return None  # a finished set stays as it finished
        await _finish_failed(previous, "InvalidSpec", "invalid spec: " + validation_message(error), events)
        return None
    definition = definition_digest(body.get("spec") or {})

    if previous.completion_time and previous.definition is None:
        # Stopped before its dataset was resolved: no child to re-run; the generation is recorded as refused.
        result = apply_rerun(spec, previous, precise_timestamp(time.time()), lambda tasks, policy: None)
        await events.status(previous, result.status)
        for reason, message, warning in result.events:
            await events.post(reason, message, warning=warning)
        return None
    rescan_images = False
    if previous.definition is None:
        resolved = await _resolve(client, ref, spec, metadata, previous, definition, settings, events)
        if resolved is None or isinstance(resolved, float):
            return resolved
        previous = resolved
        # Images pre-pulled while the set was suspended came from the dataset as it was then: found again
        # from the dataset just recorded (the DaemonSet stays when they are the same).
        rescan_images = True

    children = [child_view(child) for child in await _owned_children(client, ref)]
    now = precise_timestamp(time.time())  # after the listing: a child seen finished finished before now
    plan = plan_set(spec, previous, children, definition=definition, now=now, generation=metadata.get("generation"))
    unfinished = [child.name for child in children if not is_terminal(child.phase)]
    status, pool_due = await _warm_pool(client, ref, spec, previous, plan.status, settings, unfinished)
    status, prepull_due = await _pre_pull(client, ref, spec, previous, status, settings, events, rescan=rescan_images)
    create = plan.create
    if spec.pre_pull is not None and status.pre_pull is not None and plan.create:
        waited = time.time() - parse_timestamp(status.start_time or now)
        if prepull_holds(status.pre_pull, spec.pre_pull.wait_sec, waited):
            create = []  # the children start once the images are in (or the wait is over): the next passes
            held = f"{len(plan.create)} children wait for their images (prePull.waitSec {spec.pre_pull.wait_sec})"
            status.pre_pull.message = f"{held}: {status.pre_pull.message}" if status.pre_pull.message else held
    await events.status(previous, status)
    for reason, message, warning in plan.events:
        await events.post(reason, message, warning=warning)
    for child, generation in plan.mark_replaced:  # after the status records what replaced them
        with contextlib.suppress(NotFound):
            await client.patch_episode(namespace, child, replaced_patch(generation))
    for child in plan.suspend:
        await _suspend_child(client, namespace, child, suspend=True)
    for child in plan.resume:
        await _suspend_child(client, namespace, child, suspend=False)
    if plan.suspend:
        await events.post("ChildrenSuspended", f"suspended {len(plan.suspend)} active children: {plan.suspend}")
    if plan.resume:
        await events.post("ChildrenResumed", f"resumed {len(plan.resume)} children: {plan.resume}")
    refusal = await _create_children(client, ref, spec, plan.status.tasks, create, events)
    if refusal is not None:
        await _finish_failed(plan.status, *refusal, events, when_idle=True)
    if plan.status.completion_time:
        return None
    return _next_pass(settings, pool_due=pool_due, prepull_due=prepull_due)


def _next_pass(settings: SetSettings, *, pool_due: bool, prepull_due: bool) -> float:
    """Seconds to the next pass: the resync, sooner while a pool fills or images are on their way (their pods
    are not watched)."""
    delay = settings.resync_sec
    if pool_due:
        delay = min(delay, settings.pool_poll_sec)
    if prepull_due:
        delay = min(delay, settings.prepull_poll_sec)
    return delay


async def _pre_pull(
    client: KubeClient,
    ref: OwnerRef,
    spec: EpisodeSetSpec,
    previous: EpisodeSetStatus,
    status: EpisodeSetStatus,
    settings: SetSettings,
    events: SetWriter,
    *,
    rescan: bool = False,
) -> tuple[EpisodeSetStatus, bool]:
    """The pre-pull after this pass (kube/prepull.py), and whether it still pulls (polled). A complete set, or
    one whose prePull was removed, has its DaemonSet deleted; its Events say when a pull fails and when all is in.
    ``rescan``: find the images from ``status.tasks`` again, not from the previous pre-pull."""
    if spec.pre_pull is None or status.completion_time:
        # The completing pass of a pre-pulling set releases it even when its last pass wrote no status of it.
        if previous.pre_pull is not None or (status.completion_time and spec.pre_pull is not None):
            await release_prepull(client, ref)
        return status.model_copy(update={"pre_pull": None}), False
    found = None if rescan else previous.pre_pull
    pulled = await reconcile_prepull(client, ref, spec, found, status.tasks, settings.prepull)
    before = previous.pre_pull
    newly = prepull_failing(pulled) - (prepull_failing(before) if before is not None else set())
    if newly:  # once per image that starts failing (its message changes with the kubelet's back-off)
        rows = [f"{row.image} {row.message}" for row in pulled.images if row.image in newly]
        await events.post("PrePullFailing", "; ".join(rows), warning=True)
    if prepull_done(pulled) and not (before is not None and prepull_done(before)):
        await events.post("PrePulled", f"{len(pulled.images)} images on every node ({pulled.ready})")
    return status.model_copy(update={"pre_pull": pulled}), not prepull_done(pulled)


async def _warm_pool(
    client: KubeClient,
    ref: OwnerRef,
    spec: EpisodeSetSpec,
    previous: EpisodeSetStatus,
    status: EpisodeSetStatus,
    settings: SetSettings,
    unfinished: Sequence[str] = (),
) -> tuple[EpisodeSetStatus, bool]:
    """The pool after this pass (kube/warm_pool.py), and whether it waits on pods to start (polled: its pods
    are not watched). A complete set, or one whose pool was removed, has its pool's pods deleted.
    ``unfinished``: the names of the set's children yet to finish."""
    if spec.warm_pool is None or status.completion_time:
        if previous.warm_pool is not None:
            await release_pool(client, ref)
        return status.model_copy(update={"warm_pool": None}), False
    # Children that may still claim a pod (before the dataset is resolved: as many as the target).
    remaining = spec.warm_pool.target if status.total is None else status.total - status.finished
    pool = await reconcile_pool(client, ref, spec, remaining=remaining, unfinished=unfinished, settings=settings.pool)
    return status.model_copy(update={"warm_pool": pool}), pool.ready < pool.target


# --- dataset --------------------------------------------------------------------------------------
async def _resolve(
    client: KubeClient,
    ref: OwnerRef,
    spec: EpisodeSetSpec,
    metadata: Mapping[str, Any],
    previous: EpisodeSetStatus,
    definition: str,
    settings: SetSettings,
    events: SetWriter,
) -> EpisodeSetStatus | float | None:
    """The status with the dataset recorded (written), a delay to wait, or None when the set failed."""
    if spec.suspend:
        status = previous.model_copy(
            update={"phase": "Pending", "reason": "Suspended", "message": "suspended (spec.suspend): not started"}
        )
        # The pool fills and the images are pulled while the set waits: its first children find them ready.
        status, pool_due = await _warm_pool(client, ref, spec, previous, status, settings)
        status, prepull_due = await _suspended_pre_pull(client, ref, spec, previous, status, settings, events)
        await events.status(previous, status)
        return _next_pass(settings, pool_due=pool_due, prepull_due=prepull_due)
    try:
        tasks = await resolve_dataset(client, ref.namespace, spec)
    except DatasetError as error:
        created = parse_timestamp(metadata.get("creationTimestamp") or precise_timestamp(time.time()))
        if error.waitable and time.time() - created < settings.source_wait_sec:
            status = previous.model_copy(
                update={"phase": "Pending", "reason": "WaitingForDataset", "message": f"waiting: {error}"}
            )
            await events.status(previous, status)
            return 2.0
        await _finish_failed(previous, "DatasetUnavailable", str(error), events)
        return None
    total = len(tasks) * spec.attempts
    too_large = _too_large(tasks, spec)
    if too_large is not None:
        await _finish_failed(previous, "DatasetTooLarge", too_large, events)
        return None
    now = precise_timestamp(time.time())
    status = previous.model_copy(
        update={
            "phase": "Running",
            "reason": None,
            "message": None,
            "tasks": tasks,
            "total": total,
            "progress": f"0/{total}",
            "definition": definition,
            "start_time": now,
        }
    )
    await events.status(previous, status)
    await events.post("DatasetResolved", f"{len(tasks)} tasks × {spec.attempts} attempts = {total} children")
    return status


async def _suspended_pre_pull(
    client: KubeClient,
    ref: OwnerRef,
    spec: EpisodeSetSpec,
    previous: EpisodeSetStatus,
    status: EpisodeSetStatus,
    settings: SetSettings,
    events: SetWriter,
) -> tuple[EpisodeSetStatus, bool]:
    """The pre-pull of a set not started yet: its images found from the dataset as it is now (read until they
    are found, then kept in the pre-pull's status), the dataset itself not recorded — the set resolves it
    when it starts. A dataset that cannot be resolved yet pulls nothing and says why."""
    tasks: list[SetTaskStatus] = []
    if spec.pre_pull is not None and not (previous.pre_pull is not None and previous.pre_pull.images):
        try:
            tasks = await resolve_dataset(client, ref.namespace, spec)
        except DatasetError as error:
            waiting = PrePullStatus(message=f"nothing pulled: the dataset cannot be resolved yet: {error}")
            return status.model_copy(update={"pre_pull": waiting}), error.waitable
        too_large = _too_large(tasks, spec)
        if too_large is not None:  # the set fails when it starts: its task folders are not read for it
            return status.model_copy(update={"pre_pull": PrePullStatus(message=f"nothing pulled: {too_large}")}), False
    pulled, due = await _pre_pull(
        client, ref, spec, previous, status.model_copy(update={"tasks": tasks}), settings, events
    )
    return status.model_copy(update={"pre_pull": pulled.pre_pull}), due


def _too_large(tasks: Sequence[SetTaskStatus], spec: EpisodeSetSpec) -> str | None:
    """Why a dataset makes more children than a set holds, if it does."""
    total = len(tasks) * spec.attempts
    if total <= MAX_CHILDREN:
        return None
    return (
        f"{len(tasks)} tasks × {spec.attempts} attempts = {total} children, more than a set holds "
        f"({MAX_CHILDREN}); split the dataset into several sets"
    )


async def resolve_dataset(client: KubeClient, namespace: str, spec: EpisodeSetSpec) -> list[SetTaskStatus]:
    """The dataset's tasks in order: the listed ones, then the selected ConfigMaps by task ID."""
    tasks: list[SetTaskStatus] = []
    where: dict[str, str] = {}

    def add(name: str, config_map: str | None, origin: str) -> None:
        if name in where:
            raise DatasetError(
                f"task ID {name!r} appears twice ({where[name]} and {origin}); task IDs are unique in a set"
            )
        where[name] = origin
        tasks.append(SetTaskStatus(index=len(tasks), name=name, config_map=config_map))

    for position, entry in enumerate(spec.dataset.tasks):
        origin = f"spec.dataset.tasks[{position}]"
        if entry.config_map is None:
            add(entry.name or f"inline-{position}", None, origin)
            continue
        reference = entry.config_map
        try:
            config_map = await client.get_config_map(namespace, reference.name)
        except NotFound:
            raise DatasetError(f"{origin}: configmap {namespace}/{reference.name} not found", waitable=True) from None
        except KubeError as error:
            if _refused(error):
                raise DatasetError(f"{origin}: {error}") from error
            raise
        if reference.key not in (config_map.binary_data or {}):
            raise DatasetError(
                f"{origin}: configmap {namespace}/{reference.name} has no binaryData key {reference.key!r}"
            )
        labels = config_map.metadata.labels or {}
        add(entry.name or labels.get(TASK_LABEL) or reference.name, reference.name, origin)

    if spec.dataset.selector is not None:
        selector = spec.dataset.selector.render()
        try:
            found = await client.list_config_maps(namespace, selector)
        except KubeError as error:
            if _refused(error):
                raise DatasetError(f"spec.dataset.selector {selector!r}: {error}") from error
            raise
        if not found:
            raise DatasetError(f"spec.dataset.selector {selector!r} matches no ConfigMap in {namespace}", waitable=True)
        selected = []
        for config_map in found:
            config_name = config_map.metadata.name
            if DEFAULT_TASK_ARCHIVE_KEY not in (config_map.binary_data or {}):
                raise DatasetError(
                    f"configmap {namespace}/{config_name} (spec.dataset.selector) is not a packed task: "
                    f"no binaryData key {DEFAULT_TASK_ARCHIVE_KEY!r}"
                )
            selected.append(((config_map.metadata.labels or {}).get(TASK_LABEL) or config_name, config_name))
        for task_name, config_name in sorted(selected):
            add(task_name, config_name, f"configmap {config_name}")
    if not tasks:
        raise DatasetError("the dataset has no tasks")
    return tasks


# --- children -------------------------------------------------------------------------------------
def _refused(error: KubeError) -> bool:
    """A request the API server will refuse again (bad request, invalid object), unlike 403/429/5xx."""
    return error.status in (400, 422)


def _owned_by(item: Mapping[str, Any], uid: str) -> bool:
    return any(owner.get("uid") == uid for owner in item["metadata"].get("ownerReferences") or [])


async def _owned_children(client: KubeClient, ref: OwnerRef) -> list[dict[str, Any]]:
    listed = await client.list_episodes(ref.namespace, set_selector(ref.name))
    return [item for item in listed if _owned_by(item, ref.uid)]


async def _create_children(
    client: KubeClient,
    ref: OwnerRef,
    spec: EpisodeSetSpec,
    tasks: Sequence[SetTaskStatus],
    slots: Sequence[tuple[int, int]],
    events: SetWriter,
) -> tuple[str, str] | None:
    """Create the children of ``slots``; (reason, message) when one cannot be created, ever."""
    by_index = {task.index: task for task in tasks}
    for index, attempt in slots:
        manifest = child_manifest(ref, spec, by_index[index], attempt, precise_timestamp(time.time()))
        name = manifest["metadata"]["name"]
        try:
            await client.create_episode(manifest)
        except KubeError as error:
            if not isinstance(error, Conflict):
                if _refused(error):
                    return "ChildRefused", f"the API server refuses child {name}: {error}"
                raise
            try:
                existing = await client.get_episode(ref.namespace, name)
            except NotFound:
                continue  # deleted in between: the next pass creates it
            if _owned_by(existing, ref.uid) or existing["metadata"].get("deletionTimestamp"):
                continue  # ours already, or a former set's child on its way out
            return (
                "NameConflict",
                f"episode {ref.namespace}/{name} exists and is not a child of this set; rename the set or delete it",
            )
        await events.post("ChildCreated", f"created episode {name} (task {by_index[index].name}, attempt {attempt})")
    return None


async def _suspend_child(client: KubeClient, namespace: str, name: str, *, suspend: bool) -> None:
    patch = {
        "spec": {"suspend": suspend},
        "metadata": {"annotations": {SUSPENDED_BY_SET_ANNOTATION: "true" if suspend else None}},
    }
    with contextlib.suppress(NotFound):
        await client.patch_episode(namespace, name, patch)


# --- status and events ----------------------------------------------------------------------------
async def _finish_failed(
    previous: EpisodeSetStatus,
    reason: str,
    message: str,
    events: SetWriter,
    *,
    when_idle: bool = False,
) -> None:
    """Mark the set Failed for good (complete at once unless ``when_idle`` and children are active)."""
    now = precise_timestamp(time.time())
    message = message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."
    status = previous.model_copy(update={"phase": "Failed", "reason": reason, "message": message})
    status.start_time = status.start_time or now
    if not (when_idle and status.active):
        status.completion_time = now
    await events.status(previous, status)
    await events.post(reason, message, warning=True)


@dataclass
class SetWriter:
    """What a pass writes: the set's status (fenced by the replica's claim) and its Events.

    An Event is named after its reason and message, which name the transition (the child
    created, the dataset resolved), so a pass repeated by another replica posts nothing twice.
    Losing an Event is logged, never fatal."""

    client: KubeClient
    ref: OwnerRef
    logger: logging.Logger
    claim: Claim | None = None

    async def status(self, previous: EpisodeSetStatus, status: EpisodeSetStatus) -> None:
        """Write the status if it changed (each write wakes the loop again)."""
        if status.to_api() == previous.to_api():
            return
        guard = None
        if self.claim is not None:
            self.claim.check()
            guard = self.claim.guard
        try:
            await self.client.replace_episodeset_status(self.ref.namespace, self.ref.name, status.to_api(), guard=guard)
        except NotFound as error:
            raise SetGone(str(error)) from error
        except KubeError as error:
            if error.status == 422 and self.claim is not None:
                await self.claim.confirm()  # the claim's precondition failed: Fenced
            raise

    async def post(self, reason: str, message: str, *, warning: bool = False) -> None:
        """Queue the Event (posted in the background, see :mod:`episode_operator.kube.event_recorder`), named
        for its occasion so that a second replica's driver does not post it again."""
        name = event_name(self.ref, reason, message)
        record_event(self.client, self.ref, reason, message, warning=warning, logger=self.logger, name=name)
