"""Pod manifests for an episode's sandboxes (pure builders, no API calls).

The agent pod: the task image as ``main`` with its own ENTRYPOINT kept and a keep-alive
as its arguments, every compose sidecar as another container reachable by its service
name (``hostAliases`` → 127.0.0.1), an ``emptyDir`` at ``/episode-operator`` of each container's
own for the supervisor and its jobs (main's records out of the sidecars' reach, and each sidecar's
writable by its own user), no service-account token, resources from ``[environment]``. A
verifier pod is the same shape with the verifier's image and environment and no sidecars. Both
are owned by the Episode, so deleting it deletes them.

**The verifier's capacity is the agent pod's** (docs/runtime.md, "Pods and capacity"): while a
separate turn that is not the last verifies, both pods live, so the agent pod reserves the
largest such verifier's requests (a ``verifier-reservation`` container that only sleeps) and
that verifier pod runs on the agent pod's node with its requests released to it (zero requests,
its own limits). A pod that holds capacity then never waits for more: separate verifiers can
never deadlock with agent pods holding what they need. The last turn's verifier starts after the
agent pod is gone (Gym) and asks for its own requests.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from episode_operator.api.models import KIND, EpisodeSpec
from episode_operator.api.vocabulary import (
    API_VERSION,
    ATTEMPT_LABEL,
    EPISODE_LABEL,
    MANAGED_BY,
    ROLE_LABEL,
    TURN_LABEL,
)
from episode_operator.capture.wire import KEY_ENV
from episode_operator.kube.objects.env import pod_entries
from episode_operator.runtime.agents.model import (
    CAPTURE_CONTAINER,
    CAPTURE_PORT,
    CAPTURE_STORE,
    Capture,
    SandboxNeeds,
    Toolchain,
)
from episode_operator.runtime.sandbox import KEEP_ALIVE
from episode_operator.runtime.supervisor import SUPERVISOR_DIR
from episode_operator.taskfolder.compose import Sidecar
from episode_operator.taskfolder.models import EnvironmentConfig
from episode_operator.taskfolder.plan import EpisodePlan, NetworkPolicy

SUPERVISOR_VOLUME = "episode-operator"
CAPTURE_VOLUME = "episode-operator-capture"
CAPTURE_SUPERVISOR_VOLUME = "episode-operator-capture-jobs"
NAME_LIMIT = 63
RESERVATION_CONTAINER = "verifier-reservation"


@dataclass(frozen=True)
class OwnerRef:
    """An Episode (or EpisodeSet), as the objects it owns and its events refer to it."""

    name: str
    namespace: str
    uid: str
    kind: str = KIND

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class AgentImages:
    """Where the images an agent pod may need beyond the task's come from (operator settings)."""

    # The operator's own image: it runs the capture proxy (``episode-operator capture-proxy``).
    capture: str | None = None
    # Toolchain images are ``<repository>/toolchain-<name>:<version>`` (hack/toolchain builds them).
    toolchain_repository: str = "episode-operator.local"

    def toolchain(self, toolchain: Toolchain) -> str:
        return f"{self.toolchain_repository}/toolchain-{toolchain.name}:{toolchain.version}"


@dataclass(frozen=True)
class SandboxPod:
    """What differs between the agent pod and a verifier pod."""

    role: str
    attempt: int
    image: str
    environment: EnvironmentConfig
    env: Mapping[str, str] = field(default_factory=dict)
    sidecars: Sequence[Sidecar] = ()
    turn: int | None = None
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    # The agent kind's additions (agent pod only): harness toolchains, the capture proxy.
    needs: SandboxNeeds = field(default_factory=SandboxNeeds)
    # The agent pod: what it reserves for its separate verifiers (verifier_reservation).
    reservation: Mapping[str, str] = field(default_factory=dict)
    # A verifier pod that uses the agent pod's reservation: on its node, its requests released.
    node_name: str | None = None


