"""In-cluster builds on the real cluster: buildah Jobs, the registry of hack/cluster, containerd pulling.

Base images come from the cluster's registry (hack/cluster publishes the sandbox image there and
the tests mirror ubuntu:24.04 to it); built images are pushed there and pods pull them back.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from kubernetes import client

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.api.vocabulary import BUILD_LABEL
from episode_operator.kube.builds import BuildCoordinator, BuildSettings
from episode_operator.kube.client import KubeClient
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.runtime.sandbox_images import BuildFailed, BuildOutage, BuildReady
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from episode_operator.taskfolder.buildcontext import BuildSource
from episode_operator.taskfolder.image_refs import ImageMirrors
from tests.cluster.harness import episode_spec, run_sandbox_job, suspended_episode

REGISTRY = "198.18.255.1:5000"
NOTHING_LISTENS = "198.18.255.1:5999"
BUILDER = "episode-operator.local/builder:bookworm"
MIRRORS = ImageMirrors.parse([f"ubuntu:24.04={REGISTRY}/episode-operator/sandbox:bookworm"])
SOURCE = BuildSource("environment/Dockerfile", "environment")
TASK = Path(__file__).parent / "tasks" / "built-sidecar"


def settings(namespace: str, *, registry: str = REGISTRY) -> BuildSettings:
    return BuildSettings(
        namespace=namespace, registry=registry, builder_image=BUILDER, tls_verify=False, mirrors=MIRRORS
    )


def build_jobs(api: client.ApiClient, namespace: str) -> list[str]:
    jobs = client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=BUILD_LABEL)
    return [job.metadata.name for job in jobs.items]


def test_a_context_builds_once_concurrent_callers_share_it_and_pods_run_the_image(
    api_client: client.ApiClient, kubeconfig: Path, quiet_namespace: str
) -> None:
    files = TaskFiles.from_mapping(
        {
            # Multi-stage with COPY --from: replay refuses it, a build is the way.
            "environment/Dockerfile": f"FROM ubuntu:24.04 AS build\nRUN echo built-in-{quiet_namespace} > /out\n"
            "FROM ubuntu:24.04\nCOPY --from=build /out /built.txt\nCOPY hello.txt /hello.txt\n",
            "environment/hello.txt": "hello\n",
        }
    )
    episode = suspended_episode(api_client, quiet_namespace, "builds")

    async def scenario() -> None:
        kube = await KubeClient.connect(str(kubeconfig))
        try:
            first, second = (
                BuildCoordinator(kube, settings(quiet_namespace)),
                BuildCoordinator(kube, settings(quiet_namespace)),
            )
            # Three callers at once, two of them in another "operator": one Job.
            results = await asyncio.gather(
                first.ensure_image(files, SOURCE, timeout_sec=300),
                first.ensure_image(files, SOURCE, timeout_sec=300),
                second.ensure_image(files, SOURCE, timeout_sec=300),
            )
            assert all(isinstance(result, BuildReady) for result in results), results
            assert build_jobs(api_client, quiet_namespace) == [f"build-{results[0].digest[7:27]}"]  # type: ignore[union-attr]
            # The two calls of one operator share one wait; of the two operators exactly one created the Job.
            assert results[0] == results[1]
            assert sorted([results[0].built, results[2].built]) == [False, True]  # type: ignore[union-attr]
            # The 2nd…Nth Episode: the finished Job is found, nothing is built.
            later = await BuildCoordinator(kube, settings(quiet_namespace)).ensure_image(files, SOURCE, timeout_sec=300)
            assert isinstance(later, BuildReady) and not later.built and later.image == results[0].image  # type: ignore[union-attr]
            assert len(build_jobs(api_client, quiet_namespace)) == 1

            # containerd pulls the image back from the registry and a pod runs it.
            task = load_task(TaskFiles.from_directory(TASK))
            plan = resolve_plan(task).model_copy(update={"sidecars": []})
            spec = EpisodeSpec.model_validate(episode_spec(files={"task.toml": "# not driven"}))
            provider = KubeProvider(kube, episode, spec, plan, later.image, {})
            sandbox = await provider.agent(1)
            code, output = await run_sandbox_job(sandbox, "cat /built.txt /hello.txt", name="built")
            assert (code, output) == (0, f"built-in-{quiet_namespace}\nhello\n")
            await provider.release_all(keep=False)
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_a_failing_build_is_the_tasks_failure_and_is_not_built_again(
    api_client: client.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    files = TaskFiles.from_mapping(
        {"environment/Dockerfile": f"FROM ubuntu:24.04\nRUN echo {namespace}; echo broken >&2; exit 3\n"}
    )

    async def scenario() -> None:
        kube = await KubeClient.connect(str(kubeconfig))
        try:
            failed = await BuildCoordinator(kube, settings(namespace)).ensure_image(files, SOURCE, timeout_sec=300)
            assert isinstance(failed, BuildFailed), failed
            assert "the Dockerfile failed to build" in failed.message
            assert b"broken" in failed.log
            again = await BuildCoordinator(kube, settings(namespace)).ensure_image(files, SOURCE, timeout_sec=300)
            assert isinstance(again, BuildFailed) and again.message == failed.message
            assert len(build_jobs(api_client, namespace)) == 1
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_an_unreachable_registry_is_an_outage(api_client: client.ApiClient, kubeconfig: Path, namespace: str) -> None:
    files = TaskFiles.from_mapping({"environment/Dockerfile": f"FROM ubuntu:24.04\nRUN echo {namespace}\n"})

    async def scenario() -> None:
        kube = await KubeClient.connect(str(kubeconfig))
        try:
            builds = BuildCoordinator(kube, settings(namespace, registry=NOTHING_LISTENS))
            outage = await builds.ensure_image(files, SOURCE, timeout_sec=300)
            assert isinstance(outage, BuildOutage), outage
            assert outage.kind == "registry" and f"cannot push to {NOTHING_LISTENS}" in outage.message
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_a_compose_sidecar_built_in_cluster_serves_the_agent(
    api_client: client.ApiClient, kubeconfig: Path, quiet_namespace: str
) -> None:
    files = TaskFiles.from_directory(TASK)
    task = load_task(files)
    plan = resolve_plan(task)
    (sidecar,) = plan.sidecars
    assert sidecar.image is None and sidecar.build is not None
    source = BuildSource(sidecar.build.dockerfile, sidecar.build.context, sidecar.build.args, sidecar.build.target)
    episode = suspended_episode(api_client, quiet_namespace, "builds")

    async def scenario() -> None:
        kube = await KubeClient.connect(str(kubeconfig))
        try:
            built = await BuildCoordinator(kube, settings(quiet_namespace)).ensure_image(files, source, timeout_sec=300)
            assert isinstance(built, BuildReady), built
            with_image = plan.model_copy(update={"sidecars": [sidecar.model_copy(update={"image": built.image})]})
            spec = EpisodeSpec.model_validate(episode_spec(files={"task.toml": "# not driven"}))
            image = plan.environment.docker_image or ""
            provider = KubeProvider(kube, episode, spec, with_image, image, with_image.main_env)
            sandbox = await provider.agent(1)
            # The sidecar's server may still be starting: the fetch polls for it, bounded, in the pod.
            fetch = (
                "import time, urllib.request as u\n"
                "for attempt in range(120):\n"
                "    try:\n"
                "        print(u.urlopen('http://api:8080/answer', timeout=2).read().decode()); break\n"
                "    except OSError:\n"
                "        time.sleep(0.25)\n"
            )
            code, output = await run_sandbox_job(sandbox, f"python3 -c {shlex.quote(fetch)}", name="fetch")
            assert (code, output.strip()) == (0, "42")
            await provider.release_all(keep=False)
        finally:
            await kube.close()

    asyncio.run(scenario())
