"""Tasks of any size (README): a folder over a ConfigMap's size, pushed to the cluster's registry by
``kubectl episode pack``/``run`` as README prints them, run to its reward; and, beside an honest artifact,
an attacker's — tampered (served by a lying registry), oversized, a hard-link bomb, from a registry the
operator does not fetch from — each refused with a status naming ``spec.task.oci.reference`` and why.

The operator is this module's own, watching a namespace no other operator of the session watches, with
the cluster's registry and the lying one as its ``--task-registry`` and an 8 MiB ``--task-artifact-limit``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from episode_operator.runtime.oci_tasks import push_task
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.oci_artifact import Layer, TaskRepository, task_manifest
from episode_operator.taskfolder.sources import SourceLimits, pack_tar
from tests.cluster.harness import (
    OperatorProcess,
    context_kubeconfig,
    create_episode,
    install_crd,
    read_episode,
    wait_for_episode,
)
from tests.cluster.test_gitops import Shell
from tests.conftest import REPO
from tests.oci_registry import FakeRegistry, fake_registry

pytestmark = pytest.mark.xdist_group("task-artifacts")

README = REPO / "README.md"
REGISTRY = "198.18.255.1:5000"
MiB = 1024 * 1024
LIMIT = 8 * MiB
TASK_TOML = """\
schema_version = "1.4"
[task]
name = "tests/big-task"
[agent]
timeout_sec = 60.0
[verifier]
timeout_sec = 120.0
[environment]
docker_image = "episode-operator.local/sandbox:bookworm"
workdir = "/app"
"""


def big_folder(data: bytes) -> dict[str, bytes]:
    """A task whose test passes only when every byte of ``data`` reached the verifier as it was packed."""
    digest = hashlib.sha256(data).hexdigest()
    return {
        "task.toml": TASK_TOML.encode(),
        "instruction.md": b"Nothing to do: the test checks the data travelled intact.\n",
        "solution/solve.sh": b"true\n",
        "tests/data.bin": data,
        "tests/test.sh": (
            f'if [ "$(sha256sum /tests/data.bin | cut -d" " -f1)" = {digest} ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ).encode(),
    }


def write(root: Path, files: dict[str, bytes]) -> Path:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def push(files: dict[str, bytes] | bytes, task: str) -> str:
    """An artifact in the cluster's registry, as pack pushes one (or any archive, as an attacker would)."""
    archive = files if isinstance(files, bytes) else pack_tar(TaskFiles.from_mapping(files))
    repository = TaskRepository.parse(f"http://{REGISTRY}/episode-tasks-tests").child(task)
    return str(asyncio.run(push_task(repository, archive)).reference)


@pytest.fixture(scope="module")
def liar() -> Iterator[FakeRegistry]:
    """A registry that answers other bytes than the digests asked for: an attacker's, or a corrupting one."""
    with fake_registry() as registry:
        registry.tamper = "blob"
        yield registry


@pytest.fixture
def operator_here(
    kubeconfig: Path, quiet_namespace: str, liar: FakeRegistry, tmp_path: Path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        kubeconfig,
        tmp_path / "data",
        tmp_path / "operator.log",
        quiet_namespace,
        extra_args=(
            f"--task-registry=http://{REGISTRY}",
            f"--task-registry=http://{liar.address}",
            f"--task-artifact-limit={LIMIT}",
        ),
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_a_folder_over_a_configmap_runs_as_the_readme_prints_it_and_is_pushed_once(
    kubeconfig: Path, quiet_namespace: str, operator_here: OperatorProcess, api_client: client.ApiClient, tmp_path: Path
) -> None:
    block = README.read_text().split("<!-- BEGIN tasks-of-any-size -->\n```sh\n")[1].split("```\n<!-- END")[0]
    shell = Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": quiet_namespace}), tmp_path / "repo")
    write(shell.workdir / "my-big-task", big_folder(os.urandom(3 * MiB)))  # the user's folder: 3 MiB, incompressible
    # The user's dataset: another big folder beside a small one (a ConfigMap).
    write(shell.workdir / "my-dataset" / "big-one", big_folder(os.urandom(2 * MiB)))
    write(shell.workdir / "my-dataset" / "small-one", big_folder(os.urandom(1000)))
    install_crd(api_client)  # this branch's CRD (spec.task.oci): a session of another branch may have replaced it
    shell(block, timeout=900)  # bash -e: `run --wait` and `eval --wait` exit 0 only when all Succeeded
    transcript = shell.transcript[-1]
    assert "my-big-task: over a ConfigMap's size; pushed " in transcript, transcript  # by pack
    assert "already in the registry (nothing uploaded)" in transcript, transcript  # run: the same folder
    assert "big-one: over a ConfigMap's size; pushed " in transcript, transcript  # by eval
    reference = transcript.split("reference: ")[1].split()[0]
    assert reference.startswith(f"{REGISTRY}/episode-tasks/my-big-task@sha256:")
    episodes = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "episode-operator.dev", "v1alpha1", quiet_namespace, "episodes"
    )["items"]
    tasks = {json.dumps(episode["spec"]["task"], sort_keys=True): episode["metadata"]["name"] for episode in episodes}
    assert len(episodes) == 3 and json.dumps({"oci": {"reference": reference}}) in tasks, tasks
    big_one = [episode for episode in episodes if "big-one" in json.dumps(episode["spec"]["task"])]
    assert len(big_one) == 1 and "oci" in big_one[0]["spec"]["task"], tasks
    assert any("configMap" in episode["spec"]["task"] for episode in episodes), tasks  # the small one
    for episode in episodes:
        status = read_episode(api_client, quiet_namespace, episode["metadata"]["name"])["status"]
        assert (status["phase"], status["outcome"], status["reward"]) == ("Succeeded", "Graded", 1.0), status
    cached = sorted(path.name for path in (operator_here.data_dir / "task-artifacts" / "sha256").glob("*.tar.gz"))
    oci = [episode["spec"]["task"]["oci"]["reference"] for episode in episodes if "oci" in episode["spec"]["task"]]
    assert cached == sorted(item.split("sha256:")[1] + ".tar.gz" for item in oci)


