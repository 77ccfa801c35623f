"""In-cluster builds, the pure parts and the coordinator's decisions against a fake API.

The fake stands in for the API server's Jobs and pods: a created Job runs when the test says
so and ends with the build script's exit code, as the real build pod does (tests/cluster covers
the real buildah, registry and containerd).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import random
import tarfile
from typing import Any

import pytest

from episode_operator.kube.builds import BuildCoordinator, BuildSettings
from episode_operator.kube.client import Conflict, NotFound
from episode_operator.kube.objects.buildjobs import (
    EXIT_BUILD,
    EXIT_PULL,
    EXIT_PUSH,
    MANIFEST_DIGEST_ANNOTATION,
    BuildJobSpec,
    build_job,
    build_script,
)
from episode_operator.runtime.sandbox_images import BuildFailed, BuildOutage, BuildReady
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.buildcontext import (
    PACKED_DOCKERFILE,
    BuildSource,
    base_images,
    mirror_from_lines,
    pack_build_context,
)
from episode_operator.taskfolder.image_refs import ImageMirrors

MIRRORS = ImageMirrors.parse(["ubuntu:24.04=registry.test/sandbox:1", "docker.io/library/=registry.test/library/"])
DOCKERFILE = "ARG BASE=ubuntu:24.04\nFROM ${BASE} AS build\nRUN make\nFROM python:3.12 \\\n  AS final\n"
DOCKERFILE += "COPY --from=build /a /b\nFROM build AS again\nFROM scratch\n"
SOURCE = BuildSource("environment/Dockerfile", "environment")


def files(dockerfile: str = DOCKERFILE, **extra: str) -> TaskFiles:
    return TaskFiles.from_mapping(
        {"environment/Dockerfile": dockerfile, "environment/app.py": "print()", "task.toml": "x", **extra}
    )


def test_from_lines_are_mirrored_and_stages_kept() -> None:
    assert mirror_from_lines(DOCKERFILE, MIRRORS).splitlines() == [
        "ARG BASE=ubuntu:24.04",
        "FROM registry.test/sandbox:1 AS build",
        "RUN make",
        "FROM registry.test/library/python:3.12 AS final",  # two lines before, one now
        "COPY --from=build /a /b",
        "FROM build AS again",
        "FROM scratch",
    ]
    assert base_images(DOCKERFILE) == ("ubuntu:24.04", "python:3.12")
    assert base_images(DOCKERFILE, {"BASE": "debian:12"}) == ("debian:12", "python:3.12")
    assert mirror_from_lines("FROM x\nENV A\n", MIRRORS) == "FROM x\nENV A\n"  # unparsable: left to the builder


def test_a_packed_context_is_reproducible_and_its_digest_covers_everything() -> None:
    first = pack_build_context(files(), SOURCE, MIRRORS)
    assert first == pack_build_context(files(), SOURCE, MIRRORS)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first.archive))) as archive:
        assert sorted(archive.getnames()) == sorted([PACKED_DOCKERFILE, "Dockerfile", "app.py"])
        packed = archive.extractfile(PACKED_DOCKERFILE)
        assert packed is not None and b"FROM registry.test/sandbox:1 AS build" in packed.read()
    digests = {
        first.digest,
        pack_build_context(files(**{"environment/app.py": "print(2)"}), SOURCE, MIRRORS).digest,
        pack_build_context(files(), BuildSource(SOURCE.dockerfile, SOURCE.context, {"A": "1"}), MIRRORS).digest,
        pack_build_context(files(), BuildSource(SOURCE.dockerfile, SOURCE.context, target="build"), MIRRORS).digest,
        pack_build_context(files(), SOURCE).digest,  # other mirrors, another Dockerfile in the context
    }
    assert len(digests) == 5
    # Files outside the context do not count.
    assert pack_build_context(files(**{"tests/test.sh": "x"}), SOURCE, MIRRORS).digest == first.digest


def test_the_build_job_is_bounded_never_retried_and_named_by_the_digest() -> None:
    spec = BuildJobSpec(
        namespace="builds",
        digest_hex="ab" * 32,
        image="registry.test/builds:" + "ab" * 32,
        builder_image="builder:1",
        timeout_sec=600.5,
        base_images=("registry.test/sandbox:1",),
        args={"V": "2"},
        target="final",
        tls_verify=False,
    )
    job = build_job(spec)
    assert job["metadata"]["name"] == "build-" + "ab" * 10
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 601)
    script = build_script(spec)
    assert "pull --tls-verify=false registry.test/sandbox:1 || exit 21" in script
    assert "--build-arg V=2 --target final /workspace/context || exit 10" in script
    assert script.endswith(f"|| exit {EXIT_PUSH}")
    # The push says which manifest it pushed, in the termination message the coordinator reads.
    assert "push --tls-verify=false --digestfile /dev/termination-log " in script
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["terminationMessagePath"] == "/dev/termination-log"


class FakeApi:
    """Jobs and pods as the API server keeps them; ``finish`` ends a running build."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.config_maps: list[str] = []
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.logs: dict[str, bytes] = {}
        self.exit_codes: dict[str, int] = {}
        self.waiting: str | None = None
        self.pods_gone = False  # the Jobs' pods deleted (their Jobs stay)
        self.no_digest = False  # builds whose push wrote no digest (an older operator's build script)

    def finish(self, name: str, code: int, log: bytes = b"", *, deadline: bool = False) -> None:
        self.exit_codes[name], self.logs[name] = code, log
        status: dict[str, Any] = {"succeeded": 1} if code == 0 else {"failed": 1}
        if deadline:
            status = {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}
        self.jobs[name]["status"] = status

    async def apply_config_map(self, manifest: dict[str, Any]) -> None:
        self.config_maps.append(manifest["metadata"]["name"])

    async def create_job(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        if name in self.jobs:
            raise Conflict(f"job {name} exists", status=409)
        self.jobs[name] = {"metadata": {**manifest["metadata"], "annotations": {}}, "status": {}}
        self.created.append(name)

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.jobs[name]["metadata"]["annotations"].update(annotations)

    async def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.jobs:
            raise NotFound(f"job {name}", status=404)
        return self.jobs[name]

    async def delete_job(self, namespace: str, name: str) -> None:
        self.jobs.pop(name, None)
        self.deleted.append(name)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        name = selector.removeprefix("job-name=")
        if name not in self.jobs or self.pods_gone:
            return []
        state: dict[str, Any] = {}
        if name in self.exit_codes:
            code = self.exit_codes[name]
            state = {"terminated": {"exitCode": code, "message": "" if code or self.no_digest else manifest(name)}}
        elif self.waiting:
            state = {"waiting": {"reason": self.waiting}}
        return [{"metadata": {"name": f"{name}-pod"}, "status": {"containerStatuses": [{"state": state}]}}]

    async def read_pod_log(self, namespace: str, name: str, container: str, *, limit_bytes: int) -> bytes:
        return self.logs.get(name.removesuffix("-pod"), b"")


def manifest(job: str) -> str:
    """The manifest digest the fake build of ``job`` pushed."""
    return "sha256:" + hashlib.sha256(job.encode()).hexdigest()


def coordinator(api: FakeApi) -> BuildCoordinator:
    settings = BuildSettings(
        namespace="builds",
        registry="push.test:5000",
        pull_registry="pull.test:5000",
        builder_image="builder:1",
        mirrors=MIRRORS,
        poll_first_sec=0.001,
        poll_max_sec=0.001,
    )
    return BuildCoordinator(api, settings)  # type: ignore[arg-type]


async def finish_when_created(api: FakeApi, code: int, log: bytes = b"", **kwargs: Any) -> None:
    """End the next Job created from now on, as its build pod would."""
    known = len(api.created)
    while len(api.created) == known:
        await asyncio.sleep(0)
    api.finish(api.created[-1], code, log, **kwargs)


def test_one_build_per_digest_reused_and_shared_by_concurrent_callers() -> None:
    api = FakeApi()
    builds = coordinator(api)

    async def scenario() -> list[object]:
        finishing = asyncio.create_task(finish_when_created(api, 0))
        results = await asyncio.gather(*(builds.ensure_image(files(), SOURCE, timeout_sec=60) for _ in range(5)))
        await finishing
        later = await builds.ensure_image(files(), SOURCE, timeout_sec=60)
        other = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)  # another operator
        return [*results, later, other]

    results = asyncio.run(scenario())
    assert len(api.created) == 1 and api.config_maps == api.created
    assert all(isinstance(result, BuildReady) for result in results)
    ready = [result for result in results if isinstance(result, BuildReady)]
    assert ready[0].image == f"pull.test:5000/episode-operator/builds:{ready[0].digest.removeprefix('sha256:')}"
    assert [result.built for result in ready] == [True] * 5 + [False, False]
    # Every caller gets the image by the manifest digest the push wrote, never by the tag; the Job records it.
    (job,) = api.created
    assert {result.pinned for result in ready} == {f"pull.test:5000/episode-operator/builds@{manifest(job)}"}
    assert api.jobs[job]["metadata"]["annotations"] == {MANIFEST_DIGEST_ANNOTATION: manifest(job)}


