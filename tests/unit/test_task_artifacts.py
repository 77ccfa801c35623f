"""spec.task.oci: task folders over a ConfigMap's size, pushed once as OCI artifacts and fetched by the operator
from its allowed registries only — bounded, verified against the digest, cached — then read with the very limits
of a ConfigMap's archive. The registry here is ``tests/oci_registry.py``, honest or lying."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeSpec, TaskSource
from episode_operator.cli.kubectl_episode import cli
from episode_operator.kube.driver import TaskSourceError, read_task_files
from episode_operator.runtime.oci_tasks import (
    ArtifactMissing,
    TaskArtifacts,
    TaskArtifactSettings,
    push_task,
)
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.oci_artifact import (
    ArtifactError,
    Layer,
    TaskReference,
    TaskRepository,
    sha256_digest,
    task_layer,
    task_manifest,
)
from episode_operator.taskfolder.sources import pack_tar
from tests.oci_registry import FakeRegistry, fake_registry
from tests.unit.folders import single_step

MIB = 1024 * 1024


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with fake_registry() as running:
        yield running


def artifacts(registry: FakeRegistry, cache: Path, **settings: Any) -> TaskArtifacts:
    return TaskArtifacts(TaskArtifactSettings(registries={registry.address: True}, cache_dir=cache, **settings))


def big_folder(size: int = 3 * MIB, seed: bytes = b"") -> TaskFiles:
    files: dict[str, bytes | str] = {**single_step(), "data.bin": seed + os.urandom(size)}
    return TaskFiles.from_mapping(files)


def repository(registry: FakeRegistry, task: str = "big") -> TaskRepository:
    return TaskRepository.parse(f"http://{registry.address}/tasks").child(task)


def push_raw(registry: FakeRegistry, archive: bytes, repo: str = "tasks/raw") -> str:
    """An artifact put straight into the registry (as anyone with push rights could): its reference."""
    registry.put_blob(b"{}")
    layer = Layer(registry.put_blob(archive), len(archive))
    return f"{registry.address}/{repo}@{registry.put_manifest(task_manifest(layer))}"


# --- references and manifests (pure) --------------------------------------------------------------------
def test_references_parse_and_refuse_with_the_reason() -> None:
    digest = "sha256:" + "a" * 64
    parsed = TaskReference.parse(f"198.18.255.1:5000/tasks/big@{digest}")
    assert (parsed.registry, parsed.repository, parsed.digest) == ("198.18.255.1:5000", "tasks/big", digest)
    for bad, reason in [
        ("198.18.255.1:5000/tasks/big:latest", "sha256"),
        (f"198.18.255.1:5000/tasks/big@sha256:{'a' * 63}", "sha256"),
        (f"tasks/big@{digest}", "registry host"),
        (f"198.18.255.1:5000/Tasks@{digest}", "repository"),
        (f"198.18.255.1:5000@{digest}", "registry host"),
    ]:
        with pytest.raises(ArtifactError, match=reason):
            TaskReference.parse(bad)
    assert TaskRepository.parse("http://h:5000/a/b").insecure
    assert not TaskRepository.parse("h.example/a").insecure
    with pytest.raises(ArtifactError, match="scheme"):
        TaskRepository.parse("ftp://h/a")
    with pytest.raises(ArtifactError, match="repository after the host"):
        TaskRepository.parse("http://h:5000")


def test_the_crd_field_refuses_a_tag_and_a_second_source() -> None:
    with pytest.raises(ValidationError, match=r"reference"):
        TaskSource.model_validate({"oci": {"reference": "198.18.255.1:5000/tasks/big:latest"}})
    digest = "sha256:" + "b" * 64
    with pytest.raises(ValidationError, match="exactly one of inline, configMap or oci"):
        TaskSource.model_validate({"oci": {"reference": f"h:1/t@{digest}"}, "configMap": {"name": "x"}})
    assert TaskSource.model_validate({"oci": {"reference": f"h:1/t@{digest}"}}).oci is not None


def test_a_manifest_is_checked_before_its_layer_is_fetched() -> None:
    layer = Layer("sha256:" + "c" * 64, 10)
    manifest = task_manifest(layer)
    assert manifest == task_manifest(layer)  # canonical: the same layer, the same name
    reference = TaskReference("h:1", "t", sha256_digest(manifest))
    assert task_layer(manifest, reference, 10) == layer
    with pytest.raises(ArtifactError, match="over the operator's limit of 9"):
        task_layer(manifest, reference, 9)
    with pytest.raises(ArtifactError, match="whose digest is"):
        task_layer(manifest + b" ", reference, 10)
    two = json.dumps({"layers": [{}, {}]}).encode()
    with pytest.raises(ArtifactError, match="exactly one layer, this one has 2"):
        task_layer(two, TaskReference("h:1", "t", sha256_digest(two)), 10)
    other = json.dumps({"layers": [{"mediaType": "application/x-bomb", "digest": layer.digest, "size": 1}]}).encode()
    with pytest.raises(ArtifactError, match="application/x-bomb"):
        task_layer(other, TaskReference("h:1", "t", sha256_digest(other)), 10)


# --- push and fetch ---------------------------------------------------------------------------------------
def test_the_same_folder_is_pushed_once_and_fetched_once(registry: FakeRegistry, tmp_path: Path) -> None:
    files = big_folder()
    archive = pack_tar(files)
    first = asyncio.run(push_task(repository(registry), archive))
    assert first.uploaded and registry.requests["PUT upload"] == 2  # the config and the layer
    again = asyncio.run(push_task(repository(registry), pack_tar(big_folder_copy(files))))
    assert not again.uploaded and again.reference == first.reference
    assert registry.requests["PUT upload"] == 2 and registry.requests["PUT manifest"] == 1

    fetcher = artifacts(registry, tmp_path)
    path = asyncio.run(fetcher.fetch(str(first.reference)))
    assert TaskFiles.from_tar(path.read_bytes()).digest() == files.digest()
    assert asyncio.run(fetcher.fetch(str(first.reference))) == path
    assert fetcher.fetches == 1 and registry.requests["GET blob"] == 1  # the second came from the cache


def big_folder_copy(files: TaskFiles) -> TaskFiles:
    return TaskFiles.from_mapping({path: entry.data for path, entry in files.items()})


def test_a_tampered_layer_is_refused_and_not_cached(registry: FakeRegistry, tmp_path: Path) -> None:
    pushed = asyncio.run(push_task(repository(registry), pack_tar(big_folder(100_000))))
    registry.tamper = "blob"
    fetcher = artifacts(registry, tmp_path)
    with pytest.raises(ArtifactError, match="tampered with or corrupt"):
        asyncio.run(fetcher.fetch(str(pushed.reference)))
    assert not fetcher.cached(pushed.reference).exists()
    assert list(fetcher.cached(pushed.reference).parent.iterdir()) == []  # no partial download left behind
    registry.tamper = None
    assert asyncio.run(fetcher.fetch(str(pushed.reference))).is_file()


def test_a_tampered_manifest_is_refused(registry: FakeRegistry, tmp_path: Path) -> None:
    pushed = asyncio.run(push_task(repository(registry), pack_tar(big_folder(1000))))
    registry.tamper = "manifest"
    with pytest.raises(ArtifactError, match="manifest whose digest is"):
        asyncio.run(artifacts(registry, tmp_path).fetch(str(pushed.reference)))
    assert registry.requests["GET blob"] == 0


def test_a_layer_over_the_limit_is_refused_before_a_byte_of_it(registry: FakeRegistry, tmp_path: Path) -> None:
    pushed = asyncio.run(push_task(repository(registry), pack_tar(big_folder(2 * MIB))))
    with pytest.raises(ArtifactError, match=r"over the operator's limit of 1048576 \(--task-artifact-limit\)"):
        asyncio.run(artifacts(registry, tmp_path, max_layer_bytes=MIB).fetch(str(pushed.reference)))
    assert registry.requests["GET blob"] == 0


def test_a_registry_sending_more_than_declared_is_cut_off(registry: FakeRegistry, tmp_path: Path) -> None:
    pushed = asyncio.run(push_task(repository(registry), pack_tar(big_folder(1000))))
    registry.tamper = "longer"
    with pytest.raises(ArtifactError, match="sent more than the"):
        asyncio.run(artifacts(registry, tmp_path).fetch(str(pushed.reference)))


def test_only_the_operators_registries_are_called(registry: FakeRegistry, tmp_path: Path) -> None:
    pushed = asyncio.run(push_task(repository(registry), pack_tar(big_folder(1000))))
    pushed_requests = sum(registry.requests.values())
    fetcher = TaskArtifacts(TaskArtifactSettings(registries={"registry.internal:5000": False}, cache_dir=tmp_path))
    with pytest.raises(ArtifactError, match=r"not one this operator fetches tasks from \(--task-registry"):
        asyncio.run(fetcher.fetch(str(pushed.reference)))
    assert sum(registry.requests.values()) == pushed_requests  # not one request since the push


def test_a_missing_artifact_is_waited_for_then_refused_naming_the_field(registry: FakeRegistry, tmp_path: Path) -> None:
    missing = f"{registry.address}/tasks/none@sha256:{'d' * 64}"
    with pytest.raises(ArtifactMissing, match="not found"):
        asyncio.run(artifacts(registry, tmp_path).fetch(missing))
    source = TaskSource.model_validate({"oci": {"reference": missing}})
    with pytest.raises(TaskSourceError, match=r"^spec\.task\.oci\.reference: .*not found in the registry"):
        asyncio.run(read_task_files(None, "ns", source, 1.5, artifacts(registry, tmp_path)))  # type: ignore[arg-type]
    assert registry.requests["GET manifest"] >= 2  # waited: asked again


def test_a_hard_link_bomb_is_refused_with_a_configmaps_limits(registry: FakeRegistry, tmp_path: Path) -> None:
    """1 MiB of zeros and 600 hard links to it: 1 KiB packed, 600 MiB as files — over the folder limit, refused
    as the links are resolved, before anything is unpacked anywhere."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, content in single_step().items():
            info = tarfile.TarInfo(path)
            info.size = len(content.encode())
            archive.addfile(info, io.BytesIO(content.encode()))
        info = tarfile.TarInfo("zeros")
        info.size = MIB
        archive.addfile(info, io.BytesIO(b"\0" * MIB))
        for index in range(600):
            link = tarfile.TarInfo(f"links/{index}")
            link.type, link.linkname = tarfile.LNKTYPE, "zeros"
            archive.addfile(link)
    assert len(buffer.getvalue()) < 64 * 1024
    reference = push_raw(registry, buffer.getvalue())
    source = TaskSource.model_validate({"oci": {"reference": reference}})
    files = asyncio.run(read_task_files(None, "ns", source, 0, artifacts(registry, tmp_path)))  # type: ignore[arg-type]
    messages = [problem.render() for problem in files.problems]
    assert any("links/" in message and "exceeds 536870912 bytes" in message for message in messages), messages
    assert sum(len(entry.data) for entry in files.values()) <= 536870912


