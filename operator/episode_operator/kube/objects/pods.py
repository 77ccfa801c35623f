"""Pod manifests for an episode's sandboxes (pure builders, no API calls).

The agent pod: the task image as ``main`` with its own ENTRYPOINT kept and a keep-alive
as its arguments, every compose sidecar as another container reachable by its service
name (``hostAliases`` → 127.0.0.1), an ``emptyDir`` at ``/episode-operator`` of each container's
own for the supervisor and its jobs (main's records out of the sidecars' reach, and each sidecar's
writable by its own user), no service-account token, resources from ``[environment]`` (its
CPUs requested as the operator's ``SandboxRequests`` say). A verifier pod is the same shape with
the verifier's image and environment; when Harbor's verifier environment is the task's
``environment/`` (``VerifierPlan.compose``), its compose file runs there too: the same sidecars and
compose volumes, new ones in the new pod, filled as the agent pod's are. Both are owned by the
Episode, so deleting it deletes them.

**Compose volumes** (docs/harbor-layout.md): a named or anonymous volume is one ``emptyDir``
(``compose-<name>``) that every service naming it mounts; the binds of ``environment/`` are paths of
one ``emptyDir`` (``episode-operator-binds``) holding the bound files, so binds of the same files share
what is written through them, as on Harbor's host. Before any container starts, an init container in
the task's image (``episode-operator-volumes``, as root) fills them as Docker would: it unpacks the bound
files from the ConfigMap the operator makes for them (:func:`environment_files_config_map`), and
gives each volume ``main`` mounts what Docker gives a new one — the image's content at the mount
path with that folder's owner and mode, or (``nocopy``, nothing there) an empty root's 0755 — and
Harbor's mode 0777 to one mounted at a folder of the sandbox's layout (``/logs/agent``…), which
Harbor's ``ensure_dirs`` gives it after ``compose up``. The task's image has ``sh`` and ``tar``
already: the supervisor needs both. A volume only sidecars name is filled from the image of the
first sidecar naming it, as Docker fills it from the first container mounting it; a sidecar's image
may have no shell, so the operator lends it one: an init container of the operator's own image
(``episode-operator-copier``) copies that image's static busybox into an ``emptyDir``, and an init
container of the sidecar's image (``episode-operator-volumes-<service>``) runs the same fill with it,
as root. Nothing of the sidecar's image runs: only the lent busybox, reading the image's files.

**The verifier's capacity is the agent pod's** (docs/runtime.md, "Pods that wait, and capacity"): while a
separate turn that is not the last verifies, both pods live, so the agent pod reserves the
largest such verifier's requests (a ``verifier-reservation`` container that only sleeps) and
that verifier pod runs on the agent pod's node with its requests released to it (zero requests,
its own limits; its sidecars' requests are counted and released with main's). A pod that holds
capacity then never waits for more: separate verifiers can never deadlock with agent pods holding
what they need. The last turn's verifier starts after the
agent pod is gone (Gym) and asks for its own requests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from episode_operator.api.episode_resource import KIND, EpisodeSpec
from episode_operator.api.vocabulary import (
    API_VERSION,
    ATTEMPT_LABEL,
    EPISODE_LABEL,
    MANAGED_BY,
    QUEUE_LABEL,
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
from episode_operator.runtime.sandbox_protocol import KEEP_ALIVE
from episode_operator.runtime.supervisor import SUPERVISOR_DIR
from episode_operator.runtime.turn.context import LOGS_VERIFIER, SANDBOX_LAYOUT
from episode_operator.taskfolder.compose import (
    BOUND_ARCHIVE_LIMIT,
    ENVIRONMENT,
    ComposeVolume,
    Sidecar,
    binds_of,
    sidecar_only_volumes,
)
from episode_operator.taskfolder.plan import EpisodePlan, NetworkPolicy, VerifierPlan
from episode_operator.taskfolder.task_toml import EnvironmentConfig

SUPERVISOR_VOLUME = "episode-operator"
CAPTURE_VOLUME = "episode-operator-capture"
CAPTURE_SUPERVISOR_VOLUME = "episode-operator-capture-jobs"
NAME_LIMIT = 63
RESERVATION_CONTAINER = "verifier-reservation"
# Compose volumes: the emptyDir of the bound files, the ConfigMap volume that brings them, its key,
# the init container that fills the volumes, and where it sees each of them. Named outside what the
# compose file names (its volumes are compose-<name>, its services' supervisor-<name>).
ENVIRONMENT_VOLUME = "episode-operator-binds"
ENVIRONMENT_FILES_VOLUME = "episode-operator-binds-files"
ENVIRONMENT_ARCHIVE_KEY = "environment.tar"
VOLUME_FILLER = "episode-operator-volumes"
FILLER_ROOT = "/episode-operator-init"
# The filler's arguments: the bound files' archive ('' for none) and their folder, then for each
# mount its path in the image, where the filler sees it, how it is filled (FILLS) and the mode it is
# then given ('-' to leave it).
FILL_SCRIPT = """set -eu
archive=$1 environment=$2
shift 2
if [ -n "$archive" ]; then
    tar -x -f "$archive" -C "$environment"
    chmod 0755 "$environment"