def test_the_digest_outlives_the_build_pod_and_a_build_that_recorded_none_is_built_again() -> None:
    api = FakeApi()

    async def scenario() -> tuple[object, object, object]:
        finishing = asyncio.create_task(finish_when_created(api, 0))
        first = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)
        await finishing
        api.pods_gone = True  # the Job's record answers now
        later = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)
        # A succeeded Job with no digest recorded and no pod to read it from: built again.
        (job,) = api.created
        api.jobs[job]["metadata"]["annotations"].clear()
        api.pods_gone = False
        finishing = asyncio.create_task(finish_when_created(api, 0))
        api.no_digest = True
        api.exit_codes.pop(job)  # the old pod is gone with its message
        rebuilt_without = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)
        await finishing
        return first, later, rebuilt_without

    first, later, rebuilt_without = asyncio.run(scenario())
    assert isinstance(first, BuildReady) and isinstance(later, BuildReady)
    assert later.pinned == first.pinned and not later.built
    # The rebuild's push wrote no digest either: an outage, never the tag handed out instead.
    assert isinstance(rebuilt_without, BuildOutage) and "pushed no manifest digest" in rebuilt_without.message
    assert len(api.created) == 2 and api.deleted == [api.created[0]]


@pytest.mark.parametrize(
    ("code", "log", "deadline", "kind", "message"),
    [
        (
            EXIT_BUILD,
            b"STEP 2/3: RUN make\nerror building at STEP: exit status 2\n",
            False,
            BuildFailed,
            "failed to build",
        ),
        (EXIT_PULL, b"Error: manifest unknown\n", False, BuildFailed, "a base image cannot be pulled"),
        (EXIT_PULL, b"dial tcp 198.18.255.1:5000: connect: connection refused\n", False, BuildOutage, "cannot reach"),
        (EXIT_PUSH, b"Error: pushing: connection refused\n", False, BuildOutage, "cannot push to push.test:5000"),
        (0, b"", True, BuildFailed, "ran past build_timeout_sec (60 s)"),
    ],
)
def test_failures_are_classified(code: int, log: bytes, deadline: bool, kind: type, message: str) -> None:
    api = FakeApi()

    async def scenario() -> object:
        finishing = asyncio.create_task(finish_when_created(api, code, log, deadline=deadline))
        result = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)
        await finishing
        return result

    result = asyncio.run(scenario())
    assert isinstance(result, kind) and message in result.message, result
    assert result.log == log


