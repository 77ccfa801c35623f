"""From an Episode object to a finished episode: read the task, check it, run it.

The driver is what the operator runs for each active Episode (a kopf daemon calls
:func:`drive_episode`). Everything that can be refused is refused before any pod exists:
a spec the models reject, a task source that cannot be read, a task folder the loader
refuses, a seed-time refusal (no image, an oracle without solutions, an unresolvable
``${VAR}``). Each ends the Episode ``Failed`` with a message naming the cause — never a
crash loop. Then :class:`~episode_operator.runtime.episode.EpisodeRunner` takes over.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from episode_operator.api.models import (
    Condition,
    EpisodeSpec,
    EpisodeStatus,
    TaskSource,
    TaskStatus,
    validation_message,
)
from episode_operator.kube.client import KubeClient, KubeError, NotFound
from episode_operator.kube.pods import OwnerRef, episode_selector
from episode_operator.kube.sandbox import KubeProvider
from episode_operator.kube.status import KubeStatusSink
from episode_operator.kube.tombstones import answer_from_tombstone
from episode_operator.runtime.episode import EpisodeConfig, EpisodeObserver, EpisodeRunner, timestamp
from episode_operator.runtime.store import FileStore, episode_store_root
from episode_operator.runtime.wakeups import Wakeups
from episode_operator.taskfolder import EpisodePlan, Problem, TaskFiles, resolve_plan, seed_refusals, validate_task
from episode_operator.taskfolder.envtemplates import UnresolvedTemplate, resolve_env_templates

# Kueue's queue label: an Episode's is copied to its pods.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FAILURE_INVALID_SPEC = "episode:invalid_spec"
FAILURE_TASK_SOURCE = "episode:task_source"
FAILURE_INVALID_TASK = "harbor:invalid_task"
FAILURE_SEED = "harbor:seed_refused"
MESSAGE_LIMIT = 4000


@dataclass(frozen=True)
class DriverSettings:
    """Operator-wide settings the driver needs."""

    data_dir: Path
    pull_grace_sec: float = 120.0
    poll_interval_sec: float = 30.0
    source_wait_sec: float = 30.0
    backoff_base_sec: float = 5.0
    extra_pod_labels: Mapping[str, str] = field(default_factory=dict)
    # Woken by the pod watch (handlers.py): a starting pod is read when it changes.
    pod_wakeups: Wakeups | None = None


class TaskSourceError(Exception):
    pass


async def drive_episode(
    client: KubeClient,
    body: Mapping[str, Any],
    settings: DriverSettings,
    logger: logging.Logger,
    *,
    observer: EpisodeObserver | None = None,
) -> EpisodeStatus:
    """Run the Episode in ``body`` from its current status to a terminal phase."""
    if (recorded := await answer_from_tombstone(client, body, logger)) is not None:
        return recorded  # a run-once Episode re-created after its TTL: not run again (kube/tombstones.py)
    metadata = body["metadata"]
    episode = OwnerRef(metadata["name"], metadata["namespace"], metadata["uid"])
    sink = KubeStatusSink(client, episode, metadata.get("generation"), logger)
    try:
        status = EpisodeStatus.model_validate(body.get("status") or {})
    except ValidationError:
        status = EpisodeStatus()  # a status we cannot read is one we did not write: start over
    if status.phase in ("Succeeded", "Failed"):
        return status
    try:
        spec = EpisodeSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        return await _refuse(sink, status, FAILURE_INVALID_SPEC, "invalid spec: " + validation_message(error))
    try:
        files = await read_task_files(client, episode.namespace, spec.task, settings.source_wait_sec)
    except TaskSourceError as error:
        return await _refuse(sink, status, FAILURE_TASK_SOURCE, str(error))
    validation = validate_task(files)
    if validation.task is None:
        return await _refuse(
            sink, status, FAILURE_INVALID_TASK, "task refused: " + _problems(validation.problems), digest=files.digest()
        )
    plan = resolve_plan(validation.task, timeout_multiplier=spec.timeout_multiplier)
    problems = seed_refusals(plan, agent=spec.agent.kind, image_override=spec.image) + _oracle_refusals(plan, spec)
    try:
        plan, main_env = resolve_plan_env(plan, spec)
    except UnresolvedTemplate as error:
        problems.append(Problem("task.toml", "env", str(error)))
    if problems:
        return await _refuse(
            sink, status, FAILURE_SEED, "refused at seed: " + _problems(problems), digest=files.digest()
        )
    image = spec.image or plan.environment.docker_image
    assert image is not None
    labels = {**settings.extra_pod_labels, **queue_labels(metadata.get("labels") or {})}
    provider = KubeProvider(
        client,
        episode,
        spec,
        plan,
        image,
        main_env,
        extra_labels=labels,
        pull_grace_sec=settings.pull_grace_sec,
        wakeups=settings.pod_wakeups,
    )
    config = EpisodeConfig(
        plan=plan,
        files=files,
        agent=spec.agent,
        digest=files.digest(),
        task_name=validation.task.config.task.name if validation.task.config.task else None,
        outage_retries=spec.retries.outages,
        keep_pods_on_failure=spec.debug.keep_pods,
        poll_interval_sec=settings.poll_interval_sec,
        backoff_base_sec=settings.backoff_base_sec,
    )
    store = FileStore(episode_store_root(settings.data_dir, episode.namespace, episode.name, episode.uid))
    return await EpisodeRunner(config, provider, sink, store, observer=observer).run(status)


async def read_task_files(client: KubeClient, namespace: str, source: TaskSource, wait_sec: float) -> TaskFiles:
    """The task folder from the Episode itself or from a packed ConfigMap.

    A missing ConfigMap is waited for a little: ``kubectl apply -f dir/`` and GitOps tools
    may create the Episode before the ConfigMap it names.
    """
    if source.inline is not None:
        return TaskFiles.from_mapping(source.inline.files)
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
    return TaskFiles.from_tar(archive)


def resolve_plan_env(plan: EpisodePlan, spec: EpisodeSpec) -> tuple[EpisodePlan, dict[str, str]]:
    """Resolve ``${VAR}`` templates of the main, verifier and solution env from the agent's literal env."""
    source = {
        entry["name"]: entry["value"]
        for entry in spec.agent.env
        if isinstance(entry.get("name"), str) and isinstance(entry.get("value"), str)
    }
    main_env = resolve_env_templates(plan.main_env, source)
    turns = [
        turn.model_copy(
            update={
                "verifier": turn.verifier.model_copy(update={"env": resolve_env_templates(turn.verifier.env, source)})
            }
        )
        for turn in plan.turns
    ]
    solution_env = resolve_env_templates(plan.solution_env, source)
    return plan.model_copy(update={"turns": turns, "solution_env": solution_env, "main_env": main_env}), main_env