fi
while [ "$#" -ge 4 ]; do
    image_path=$1 seen=$2 fill=$3 mode=$4
    shift 4
    if [ "$fill" != keep ] && [ -z "$(ls -A "$seen")" ]; then
        if [ "$fill" = new ] || [ "$fill" = new-copy ]; then
            chown 0:0 "$seen"
            chmod 0755 "$seen"
        fi
        if [ "$fill" != new ] && [ -d "$image_path" ]; then
            # The folder's own owner and mode come with its content: "$image_path/." is the folder.
            cp -a "$image_path/." "$seen/"
        fi
    fi
    [ "$mode" = - ] || chmod "$mode" "$seen"
done
"""
# How FILL_SCRIPT fills a mount, by what Docker does when a container mounts a volume: the first
# mount of a volume makes it new (root's 0755) and, unless `nocopy`, copies in what the image has at
# the path; a later mount copies only into a volume still empty (Docker copies whenever a container
# mounts an empty volume). A bind is filled from the archive.
FILLS = {
    # (first mount of the volume, copies the image's content) -> fill
    (True, True): "new-copy",
    (True, False): "new",
    (False, True): "copy",
    (False, False): "keep",
}
BIND_FILL = "keep"
# The folders Harbor's ensure_dirs makes 0777 after `compose up`, whatever is mounted there: the
# writable automatic mount targets of the environment (base.py __init__: the agent's three;
# trial.py _verifier_env_mounts: a separate verifier's /logs/verifier only). It runs in main only.
ENSURED_DIRS = {"agent": SANDBOX_LAYOUT, "verifier": (LOGS_VERIFIER,)}
# The copier a sidecar's image is lent (module docstring): the init container and volume, where the
# fillers see it, and where the operator's own image has its static busybox (Debian's busybox-static).
COPIER = "episode-operator-copier"
COPIER_ROOT = "/episode-operator-copier"
COPIER_BUSYBOX = "/bin/busybox"
# Copies the busybox, with a link per applet beside it: the fill runs with them alone on its PATH.
COPIER_INSTALL = 'set -eu\ncp "$1" "$2/busybox"\n"$2/busybox" --install -s "$2"\n'


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

    # The operator's own image: it runs the capture proxy (``episode-operator capture-proxy``), and
    # lends its static busybox (COPIER_BUSYBOX) to fill the compose volumes only sidecars mount.
    capture: str | None = None
    # Toolchain images are ``<repository>/toolchain-<name>:<version>`` (hack/toolchain builds them).
    toolchain_repository: str = "episode-operator.local"

    def toolchain(self, toolchain: Toolchain) -> str:
        return f"{self.toolchain_repository}/toolchain-{toolchain.name}:{toolchain.version}"


@dataclass(frozen=True)
class SandboxRequests:
    """How much of what ``[environment]`` limits a sandbox pod asks the scheduler for
    (``episode-operator run --cpu-request-fraction``, Helm ``cpuRequestFraction``).

    Harbor's ``cpus`` is Docker's ``--cpus``: a CFS quota that caps a container and reserves
    nothing. By default a pod requests what it is limited to, so a node holds as many ``cpus = 1``
    sandboxes as it has CPUs, however idle they are; sandboxes that mostly wait (on a model, a
    download) fit many times over when each requests a fraction of its CPUs, each still capped at
    all of them. Memory, storage and GPUs are requested in full: a pod using more memory than it
    requested is the first the kubelet evicts, and extended resources cannot be overcommitted.
    """

    cpu_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.cpu_fraction <= 1:
            raise ValueError(f"a CPU request fraction is above 0 and at most 1, not {self.cpu_fraction}")

    def cpu(self, cpus: int) -> str:
        """The CPU request of a pod limited to ``cpus``: whole CPUs as written, a share in millicores (1m at least)."""
        if self.cpu_fraction == 1:
            return str(cpus)
        return f"{max(1, round(cpus * self.cpu_fraction * 1000))}m"


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
    # How much of its limits the pod requests (an operator setting).
    requests: SandboxRequests = field(default_factory=SandboxRequests)
    # The agent pod: main's compose volumes, and the ConfigMap holding the files the binds name.
    volumes: Sequence[ComposeVolume] = ()
    environment_files: str | None = None


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


def resources_of(environment: EnvironmentConfig, requests: SandboxRequests) -> dict[str, Any]:
    """Limits from ``[environment]`` (cpus, memory_mb, storage_mb, gpus) and what ``requests`` asks of them."""
    limits: dict[str, str] = {}
    if environment.cpus:
        limits["cpu"] = str(environment.cpus)
    if environment.memory_mb:
        limits["memory"] = f"{environment.memory_mb}Mi"
    if environment.storage_mb:
        limits["ephemeral-storage"] = f"{environment.storage_mb}Mi"
    resources: dict[str, Any] = {}
    if limits:
        asked = dict(limits)
        if environment.cpus:
            asked["cpu"] = requests.cpu(environment.cpus)
        resources = {"requests": asked, "limits": dict(limits)}
    if environment.gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(environment.gpus)
    return resources


def verifier_requests(verifier: VerifierPlan, sidecars: Sequence[Sidecar], requests: SandboxRequests) -> dict[str, str]:
    """What a separate verifier's pod asks the scheduler for (``requests`` making main's): its main
    container's requests and, when the task's compose services run beside it, theirs."""
    if verifier.mode != "separate" or verifier.environment is None:
        return {}
    asked = [resources_of(verifier.environment, requests).get("requests") or {}]
    if verifier.compose:
        asked += [sidecar_requests(sidecar.resources) for sidecar in sidecars]
    total: dict[str, float] = {}
    for container in asked:
        for name, quantity in container.items():
            total[name] = total.get(name, 0.0) + _magnitude(quantity)
    return {name: _quantity(name, magnitude) for name, magnitude in total.items()}


def sidecar_requests(resources: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """A container's requests as Kubernetes makes them: its limits where it names no request."""
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def verifier_reservation(plan: EpisodePlan, requests: SandboxRequests) -> dict[str, str]:
    """What the agent pod reserves for the separate verifiers that run beside it: per resource, the
    largest request (:func:`verifier_requests`) of a separate turn's verifier pod that is not the last
    (the last starts after the agent pod is gone). GPUs are not reserved: an extended resource
    cannot be requested by one pod and used by another."""
    largest: dict[str, str] = {}
    for turn in plan.turns[:-1]:
        for name, quantity in verifier_requests(turn.verifier, plan.sidecars, requests).items():
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