def test_a_tasks_failure_is_cached_and_an_outage_is_built_again() -> None:
    api = FakeApi()

    async def scenario() -> tuple[object, object, object]:
        finishing = asyncio.create_task(finish_when_created(api, EXIT_BUILD, b"broken\n"))
        broken = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)
        await finishing
        again = await coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60)
        # Another context whose push failed (the registry was down) builds again on the next call.
        other = files(**{"environment/app.py": "print(3)"})
        finishing = asyncio.create_task(finish_when_created(api, EXIT_PUSH, b"connection refused\n"))
        await coordinator(api).ensure_image(other, SOURCE, timeout_sec=60)
        await finishing
        finishing = asyncio.create_task(finish_when_created(api, 0))
        retried = await coordinator(api).ensure_image(other, SOURCE, timeout_sec=60)
        await finishing
        return broken, again, retried

    broken, again, retried = asyncio.run(scenario())
    assert isinstance(broken, BuildFailed) and isinstance(again, BuildFailed) and again.message == broken.message
    assert isinstance(retried, BuildReady) and retried.built
    assert len(api.created) == 3 and api.deleted == [api.created[1]]


def test_a_builder_image_that_cannot_start_is_an_outage() -> None:
    api = FakeApi()
    api.waiting = "ErrImageNeverPull"
    result = asyncio.run(coordinator(api).ensure_image(files(), SOURCE, timeout_sec=60))
    assert isinstance(result, BuildOutage) and result.kind == "builder-image"


def test_a_context_too_large_for_a_config_map_is_refused() -> None:
    noise = random.Random(1).randbytes(1_000_000).hex()  # does not compress below the limit
    big = files(**{"environment/blob.bin": noise})
    result = asyncio.run(coordinator(FakeApi()).ensure_image(big, SOURCE, timeout_sec=60))
    assert isinstance(result, BuildFailed) and "in-cluster builds take at most" in result.message