def short_name(base: str, suffix: str, limit: int = NAME_LIMIT) -> str:
    """``base-suffix`` as a DNS-1123 label of at most ``limit`` characters, unique by a hash when cut."""
    name = f"{base}-{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    keep = limit - len(suffix) - len(digest) - 2
    return f"{base[:keep].rstrip('-.')}-{digest}-{suffix}"


def label_value(value: str) -> str:
    """A label value (at most 63 characters) that still identifies ``value``."""
    if len(value) <= NAME_LIMIT:
        return value
    return f"{value[:54].rstrip('-._')}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def agent_pod_name(episode: str, attempt: int) -> str:
    return short_name(episode, f"a{attempt}")


def verifier_pod_name(episode: str, attempt: int, turn: int) -> str:
    return short_name(episode, f"a{attempt}-v{turn + 1}")


def episode_selector(episode: str) -> str:
    """The label selector of every pod of an Episode."""
    return f"{EPISODE_LABEL}={label_value(episode)}"


def resources_of(environment: EnvironmentConfig) -> dict[str, Any]:
    """Requests and limits from ``[environment]``: cpus, memory_mb, storage_mb, gpus."""
    quantities: dict[str, str] = {}
    if environment.cpus:
        quantities["cpu"] = str(environment.cpus)
    if environment.memory_mb:
        quantities["memory"] = f"{environment.memory_mb}Mi"
    if environment.storage_mb:
        quantities["ephemeral-storage"] = f"{environment.storage_mb}Mi"
    resources: dict[str, Any] = {}
    if quantities:
        resources = {"requests": dict(quantities), "limits": dict(quantities)}
    if environment.gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(environment.gpus)
    return resources


def verifier_reservation(plan: EpisodePlan) -> dict[str, str]:
    """What the agent pod reserves for the separate verifiers that run beside it: per resource, the
    largest request of a separate turn's verifier that is not the last (the last starts after the
    agent pod is gone). GPUs are not reserved: an extended resource cannot be requested by one pod
    and used by another."""
    largest: dict[str, str] = {}
    for turn in plan.turns[:-1]:
        environment = turn.verifier.environment
        if turn.verifier.mode != "separate" or environment is None:
            continue
        for name, quantity in (resources_of(environment).get("requests") or {}).items():
            if name not in largest or _magnitude(quantity) > _magnitude(largest[name]):
                largest[name] = quantity
    return largest


def released(resources: Mapping[str, Any]) -> dict[str, Any]:
    """``resources`` with zero requests (limits kept): a pod using capacity another pod reserved.
    Extended resources (GPUs) keep theirs: they cannot be overcommitted."""
    limits = dict(resources.get("limits") or {})
    requests = {name: "0" for name in (resources.get("requests") or {}) if "/" not in name}
    requests.update({name: value for name, value in limits.items() if "/" in name})
    return {"requests": requests, "limits": limits} if limits or requests else {}


def _magnitude(quantity: str) -> float:
    """A quantity as resources_of writes them (a CPU count, ``<n>Mi``) as a number to compare."""
    return float(quantity.removesuffix("Mi"))


def container_security(spec: EpisodeSpec) -> dict[str, Any]:
    """Every sandbox container: no privilege escalation unless asked, no raw sockets.

    The default capabilities otherwise stay: tasks run as root and install packages, and the
    supervisor switches users and changes the working directory's owner.
    """
    return {
        "allowPrivilegeEscalation": spec.security.allow_privilege_escalation,
        "capabilities": {"drop": ["NET_RAW"]},
    }


def _env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in env.items()]