def _oracle_refusals(plan: EpisodePlan, spec: EpisodeSpec) -> list[Problem]:
    if spec.agent.kind != "oracle":
        return []
    return [
        Problem(f"{turn.solution or 'solution'}/solve.sh", None, f"the oracle needs a solve.sh for turn {turn.name!r}")
        for turn in plan.turns
        if not turn.solution_runnable
    ]


def _problems(problems: Sequence[Problem]) -> str:
    text = "; ".join(problem.render() for problem in problems)
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


async def _refuse(
    sink: KubeStatusSink, status: EpisodeStatus, failure_kind: str, message: str, *, digest: str | None = None
) -> EpisodeStatus:
    now = timestamp(time.time())
    status.phase = "Failed"
    status.outcome = "TerminalFailure"
    status.failure_kind = failure_kind
    status.message = message
    status.started_at = status.started_at or now
    status.finished_at = now
    if digest:
        status.task = TaskStatus(digest=digest)
    status.conditions = [
        Condition(
            type="Failed", status="True", reason="TerminalFailure", message=message[:1024], last_transition_time=now
        )
    ]
    await sink.event("EpisodeRefused", message, warning=True)
    await sink.publish(status)
    return status


async def release_episode_pods(client: KubeClient, namespace: str, name: str) -> None:
    """Delete every pod of an Episode (it was deleted while running)."""
    for pod in await client.list_pods(namespace, episode_selector(name)):
        await client.delete_pod(namespace, pod["metadata"]["name"], grace_seconds=0)


async def announce_waiting(client: KubeClient, body: Mapping[str, Any], active: int) -> None:
    """Mark a not-yet-started Episode Pending while it waits for a free slot (best effort)."""
    status = EpisodeStatus.model_validate(body.get("status") or {})
    if status.phase not in (None, "Pending"):
        return
    status.phase = "Pending"
    status.message = f"waiting: {active} episode(s) running, the operator's maxActiveEpisodes"
    metadata = body["metadata"]
    with contextlib.suppress(KubeError):
        await client.replace_episode_status(metadata["namespace"], metadata["name"], status.to_api())


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


def queue_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels of an Episode its pods carry too (Kueue's queue name)."""
    return {QUEUE_LABEL: labels[QUEUE_LABEL]} if QUEUE_LABEL in labels else {}
