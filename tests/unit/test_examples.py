"""Every example Episode in manifests/examples is valid: against the CRD's schema, and its task.

The CRD's structural OpenAPI v3 schema is turned into a JSON Schema the way the API server reads
it: ``nullable`` admits null, ``x-kubernetes-preserve-unknown-fields`` admits anything, and any
other unknown field is an error (the API server would silently prune it, so an example that
relies on one is wrong).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from episode_operator.kube.objects.crds import episode_crd
from episode_operator.kube.objects.tasks import task_config_map
from episode_operator.taskfolder.loader import validate_task
from episode_operator.taskfolder.sources import TaskFiles
from tests.conftest import EXAMPLE_TASKS, REPO

EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))


def json_schema(node: Any) -> Any:
    """A Kubernetes structural schema node as a JSON Schema (draft 4: boolean exclusiveMinimum)."""
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return {}
    result = {key: json_schema(value) for key, value in node.items() if not key.startswith("x-kubernetes-")}
    if "properties" in result:
        result["properties"] = {name: json_schema(child) for name, child in node["properties"].items()}
        result.setdefault("additionalProperties", False)
    if result.pop("nullable", False) and "type" in result:
        result["type"] = [result["type"], "null"]
        if "enum" in result:
            result["enum"] = [*result["enum"], None]
    return result


def episode_validator() -> jsonschema.Draft4Validator:
    schema = copy.deepcopy(episode_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft4Validator(json_schema(schema))


def episodes_in(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "Episode"]


def test_there_are_examples_of_each_task_source_and_agent() -> None:
    specs = [episode["spec"] for path in EXAMPLES for episode in episodes_in(path)]
    assert {next(iter(spec["task"])) for spec in specs} == {"inline", "configMap"}
    assert {spec["agent"]["kind"] for spec in specs} >= {"oracle", "command"}
    assert any(spec["agent"].get("envFrom") for spec in specs)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_matches_the_crd_schema(path: Path) -> None:
    episodes = episodes_in(path)
    assert episodes, f"{path.name} holds no Episode"
    validator = episode_validator()
    for episode in episodes:
        errors = [
            f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(episode)
        ]
        assert errors == []
        assert episode["apiVersion"] == "episode-operator.dev/v1alpha1"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_task_is_a_valid_task_folder(path: Path) -> None:
    for episode in episodes_in(path):
        task = episode["spec"]["task"]
        if "inline" in task:
            validation = validate_task(TaskFiles.from_mapping(task["inline"]["files"]))
            assert validation.problems == () and validation.task is not None, validation.problems
            # The inline copy is examples/tasks/hello, file for file.
            folder = EXAMPLE_TASKS / "hello"
            expected = {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()}
            assert task["inline"]["files"] == expected
        else:
            # The ConfigMap is what `kubectl episode pack examples/tasks/three-step-ledger` makes today.
            packed = task_config_map(
                TaskFiles.from_directory(EXAMPLE_TASKS / "three-step-ledger"), task="three-step-ledger", namespace="x"
            )
            assert task["configMap"]["name"] == packed["metadata"]["name"], "re-run the pack command in the example"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda spec: spec["agent"].update(kind="human"), "agent/kind"),
        (lambda spec: spec.pop("task"), "'task' is a required property"),
        (lambda spec: spec.update(timeoutMultiplier=0), "timeoutMultiplier"),
        (lambda spec: spec.update(tiemoutMultiplier=2), "Additional properties"),
        (lambda spec: spec["agent"].update(envFrom="model-key"), "agent/envFrom"),
    ],
)
def test_the_schema_check_refuses_broken_episodes(change: Any, complaint: str) -> None:
    (episode,) = episodes_in(REPO / "manifests" / "examples" / "command-agent.yaml")
    change(episode["spec"])
    messages = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in episode_validator().iter_errors(episode)]
    assert any(complaint in message for message in messages), messages


def test_nullable_fields_admit_null() -> None:
    (episode,) = episodes_in(REPO / "manifests" / "examples" / "hello-inline.yaml")
    episode["spec"]["image"] = None
    assert list(episode_validator().iter_errors(episode)) == []
