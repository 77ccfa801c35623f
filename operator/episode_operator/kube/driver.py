"""From an Episode object to a finished episode: read the task, admit it, run it.

The driver is what the operator runs for each active Episode (a kopf daemon calls
:func:`drive_episode`). It reads the task source (the only I/O before the run) and hands
the spec and the files to admission (``runtime/admission.py``), which refuses everything
that can be refused before any pod exists; a refusal ends the Episode ``Failed`` with a
message naming the cause — never a crash loop. Then
:class:`~episode_operator.runtime.episode.EpisodeRunner` takes over.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeStatus, TaskSource
from episode_operator.api.vocabulary import (
    FAILURE_SEED,
    FAILURE_TASK_SOURCE,
    SET_LABEL,
    is_terminal,
)
from episode_operator.kube.builds import BuildCoordinator
from episode_operator.kube.client import Guard, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.env import AgentEnv, Sources, referenced, resolve_agent_env, secret_data
from episode_operator.kube.objects.pods import AgentImages, OwnerRef, SandboxRequests, episode_selector
from episode_operator.kube.regrade_driver import drive_regrade
from episode_operator.kube.replicas import Claim
from episode_operator.kube.running import episode_provider, runner_config
from episode_operator.kube.status import KubeStatusSink, refuse
from episode_operator.kube.tombstone_configmaps import answer_from_tombstone
from episode_operator.kube.upstream import HostResolver, Unresolvable, model_problem, pinned_needs, system_resolver
from episode_operator.runtime.admission import Refusal, admit_spec, admit_task
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.agents.model import CaptureBounds
from episode_operator.runtime.episode import EpisodeObserver, EpisodeRunner
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.fencing import FencedProvider
from episode_operator.runtime.limits import OutputLimits
from episode_operator.runtime.oci_tasks import ArtifactMissing, TaskArtifacts, TaskArtifactSettings
from episode_operator.runtime.sandbox_images import ImagePolicy
from episode_operator.runtime.timing import DEFAULT_TIMING, Timing
from episode_operator.runtime.wakeups import Wakeups
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.image_refs import ImageMirrors
from episode_operator.taskfolder.oci_artifact import ArtifactError


@dataclass(frozen=True)
class DriverSettings:
    """Operator-wide settings the driver needs."""

    # Where logs and artifacts are kept (runtime/episode_store.py): the data directory or a bucket.
    store: BlobStore
    # How long pulls, unschedulable pods, missing task sources and job polls are waited for.
    timing: Timing = DEFAULT_TIMING
    extra_pod_labels: Mapping[str, str] = field(default_factory=dict)
    # Woken by the pod watch (handlers.py): a starting pod is read when it changes.
    pod_wakeups: Wakeups | None = None
    # The images of harness toolchains and of the capture proxy (the operator's own image).
    agent_images: AgentImages = field(default_factory=AgentImages)
    # How much of [environment]'s limits sandbox pods request (--cpu-request-fraction).
    sandbox_requests: SandboxRequests = field(default_factory=SandboxRequests)
    # Where images are pulled from (--image-mirror): every image an Episode names.
    image_mirrors: ImageMirrors = field(default_factory=ImageMirrors)
    # In-cluster builds (--build-registry); None: Dockerfiles replay cannot apply are refused.
    builds: BuildCoordinator | None = None
    # Every capture container's resources and journal bounds (--capture-*).
    capture_bounds: CaptureBounds = field(default_factory=CaptureBounds)
    # How a model endpoint's hostname that is no Service is resolved (kube/upstream.py).
    resolve_host: HostResolver = system_resolver
    # What a sandbox's answers and a turn's artifacts may hold (--answer-limit …: runtime/limits.py).
    limits: OutputLimits = field(default_factory=OutputLimits)
    # Task folders as OCI artifacts (--task-registry …): fetched, verified and cached by digest.
    task_artifacts: TaskArtifacts = field(default_factory=lambda: TaskArtifacts(TaskArtifactSettings()))

    @property
    def image_policy(self) -> ImagePolicy:
        build_repository = self.builds.settings.pull_repository if self.builds is not None else None
        return ImagePolicy(self.image_mirrors, build_repository)


class TaskSourceError(Exception):
    pass


async def drive_episode(
    client: KubeClient,
    body: Mapping[str, Any],
    settings: DriverSettings,
    logger: logging.Logger,
    *,
    observer: EpisodeObserver | None = None,
    claim: Claim | None = None,
) -> EpisodeStatus:
    """Run the Episode in ``body`` from its current status to a terminal phase.

    ``claim``: this replica's claim on it (kube/replicas.py), the fence of every sandbox call
    and status write; None for a sole operator."""
    if (recorded := await answer_from_tombstone(client, body, logger)) is not None:
        return recorded  # a run-once Episode re-created after its TTL: not run again (kube/tombstone_configmaps.py)
    metadata = body["metadata"]
    episode = OwnerRef(metadata["name"], metadata["namespace"], metadata["uid"])
    generation = metadata.get("generation")
    try:
        status = EpisodeStatus.model_validate(body.get("status") or {})
    except ValidationError:
        status = EpisodeStatus()  # a status we cannot read is one we did not write: start over
    sink = KubeStatusSink(
        client, episode, generation, logger, claim=claim, position=(status.attempt, status.current_turn)
    )
    if is_terminal(status.phase):
        return status
    spec = admit_spec(body.get("spec") or {})
    if isinstance(spec, Refusal):
        return await refuse(sink, status, spec, generation)
    try:
        files = await read_task_files(
            client, episode.namespace, spec.task, settings.timing.source_wait_sec, settings.task_artifacts
        )
    except TaskSourceError as error:
        return await refuse(sink, status, Refusal(FAILURE_TASK_SOURCE, str(error)), generation)
    # Validation, planning and the digest read every byte of the folder: off the event loop.
    lends_copier = settings.agent_images.capture is not None
    # A child of an EpisodeSet: with a build registry its Dockerfile is built once for all its attempts.
    set_child = SET_LABEL in (metadata.get("labels") or {})
    admission = await asyncio.to_thread(
        admit_task, spec, files, settings.image_policy, lends_copier=lends_copier, set_child=set_child
    )
    if isinstance(admission, Refusal):
        return await refuse(sink, status, admission, generation)
    if spec.regrade is not None:  # no agent runs: its model, key and env are not the regrade's business
        return await drive_regrade(client, body, admission, files, status, sink, settings, observer, claim)
    needs = agent_kind(spec.agent).sandbox_needs(spec.agent)
    problem = await model_problem(client, episode.namespace, needs, settings.agent_images)
    if problem is not None:
        return await refuse(
            sink, status, Refusal(FAILURE_SEED, f"refused at seed: {problem}", admission.digest), generation
        )
    try:
        needs = await pinned_needs(client, episode.namespace, needs, settings.capture_bounds, settings.resolve_host)
    except Unresolvable as error:
        return await refuse(
            sink, status, Refusal(FAILURE_SEED, f"refused at seed: {error}", admission.digest), generation
        )
    agent_env = await read_agent_env(client, episode.namespace, spec.agent.env, spec.agent.env_from, admission.main_env)
    if agent_env.problems:
        message = f"refused at seed: {'; '.join(agent_env.problems)}"
        return await refuse(sink, status, Refusal(FAILURE_SEED, message, admission.digest), generation)
    for skipped in agent_env.skipped:
        await sink.event("AgentEnvSkipped", f"{skipped}: not given to the agent", warning=True)
    provider = episode_provider(client, body, admission, files, settings, needs=needs)
    config = runner_config(
        admission,
        files,
        settings,
        generation,
        agent_env=agent_env.values,
        agent_outcomes=spec.harbor.agent_outcome_policy,
    )
    store = settings.store.episode(episode.namespace, episode.name, episode.uid)
    fenced = provider if claim is None else FencedProvider(provider, claim)
    runner = EpisodeRunner(config, fenced, sink, store, observer=observer, builder=settings.builds)
    return await runner.run(status)


async def read_agent_env(
    client: KubeClient,
    namespace: str,
    env: list[dict[str, Any]],
    env_from: list[dict[str, Any]],
    container_env: Mapping[str, str],
) -> AgentEnv:
    """``spec.agent.env``/``envFrom`` as the agent's jobs get them (kube/objects/env.py): the Secrets
    and ConfigMaps they name read here, each once; one that cannot be read is a problem that names it."""
    secrets: dict[str, dict[str, str]] = {}
    config_maps: dict[str, dict[str, str]] = {}
    unreadable: list[str] = []
    for kind, name in sorted(referenced(env, env_from)):
        try:
            if kind == "secret":
                secrets[name] = secret_data(await client.get_secret(namespace, name))
            else:
                config_maps[name] = dict((await client.get_config_map(namespace, name)).data or {})
        except NotFound:
            pass  # resolve_agent_env says where it is named (unless optional)
        except KubeError as error:
            unreadable.append(f"cannot read {kind} {namespace}/{name}: {error}")
    resolved = resolve_agent_env(env, env_from, Sources(secrets, config_maps), container_env)
    return replace(resolved, problems=[*unreadable, *resolved.problems]) if unreadable else resolved


async def read_task_files(
    client: KubeClient,
    namespace: str,
    source: TaskSource,
    wait_sec: float,
    artifacts: TaskArtifacts | None = None,
) -> TaskFiles:
    """The task folder from the Episode itself, from a packed ConfigMap or from an OCI artifact.

    A missing ConfigMap or artifact is waited for a little: ``kubectl apply -f dir/`` and GitOps tools
    may create the Episode before the ConfigMap it names. Read in a worker thread, so that a big
    folder never holds the event loop the other Episodes run on.
    """
    if source.inline is not None:
        return await asyncio.to_thread(TaskFiles.from_mapping, source.inline.files)
    if source.oci is not None:
        return await _read_artifact(artifacts or TaskArtifacts(TaskArtifactSettings()), source.oci.reference, wait_sec)
    assert source.config_map is not None
    reference = source.config_map
    deadline = asyncio.get_running_loop().time() + wait_sec
    while True:
        try:
            config_map = await client.get_config_map(namespace, reference.name)
            break
        except NotFound:
            if asyncio.get_running_loop().time() > deadline:
                raise TaskSourceError(f"configmap {namespace}/{reference.name} not found") from None
            await asyncio.sleep(1.0)
        except KubeError as error:
            raise TaskSourceError(f"cannot read configmap {namespace}/{reference.name}: {error}") from error
    binary = config_map.binary_data or {}
    if reference.key not in binary:
        keys = sorted({*binary, *(config_map.data or {})})
        raise TaskSourceError(
            f"configmap {namespace}/{reference.name} has no binaryData key {reference.key!r} "
            f"(keys: {', '.join(keys) or 'none'})"
        )
    try:
        archive = base64.b64decode(binary[reference.key], validate=True)
    except ValueError as error:
        raise TaskSourceError(f"configmap {namespace}/{reference.name}: {reference.key} is not base64") from error
    # Unpacking is bounded (taskfolder/sources.py: files, bytes, links as resolved) and runs off the loop.
    return await asyncio.to_thread(TaskFiles.from_tar, archive)


async def _read_artifact(artifacts: TaskArtifacts, reference: str, wait_sec: float) -> TaskFiles:
    """spec.task.oci: fetched (verified, bounded, cached: runtime/oci_tasks.py), then unpacked from the
    file with exactly the limits of a ConfigMap's archive."""
    field_name = "spec.task.oci.reference"
    deadline = asyncio.get_running_loop().time() + wait_sec
    while True:
        try:
            path = await artifacts.fetch(reference)
            break
        except ArtifactError as error:
            raise TaskSourceError(f"{field_name}: {error}") from error
        except ArtifactMissing as error:
            if asyncio.get_running_loop().time() > deadline:
                raise TaskSourceError(f"{field_name}: {error}") from None
            await asyncio.sleep(1.0)
    return await asyncio.to_thread(_unpack_file, path)


