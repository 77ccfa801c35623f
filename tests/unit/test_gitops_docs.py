"""What GitOps needs of the examples and what docs/gitops.md tells, checked without a cluster.

Every manifest in manifests/examples (and every Episode or EpisodeSet the README shows) has a
``metadata.name`` and fits its CRD; the packed task in manifests/examples/gitops is what ``pack``
prints today; the Argo CD health checks of docs/gitops.md run in Lua 5.1 (gopher-lua's dialect)
and say what the page says; the annotations it names are spelled as the tools and the operator
spell them. (tests/cluster/test_gitops.py runs the page's commands.)
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import lupa.lua51 as lua51
import pytest
import yaml
from click.testing import CliRunner

from episode_operator.cli.kubectl_episode import cli
from episode_operator.kube.objects.crds import episode_crd, episodeset_crd
from episode_operator.runtime.tombstones import RUN_ONCE_ANNOTATION
from tests.conftest import EXAMPLE_TASKS, REPO
from tests.unit.test_examples import json_schema

PAGE = REPO / "docs" / "gitops.md"
MANIFESTS = sorted((REPO / "manifests" / "examples").rglob("*.yaml"))
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)
CRDS = {"Episode": episode_crd, "EpisodeSet": episodeset_crd}


def validator(kind: str) -> jsonschema.Draft4Validator:
    schema = copy.deepcopy(CRDS[kind]()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft4Validator(json_schema(schema))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc and "kind" in doc]


def readme_objects() -> list[dict[str, Any]]:
    blocks = YAML_BLOCK.findall((REPO / "README.md").read_text())
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc and doc.get("kind") in CRDS]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: str(path.relative_to(REPO / "manifests" / "examples")))
def test_every_example_object_is_named_and_fits_its_crd(path: Path) -> None:
    for document in documents(path):
        if document["kind"] == "Kustomization":
            assert all((path.parent / resource).is_file() for resource in document["resources"])
            continue
        metadata = document["metadata"]
        assert metadata.get("name") and "generateName" not in metadata, path
        if document["kind"] in CRDS:
            assert [error.message for error in validator(document["kind"]).iter_errors(document)] == []


def test_the_readme_shows_named_objects_that_fit_their_crds() -> None:
    objects = readme_objects()
    assert {obj["kind"] for obj in objects} == set(CRDS)
    for obj in objects:
        assert obj["metadata"].get("name"), obj["metadata"]
        assert [error.message for error in validator(obj["kind"]).iter_errors(obj)] == []


def test_the_gitops_folder_packs_the_task_as_pack_prints_it_today() -> None:
    printed = CliRunner().invoke(cli, ["pack", str(EXAMPLE_TASKS / "hello"), "-o", "yaml"])
    assert printed.exit_code == 0, printed.output
    assert (REPO / "manifests" / "examples" / "gitops" / "task-hello.yaml").read_text() == printed.output
    (config_map,) = documents(REPO / "manifests" / "examples" / "gitops" / "task-hello.yaml")
    named = {config_map["metadata"]["name"]}
    for path in (REPO / "manifests" / "examples" / "gitops").glob("hello-*.yaml"):
        for document in documents(path):
            spec = document["spec"]
            tasks = spec["dataset"]["tasks"] if document["kind"] == "EpisodeSet" else [spec["task"]]
            assert {task["configMap"]["name"] for task in tasks} <= named, path
    assert RUN_ONCE_ANNOTATION in (REPO / "manifests" / "examples" / "gitops" / "hello-once.yaml").read_text()


# --- Argo CD health checks ---------------------------------------------------------------------------------
def health_checks() -> dict[str, str]:
    for block in YAML_BLOCK.findall(PAGE.read_text()):
        document = yaml.safe_load(block)
        if document.get("kind") == "ConfigMap" and document["metadata"]["name"] == "argocd-cm":
            return {
                key.removeprefix("resource.customizations.health."): script for key, script in document["data"].items()
            }
    raise AssertionError("docs/gitops.md shows no argocd-cm")


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """Run the page's health check as Argo CD does: ``obj`` global, a table returned."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)

    def table(value: Any) -> Any:
        if isinstance(value, dict):
            return runtime.table_from({key: table(item) for key, item in value.items()})
        if isinstance(value, list):
            return runtime.table_from([table(item) for item in value])
        return value

    runtime.globals().obj = table(obj)
    result = runtime.execute(health_checks()[f"episode-operator.dev_{kind}"])
    return str(result["status"]), str(result["message"])


@pytest.mark.parametrize(
    ("kind", "obj", "status", "fragment"),
    [
        ("Episode", {"spec": {}}, "Progressing", "Pending"),
        ("Episode", {"spec": {}, "status": {"phase": "Running", "progress": "1/3"}}, "Progressing", "Running 1/3"),
        ("Episode", {"spec": {"suspend": True}, "status": {"phase": "Pending"}}, "Suspended", "spec.suspend"),
        (
            "Episode",
            {"spec": {}, "status": {"phase": "Succeeded", "outcome": "Graded", "message": "reward 1"}},
            "Healthy",
            "Graded: reward 1",
        ),
        (
            "Episode",
            {"spec": {}, "status": {"phase": "Failed", "failureKind": "harbor:task_deadline"}},
            "Degraded",
            "harbor:task_deadline",
        ),
        (
            "EpisodeSet",
            {"spec": {}, "status": {"phase": "Running", "progress": "3/8", "active": 2}},
            "Progressing",
            "2 active",
        ),
        ("EpisodeSet", {"spec": {"suspend": True}, "status": {"phase": "Pending"}}, "Suspended", "spec.suspend"),
        (
            "EpisodeSet",
            {"spec": {}, "status": {"phase": "Succeeded", "progress": "8/8", "completionTime": "2026-01-01T00:00:00Z"}},
            "Healthy",
            "8/8 finished",
        ),
        (
            "EpisodeSet",
            {"spec": {}, "status": {"phase": "Failed", "reason": "FailurePolicy"}},
            "Degraded",
            "FailurePolicy",
        ),
    ],
)
def test_the_argo_cd_health_checks_say_what_the_page_says(
    kind: str, obj: dict[str, Any], status: str, fragment: str
) -> None:
    found, message = health(kind, obj)
    assert found == status and fragment in message, (found, message)


# --- the annotations the page names ------------------------------------------------------------------------
KNOWN_ANNOTATIONS = {
    RUN_ONCE_ANNOTATION,
    "argocd.argoproj.io/sync-options",
    "argocd.argoproj.io/sync-wave",
    "argocd.argoproj.io/compare-options",
    "kustomize.toolkit.fluxcd.io/prune",
    "kustomize.toolkit.fluxcd.io/ssa",
    "kustomize.toolkit.fluxcd.io/reconcile",
}


def test_every_annotation_the_page_names_is_a_real_one() -> None:
    named = set(re.findall(r"`([a-z0-9.-]+\.[a-z]+/[a-z-]+)(?::|=)", PAGE.read_text()))
    assert named and named <= KNOWN_ANNOTATIONS, named - KNOWN_ANNOTATIONS
    assert {"argocd.argoproj.io/sync-options", "kustomize.toolkit.fluxcd.io/ssa", RUN_ONCE_ANNOTATION} <= named
