"""Generate the Episode and EpisodeSet CustomResourceDefinitions from the pydantic models.

Kubernetes wants a *structural* OpenAPI v3 schema: no ``$ref``, ``nullable`` instead of a
``null`` alternative, ``exclusiveMinimum`` as a flag, and free-form Kubernetes objects
(resources, tolerations, env) marked ``x-kubernetes-preserve-unknown-fields`` so the API
server keeps them. The enum of ``spec.agent.kind`` is the agent registry's kinds
(``runtime/agents/``). Run ``python -m episode_operator.kube.objects.crds --write`` after
changing either: it writes ``crds/`` and the Helm chart's identical copy
(``helm/episode-operator/crds/``); the unit tests fail while either committed file differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from episode_operator.api.episode_resource import KIND, PLURAL, SHORT_NAMES, SINGULAR, EpisodeSpec, EpisodeStatus
from episode_operator.api.episodeset_resource import (
    SET_KIND,
    SET_PLURAL,
    SET_SHORT_NAMES,
    SET_SINGULAR,
    EpisodeSetSpec,
    EpisodeSetStatus,
)
from episode_operator.api.vocabulary import GROUP, VERSION
from episode_operator.runtime.agents import AGENT_KINDS

CRD_FILE = f"{PLURAL}.{GROUP}.yaml"
# Where `--write` puts the CRD, relative to the repository: kubectl/kustomize installs and the chart.
CRD_FOLDERS = (Path("crds"), Path("helm/episode-operator/crds"))
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.reward"},
    {"name": "Turns", "type": "string", "jsonPath": ".status.progress"},
    {"name": "Outcome", "type": "string", "jsonPath": ".status.outcome"},
    {"name": "Failure", "type": "string", "jsonPath": ".status.failureKind", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
SET_CRD_FILE = f"{SET_PLURAL}.{GROUP}.yaml"
SET_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Done", "type": "string", "jsonPath": ".status.progress"},
    {"name": "Active", "type": "integer", "jsonPath": ".status.active"},
    {"name": "Mean", "type": "number", "jsonPath": ".status.meanReward"},
    {"name": "Pass@1", "type": "number", "jsonPath": ".status.passAtK[0].value", "priority": 1},
    {"name": "Infra", "type": "integer", "jsonPath": ".status.outcomes.ungraded"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
DROPPED_KEYWORDS = {"title", "$defs"}


def structural(node: Any, definitions: dict[str, Any]) -> Any:
    """A pydantic JSON schema node rewritten as a Kubernetes structural schema node."""
    if isinstance(node, list):
        return [structural(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return structural(merged, definitions)
    if "anyOf" in node:
        options = [option for option in node["anyOf"] if option != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"a structural schema cannot express the union {node['anyOf']!r}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        resolved = structural({**options[0], **rest}, definitions)
        if len(options) < len(node["anyOf"]):
            resolved["nullable"] = True
        return resolved
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROPPED_KEYWORDS or (key == "default" and value is None):
            continue
        if key == "exclusiveMinimum":
            result["minimum"] = value
            result["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            result["maximum"] = value
            result["exclusiveMaximum"] = True
        elif key == "properties":
            result[key] = {name: structural(child, definitions) for name, child in value.items()}
        elif key == "const":
            result["enum"] = [value]
        else:
            result[key] = structural(value, definitions)
    if "enum" in result and "type" not in result:
        result["type"] = "string"
    if result.get("type") == "object" and "properties" not in result:
        extra = result.get("additionalProperties")
        if extra in (None, True, {}):
            result.pop("additionalProperties", None)
            result["x-kubernetes-preserve-unknown-fields"] = True
    return result


def schema_of(model: type[BaseModel], *, defaults: bool = True) -> dict[str, Any]:
    """The structural schema of one model, by camelCase names.

    ``defaults=False`` drops every ``default``: the operator writes the whole status, so
    defaults there only cost (a 1.20 API server even refuses an empty-string one).
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = structural(raw, raw.get("$defs", {}))
    assert isinstance(schema, dict)
    return schema if defaults else _without_defaults(schema)


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_defaults(value) for key, value in node.items() if key != "default"}
    if isinstance(node, list):
        return [_without_defaults(item) for item in node]
    return node


def custom_resource_definition(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: list[str],
    columns: list[dict[str, Any]],
    description: str,
    spec: dict[str, Any],
    status: dict[str, Any],
) -> dict[str, Any]:
    """A namespaced CRD of the group, one served and stored version with a status subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": ["episode-operator"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def episode_crd() -> dict[str, Any]:
    """The CustomResourceDefinition manifest of Episode."""
    return custom_resource_definition(
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short_names=SHORT_NAMES,
        columns=PRINTER_COLUMNS,
        description="One run of a Harbor task folder: every turn, verified and scored.",
        spec=_with_agent_kinds(schema_of(EpisodeSpec)),
        status=schema_of(EpisodeStatus, defaults=False),
    )


def episodeset_crd() -> dict[str, Any]:
    """The CustomResourceDefinition manifest of EpisodeSet.

    The Episode template carries no defaults of its own: a child gets the Episode CRD's. Nor do the
    dataset's tasks (the operator's models fill them in): the API server would default fields inside
    list items, and ``kubectl apply`` and GitOps tools would then see a change on every sync.
    """
    spec = _with_agent_kinds(schema_of(EpisodeSetSpec))
    for field in ("template", "dataset"):
        spec["properties"][field] = _without_defaults(spec["properties"][field])
    return custom_resource_definition(
        kind=SET_KIND,
        plural=SET_PLURAL,
        singular=SET_SINGULAR,
        short_names=SET_SHORT_NAMES,
        columns=SET_PRINTER_COLUMNS,
        description="A dataset of task folders × an agent × attempts, run as child Episodes; their results "
        "rolled up (mean reward, pass@k).",
        spec=spec,
        status=schema_of(EpisodeSetStatus, defaults=False),
    )


def _with_agent_kinds(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec.agent.kind`` enumerates the agent registry's kinds (the API server refuses others)."""
    spec["properties"]["agent"]["properties"]["kind"]["enum"] = list(AGENT_KINDS)
    return spec


def _render(manifest: dict[str, Any], source: str) -> str:
    header = f"# Generated by `python -m episode_operator.kube.objects.crds --write` from {source}. Do not edit.\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=100, allow_unicode=True)


def render_crd() -> str:
    """The Episode CRD as the YAML committed under ``crds/``."""
    return _render(episode_crd(), "api/episode_resource.py and runtime/agents/")


def render_episodeset_crd() -> str:
    """The EpisodeSet CRD as the YAML committed under ``crds/``."""
    return _render(episodeset_crd(), "api/episodeset_resource.py and runtime/agents/")


def rendered_crds() -> dict[str, str]:
    """Every CRD of the operator: file name -> YAML."""
    return {CRD_FILE: render_crd(), SET_CRD_FILE: render_episodeset_crd()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print or write the Episode and EpisodeSet CRDs.")
    parser.add_argument(
        "--write",
        type=Path,
        nargs="*",
        metavar="FOLDER",
        help=f"Write into these folders (default: {' and '.join(f'{folder}/' for folder in CRD_FOLDERS)}).",
    )
    options = parser.parse_args(argv)
    rendered = rendered_crds()
    if options.write is None:
        sys.stdout.write("---\n".join(rendered.values()))
        return
    for folder in options.write or CRD_FOLDERS:
        folder.mkdir(parents=True, exist_ok=True)
        for filename, text in rendered.items():
            (folder / filename).write_text(text)


if __name__ == "__main__":
    main()
