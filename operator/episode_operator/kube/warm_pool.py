"""Warm pools, with I/O: the set's pass keeps its pool filled and marked; an attempt claims a pod from it.

The decisions are :mod:`episode_operator.kube.objects.warm_pool_plan`'s; this module lists, probes, patches,
creates and deletes (docs/warm-pools.md).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from episode_operator.api.episodeset_resource import EpisodeSetSpec, WarmPoolStatus
from episode_operator.api.vocabulary import POOL_KEY_LABEL, POOL_MARK_ANNOTATION
from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.pods import AgentImages, OwnerRef, SandboxRequests
from episode_operator.kube.objects.warm_pool_plan import (
    MARK_PROBES,
    PROBE,
    Mark,
    Probe,
    Wanted,
    candidates,
    claim_patch,
    claimed_selector,
    container_images,
    fresh_after_claim,
    holding,
    mark_patch,
    placed_annotation,
    placed_at_mark,
    plan_pool,
    pod_key,
    pool_placement,
    pool_pod,
    pool_selector,
    probed,
    split_probed,
)
from episode_operator.kube.upstream import HostResolver, Unresolvable, model_problem, pinned_needs, system_resolver
from episode_operator.runtime import supervisor
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.agents.model import CaptureBounds, SandboxNeeds
from episode_operator.runtime.limits import Spool
from episode_operator.runtime.sandbox_protocol import MAIN_CONTAINER

PROBE_BYTES = 64 * 1024
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolSettings:
    """The operator's settings a pool pod is built with: the same as an attempt's agent pod."""

    requests: SandboxRequests = field(default_factory=SandboxRequests)
    images: AgentImages = field(default_factory=AgentImages)
    capture_bounds: CaptureBounds = field(default_factory=CaptureBounds)
    resolve_host: HostResolver = system_resolver


async def probe(
    client: KubeClient, namespace: str, name: str, placement: supervisor.Command | None = None
) -> tuple[Probe | None, bytes | None]:
    """Run the probe once in the pod's main container (never retried: a retry would take a PID too); with
    ``placement``, the supervisor's placement after it in the same exec. What the probe saw, and the placement's
    answer (None: none asked, or it failed)."""
    argv = PROBE if placement is None else probed(placement.argv)
    bound = PROBE_BYTES + (placement.answer.stdout if placement is not None else 0)
    stdout = Spool(bound, "the pool probe's answer", "its bound")
    stderr = Spool(PROBE_BYTES, "the pool probe's stderr", "its bound")
    with stdout, stderr:
        try:
            code = await client.exec(
                namespace,
                name,
                MAIN_CONTAINER,
                argv,
                stdout=stdout,
                stderr=stderr,
                stdin=placement.stdin if placement is not None else None,
                timeout_sec=30.0,
                attempts=1,
            )
        except KubeError:
            return None, None
        seen, placed = split_probed(stdout.getvalue())
        if placement is None:
            return (Probe.read(seen) if code == 0 else None), None
        # A placement that failed is made again, on its own, by the sandbox (it says why then).
        return Probe.read(seen), (placed if code == 0 else None)


async def marked(client: KubeClient, namespace: str, name: str) -> Mark | None:
    """The pod's mark: probes back to back (how many PIDs an exec costs, and the last PID taken)."""
    probes: list[Probe] = []
    for _ in range(MARK_PROBES):
        answer, _ = await probe(client, namespace, name)
        if answer is None:
            return None
        probes.append(answer)
    return Mark.of(probes)


def _count(client: KubeClient, metric: str, *labels: str, value: float = 1.0, gauge: bool = False) -> None:
    metrics = getattr(client, "metrics", None)
    if metrics is None:
        return
    instrument = getattr(metrics, metric).labels(*labels)
    if gauge:
        instrument.set(value)
    else:
        instrument.inc(value)


async def pool_needs(
    client: KubeClient, namespace: str, spec: EpisodeSetSpec, settings: PoolSettings
) -> tuple[SandboxNeeds, str | None]:
    """What the set's agent adds to its pods, as an attempt's pod gets it (a capture proxy pinned to the same
    upstream, with the same settings), and why the pool makes no pods (None: it does)."""
    needs = agent_kind(spec.agent).sandbox_needs(spec.agent)
    problem = await model_problem(client, namespace, needs, settings.images)
    if problem is None:
        try:
            return await pinned_needs(client, namespace, needs, settings.capture_bounds, settings.resolve_host), None
        except Unresolvable as error:
            problem = str(error)
    # No pod is made; the key is that of the pod without its proxy.
    return replace(needs, capture=None), f"no pool pods: {problem}"