def _sidecar_container(sidecar: Sidecar, task_image: str, spec: EpisodeSpec) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": sidecar.name,
        "image": sidecar.image or task_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env_list(sidecar.env),
        "volumeMounts": [{"name": _supervisor_volume(sidecar), "mountPath": SUPERVISOR_DIR}]
        + [
            {"name": _volume_name(volume.name), "mountPath": volume.mount_path, "readOnly": volume.read_only}
            for volume in sidecar.volumes
        ],
    }
    if sidecar.command is not None:
        container["command"] = sidecar.command
    if sidecar.args is not None:
        container["args"] = sidecar.args
    if sidecar.ports:
        container["ports"] = [{"containerPort": port} for port in sidecar.ports]
    if sidecar.working_dir:
        container["workingDir"] = sidecar.working_dir
    security: dict[str, Any] = container_security(spec)
    if sidecar.run_as_user is not None:
        security["runAsUser"] = sidecar.run_as_user
    if sidecar.run_as_group is not None:
        security["runAsGroup"] = sidecar.run_as_group
    container["securityContext"] = security
    if sidecar.resources:
        container["resources"] = sidecar.resources
    if sidecar.probe is not None:
        probe = sidecar.probe
        container["readinessProbe"] = {
            "exec": {"command": ["sh", "-c", probe.command]},
            "periodSeconds": max(1, math.ceil(probe.interval_sec)),
            "timeoutSeconds": max(1, math.ceil(probe.timeout_sec)),
            "failureThreshold": max(1, probe.retries),
            "initialDelaySeconds": math.ceil(probe.start_period_sec),
        }
    return container


def _reservation_container(pod: SandboxPod, spec: EpisodeSpec) -> dict[str, Any]:
    """A container that only holds the capacity the agent pod reserves for its separate verifiers."""
    return {
        "name": RESERVATION_CONTAINER,
        "image": pod.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(KEEP_ALIVE),
        "resources": {"requests": dict(pod.reservation), "limits": dict(pod.reservation)},
        "securityContext": container_security(spec),
    }


def _supervisor_volume(sidecar: Sidecar) -> str:
    """A sidecar's own supervisor folder."""
    return short_name("supervisor", re.sub(r"[^a-z0-9-]", "-", sidecar.name.lower()).strip("-") or "sidecar")


def _volume_name(compose_name: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]", "-", compose_name.lower()).strip("-") or "volume"
    return short_name("compose", cleaned)


def _toolchain_volume(toolchain: Toolchain) -> str:
    return short_name("toolchain", re.sub(r"[^a-z0-9-]", "-", toolchain.name.lower()))


def _toolchain_copier(toolchain: Toolchain, images: AgentImages, spec: EpisodeSpec) -> dict[str, Any]:
    """An init container copying a toolchain's tree into its volume (the image's own command does the copy)."""
    return {
        "name": _toolchain_volume(toolchain),
        "image": images.toolchain(toolchain),
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": [{"name": _toolchain_volume(toolchain), "mountPath": "/toolchain"}],
        "securityContext": container_security(spec),
    }


def _capture_container(capture: Capture, images: AgentImages, spec: EpisodeSpec) -> dict[str, Any]:
    """The capture proxy: the operator's image, the key from its Secret, its store mounted here only,
    the upstream's addresses pinned (the pod's /etc/hosts is the agent's), its resources and journal bounded."""
    assert images.capture is not None  # admission refuses a model endpoint without a capture image
    args = [
        "capture-proxy",
        "--listen",
        f"127.0.0.1:{CAPTURE_PORT}",
        "--upstream",
        capture.upstream,
        *(option for address in capture.upstream_addresses for option in ("--upstream-address", address)),
        "--store",
        CAPTURE_STORE,
        "--max-record-bytes",
        str(capture.bounds.max_record_bytes),
        "--max-journal-bytes",
        str(capture.bounds.max_journal_bytes),
    ]
    if capture.token_ids:
        args.append("--token-ids")
    container: dict[str, Any] = {
        "name": CAPTURE_CONTAINER,
        "image": images.capture,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [],
        # Its own supervisor folder, not the pod's shared one: the agent must not reach the jobs that
        # mark and read its turns (a planted job record would suppress a mark).
        "volumeMounts": [
            {"name": CAPTURE_VOLUME, "mountPath": CAPTURE_STORE},
            {"name": CAPTURE_SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR},
        ],
        "readinessProbe": {
            "exec": {"command": ["test", "-f", f"{CAPTURE_STORE}/ready.json"]},
            "periodSeconds": 1,
            "failureThreshold": 60,
        },
        "resources": {"requests": dict(capture.bounds.requests), "limits": dict(capture.bounds.limits)},
        "securityContext": container_security(spec),
    }
    if capture.secret is not None:
        reference = {"name": capture.secret.name, "key": capture.secret.key}
        container["env"].append({"name": KEY_ENV, "valueFrom": {"secretKeyRef": reference}})
    return container