def test_the_cache_keeps_to_its_limit(registry: FakeRegistry, tmp_path: Path) -> None:
    fetcher = artifacts(registry, tmp_path, max_cache_bytes=150_000)
    paths = []
    for index in range(3):
        pushed = asyncio.run(push_task(repository(registry, f"t{index}"), pack_tar(big_folder(100_000))))
        paths.append(asyncio.run(fetcher.fetch(str(pushed.reference))))
    assert [path.exists() for path in paths] == [False, False, True]


# --- the CLI ------------------------------------------------------------------------------------------------
def write_folder(root: Path, files: TaskFiles) -> Path:
    for path, entry in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(entry.data)
    return root


def test_pack_pushes_a_big_folder_once_and_prints_its_task(registry: FakeRegistry, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "big-task", big_folder())
    where = f"http://{registry.address}/tasks"
    result = CliRunner().invoke(cli, ["pack", str(folder), "--task-repository", where])
    assert result.exit_code == 0, result.output
    reference = f"{registry.address}/tasks/big-task@sha256:"
    assert result.stdout.startswith(f"oci:\n  reference: {reference}"), result.stdout  # spec.task, as YAML
    assert "pushed" in result.stderr
    again = CliRunner().invoke(cli, ["pack", str(folder)], env={"EPISODE_TASK_REPOSITORY": where})
    assert again.exit_code == 0 and again.stdout == result.stdout
    assert "already in the registry (nothing uploaded)" in again.stderr
    assert registry.requests["PUT manifest"] == 1
    manifest = CliRunner().invoke(cli, ["run", str(folder), "--task-repository", where, "-o", "yaml"])
    assert manifest.exit_code == 0, manifest.output
    spec = EpisodeSpec.model_validate(next(iter(__import__("yaml").safe_load_all(manifest.stdout)))["spec"])
    assert spec.task.oci is not None and spec.task.oci.reference.startswith(reference)