async def reconcile_pool(
    client: KubeClient,
    owner: OwnerRef,
    spec: EpisodeSetSpec,
    *,
    remaining: int,
    unfinished: Collection[str] = (),
    settings: PoolSettings,
) -> WarmPoolStatus:
    """One pass over the set's pool: delete stale pods, mark the running ones, make what the target lacks.

    ``remaining``: the set's children yet to finish (or to be made); those of them named in ``unfinished``
    that hold a claimed pod are not counted: a pool pod made for them would wait for no one."""
    pool = spec.warm_pool
    assert pool is not None
    needs, refusal = await pool_needs(client, owner.namespace, spec, settings)
    key = pod_key(pool_pod(owner, spec, needs, requests=settings.requests, images=settings.images, suffix="x"))
    pods = await client.list_pods(owner.namespace, pool_selector(owner.name))
    claimed = await client.list_pods(owner.namespace, claimed_selector(owner.name))
    claimers = 0 if refusal else max(0, remaining - holding(claimed, unfinished))
    plan = plan_pool(pool, key, pods, remaining=claimers, now=time.time())
    for name, reason in plan.delete:
        log.info("warm pool %s/%s: deleting %s: %s", owner.namespace, owner.name, name, reason)
        await client.delete_pod(owner.namespace, name)
    ready = plan.ready
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    placement = pool_placement() if plan.mark else None
    for name in plan.mark:
        assert placement is not None
        # The supervisor placed before the mark (its exec's PIDs are taken before it): a claimer placing the same
        # places nothing between its claim and its agent's first job. Not placed, the claimer places it.
        _, placed = await probe(client, owner.namespace, name, placement)
        mark = await marked(client, owner.namespace, name)
        if mark is None:
            continue
        annotation = placed_annotation(placement, placed) if placed else None
        with contextlib.suppress(Conflict, NotFound):
            await client.patch_pool_pod(owner.namespace, name, mark_patch(by_name[name], mark, annotation))
            ready += 1
    message = refusal
    for _ in range(plan.create):
        manifest = pool_pod(
            owner, spec, needs, requests=settings.requests, images=settings.images, suffix=secrets.token_hex(3)
        )
        try:
            await client.create_pool_pod(owner.namespace, manifest)
        except Conflict:
            continue  # the random name was taken: the next pass makes it
        except KubeError as error:
            if error.status not in (403, 422):  # refused (a ResourceQuota, a policy): said in the status
                raise
            message = f"cannot make a pool pod: {error}"
            break
    starting = plan.starting - (ready - plan.ready) + plan.create
    _count(client, "warm_pool_pods", owner.namespace, owner.name, "ready", value=ready, gauge=True)
    _count(client, "warm_pool_pods", owner.namespace, owner.name, "starting", value=starting, gauge=True)
    return WarmPoolStatus(
        target=plan.target, ready=ready, starting=starting, claimed=len(claimed), key=key, message=message
    )


async def release_pool(client: KubeClient, owner: OwnerRef) -> None:
    """Delete the pool's unclaimed pods (the set is complete: no child will claim them)."""
    for pod in await client.list_pods(owner.namespace, pool_selector(owner.name)):
        await client.delete_pod(owner.namespace, pod["metadata"]["name"])
    _count(client, "warm_pool_pods", owner.namespace, owner.name, "ready", value=0, gauge=True)
    _count(client, "warm_pool_pods", owner.namespace, owner.name, "starting", value=0, gauge=True)


@dataclass(frozen=True)
class PoolRef:
    """The set an Episode's attempts may claim a pool pod of: the Episode's controlling owner."""

    name: str
    uid: str


def pool_of(metadata: Mapping[str, Any], annotation: str) -> PoolRef | None:
    """The pool an Episode may claim from: its controlling EpisodeSet's, when the set marked it so."""
    if (metadata.get("annotations") or {}).get(annotation) != "true":
        return None
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == "EpisodeSet" and owner.get("controller"):
            return PoolRef(str(owner["name"]), str(owner["uid"]))
    return None


@dataclass(frozen=True)
class Claimed:
    """A claimed pool pod (as the claim's patch answered: running), and the answer of the supervisor's placement
    run with the claimer's probe (None: it was not, or failed)."""

    pod: dict[str, Any]
    placed: bytes | None = None


async def claim(
    client: KubeClient,
    episode: OwnerRef,
    pool: PoolRef,
    manifest: Mapping[str, Any],
    *,
    placement: supervisor.Command | None = None,
) -> Claimed | None:
    """A pool pod handed to the attempt whose fresh pod would be ``manifest`` (its labels, owner), or None.

    Each candidate is claimed by a patch guarded by its resourceVersion: a claimer that loses the race
    (409) goes on to the next. The winner probes the pod (with ``placement``, placing the supervisor in the
    same exec, after the probe, unless the pool placed this very placement before the mark): one that something
    ran in since its mark is deleted (it is the claimer's now) and the next tried; none left, the attempt makes
    a fresh pod.
    """
    wanted = Wanted(pool.name, pool.uid, pod_key(manifest), container_images(manifest))
    try:
        pods = await client.list_pods(episode.namespace, pool_selector(pool.name))
    except KubeError:
        return None
    if not any((pod["metadata"].get("labels") or {}).get(POOL_KEY_LABEL) == wanted.key for pod in pods) and pods:
        log.info(
            "episode %s/%s: its pod (key %s) is not the pool's (key %s): a fresh pod",
            episode.namespace,
            episode.name,
            wanted.key,
            (pods[0]["metadata"].get("labels") or {}).get(POOL_KEY_LABEL),
        )
    labels = manifest["metadata"]["labels"]
    for pod in candidates(pods, wanted):
        name = pod["metadata"]["name"]
        try:
            claimed = await client.patch_pool_pod(episode.namespace, name, claim_patch(pod, labels, episode, pool.name))
        except (Conflict, NotFound):
            _count(client, "warm_pool_claims", "lost_race")
            continue
        mark = Mark.parse((pod["metadata"].get("annotations") or {}).get(POOL_MARK_ANNOTATION))
        at_mark = placed_at_mark(pod, placement) if placement is not None else None
        seen, placed = await probe(client, episode.namespace, name, None if at_mark is not None else placement)
        placed = at_mark if at_mark is not None else placed
        reason = "its probe did not answer" if seen is None or mark is None else fresh_after_claim(mark, seen)
        if reason is not None:
            log.warning("pool pod %s/%s is not fresh, deleted: %s", episode.namespace, name, reason)
            _count(client, "warm_pool_claims", "stale")
            with contextlib.suppress(KubeError):
                await client.delete_pod(episode.namespace, name)
            continue
        _count(client, "warm_pool_claims", "claimed")
        return Claimed(claimed, placed)
    _count(client, "warm_pool_claims", "none")
    return None