# The suffixes resources_of writes quantities with (millicores, mebibytes), as multiples of their unit.
SUFFIXES = {"m": 0.001, "Mi": 1.0}


def _magnitude(quantity: str) -> float:
    """A quantity as resources_of and the compose reader write them (a CPU count, ``<n>m``, ``<n>Mi``)
    as a number to compare and add."""
    for suffix, scale in SUFFIXES.items():
        if quantity.endswith(suffix):
            return float(quantity.removesuffix(suffix)) * scale
    return float(quantity)


def _quantity(name: str, magnitude: float) -> str:
    """A sum of :func:`_magnitude` back as a quantity, as resources_of writes them: whole CPUs as a
    count, else millicores; the rest in mebibytes."""
    if name != "cpu":
        return f"{math.ceil(magnitude)}Mi"
    return str(int(magnitude)) if magnitude.is_integer() else f"{round(magnitude * 1000)}m"


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


def _sidecar_container(sidecar: Sidecar, task_image: str, spec: EpisodeSpec, *, release: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": sidecar.name,
        "image": sidecar.image or task_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env_list(sidecar.env),
        "volumeMounts": [
            {"name": _supervisor_volume(sidecar), "mountPath": SUPERVISOR_DIR},
            *_compose_mounts(sidecar.volumes),
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
        # In a verifier pod on the agent pod's reserved capacity, its requests are released as main's are.
        limits = dict(sidecar.resources.get("limits") or {})
        asked = {"requests": sidecar_requests(sidecar.resources), "limits": limits}
        container["resources"] = released(asked) if release else sidecar.resources
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


def _bound_path(volume: ComposeVolume) -> str:
    """Where a bind's files are in the bound files' folder ('' for the whole of environment/)."""
    return posixpath.relpath(volume.name, ENVIRONMENT).removeprefix(".")


def _compose_mounts(volumes: Sequence[ComposeVolume]) -> list[dict[str, Any]]:
    """A container's mounts of its compose volumes: a volume's emptyDir, or its path of the bound files'."""
    mounts: list[dict[str, Any]] = []
    for volume in volumes:
        mount: dict[str, Any] = {"mountPath": volume.mount_path, "readOnly": volume.read_only}
        if volume.kind == "bind":
            mount["name"] = ENVIRONMENT_VOLUME
            if _bound_path(volume):
                mount["subPath"] = _bound_path(volume)
        else:
            mount["name"] = _volume_name(volume.name)
        mounts.append(mount)
    return mounts


def _compose_pod_volumes(pod: SandboxPod) -> list[dict[str, Any]]:
    """The pod's volumes for its services' compose volumes: one emptyDir per volume name, one for the
    bound files, and the ConfigMap that brings those."""
    every = [*pod.volumes, *(volume for sidecar in pod.sidecars for volume in sidecar.volumes)]
    names = sorted({volume.name for volume in every if volume.kind == "volume"})
    volumes: list[dict[str, Any]] = [{"name": _volume_name(name), "emptyDir": {}} for name in names]
    if any(volume.kind == "bind" for volume in every):
        volumes.append({"name": ENVIRONMENT_VOLUME, "emptyDir": {}})
    if pod.environment_files is not None:
        volumes.append({"name": ENVIRONMENT_FILES_VOLUME, "configMap": {"name": pod.environment_files}})
    return volumes


def _volume_filler(pod: SandboxPod, spec: EpisodeSpec) -> dict[str, Any] | None:
    """The init container filling the compose volumes before any container starts (module docstring);
    None when there is nothing to fill."""
    binds = bool(binds_of(pod.volumes, pod.sidecars))
    if binds and pod.environment_files is None:
        raise ValueError("the pod's compose binds need the ConfigMap of their files")
    if not binds and not any(volume.kind == "volume" for volume in pod.volumes):
        return None
    seen_environment = f"{FILLER_ROOT}/environment"
    mounts: dict[str, dict[str, Any]] = {}
    arguments = [f"{FILLER_ROOT}/input/{ENVIRONMENT_ARCHIVE_KEY}" if binds else "", seen_environment]
    if binds:
        mounts[ENVIRONMENT_FILES_VOLUME] = {
            "name": ENVIRONMENT_FILES_VOLUME,
            "mountPath": f"{FILLER_ROOT}/input",
            "readOnly": True,
        }
        mounts[ENVIRONMENT_VOLUME] = {"name": ENVIRONMENT_VOLUME, "mountPath": seen_environment}
    filled: set[str] = set()
    for volume in pod.volumes:
        # Harbor's ensure_dirs makes whatever is mounted at such a folder 0777 after `compose up`.
        mode = "0777" if volume.mount_path in ENSURED_DIRS[pod.role] else "-"
        if volume.kind == "bind":
            arguments += [volume.mount_path, posixpath.join(seen_environment, _bound_path(volume)), BIND_FILL, mode]
            continue
        arguments += [*_fill_arguments(volume, filled, mounts), mode]
    return {
        "name": VOLUME_FILLER,
        "image": pod.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", FILL_SCRIPT, VOLUME_FILLER, *arguments],
        "volumeMounts": list(mounts.values()),
        # As root whatever the image's USER: it copies the image's files with their owners, as Docker does.
        "securityContext": {**container_security(spec), "runAsUser": 0, "runAsGroup": 0},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _fill_arguments(volume: ComposeVolume, filled: set[str], mounts: dict[str, dict[str, Any]]) -> list[str]:
    """A volume mount's path in the image, where the filler sees it and how it is filled (FILLS); the
    filler's mount of the volume added to ``mounts``, its name to ``filled``."""
    name = _volume_name(volume.name)
    seen = f"{FILLER_ROOT}/volumes/{name}"
    mounts[name] = {"name": name, "mountPath": seen}
    fill = FILLS[(volume.name not in filled, volume.copy_image_content)]
    filled.add(volume.name)
    return [volume.mount_path, seen, fill]


def _sidecar_fillers(pod: SandboxPod, spec: EpisodeSpec, images: AgentImages) -> list[dict[str, Any]]:
    """The init containers filling the volumes only sidecars mount, each sidecar's from its own image
    with the operator's lent busybox (module docstring), the copier that lends it first; none when
    there are no such volumes."""
    volumes = sidecar_only_volumes(pod.volumes, pod.sidecars)
    if not volumes:
        return []
    if images.capture is None:
        raise ValueError("the pod's sidecar-only volumes need the operator's own image to lend its copier")
    copier_mount = {"name": COPIER, "mountPath": COPIER_ROOT}
    root = {**container_security(spec), "runAsUser": 0, "runAsGroup": 0}
    containers: list[dict[str, Any]] = [
        {
            "name": COPIER,
            "image": images.capture,
            "imagePullPolicy": "IfNotPresent",
            "command": [COPIER_BUSYBOX, "sh", "-c", COPIER_INSTALL, COPIER, COPIER_BUSYBOX, COPIER_ROOT],
            "volumeMounts": [copier_mount],
            "securityContext": container_security(spec),
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    filled: set[str] = set()
    for sidecar in pod.sidecars:
        mine = sidecar_only_volumes(pod.volumes, [sidecar])
        if not mine:
            continue
        mounts: dict[str, dict[str, Any]] = {}
        # No layout folder is ensured in a sidecar: Harbor's ensure_dirs runs in main.
        arguments = [argument for volume in mine for argument in (*_fill_arguments(volume, filled, mounts), "-")]
        containers.append(
            {
                "name": _sidecar_filler_name(sidecar),
                "image": sidecar.image or pod.image,
                "imagePullPolicy": "IfNotPresent",
                "command": [f"{COPIER_ROOT}/sh", "-c", FILL_SCRIPT, VOLUME_FILLER, "", "", *arguments],
                "env": [{"name": "PATH", "value": COPIER_ROOT}],
                "volumeMounts": [{**copier_mount, "readOnly": True}, *mounts.values()],
                # As root whatever the image's USER: it copies the image's files with their owners, as Docker does.
                "securityContext": root,
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        )
    return containers


def _sidecar_filler_name(sidecar: Sidecar) -> str:
    """``episode-operator-volumes-<service>``, a container name (a DNS label) unique by a hash when cut."""
    cleaned = re.sub(r"[^a-z0-9-]", "-", sidecar.name.lower()).strip("-") or "sidecar"
    name = f"{VOLUME_FILLER}-{cleaned}"
    if len(name) <= NAME_LIMIT:
        return name
    return f"{VOLUME_FILLER}-{hashlib.sha256(sidecar.name.encode()).hexdigest()[:8]}"


def environment_files_config_map(episode: OwnerRef, archive: bytes) -> dict[str, Any]:
    """The ConfigMap bringing the files the compose binds name into the agent pod (the volume filler
    unpacks it), owned by the Episode and named by its content."""
    if len(archive) > BOUND_ARCHIVE_LIMIT:
        raise ValueError(f"the bound files' archive is {len(archive)} bytes; admission allows {BOUND_ARCHIVE_LIMIT}")
    digest = hashlib.sha256(archive).hexdigest()[:12]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": short_name(episode.name, f"env-{digest}"),
            "namespace": episode.namespace,
            "labels": {**MANAGED_BY, EPISODE_LABEL: label_value(episode.name)},
            "ownerReferences": [episode.owner_reference()],
        },
        "binaryData": {ENVIRONMENT_ARCHIVE_KEY: base64.b64encode(archive).decode()},
    }


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
    if capture.params:
        args += ["--params", json.dumps(dict(capture.params), sort_keys=True, separators=(",", ":"))]
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
        "volumeMounts": [{"name": SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR}, *_compose_mounts(pod.volumes)],
        "securityContext": container_security(spec),
    }
    if pod.role == "agent":
        # Only the entries naming the pod itself: the agent's values go to its own jobs (kube/objects/env.py).
        main["env"] += pod_entries(spec.agent.env)
    if pod.environment.workdir:
        main["workingDir"] = pod.environment.workdir
    resources = (
        spec.resources
        if spec.resources is not None and pod.role == "agent"
        else resources_of(pod.environment, pod.requests)
    )
    # A verifier pod on the agent pod's node runs on the capacity it reserved: its requests released.
    released_requests = pod.node_name is not None
    if released_requests:
        resources = released(resources)
    if resources:
        main["resources"] = resources
    volumes: list[dict[str, Any]] = [{"name": SUPERVISOR_VOLUME, "emptyDir": {}}]
    volumes += [{"name": _supervisor_volume(sidecar), "emptyDir": {}} for sidecar in pod.sidecars]
    volumes += _compose_pod_volumes(pod)
    images = images or AgentImages()
    filler = _volume_filler(pod, spec)
    sidecar_fillers = _sidecar_fillers(pod, spec, images)
    if sidecar_fillers:
        volumes.append({"name": COPIER, "emptyDir": {}})
    init_containers = [
        *([filler] if filler else []),
        *sidecar_fillers,
        *(_toolchain_copier(t, images, spec) for t in pod.needs.toolchains),
    ]
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
            *(_sidecar_container(sidecar, pod.image, spec, release=released_requests) for sidecar in pod.sidecars),
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


def queue_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels of an Episode its pods carry too (Kueue's queue name)."""
    return {QUEUE_LABEL: labels[QUEUE_LABEL]} if QUEUE_LABEL in labels else {}