def test_a_big_folder_without_a_repository_is_refused_naming_the_flag(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "big-task", big_folder())
    result = CliRunner().invoke(cli, ["run", str(folder), "-o", "yaml"], env={"EPISODE_TASK_REPOSITORY": ""})
    assert result.exit_code == 1
    assert "a ConfigMap holds about" in result.output and "give --task-repository" in result.output
    assert "Traceback" not in result.output
    bad = CliRunner().invoke(cli, ["pack", str(folder), "--task-repository", "ftp://x/y"])
    assert bad.exit_code == 2 and "--task-repository" in bad.output and "scheme" in bad.output


def test_an_unreachable_registry_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "big-task", big_folder())
    with fake_registry() as gone:
        address = gone.address
    result = CliRunner().invoke(cli, ["pack", str(folder), "--task-repository", f"http://{address}/tasks"])
    assert result.exit_code == 1, result.output
    assert f"cannot push to {address}" in result.output and "Traceback" not in result.output


def test_eval_pushes_a_datasets_big_task_and_packs_the_rest_as_configmaps(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    """A dataset of one big folder and one small: the set names the big one by its artifact's digest and the
    small one by its ConfigMap, and only the small one's ConfigMap is a manifest to apply."""
    dataset = tmp_path / "mixed"
    write_folder(dataset / "big-task", big_folder())
    write_folder(dataset / "small-task", TaskFiles.from_mapping(single_step()))
    where = f"http://{registry.address}/tasks"
    args = ["eval", str(dataset), "--task-repository", where, "-o", "yaml"]
    result = CliRunner().invoke(cli, [*args, "--agent", "nop"])
    assert result.exit_code == 0, result.output
    manifests = list(__import__("yaml").safe_load_all(result.stdout))
    assert [manifest["kind"] for manifest in manifests] == ["ConfigMap", "EpisodeSet"]
    tasks = {task["name"]: task for task in manifests[1]["spec"]["dataset"]["tasks"]}
    assert tasks["big-task"]["oci"]["reference"].startswith(f"{registry.address}/tasks/big-task@sha256:")
    assert tasks["small-task"]["configMap"]["name"] == manifests[0]["metadata"]["name"]
    assert registry.requests["PUT manifest"] == 1 and "pushed" in result.stderr
    again = CliRunner().invoke(cli, [*args, "--agent", "nop"])
    assert again.exit_code == 0 and again.stdout == result.stdout  # the same set, and nothing pushed again
    assert registry.requests["PUT manifest"] == 1


def test_a_datasets_big_task_without_a_repository_is_refused_and_nothing_pushed(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    dataset = tmp_path / "mixed"
    write_folder(dataset / "big-task", big_folder())
    write_folder(dataset / "small-task", TaskFiles.from_mapping(single_step()))
    result = CliRunner().invoke(
        cli, ["eval", str(dataset), "--agent", "nop", "-o", "yaml"], env={"EPISODE_TASK_REPOSITORY": ""}
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{dataset / 'big-task'}: " in result.output and "give --task-repository" in result.output
    # The Gym server's catalogue holds ConfigMaps: pack --dataset refuses the big folder, naming why.
    packed = CliRunner().invoke(cli, ["pack", str(dataset), "--dataset", "mixed", "-o", "yaml"])
    assert packed.exit_code == 1 and "catalogue holds ConfigMaps only" in packed.output
    assert not registry.requests.get("PUT manifest")
