"""Warm pools, without I/O: the pool pod's manifest, its key, what makes a pod claimable, the claim
patch and the refill decision (docs/warm-pools.md).

A pool pod is an attempt's agent pod made before the attempt: :func:`pool_pod` builds it with
``sandbox_pod`` itself, from the set's template and agent and the pool's image and resources, then
gives it the pool's name, labels and owner (the EpisodeSet). Its *key* is the digest of its pod spec
(:func:`pod_key`); an attempt claims a pool pod only when the pod spec it would make hashes to the
same key. So nothing is configured at claim: a task whose pod would differ in any way (env, compose
sidecars or volumes, bound files, the capture proxy's upstream or settings, a verifier reservation, another image, other
resources or toolchains) never matches and gets a fresh pod.

A pod is claimable when every row of :data:`CLAIM_CHECKS` holds; the claim is one JSON patch guarded
by the pod's resourceVersion (:func:`claim_patch`): of concurrent claimers one wins, the others get
a conflict and try the next pod. After the claim the claimer probes the pod (:func:`fresh_after_claim`):
the PID its probe got must follow the mark's, and no process may have appeared since the mark.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episode_operator.api.episode_resource import EpisodeSpec, TaskSource
from episode_operator.api.episodeset_resource import EpisodeSetSpec, WarmPool, child_spec
from episode_operator.api.vocabulary import (
    ATTEMPT_LABEL,
    EPISODE_LABEL,
    FIELD_MANAGER,
    MANAGED_BY,
    POOL_CLAIMED_LABEL,
    POOL_KEY_LABEL,
    POOL_LABEL,
    POOL_MARK_ANNOTATION,
    POOL_PLACED_ANNOTATION,
    QUEUE_LABEL,
    ROLE_LABEL,
    parse_timestamp,
)
from episode_operator.kube.objects.pod_state import pod_verdict
from episode_operator.kube.objects.pods import (
    AgentImages,
    OwnerRef,
    SandboxPod,
    SandboxRequests,
    label_value,
    sandbox_pod,
    short_name,
)
from episode_operator.runtime import supervisor
from episode_operator.runtime.agents.model import SandboxNeeds
from episode_operator.runtime.limits import OutputLimits
from episode_operator.runtime.turn.context import SANDBOX_LAYOUT
from episode_operator.taskfolder.task_toml import EnvironmentConfig

KEY_LENGTH = 40
# The probe run in a pool pod's main container, once when it is marked and once by the claimer: the shell's
# own PID, then every PID alive. No command is forked: `echo` and the glob are the shell's own.
PROBE = ("sh", "-c", 'echo "$$"; for p in /proc/[0-9]*; do echo "${p#/proc/}"; done')
# What separates, in one exec's answer, the claimer's probe from the supervisor's placement run after it.
PLACED_AFTER = "--- placed ---"


def probed(placement: Sequence[str]) -> tuple[str, ...]:
    """The claimer's probe and then, in the same shell, the supervisor's placement (``sh -c SCRIPT NAME ARGS…``):
    one exec instead of two between the claim and the agent's first command. The probe reads the PIDs before the
    placement forks anything, so its answer is the one a probe of its own would give."""
    sh, flag, script, *args = placement
    if (sh, flag) != ("sh", "-c"):
        raise ValueError(f"the placement is not a shell script: {list(placement)[:2]}")
    return ("sh", "-c", f"{PROBE[2]}\necho '{PLACED_AFTER}'\n{script}", *args)


def split_probed(output: bytes) -> tuple[bytes, bytes | None]:
    """The probe's answer and the placement's (None: the placement did not start)."""
    probe_part, found, placed = output.partition(f"\n{PLACED_AFTER}\n".encode())
    return (probe_part, placed) if found else (output, None)


# Managed-fields entries the API server writes for others than the operator without anyone touching the pod:
# the kubelet's status, the scheduler's binding.
SYSTEM_SUBRESOURCES = frozenset({"status", "binding"})


# --- the pool's pod ---------------------------------------------------------------------------------
def pod_key(manifest: Mapping[str, Any]) -> str:
    """The digest of a pod manifest's spec: equal for the pool's pod and an attempt's that may claim it."""
    canonical = json.dumps(manifest["spec"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def pool_selector(set_name: str, key: str | None = None) -> str:
    selector = f"{POOL_LABEL}={label_value(set_name)}"
    return selector if key is None else f"{selector},{POOL_KEY_LABEL}={key}"


def pool_environment(pool: WarmPool) -> EnvironmentConfig:
    return EnvironmentConfig(cpus=pool.cpus, memory_mb=pool.memory_mb, storage_mb=pool.storage_mb, workdir=pool.workdir)


def pool_episode_spec(spec: EpisodeSetSpec) -> EpisodeSpec:
    """A child's spec as far as its pod depends on it (the task is not in the pod)."""
    return child_spec(spec, TaskSource.model_validate({"configMap": {"name": "warm-pool"}}), {})


def pool_pod(
    owner: OwnerRef,
    spec: EpisodeSetSpec,
    needs: SandboxNeeds,
    *,
    requests: SandboxRequests,
    images: AgentImages,
    suffix: str,
) -> dict[str, Any]:
    """A pool pod of the set ``owner``: the agent pod a child would get, under the pool's name, labels and owner."""
    assert spec.warm_pool is not None
    pod = SandboxPod(
        role="agent",
        attempt=0,
        image=spec.warm_pool.image,
        environment=pool_environment(spec.warm_pool),
        needs=needs,
        requests=requests,
    )
    manifest = sandbox_pod(owner, pool_episode_spec(spec), pod, extra_labels={}, images=images)
    key = pod_key(manifest)
    manifest["metadata"] = {
        "name": short_name(owner.name, f"pool-{suffix}"),
        "namespace": owner.namespace,
        # The set's Kueue queue too: a pool pod is admitted under the queue's quota as its children's pods are.
        "labels": {
            **MANAGED_BY,
            **({QUEUE_LABEL: spec.queue_name} if spec.queue_name else {}),
            POOL_LABEL: label_value(owner.name),
            POOL_KEY_LABEL: key,
        },
        "ownerReferences": [owner.owner_reference()],
    }
    return manifest


# --- freshness ----------------------------------------------------------------------------------------
# An exec costs the container runtime a few PIDs of the container's namespace (runc's set-up forks: 5 or 6 on the
# project's cluster); a stride outside 1..MAX_STRIDE is not a runtime's, and the pod is not marked.
MAX_STRIDE = 64
# How many probes mark a pod: the stride is the least PIDs one of them cost after the one before.
MARK_PROBES = 3


@dataclass(frozen=True)
class Probe:
    """What one probe saw: its own PID and the other PIDs alive."""

    pid: int
    alive: frozenset[int]

    @classmethod
    def read(cls, output: bytes) -> Probe | None:
        """The probe's answer read: its PID first, then every PID alive (its own among them)."""
        try:
            numbers = [int(line) for line in output.decode().split()]
        except (UnicodeDecodeError, ValueError):
            return None
        if not numbers:
            return None
        return cls(numbers[0], frozenset(numbers[1:]) - {numbers[0]})


@dataclass(frozen=True)
class Mark:
    """A pool pod's freshness mark: the last of MARK_PROBES probes run back to back, and the fewest PIDs one
    exec cost between them (``stride``)."""

    pid: int
    stride: int
    alive: frozenset[int]

    def annotation(self) -> str:
        return f"{self.pid}:{self.stride}:{','.join(str(p) for p in sorted(self.alive))}"

    @classmethod
    def parse(cls, text: str | None) -> Mark | None:
        parts = (text or "").split(":")
        if len(parts) != 3:
            return None
        try:
            mark = cls(int(parts[0]), int(parts[1]), frozenset(int(p) for p in parts[2].split(",") if p))
        except ValueError:
            return None
        return mark if 0 < mark.stride <= MAX_STRIDE else None

    @classmethod
    def of(cls, probes: Sequence[Probe]) -> Mark | None:
        """The mark of probes run back to back (None: they do not read as consecutive execs and nothing else)."""
        if len(probes) < 2:
            return None
        strides = [after.pid - before.pid for before, after in itertools.pairwise(probes)]
        if not all(0 < stride <= MAX_STRIDE for stride in strides):
            return None
        if any(probe.alive != probes[0].alive for probe in probes):
            return None
        return cls(probes[-1].pid, min(strides), probes[-1].alive)


def fresh_after_claim(mark: Mark, probe: Probe) -> str | None:
    """Why a claimed pod is not as its mark left it (None: nobody ran anything in it since).

    PIDs are handed out in order in the container's PID namespace, and an exec costs the runtime a few of them,
    about the same each time (runc: 5 or 6; the mark's stride is the fewest it saw). The claimer's probe alone
    takes about one stride; one more exec at least doubles that. So a probe more than one and a half strides
    past the mark's means something ran since (this holds while an exec's cost varies by less than a quarter);
    a process left behind would be alive now."""
    taken = probe.pid - mark.pid
    if not 0 < taken <= mark.stride + mark.stride // 2:
        return (
            f"its probe got PID {probe.pid}, {taken} after the mark's (an exec takes about {mark.stride}): "
            "something ran in it since it was marked"
        )
    appeared = probe.alive - mark.alive
    if appeared:
        return f"processes appeared since it was marked: {sorted(appeared)}"
    return None


def _status_only(entry: Mapping[str, Any]) -> bool:
    """A managed-fields entry of the status alone: the kubelet's (an API server before 1.22 names no subresource)."""
    if entry.get("subresource") in SYSTEM_SUBRESOURCES:
        return True
    return set((entry.get("fieldsV1") or {}).keys()) <= {"f:status"}


def touched_by(pod: Mapping[str, Any]) -> list[str]:
    """The field managers other than the operator that changed the pod (a label, an image…), outside status."""
    entries = (pod.get("metadata") or {}).get("managedFields") or []
    return sorted(
        {
            str(entry.get("manager"))
            for entry in entries
            if entry.get("manager") != FIELD_MANAGER and not _status_only(entry)
        }
    )


# --- claimability: one row per check, each a reason or None ----------------------------------------
@dataclass(frozen=True)
class Wanted:
    """What an attempt asks of a pool pod: its set's pool, its own pod's key and images."""

    set_name: str
    set_uid: str
    key: str
    images: Mapping[str, str]  # container name → image, init containers included


def container_images(pod: Mapping[str, Any]) -> dict[str, str]:
    spec = pod.get("spec") or {}
    return {
        str(c.get("name")): str(c.get("image"))
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    }


def _owner(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if [(o.get("kind"), o.get("uid"), o.get("controller")) for o in owners] != [("EpisodeSet", wanted.set_uid, True)]:
        return "not owned by the set alone"
    return None


def _labels(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(POOL_LABEL) != label_value(wanted.set_name) or labels.get(POOL_KEY_LABEL) != wanted.key:
        return "not of this pool and key"
    if EPISODE_LABEL in labels or ATTEMPT_LABEL in labels or ROLE_LABEL in labels:
        return "already an Episode's"
    return None


def _untouched(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    others = touched_by(pod)
    return f"changed by {', '.join(others)}" if others else None


def _marked(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return None if Mark.parse(annotations.get(POOL_MARK_ANNOTATION)) else "not marked fresh yet"


def _running(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    verdict = pod_verdict(pod)
    if not verdict.ready:
        return f"not ready: {verdict.message}"
    statuses = [*((pod.get("status") or {}).get("containerStatuses") or [])]
    if any(int(s.get("restartCount") or 0) for s in statuses):
        return "a container restarted"
    return None


def _images(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    return None if container_images(pod) == dict(wanted.images) else "its images are not the attempt's"


CLAIM_CHECKS: tuple[tuple[str, Callable[[Mapping[str, Any], Wanted], str | None]], ...] = (
    ("owner", _owner),
    ("labels", _labels),
    ("untouched", _untouched),
    ("marked", _marked),
    ("running", _running),
    ("images", _images),
)


def unclaimable(pod: Mapping[str, Any], wanted: Wanted) -> str | None:
    """The first check the pod fails, as ``check: why`` (None: claimable)."""
    for name, check in CLAIM_CHECKS:
        reason = check(pod, wanted)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def candidates(pods: Sequence[Mapping[str, Any]], wanted: Wanted) -> list[Mapping[str, Any]]:
    """The claimable pods, oldest first (by creation, then name)."""
    usable = [pod for pod in pods if unclaimable(pod, wanted) is None]
    return sorted(usable, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


def claim_patch(pod: Mapping[str, Any], labels: Mapping[str, str], owner: OwnerRef, set_name: str) -> list[Any]:
    """The JSON patch that hands ``pod`` to an attempt, applied only to the version the claimer checked."""
    metadata = pod["metadata"]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": metadata["resourceVersion"]},
        {"op": "replace", "path": "/metadata/labels", "value": {**labels, POOL_CLAIMED_LABEL: label_value(set_name)}},
        {"op": "replace", "path": "/metadata/ownerReferences", "value": [owner.owner_reference()]},
    ]


def claimed_selector(set_name: str) -> str:
    """The pods claimed from the set's pool that still exist."""
    return f"{POOL_CLAIMED_LABEL}={label_value(set_name)}"


def holding(claimed: Sequence[Mapping[str, Any]], unfinished: Collection[str]) -> int:
    """How many of the set's unfinished children (by name) hold a claimed pod not being deleted: each claims
    none until its attempt ends (a retry's claims again once that pod is going)."""
    names = {label_value(name) for name in unfinished}
    holders = set()
    for pod in claimed:
        metadata = pod.get("metadata") or {}
        episode = (metadata.get("labels") or {}).get(EPISODE_LABEL)
        if episode in names and not metadata.get("deletionTimestamp"):
            holders.add(episode)
    return len(holders)


def pool_placement(limits: OutputLimits = supervisor.DEFAULT_LIMITS) -> supervisor.Command:
    """The supervisor's placement in an agent pod, made alike by the pool before its mark and by a claimer after
    its claim (the same script and layout: what :func:`placed_at_mark` compares)."""
    return supervisor.placement(layout=SANDBOX_LAYOUT, limits=limits)


def placement_digest(command: supervisor.Command) -> str:
    """What identifies a supervisor placement: its script (stdin) and its arguments (the layout)."""
    identity = json.dumps(list(command.argv)).encode() + b"\0" + (command.stdin or b"")
    return hashlib.sha256(identity).hexdigest()[:KEY_LENGTH]


def placed_annotation(command: supervisor.Command, answer: bytes) -> str:
    """The annotation saying the supervisor was placed in the pool pod before its mark, and what it answered."""
    return json.dumps({"placement": placement_digest(command), "answer": answer.decode("utf-8", "replace")})


def placed_at_mark(pod: Mapping[str, Any], command: supervisor.Command) -> bytes | None:
    """The answer of the placement made in the pool pod before its mark, when it is this one (the same script and
    layout: the same operator); None: the claimer places it (another version placed it, or none did)."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(POOL_PLACED_ANNOTATION)
    try:
        placed = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(placed, dict) or placed.get("placement") != placement_digest(command):
        return None
    answer = placed.get("answer")
    return answer.encode() if isinstance(answer, str) else None


def mark_patch(pod: Mapping[str, Any], mark: Mark, placed: str | None = None) -> list[Any]:
    """The JSON patch that marks a running pool pod fresh, on the version the probe ran in (with ``placed``, the
    annotation of the supervisor's placement made before the mark)."""
    metadata = pod["metadata"]
    annotations = {**(metadata.get("annotations") or {}), POOL_MARK_ANNOTATION: mark.annotation()}
    if placed is not None:
        annotations[POOL_PLACED_ANNOTATION] = placed
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": metadata["resourceVersion"]},
        {"op": "replace", "path": "/metadata/annotations", "value": annotations},
    ]


# --- refill -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolPlan:
    """What one pass does to the pool: pods to make, to delete (with why), to mark, and the counts."""

    create: int
    delete: tuple[tuple[str, str], ...]
    mark: tuple[str, ...]
    target: int
    ready: int
    starting: int


def _stale(pod: Mapping[str, Any], key: str, now: float, max_age_sec: int) -> str | None:
    """Why a pool pod must go: another key (the spec changed), touched, lost, restarted or too old."""
    metadata = pod["metadata"]
    if (metadata.get("labels") or {}).get(POOL_KEY_LABEL) != key:
        return "made for another pod spec"
    others = touched_by(pod)
    if others:
        return f"changed by {', '.join(others)}"
    verdict = pod_verdict(pod)
    if verdict.lost:
        return verdict.message
    if any(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or []):
        return "a container restarted"
    created = metadata.get("creationTimestamp")
    if created and now - parse_timestamp(created) > max_age_sec:
        return f"older than {max_age_sec} s"
    return None


def plan_pool(pool: WarmPool, key: str, pods: Sequence[Mapping[str, Any]], *, remaining: int, now: float) -> PoolPlan:
    """The refill decision: keep ``min(target, remaining)`` pods ready, never more than the quota existing.

    ``pods``: the unclaimed pods of the pool (a claimed pod carries the attempt's labels, not the pool's);
    ``remaining``: children that may still claim one: not yet created, or unfinished and holding no claimed pod.
    """
    target = max(0, min(pool.target, remaining))
    delete: list[tuple[str, str]] = []
    mark: list[str] = []
    ready = starting = 0
    kept: list[Mapping[str, Any]] = []
    for pod in pods:
        metadata = pod["metadata"]
        if metadata.get("deletionTimestamp"):
            continue  # going: neither counted nor deleted again
        reason = _stale(pod, key, now, pool.max_age_sec)
        if reason is not None:
            delete.append((metadata["name"], reason))
            continue
        kept.append(pod)
    # Past the target (fewer children remain, the target went down): the youngest go first.
    kept.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
    for pod in kept[target:]:
        delete.append((pod["metadata"]["name"], "more pods than the pool's target"))
    for pod in kept[:target]:
        annotations = pod["metadata"].get("annotations") or {}
        if Mark.parse(annotations.get(POOL_MARK_ANNOTATION)) is not None:
            ready += 1
        else:
            starting += 1
            if pod_verdict(pod).ready:
                mark.append(pod["metadata"]["name"])
    existing = ready + starting
    going = sum(1 for pod in pods if pod["metadata"].get("deletionTimestamp")) + len(delete)
    room = max(0, pool.bound - existing - going)
    create = max(0, min(target - existing, room))
    return PoolPlan(create, tuple(delete), tuple(mark), target, ready, starting)
