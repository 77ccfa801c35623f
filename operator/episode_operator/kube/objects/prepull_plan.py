"""Pre-pull, without I/O: which images a set pre-pulls, its DaemonSet, what its pods say about each image,
and the preferred node affinity of a child's pod (docs/prepull.md).

One DaemonSet per EpisodeSet with ``spec.prePull``, owned by the set. Its pod runs every image as a container
of its own, so an image that cannot be pulled holds back no other (init containers run one after another: the
first failing pull would stop the rest). Images may have no shell, so an init container of the operator's own
image copies its static busybox into an ``emptyDir`` (as compose sidecars' fillers are lent it, kube/objects/pods.py)
and each image's container runs that busybox's ``sleep``: nothing of the image runs, it only has to be on the node.

Where an image is: a node whose DaemonSet pod has started the image's container (the kubelet records an
``imageID`` once the image is there). The DaemonSet's pods are namespaced, so the operator needs no permission
on Nodes (a cluster-scoped read), and they list every image, where ``node.status.images`` stops at the
kubelet's ``nodeStatusMaxImages`` (50 by default).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episode_operator.api.episodeset_resource import EpisodeSetSpec, PrePullImage, PrePullStatus
from episode_operator.api.vocabulary import MANAGED_BY, PREPULL_LABEL
from episode_operator.kube.objects.pods import COPIER_BUSYBOX, OwnerRef, label_value, short_name
from episode_operator.kube.objects.warm_pool_plan import pool_episode_spec

PREPULL_ROOT = "/episode-operator-prepull"
PREPULL_VOLUME = "episode-operator-prepull"
COPIER_CONTAINER = "episode-operator-copier"
# The annotation on the DaemonSet: the digest of its images (another digest: it is replaced).
IMAGES_ANNOTATION = f"{PREPULL_LABEL}-images"
# Each image's container sleeps as long as a 32-bit sleep may: it exists only for its image to stay pinned.
SLEEP = ("sleep", "2147483647")
# Per container: enough for a sleeping busybox; the scheduler counts them for every image.
REQUESTS = {"cpu": "1m", "memory": "4Mi"}
LIMITS = {"cpu": "10m", "memory": "16Mi"}
# Nobody: the busybox needs no user of the image's /etc/passwd.
NOBODY = 65534

# What a waiting container of the DaemonSet's pod says about its image, by the kubelet's reason.
PULL_STATES: Mapping[str, str] = {
    "ContainerCreating": "pulling",
    "PodInitializing": "pulling",
    "ErrImagePull": "failing",
    "ImagePullBackOff": "failing",
    "InvalidImageName": "failing",
    "ErrImageNeverPull": "failing",
    "CreateContainerError": "failing",
    "CreateContainerConfigError": "failing",
}
# The weight of a node holding the pod's main image, and of one holding another of its images (toolchains…).
MAIN_WEIGHT = 100
OTHER_WEIGHT = 10
MESSAGE_NODES = 3  # nodes named per image in a message
# The most images one pre-pull pod runs (a container each, on every node): a dataset of thousands of distinct
# images is not pulled onto every node whole (their disks); the rest are said in the status and pulled by their pods.
MAX_IMAGES = 64
# The node label a preferred term names nodes by. Not the field metadata.name: until Kubernetes 1.22 the scheduler
# scored preferred terms' matchExpressions only; the kubelet labels its node with its own name (--hostname-override).
HOSTNAME_LABEL = "kubernetes.io/hostname"


# --- which images -----------------------------------------------------------------------------------
def set_images(spec: EpisodeSetSpec, task_images: Iterable[str], agent_images: Iterable[str]) -> list[str]:
    """Every image the set pre-pulls, each once, sorted: its tasks' (as their children's pods name them), the
    agent's (toolchains, the capture proxy), the warm pool's and ``spec.prePull.images``."""
    assert spec.pre_pull is not None
    found = {*task_images, *agent_images, *spec.pre_pull.images}
    if spec.warm_pool is not None:
        found.add(spec.warm_pool.image)
    return sorted(image for image in found if image)


def images_digest(images: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(images).encode()).hexdigest()[:16]


# --- the DaemonSet ------------------------------------------------------------------------------------
def daemon_set_name(set_name: str) -> str:
    return short_name(set_name, "prepull")


def prepull_selector(set_name: str) -> str:
    return f"{PREPULL_LABEL}={label_value(set_name)}"


def image_container(index: int) -> str:
    return f"image-{index}"


def _security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NOBODY,
        "runAsGroup": NOBODY,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def prepull_daemon_set(owner: OwnerRef, spec: EpisodeSetSpec, images: Sequence[str], copier: str) -> dict[str, Any]:
    """The set's pre-pull DaemonSet: on the nodes its children may use (the template's node selector and
    tolerations), a pod with a container per image running the operator's lent busybox (``copier``: its image)."""
    labels = {**MANAGED_BY, PREPULL_LABEL: label_value(owner.name)}
    mount = {"name": PREPULL_VOLUME, "mountPath": PREPULL_ROOT, "readOnly": True}
    copier_container = {
        "name": COPIER_CONTAINER,
        "image": copier,
        "imagePullPolicy": "IfNotPresent",
        "command": [COPIER_BUSYBOX, "cp", COPIER_BUSYBOX, f"{PREPULL_ROOT}/busybox"],
        "volumeMounts": [{**mount, "readOnly": False}],
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "securityContext": _security(),
    }
    containers = [
        {
            "name": image_container(index),
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": [f"{PREPULL_ROOT}/busybox", *SLEEP],
            "volumeMounts": [mount],
            "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
            "securityContext": _security(),
        }
        for index, image in enumerate(images)
    ]
    template = pool_episode_spec(spec)  # a child's spec, as far as its pods depend on it
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [copier_container],
        "containers": containers,
        "volumes": [{"name": PREPULL_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
    }
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = list(template.tolerations)
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = list(template.image_pull_secrets)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemon_set_name(owner.name),
            "namespace": owner.namespace,
            "labels": labels,
            "annotations": {IMAGES_ANNOTATION: images_digest(images)},
            "ownerReferences": [owner.owner_reference()],
        },
        "spec": {
            "selector": {"matchLabels": {PREPULL_LABEL: label_value(owner.name)}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def current(daemon_set: Mapping[str, Any] | None, images: Sequence[str]) -> bool:
    """Whether an existing DaemonSet pulls exactly ``images`` (else it is replaced)."""
    if daemon_set is None:
        return False
    annotations = daemon_set.get("metadata", {}).get("annotations") or {}
    return bool(annotations.get(IMAGES_ANNOTATION) == images_digest(images))


# --- what its pods say -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageOnNode:
    image: str
    node: str
    state: str  # "present", "pulling", "failing", "waiting"
    reason: str | None = None
    message: str | None = None


def observed(pods: Iterable[Mapping[str, Any]]) -> list[ImageOnNode]:
    """Each image of each scheduled pre-pull pod: there (its container was made from it), pulling or failing."""
    seen: list[ImageOnNode] = []
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        by_name = {status.get("name"): status for status in (pod.get("status") or {}).get("containerStatuses") or []}
        for container in (pod.get("spec") or {}).get("containers") or []:
            status = by_name.get(container["name"]) or {}
            state = status.get("state") or {}
            waiting = state.get("waiting") or {}
            if status.get("imageID") or "running" in state or "terminated" in state:
                seen.append(ImageOnNode(container["image"], node, "present"))
            elif waiting:
                reason = waiting.get("reason")
                kind = PULL_STATES.get(reason or "", "waiting")
                seen.append(ImageOnNode(container["image"], node, kind, reason, waiting.get("message")))
            else:
                seen.append(ImageOnNode(container["image"], node, "waiting"))
    return seen


def nodes_holding(pods: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Image → the nodes that hold it, as the set's pre-pull pods show."""
    holding: dict[str, set[str]] = {}
    for entry in observed(pods):
        if entry.state == "present":
            holding.setdefault(entry.image, set()).add(entry.node)
    return holding


def _image_message(entries: Sequence[ImageOnNode]) -> str | None:
    failing = [entry for entry in entries if entry.state == "failing"]
    if failing:
        nodes = ", ".join(sorted({entry.node for entry in failing})[:MESSAGE_NODES])
        first = failing[0]
        why = f"{first.reason}: {first.message}" if first.message else str(first.reason)
        return f"cannot be pulled on {nodes}: {why}"
    pulling = sorted({entry.node for entry in entries if entry.state == "pulling"})
    if pulling:
        return f"pulling on {', '.join(pulling[:MESSAGE_NODES])}"
    return None


def unschedulable(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """What the scheduler says of a pre-pull pod it cannot place (e.g. the node's CPU all requested), if any."""
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") or pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message") or condition.get("reason") or "Unschedulable")
    return None


def progress(
    images: Sequence[str], daemon_set: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]
) -> PrePullStatus:
    """Per image, how many of the DaemonSet's nodes hold it, and why the others do not."""
    pods = list(pods)
    entries = observed(pods)
    scheduled = len({entry.node for entry in entries})
    desired = ((daemon_set or {}).get("status") or {}).get("desiredNumberScheduled")
    of = max(int(desired) if isinstance(desired, int) else 0, scheduled)
    rows = []
    for image in images:
        mine = [entry for entry in entries if entry.image == image]
        nodes = len({entry.node for entry in mine if entry.state == "present"})
        rows.append(PrePullImage(image=image, nodes=nodes, of=of, message=_image_message(mine)))
    complete = sum(1 for row in rows if row.of and row.nodes >= row.of)
    failed = [row for row in rows if failing(row)]
    unscheduled = unschedulable(pods)
    if unscheduled:
        message = f"the pre-pull pod is not scheduled: {unscheduled}"
        if failed:
            message += "; " + "; ".join(f"{row.image} {row.message}" for row in failed)
    elif failed:
        message = "; ".join(f"{row.image} {row.message}" for row in failed)
    elif daemon_set is not None and of == 0:
        message = "the pre-pull DaemonSet runs on no node yet (the template's nodeSelector and tolerations)"
    elif complete < len(rows):
        message = f"pulling {len(rows) - complete} of {len(rows)} images"
    else:
        message = None
    name = (daemon_set or {}).get("metadata", {}).get("name")
    return PrePullStatus(daemon_set=name, images=rows, ready=f"{complete}/{len(rows)}", message=message)


def done(status: PrePullStatus) -> bool:
    """Every image on every node of the DaemonSet (nothing left to look at until something changes)."""
    return bool(status.images) and all(row.of and row.nodes >= row.of for row in status.images)


def failing(row: PrePullImage) -> bool:
    return bool(row.message and row.message.startswith("cannot be pulled"))


def failing_images(status: PrePullStatus) -> set[str]:
    return {row.image for row in status.images if failing(row)}


def holds(status: PrePullStatus, wait_sec: float, waited_sec: float) -> bool:
    """Whether the set holds its children back: within ``wait_sec``, while an image is still on its way to a
    node (one whose pull fails holds nothing: the children start, and fail or pull on their own)."""
    if waited_sec >= wait_sec:
        return False
    return any(not (row.of and row.nodes >= row.of) and not failing(row) for row in status.images)


# --- the children's pods ------------------------------------------------------------------------------------
def pod_images(manifest: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The images of a pod manifest, each once, with whether it is the main container's (the first)."""
    spec = manifest.get("spec") or {}
    found: dict[str, bool] = {}
    for position, container in enumerate(spec.get("containers") or []):
        found.setdefault(container["image"], position == 0)
    for container in spec.get("initContainers") or []:
        found.setdefault(container["image"], False)
    return list(found.items())


def image_affinity(manifest: Mapping[str, Any], holding: Mapping[str, set[str]]) -> dict[str, Any]:
    """The manifest with a *preferred* node affinity to the nodes holding its images (its main image most);
    unchanged when no node holds any. Never required: a pod whose image is nowhere yet still runs."""
    terms = []
    for image, main in pod_images(manifest):
        nodes = sorted(holding.get(image) or ())
        if nodes:
            terms.append(
                {
                    "weight": MAIN_WEIGHT if main else OTHER_WEIGHT,
                    "preference": {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": nodes}]},
                }
            )
    if not terms:
        return dict(manifest)
    spec = dict(manifest["spec"])
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
        *(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []),
        *terms,
    ]
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity
    return {**manifest, "spec": spec}
