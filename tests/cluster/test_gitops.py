"""The examples and docs/gitops.md, run exactly as they print their commands, in a user's shell.

Every ``#   kubectl …`` line of an example's header and every ``sh`` block of docs/gitops.md runs
with bash from a copy of the repository's examples (commands may write files), the kubectl on
this machine (``kubectl episode`` is the plugin on the PATH) and a kubeconfig whose current
context sets the test's namespace: nothing passes ``-n``. Then the objects they made are checked
through the API: what ran, what was answered from a tombstone and did not run again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from episode_operator.api.episodeset_resource import SET_PLURAL
from tests.cluster.harness import GROUP, PLURAL, VERSION, OperatorProcess, context_kubeconfig, install_crd, read_episode
from tests.conftest import REPO

EXAMPLE_MANIFESTS = REPO / "manifests" / "examples"
GITOPS_PAGE = REPO / "docs" / "gitops.md"
SH_BLOCK = re.compile(r"```sh\n(.*?)```", re.DOTALL)


def header_commands(path: Path) -> list[str]:
    """The commands a manifest's header comment prints (``#   kubectl …``)."""
    return [line[1:].strip() for line in path.read_text().splitlines() if re.match(r"#\s+kubectl ", line)]


def page_blocks(path: Path) -> list[str]:
    return SH_BLOCK.findall(path.read_text())