def bomb() -> bytes:
    """One MiB of zeros and enough hard links to it to pass a ConfigMap's byte bound: a few KiB packed."""
    links = SourceLimits().max_total_bytes // MiB + 8
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in {**big_folder(b"x"), "environment/big.bin": bytes(MiB)}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for number in range(links):
            link = tarfile.TarInfo(f"environment/copy{number:04d}")
            link.type, link.linkname = tarfile.LNKTYPE, "environment/big.bin"
            archive.addfile(link)
    return buffer.getvalue()


def test_an_attackers_artifacts_are_refused_naming_the_reference_and_the_honest_one_runs(
    quiet_namespace: str, operator_here: OperatorProcess, liar: FakeRegistry, api_client: client.ApiClient
) -> None:
    honest = push(big_folder(os.urandom(1000)), "honest")
    # The lying registry holds a real artifact but serves other bytes for its layer.
    liar.put_blob(b"{}")
    archive = pack_tar(TaskFiles.from_mapping(big_folder(os.urandom(1000))))
    digest = liar.put_manifest(task_manifest(Layer(liar.put_blob(archive), len(archive))))
    references = {
        "honest": honest,
        "tampered": f"{liar.address}/tasks/tampered@{digest}",
        "oversized": push(big_folder(os.urandom(LIMIT + MiB)), "oversized"),
        "bomb": push(bomb(), "bomb"),
        "elsewhere": f"registry.example:5000/tasks/elsewhere@sha256:{'e' * 64}",
    }
    install_crd(api_client)  # this branch's CRD (spec.task.oci): a session of another branch may have replaced it
    for name, reference in references.items():
        create_episode(
            api_client, quiet_namespace, name, {"task": {"oci": {"reference": reference}}, "agent": {"kind": "oracle"}}
        )
    ended = {
        name: wait_for_episode(api_client, quiet_namespace, name, operator_here, timeout=300) for name in references
    }

    assert (ended["honest"]["phase"], ended["honest"]["reward"]) == ("Succeeded", 1.0), ended["honest"]
    expected = {
        "tampered": ("episode:task_source", "tampered with or corrupt; refused"),
        "oversized": ("episode:task_source", f"over the operator's limit of {LIMIT} (--task-artifact-limit)"),
        "bomb": ("harbor:invalid_task", f"task folder exceeds {SourceLimits().max_total_bytes} bytes in all"),
        "elsewhere": ("episode:task_source", "is not one this operator fetches tasks from (--task-registry"),
    }
    for name, (kind, says) in expected.items():
        status = ended[name]
        assert (status["phase"], status.get("failureKind")) == ("Failed", kind), status
        assert says in status["message"], status["message"]
        assert not status.get("attempts"), status  # refused before any pod
    for name in ("tampered", "oversized", "elsewhere"):
        assert ended[name]["message"].startswith(f"spec.task.oci.reference: {references[name]}"), ended[name]
    assert "environment/copy" in ended["bomb"]["message"]  # the file is named
    # Nothing unverified was kept: the cache holds what hashed to its digest (the bomb did; its folder is what
    # is refused, as a ConfigMap's would be), not the tampered layer nor anything of the oversized one.
    cached = {path.name for path in (operator_here.data_dir / "task-artifacts" / "sha256").glob("*")}
    assert cached == {honest.split("sha256:")[1] + ".tar.gz", references["bomb"].split("sha256:")[1] + ".tar.gz"}
    assert operator_here.process is not None and operator_here.process.poll() is None, operator_here.log_tail()


def test_a_reference_by_tag_is_refused_by_the_api_server_naming_the_field(
    quiet_namespace: str, api_client: client.ApiClient
) -> None:
    install_crd(api_client)
    with pytest.raises(client.ApiException) as refused:
        create_episode(
            api_client,
            quiet_namespace,
            "by-tag",
            {"task": {"oci": {"reference": f"{REGISTRY}/tasks/big:latest"}}, "agent": {"kind": "oracle"}},
        )
    assert refused.value.status == 422 and "spec.task.oci.reference" in str(refused.value.body)
