"""Generate the Episode CustomResourceDefinition from the pydantic models.

Kubernetes wants a *structural* OpenAPI v3 schema: no ``$ref``, ``nullable`` instead of a
``null`` alternative, ``exclusiveMinimum`` as a flag, and free-form Kubernetes objects
(resources, tolerations, env) marked ``x-kubernetes-preserve-unknown-fields`` so the API
server keeps them. Run ``python -m episode_operator.api.crd --write`` after changing the
models; ``tests/unit/test_crd.py`` fails while the committed file differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from episode_operator.api.models import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    EpisodeSpec,
    EpisodeStatus,
)

CRD_FILE = f"{PLURAL}.{GROUP}.yaml"
PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.reward"},
    {"name": "Turns", "type": "string", "jsonPath": ".status.progress"},
    {"name": "Outcome", "type": "string", "jsonPath": ".status.outcome"},
    {"name": "Failure", "type": "string", "jsonPath": ".status.failureKind", "priority": 1},
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


def schema_of(model: type[EpisodeSpec] | type[EpisodeStatus], *, defaults: bool = True) -> dict[str, Any]:
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


def episode_crd() -> dict[str, Any]:
    """The CustomResourceDefinition manifest of Episode."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["episode-operator"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "One run of a Harbor task folder: every turn, verified and scored.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": schema_of(EpisodeSpec),
                                "status": schema_of(EpisodeStatus, defaults=False),
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as the YAML committed under ``crds/``."""
    header = "# Generated by `python -m episode_operator.api.crd --write` from api/models.py. Do not edit.\n"
    return header + yaml.safe_dump(episode_crd(), sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print or write the Episode CRD.")
    parser.add_argument("--write", type=Path, nargs="?", const=Path("crds"), help="Write into this folder.")
    options = parser.parse_args(argv)
    text = render_crd()
    if options.write is None:
        sys.stdout.write(text)
        return
    options.write.mkdir(parents=True, exist_ok=True)
    (options.write / CRD_FILE).write_text(text)


if __name__ == "__main__":
    main()
