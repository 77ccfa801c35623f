"""The Episode API: models, and the CRD generated from them (no drift, structural)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from episode_operator.api.episode_resource import EpisodeSpec, EpisodeStatus, TurnStatus
from episode_operator.kube.objects.crds import CRD_FOLDERS, episode_crd, rendered_crds
from episode_operator.runtime.admission import Refusal, admit_spec
from episode_operator.taskfolder.plan import SEED_SETTINGS, ServerSettings
from tests.conftest import REPO


@pytest.mark.parametrize("folder", CRD_FOLDERS, ids=str)
@pytest.mark.parametrize("filename", sorted(rendered_crds()))
def test_committed_crds_match_the_models(folder: Path, filename: str) -> None:
    committed = (REPO / folder / filename).read_text()
    assert committed == rendered_crds()[filename], "run: python -m episode_operator.kube.objects.crds --write"


@pytest.mark.parametrize("filename", sorted(rendered_crds()))
def test_each_crd_is_one_the_api_server_takes(filename: str) -> None:
    """The client's own model of a CRD forbids what JSONSchemaProps does not know (a ``propertyNames``
    pydantic writes for a dict with Literal keys): the API server would refuse the CRD, and every
    install with it."""
    from kubernetes.client import V1CustomResourceDefinition

    V1CustomResourceDefinition.model_validate(yaml.safe_load(rendered_crds()[filename]))


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found += walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += walk(value, f"{path}[{index}]")
    return found


def test_crd_schema_is_structural() -> None:
    schema = episode_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title", "$defs"} & set(node), path
        if "properties" in node or "items" in node or "additionalProperties" in node:
            assert node.get("type") in ("object", "array"), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path
    spec = schema["properties"]["spec"]["properties"]
    assert spec["agent"]["properties"]["kind"]["enum"] == ["oracle", "nop", "command", "harness"]
    multiplier = spec["timeoutMultiplier"]
    assert (
        multiplier["type"],
        multiplier["default"],
        multiplier["minimum"],
        multiplier["exclusiveMinimum"],
    ) == ("number", 1.0, 0, True)
    assert spec["resources"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"] is True


def test_crd_names_and_columns() -> None:
    crd = episode_crd()["spec"]
    assert crd["names"]["shortNames"] == ["epi"]  # not "ep": that is Endpoints'
    version = crd["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Reward",
        "Turns",
        "Outcome",
        "Failure",
        "Age",
    ]


EPISODE = """
task:
  configMap: {name: hello-task}
agent:
  kind: command
  command: my-agent --instruction "$EPISODE_INSTRUCTION_FILE"
  envFrom: [{secretRef: {name: model-key}}]
image: episode-operator.local/sandbox:bookworm
timeoutMultiplier: 2
nodeSelector: {pool: eval}
"""


def test_spec_round_trips_in_camel_case() -> None:
    spec = EpisodeSpec.model_validate(yaml.safe_load(EPISODE))
    assert spec.task.config_map is not None and spec.task.config_map.key == "task.tar.gz"
    assert spec.agent.env_from == [{"secretRef": {"name": "model-key"}}]
    api = spec.to_api()
    assert api["timeoutMultiplier"] == 2.0 and api["nodeSelector"] == {"pool": "eval"}
    assert EpisodeSpec.model_validate(api) == spec


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"task": {}}, "exactly one of inline, configMap or oci"),
        (
            {"task": {"inline": {"files": {}}, "configMap": {"name": "x"}}},
            "exactly one of inline, configMap or oci",
        ),
        ({"agent": {"kind": "command"}}, "spec.agent.command is required when spec.agent.kind is command"),
        ({"agent": {"kind": "command", "command": "  "}}, "spec.agent.command is required"),
        ({"agent": {"kind": "oracle", "command": "x"}}, "spec.agent.command applies to kind command only, not oracle"),
        ({"agent": {"kind": "nop", "setup": "x"}}, "spec.agent.setup applies to kind command only, not nop"),
        ({"agent": {"kind": "human"}}, "spec.agent.kind: unknown kind 'human'; one of oracle, nop, command, harness"),
        ({"timeoutMultiplier": 0}, "spec.timeoutMultiplier: Input should be greater than 0"),
        (
            {"harbor": {"promptTemplate": "Solve it."}},
            "spec.harbor.promptTemplate: a prompt template must say where the instruction goes",
        ),
        ({"harbor": {"stepSetupTimeoutSec": 0}}, "spec.harbor.stepSetupTimeoutSec: Input should be greater than 0"),
        ({"harbor": {"verifierGraceSec": -1}}, "spec.harbor.verifierGraceSec: Input should be greater than or equal"),
        ({"harbor": {"enforceTaskTimeouts": "sometimes"}}, "spec.harbor.enforceTaskTimeouts"),
    ],
)
def test_invalid_specs(change: dict[str, Any], fragment: str) -> None:
    """Admission refuses each with a message naming the field (the agent's rules come from its registry entry)."""
    document = {**yaml.safe_load(EPISODE), **change}
    refusal = admit_spec(document)
    assert isinstance(refusal, Refusal), refusal
    assert refusal.failure_kind == "episode:invalid_spec"
    assert fragment in refusal.message


def test_status_serializes_without_unset_fields() -> None:
    status = EpisodeStatus(phase="Running", turns=[TurnStatus(name="a")], current_turn=0)
    assert status.to_api() == {
        "phase": "Running",
        "verifierRewards": {},
        "attempts": [],
        "currentTurn": 0,
        "turns": [{"name": "a", "phase": "Pending", "verifierRewards": {}}],
        "conditions": [],
    }


def test_harbor_settings_default_to_the_seeds_and_reach_the_plan_as_given() -> None:
    """spec.harbor unset is Gym's server defaults; set, every field reaches resolve_plan by its name."""
    spec = EpisodeSpec.model_validate(yaml.safe_load(EPISODE))
    assert spec.harbor.server_settings() == SEED_SETTINGS
    given = {
        "stepSetupTimeoutSec": 5,
        "verifierGraceSec": 1,
        "enforceTaskTimeouts": False,
        "defaultEpisodeTimeoutSec": 900,
        "separateVerifierForArtifacts": True,
        "promptTemplate": "Context.\n{instruction}",
    }
    settings = EpisodeSpec.model_validate({**yaml.safe_load(EPISODE), "harbor": given}).harbor.server_settings()
    assert settings == ServerSettings(5, 1, False, 900, True, "Context.\n{instruction}")
    schema = episode_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    # Every setting but the outcome policy, which is the runner's (the plan knows nothing of it).
    assert set(schema["harbor"]["properties"]) == {*given, "agentOutcomePolicy"}
