"""Pre-pull, with I/O: the set's pass finds the images its children will run, keeps its DaemonSet and reads
what its pods say (docs/prepull.md). The decisions are :mod:`episode_operator.kube.objects.prepull_plan`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from episode_operator.api.episodeset_resource import EpisodeSetSpec, PrePullStatus, SetTaskStatus, child_spec
from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.kube.driver import read_task_files
from episode_operator.kube.objects.children import task_source
from episode_operator.kube.objects.pods import AgentImages, OwnerRef
from episode_operator.kube.objects.prepull_plan import (
    MAX_IMAGES,
    current,
    daemon_set_name,
    done,
    prepull_daemon_set,
    prepull_selector,
    progress,
    set_images,
)
from episode_operator.runtime.admission import Refusal, admit_task
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.oci_tasks import TaskArtifacts
from episode_operator.runtime.sandbox_images import ImagePlan, ImagePolicy

log = logging.getLogger(__name__)
# When each set's pre-pull was last read (by set uid): a complete one is not read on every pass of its set.
_checked: dict[str, float] = {}


@dataclass(frozen=True)
class PrePullSettings:
    """The operator's settings the children's images follow: its agent images, mirrors and build registry."""

    images: AgentImages = field(default_factory=AgentImages)
    policy: ImagePolicy = field(default_factory=ImagePolicy)
    artifacts: TaskArtifacts | None = None
    # A pre-pull whose every image is on every node is read again after this long (a node added), not each pass.
    recheck_sec: float = 30.0


def _pulled(images: ImagePlan) -> list[str]:
    """The images of an Episode's pods that exist before it runs (an in-cluster build's does not yet)."""
    found = [images.agent, *(image for image in images.verifiers if image), *images.sidecars.values()]
    return [image.image for image in found if image.build is None]


async def task_images(
    client: KubeClient, namespace: str, spec: EpisodeSetSpec, tasks: list[SetTaskStatus], settings: PrePullSettings
) -> tuple[list[str], list[str]]:
    """Every image the tasks' children run, as admission decides it for each (read once per set), and what
    could not be read (each naming the task): those children fail or wait on their own, as without pre-pull."""
    images: list[str] = []
    problems: list[str] = []
    for task in tasks:
        source = task_source(spec, task)
        episode = child_spec(spec, source, {})
        try:
            files = await read_task_files(client, namespace, source, 0.0, settings.artifacts)
        except Exception as error:
            problems.append(f"task {task.name}: {error}")
            continue
        # Validation and planning read every byte of the folder: off the event loop, as the driver's admission.
        lends_copier = settings.images.capture is not None
        admission = await asyncio.to_thread(admit_task, episode, files, settings.policy, lends_copier=lends_copier)
        if isinstance(admission, Refusal):
            problems.append(f"task {task.name}: {admission.message}")
            continue
        images += _pulled(admission.images)
    return images, problems


def agent_images(spec: EpisodeSetSpec, images: AgentImages) -> list[str]:
    """The images the agent kind adds to every agent pod: its toolchains', the capture proxy's."""
    needs = agent_kind(spec.agent).sandbox_needs(spec.agent)
    found = [images.toolchain(toolchain) for toolchain in needs.toolchains]
    if needs.capture is not None and images.capture is not None:
        found.append(images.capture)
    return found


async def reconcile_prepull(
    client: KubeClient,
    owner: OwnerRef,
    spec: EpisodeSetSpec,
    previous: PrePullStatus | None,
    tasks: list[SetTaskStatus],
    settings: PrePullSettings,
) -> PrePullStatus:
    """One pass: the images (found once, then kept in the status), the DaemonSet made or replaced, its progress."""
    if previous is not None and previous.images:
        images = [row.image for row in previous.images]
        left_out = previous.left_out
        problems: list[str] = []
        if done(previous) and time.monotonic() - _checked.get(owner.uid, 0.0) < settings.recheck_sec:
            return previous  # every image in: looked at again now and then (a node added), not on every pass
    else:
        found, problems = await task_images(client, owner.namespace, spec, tasks, settings)
        every = set_images(spec, found, agent_images(spec, settings.images))
        images, left_out = every[:MAX_IMAGES], max(0, len(every) - MAX_IMAGES)
    if settings.images.capture is None:
        message = "pre-pull needs the operator's own image (--capture-image) to lend its busybox: nothing pulled"
        return PrePullStatus(images=progress(images, None, []).images, message=message, left_out=left_out)
    name = daemon_set_name(owner.name)
    try:
        daemon_set: dict[str, object] | None = await client.read_daemon_set(owner.namespace, name)
    except NotFound:
        daemon_set = None
    if daemon_set is not None and not current(daemon_set, images):
        await client.delete_daemon_set(owner.namespace, name)
        daemon_set = None
    if daemon_set is None:
        try:
            daemon_set = await client.create_daemon_set(
                prepull_daemon_set(owner, spec, images, settings.images.capture)
            )
        except Conflict:
            daemon_set = None  # the old one still on its way out: the next pass makes it
        except KubeError as error:
            if error.status not in (403, 422):  # refused (a policy, a quota): said in the status
                raise
            message = f"cannot make the pre-pull DaemonSet {name}: {error}"
            return PrePullStatus(images=progress(images, None, []).images, message=message, left_out=left_out)
    pods = await client.list_pods(owner.namespace, prepull_selector(owner.name))
    status = progress(images, daemon_set, pods)
    status.left_out = left_out
    if left_out:
        bound = f"{left_out} more images than one pre-pull pod runs ({MAX_IMAGES}): their children's pods pull them"
        status.message = f"{status.message}; {bound}" if status.message else bound
    _checked[owner.uid] = time.monotonic()
    if problems:
        unread = f"{len(problems)} tasks' images unknown ({'; '.join(problems)[:400]})"
        status.message = f"{status.message}; {unread}" if status.message else unread
    return status


async def release_prepull(client: KubeClient, owner: OwnerRef) -> None:
    """Delete the set's DaemonSet (the set is complete, or pre-pull was turned off)."""
    await client.delete_daemon_set(owner.namespace, daemon_set_name(owner.name))
    _checked.pop(owner.uid, None)