def sandbox_pod(
    episode: OwnerRef,
    spec: EpisodeSpec,
    pod: SandboxPod,
    *,
    extra_labels: Mapping[str, str],
    images: AgentImages | None = None,
) -> dict[str, Any]:
    """The manifest of one sandbox pod of ``episode``."""
    name = (
        agent_pod_name(episode.name, pod.attempt)
        if pod.turn is None
        else verifier_pod_name(episode.name, pod.attempt, pod.turn)
    )
    labels = {
        **MANAGED_BY,
        **extra_labels,
        EPISODE_LABEL: label_value(episode.name),
        ATTEMPT_LABEL: str(pod.attempt),
        ROLE_LABEL: pod.role,
    }
    if pod.turn is not None:
        labels[TURN_LABEL] = str(pod.turn + 1)
    main: dict[str, Any] = {
        "name": "main",
        "image": pod.image,
        "imagePullPolicy": "IfNotPresent",
        "args": list(KEEP_ALIVE),
        "env": _env_list(pod.env),
        "volumeMounts": [{"name": SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR}],
        "securityContext": container_security(spec),
    }
    if pod.role == "agent":
        # Only the entries naming the pod itself: the agent's values go to its own jobs (kube/objects/env.py).
        main["env"] += pod_entries(spec.agent.env)
    if pod.environment.workdir:
        main["workingDir"] = pod.environment.workdir
    resources = spec.resources if spec.resources is not None and pod.role == "agent" else resources_of(pod.environment)
    if pod.node_name is not None:
        resources = released(resources)
    if resources:
        main["resources"] = resources
    volumes: list[dict[str, Any]] = [{"name": SUPERVISOR_VOLUME, "emptyDir": {}}]
    volumes += [{"name": _supervisor_volume(sidecar), "emptyDir": {}} for sidecar in pod.sidecars]
    for volume_name in sorted({volume.name for sidecar in pod.sidecars for volume in sidecar.volumes}):
        volumes.append({"name": _volume_name(volume_name), "emptyDir": {}})
    images = images or AgentImages()
    init_containers = [_toolchain_copier(toolchain, images, spec) for toolchain in pod.needs.toolchains]
    for toolchain in pod.needs.toolchains:
        # Read-only: the agent cannot alter its own harness mid-episode.
        main["volumeMounts"].append(
            {"name": _toolchain_volume(toolchain), "mountPath": toolchain.path, "readOnly": True}
        )
        volumes.append({"name": _toolchain_volume(toolchain), "emptyDir": {}})
    extra_containers = []
    if pod.needs.capture is not None:
        extra_containers.append(_capture_container(pod.needs.capture, images, spec))
        volumes += [{"name": CAPTURE_VOLUME, "emptyDir": {}}, {"name": CAPTURE_SUPERVISOR_VOLUME, "emptyDir": {}}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "containers": [
            main,
            *(_sidecar_container(sidecar, pod.image, spec) for sidecar in pod.sidecars),
            *extra_containers,
            *([_reservation_container(pod, spec)] if pod.reservation else []),
        ],
        "securityContext": {"seccompProfile": {"type": spec.security.seccomp_profile}},
        "volumes": volumes,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if pod.sidecars:
        pod_spec["hostAliases"] = [{"ip": "127.0.0.1", "hostnames": [sidecar.name for sidecar in pod.sidecars]}]
    if pod.node_name is not None:
        pod_spec["nodeName"] = pod.node_name
    if spec.node_selector:
        pod_spec["nodeSelector"] = spec.node_selector
    if spec.tolerations:
        pod_spec["tolerations"] = spec.tolerations
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = spec.image_pull_secrets
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": episode.namespace,
            "labels": labels,
            "ownerReferences": [episode.owner_reference()],
        },
        "spec": pod_spec,
    }