def _unpack_file(path: Path) -> TaskFiles:
    with path.open("rb") as stream:
        return TaskFiles.from_tar(stream)


async def release_episode_pods(client: KubeClient, namespace: str, name: str) -> None:
    """Delete every pod of an Episode (it was deleted while running)."""
    for pod in await client.list_pods(namespace, episode_selector(name)):
        await client.delete_pod(namespace, pod["metadata"]["name"], grace_seconds=0)


async def announce_waiting(
    client: KubeClient, body: Mapping[str, Any], active: int, *, guard: Guard | None = None
) -> None:
    """Mark a not-yet-started Episode Pending while it waits for a free slot (best effort; with a
    replica's claim, only while the claim stands)."""
    status = EpisodeStatus.model_validate(body.get("status") or {})
    if status.phase not in (None, "Pending"):
        return
    status.phase = "Pending"
    status.message = f"waiting: {active} episode(s) running, the operator's maxActiveEpisodes"
    metadata = body["metadata"]
    with contextlib.suppress(KubeError):
        await client.replace_episode_status(metadata["namespace"], metadata["name"], status.to_api(), guard=guard)


async def suspend_episode(client: KubeClient, body: Mapping[str, Any]) -> None:
    """Hold a suspended Episode: no pods, status Pending; a run it had starts over when resumed.

    Suspension is not an outage (the attempt counter stays); it is how a queue such as Kueue
    keeps an Episode from running, or takes its resources back.
    """
    metadata = body["metadata"]
    await release_episode_pods(client, metadata["namespace"], metadata["name"])
    previous = EpisodeStatus.model_validate(body.get("status") or {})
    status = EpisodeStatus(phase="Pending", message="suspended (spec.suspend)", task=previous.task)
    if previous.phase == "Running":
        status.message = "suspended while running; it starts over from turn 1 when resumed"
    with contextlib.suppress(NotFound):
        await client.replace_episode_status(metadata["namespace"], metadata["name"], status.to_api())