class Shell:
    """bash in a copy of the repository's examples, as a user whose kubeconfig context sets the namespace."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.workdir = workdir
        for folder in ("examples", "manifests/examples", "docs"):
            shutil.copytree(REPO / folder, workdir / folder)
        plugin_dir = str(Path(sys.executable).parent)
        self.environ = {**os.environ, "KUBECONFIG": str(kubeconfig), "PATH": f"{plugin_dir}:{os.environ['PATH']}"}
        self.transcript: list[str] = []

    def __call__(self, script: str, timeout: float = 600) -> str:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.workdir,
            env=self.environ,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.transcript.append(f"$ {script}\n{result.stdout}{result.stderr}")
        assert result.returncode == 0, "\n".join(self.transcript)
        return result.stdout


@pytest.fixture
def shell(kubeconfig: Path, namespace: str, api_client: client.ApiClient, tmp_path: Path) -> Shell:
    # This branch's CRDs: other sessions sharing the cluster may have installed theirs since this one started.
    install_crd(api_client)
    return Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace}), tmp_path / "repo")


def episode_names(api: client.ApiClient, namespace: str) -> list[str]:
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    return sorted(item["metadata"]["name"] for item in listed["items"])


def test_every_example_applies_as_its_header_prints(
    shell: Shell, namespace: str, api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    paths = sorted(EXAMPLE_MANIFESTS.glob("*.yaml"))
    assert paths
    for path in paths:
        commands = header_commands(path)
        assert any(command.startswith("kubectl apply -f ") for command in commands), path
        for command in commands:
            shell(command)
    # Each Episode ran under the name its manifest gives it, once, and finished (Complete, above).
    named = [yaml.safe_load_all(path.read_text()) for path in paths]
    expected = sorted(doc["metadata"]["name"] for docs in named for doc in docs if doc and doc["kind"] == "Episode")
    assert episode_names(api_client, namespace) == expected
    for name in expected:
        status = read_episode(api_client, namespace, name)["status"]
        assert (status["phase"], status["outcome"]) == ("Succeeded", "Graded"), (name, status)
    # Applying them again is a re-sync: nothing changes, nothing runs again.
    again = shell(" && ".join(f"kubectl apply -f manifests/examples/{path.name}" for path in paths))
    assert again.count("unchanged") == len(paths), again
    assert episode_names(api_client, namespace) == expected


def test_the_gitops_page_runs_as_printed(
    shell: Shell,
    namespace: str,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    operator: OperatorProcess,
) -> None:
    blocks = page_blocks(GITOPS_PAGE)
    assert len(blocks) == 4, "docs/gitops.md: the test knows its four command blocks"
    names, kustomize, tombstone, rerun = blocks

    # Names: the printed manifests are named, and the packed task is the committed one.
    shell(names)
    committed = (EXAMPLE_MANIFESTS / "gitops" / "task-hello.yaml").read_text()
    assert (shell.workdir / "manifests/examples/gitops/task-hello.yaml").read_text() == committed
    for printed in ("hello-run.yaml", "evaluation.yaml"):
        documents = list(yaml.safe_load_all((shell.workdir / printed).read_text()))
        assert all(doc["metadata"].get("name") and "generateName" not in doc["metadata"] for doc in documents)

    # apply -k, wait, apply -k again: unchanged, and nothing ran twice.
    output = shell(kustomize)
    assert output.count("unchanged") == 3, output
    assert episode_names(api_client, namespace) == ["hello-nightly-0-1", "hello-nightly-0-2", "hello-once"]
    nightly = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, SET_PLURAL, "hello-nightly"
    )
    assert nightly["status"]["created"] == 2

    # Run once: the TTL deletes it, the re-apply is answered from the tombstone and runs nothing.
    output = shell(tombstone)
    assert output.strip().endswith("Succeeded 1"), output
    answered = read_episode(api_client, namespace, "hello-ttl")
    recorded = tombstone_of(core, namespace, "hello-ttl")
    assert recorded is not None
    assert recorded["uid"] != answered["metadata"]["uid"]  # another object, answered from the first one's run
    status = answered["status"]
    assert status["finishedAt"] == recorded["status"]["finishedAt"] <= answered["metadata"]["creationTimestamp"]
    conditions = {condition["type"]: condition for condition in status["conditions"]}
    assert conditions["FromTombstone"]["status"] == "True" and conditions["Complete"]["status"] == "True"
    assert all(condition["observedGeneration"] == 1 for condition in status["conditions"])
    owned = [
        pod.metadata.name
        for pod in core.list_namespaced_pod(namespace).items
        if any(owner.uid == answered["metadata"]["uid"] for owner in pod.metadata.owner_references or [])
    ]
    assert owned == []  # (the first run's pods may still be terminating: they are the first Episode's)
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={answered['metadata']['uid']}")
    assert [event.reason for event in events.items] == ["FromTombstone"]

    # Forgotten tombstone: it runs again, for real, and its TTL leaves a new tombstone of the new run.
    shell(rerun)
    deadline = time.monotonic() + 120
    while (again := tombstone_of(core, namespace, "hello-ttl")) is None:  # removed by the block, until it runs
        assert time.monotonic() < deadline, f"no new tombstone\n{operator.log_tail()}"
        time.sleep(0.5)
    assert again["uid"] != recorded["uid"]
    assert again["uid"] != answered["metadata"]["uid"]  # the answered Episode itself was not the one that ran
    assert again["status"]["startedAt"] >= answered["metadata"]["creationTimestamp"], again


def tombstone_of(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    data = core.read_namespaced_config_map("episode-operator-tombstones", namespace).data or {}
    return dict(yaml.safe_load(data[name])) if name in data else None


def test_a_changed_spec_is_other_work_and_runs(
    shell: Shell, namespace: str, api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    """After the TTL deleted a run-once Episode, the same name with another agent runs (nop scores 0)."""
    _, _, tombstone, _ = page_blocks(GITOPS_PAGE)
    first_half = tombstone.split("kubectl wait --for=delete episode/hello-ttl --timeout=300s\n")[0]
    shell("kubectl episode pack examples/tasks/hello")
    shell(first_half + "kubectl wait --for=delete episode/hello-ttl --timeout=300s")
    # Another agent, and a TTL long enough to read the result (the TTL is not part of the work).
    shell("sed -i 's/kind: oracle/kind: nop/; s/AfterFinished: 5/AfterFinished: 3600/' hello-ttl.yaml")
    shell("kubectl apply -f hello-ttl.yaml")
    shell("kubectl wait --for=condition=Complete episode/hello-ttl --timeout=300s")
    status = read_episode(api_client, namespace, "hello-ttl")["status"]
    assert (status["outcome"], status["reward"]) == ("Graded", 0.0), status
    assert "FromTombstone" not in {condition["type"] for condition in status["conditions"]}
