"""Sandbox start of a task with a 5-line Dockerfile: Gym's replay vs. a prebuilt image, and a cached build.

Measured in one run on the project's cluster (hack/cluster up && hack/cluster images):

- **prebuilt** (the baseline): the same Dockerfile built once in the cluster (buildah Job), then
  each round starts a pod from that image — the least a sandbox start can cost;
- **replay**: each round starts a pod from the FROM image and replays the Dockerfile in it
  (base-environment probe, RUN, WORKDIR, COPY, ENTRYPOINT as supervised jobs);
- **cached build**: what the 2nd…Nth Episode pays to learn its image exists (the coordinator
  finds the digest's finished Job), against the first, real build.

Both starts include the supervisor's placement (the operator's first exec into a pod). Prints a
table and writes ``bench/out/replay.json``. Usage: ``python bench/replay.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from episode_operator.api.episode_resource import PLURAL, EpisodeSpec
from episode_operator.api.vocabulary import GROUP, VERSION
from episode_operator.kube.builds import BuildCoordinator, BuildSettings
from episode_operator.kube.client import KubeClient
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.runtime.episode_store import EpisodeBlobs
from episode_operator.runtime.replay_runner import ReplayConfig, ReplayReady, ReplaySource, replay_dockerfile
from episode_operator.runtime.sandbox_images import BuildReady
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from episode_operator.taskfolder.buildcontext import BuildSource
from episode_operator.taskfolder.image_refs import ImageMirrors

OUT = Path(__file__).resolve().parent / "out"
KUBECONFIG = "/var/lib/episode-operator/cluster/kubeconfig"
REGISTRY = "198.18.255.1:5000"
# Replay starts FROM the image as the node has it; the build pulls the same content from the registry.
REPLAY_MIRRORS = ImageMirrors.parse(["ubuntu:24.04=episode-operator.local/sandbox:bookworm"])
BUILD_MIRRORS = ImageMirrors.parse([f"ubuntu:24.04={REGISTRY}/episode-operator/sandbox:bookworm"])
DOCKERFILE = """\
FROM ubuntu:24.04
ENV APP_HOME=/srv/app
RUN useradd --create-home agent
WORKDIR /srv/app
COPY app.py ./
"""


def task_files(marker: str) -> TaskFiles:
    return TaskFiles.from_mapping(
        {
            "task.toml": 'schema_version = "1.4"\n[environment]\nbuild_timeout_sec = 300.0\n',
            "instruction.md": "x",
            "tests/test.sh": "true",
            "environment/Dockerfile": DOCKERFILE,
            "environment/app.py": f"print('{marker}')\n",
        }
    )


def suspended_episode(api: client.ApiClient, namespace: str) -> OwnerRef:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Episode",
        "metadata": {"name": "bench"},
        "spec": {
            "task": {"inline": {"files": {"task.toml": "# not driven"}}},
            "agent": {"kind": "oracle"},
            "suspend": True,
        },
    }
    created = client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return OwnerRef("bench", namespace, created["metadata"]["uid"])


async def measure(namespace: str, owner: OwnerRef, rounds: int, cached_calls: int) -> dict[str, Any]:
    kube = await KubeClient.connect(KUBECONFIG)
    files = task_files(namespace)
    plan = resolve_plan(load_task(files))
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": {"task.toml": "x"}}}, "agent": {"kind": "oracle"}})
    settings = BuildSettings(
        namespace=namespace, registry=REGISTRY, builder_image="episode-operator.local/builder:bookworm",
        tls_verify=False, mirrors=BUILD_MIRRORS,
    )  # fmt: skip
    source = BuildSource("environment/Dockerfile", "environment")
    results: dict[str, Any] = {"rounds": rounds}
    try:
        started = time.perf_counter()
        built = await BuildCoordinator(kube, settings).ensure_image(files, source, timeout_sec=600)
        results["first_build_sec"] = time.perf_counter() - started
        assert isinstance(built, BuildReady), built
        cached = []
        for _ in range(cached_calls):
            started = time.perf_counter()
            again = await BuildCoordinator(kube, settings).ensure_image(files, source, timeout_sec=600)
            cached.append(time.perf_counter() - started)
            assert isinstance(again, BuildReady) and not again.built
        results["cached_build_sec"] = cached

        # The first pod from the built image pulls it from the registry; rounds measure warm starts.
        warm = KubeProvider(kube, owner, spec, plan, built.image, {})
        await warm.agent(0)
        await warm.release_all(keep=False)

        replay_times, prebuilt_times = [], []
        with tempfile.TemporaryDirectory() as logs:
            for number in range(1, rounds + 1):
                # Distinct attempts: a released pod may still be terminating when the next starts.
                provider = KubeProvider(kube, owner, spec, plan, built.image, {})
                started = time.perf_counter()
                await provider.agent(2 * number)
                prebuilt_times.append(time.perf_counter() - started)
                await provider.release_all(keep=False)

                image = REPLAY_MIRRORS.apply("ubuntu:24.04")
                provider = KubeProvider(kube, owner, spec, plan, image, {})
                started = time.perf_counter()
                sandbox = await provider.agent(2 * number + 1)
                config_ = ReplayConfig(attempt=number, budget_sec=300, poll_interval_sec=5)
                outcome = await replay_dockerfile(
                    sandbox, files, ReplaySource(), plan.environment, EpisodeBlobs.local(Path(logs)), config_
                )
                replay_times.append(time.perf_counter() - started)
                assert isinstance(outcome, ReplayReady), outcome
                await provider.release_all(keep=False)
        results["prebuilt_start_sec"] = prebuilt_times
        results["replay_start_sec"] = replay_times
    finally:
        await kube.close()
    return results


def report(results: dict[str, Any]) -> None:
    def line(name: str, values: list[float]) -> str:
        low, high = min(values) * 1000, max(values) * 1000
        return f"| {name} | {statistics.median(values) * 1000:.0f} ms | {low:.0f}–{high:.0f} ms |"

    prebuilt, replay = results["prebuilt_start_sec"], results["replay_start_sec"]
    cached = results["cached_build_sec"]
    print(f"Sandbox start, 5-line Dockerfile, {results['rounds']} rounds each (median [min–max])\n")
    print("| start | median | range |\n| --- | --- | --- |")
    print(line("prebuilt image (baseline): pod + supervisor", prebuilt))
    print(line("replay: pod + supervisor + probe + 4 steps", replay))
    print(f"\nreplay / prebuilt: {statistics.median(replay) / statistics.median(prebuilt):.2f}")
    print(f"\nIn-cluster build of the same Dockerfile: first {results['first_build_sec']:.1f} s; ")
    print(
        f"2nd…Nth Episode (cached, {len(cached)} calls): median {statistics.median(cached) * 1000:.0f} ms "
        f"[{min(cached) * 1000:.0f}–{max(cached) * 1000:.0f}] "
        f"({results['first_build_sec'] / statistics.median(cached):.0f}x less than building)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cached-calls", type=int, default=10)
    arguments = parser.parse_args()
    api = config.new_client_from_config(config_file=KUBECONFIG)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api)
    namespace = f"bench-replay-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        while True:
            try:
                core.read_namespaced_service_account("default", namespace)
                break
            except client.exceptions.ApiException:
                time.sleep(0.2)
        owner = suspended_episode(api, namespace)
        results = asyncio.run(measure(namespace, owner, arguments.rounds, arguments.cached_calls))
    finally:
        core.delete_namespace(namespace, propagation_policy="Background")
    OUT.mkdir(exist_ok=True)
    (OUT / "replay.json").write_text(json.dumps(results, indent=2) + "\n")
    report(results)


if __name__ == "__main__":
    main()
