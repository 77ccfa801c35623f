"""What the driver of an Episode and that of a regrade (kube/regrade_driver.py) build alike from an admitted Episode:
the provider of its pods and the runner's configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from episode_operator.api.vocabulary import PREPULL_ANNOTATION, WARM_POOL_ANNOTATION
from episode_operator.kube.client import KubeClient
from episode_operator.kube.objects.pods import OwnerRef, queue_labels
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.kube.warm_pool import pool_of
from episode_operator.runtime.admission import Admission
from episode_operator.runtime.agents.model import SandboxNeeds
from episode_operator.runtime.episode import EpisodeConfig
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.compose import binds_of, bound_archive

if TYPE_CHECKING:
    from episode_operator.kube.driver import DriverSettings


def episode_provider(
    client: KubeClient,
    body: Mapping[str, Any],
    admission: Admission,
    files: TaskFiles,
    settings: DriverSettings,
    *,
    needs: SandboxNeeds | None = None,
    verifiers_beside_agent: bool = True,
) -> KubeProvider:
    """The provider of an Episode's pods: the operator's settings, the Episode's queue label, its bound files."""
    metadata = body["metadata"]
    episode = OwnerRef(metadata["name"], metadata["namespace"], metadata["uid"])
    binds = binds_of(admission.plan.main_volumes, admission.plan.sidecars)
    return KubeProvider(
        client,
        episode,
        admission.spec,
        admission.plan,
        admission.image,
        admission.main_env,
        extra_labels={**settings.extra_pod_labels, **queue_labels(metadata.get("labels") or {})},
        bound_files=bound_archive(files, binds) if binds else None,
        timing=settings.timing,
        wakeups=settings.pod_wakeups,
        needs=needs or SandboxNeeds(),
        images=settings.agent_images,
        sandbox_requests=settings.sandbox_requests,
        limits=settings.limits,
        verifiers_beside_agent=verifiers_beside_agent,
        pool=pool_of(metadata, WARM_POOL_ANNOTATION),
        prepull=pool_of(metadata, PREPULL_ANNOTATION),
    )


def runner_config(
    admission: Admission, files: TaskFiles, settings: DriverSettings, generation: int | None, **agent: Any
) -> EpisodeConfig:
    """The runner's configuration of an admitted Episode; ``agent``: its agent's env and outcome policy."""
    spec = admission.spec
    return EpisodeConfig(
        plan=admission.plan,
        files=files,
        agent=spec.agent,
        digest=admission.digest,
        task_name=admission.task_name,
        retries=spec.retries,
        keep_pods_on_failure=spec.debug.keep_pods,
        timing=settings.timing,
        generation=generation,
        images=admission.images,
        limits=settings.limits,
        **agent,
    )
