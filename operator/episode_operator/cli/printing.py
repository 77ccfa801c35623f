"""``kubectl episode get``'s output formats, as kubectl prints custom resources.

The table's columns are the CRD's ``additionalPrinterColumns`` (``kube/objects/crds.py``),
so ``kubectl get episodes`` and ``kubectl episode get`` print the same table: ``-o wide`` adds the
columns of priority above 0, ``-A`` a NAMESPACE column first, AGE as kubectl rounds it. ``-o name``
prints ``episode.episode-operator.dev/NAME``; ``-o json|yaml`` the object, or a ``List`` of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import yaml

from episode_operator.api.episode_resource import SINGULAR
from episode_operator.api.vocabulary import GROUP
from episode_operator.kube.objects.crds import PRINTER_COLUMNS

OutputFormat = Literal["table", "wide", "name", "json", "yaml"]
COLUMN_GAP = "   "
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")


def json_path(item: Any, path: str) -> Any:
    """The value at a printer column's simple JSONPath (``.status.passAtK[0].value``); None if absent."""
    value = item
    for match in _STEP.finditer(path):
        key, index = match.groups()
        if key is not None:
            value = value.get(key) if isinstance(value, Mapping) else None
        else:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        if value is None:
            return None
    return value


def one_line(value: Any, limit: int = 200) -> str:
    """A message or a JSON value on one line, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def human_duration(seconds: float) -> str:
    """A duration as kubectl's AGE column shows it (apimachinery's ``duration.HumanDuration``)."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def _cell(value: Any, kind: str, now: float) -> str:
    if value is None:
        return ""
    if kind == "date":
        try:
            return human_duration(now - datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp())
        except ValueError:
            return "<invalid>"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def columns(*, wide: bool) -> list[dict[str, Any]]:
    """The printer columns shown: priority 0 only, or every one with ``-o wide``."""
    return [column for column in PRINTER_COLUMNS if wide or not column.get("priority")]


def table_header(*, wide: bool, all_namespaces: bool) -> list[str]:
    names = [column["name"].upper() for column in columns(wide=wide)]
    return (["NAMESPACE"] if all_namespaces else []) + ["NAME", *names]


def table_row(item: Mapping[str, Any], *, wide: bool, all_namespaces: bool, now: float) -> list[str]:
    metadata = item.get("metadata") or {}
    cells = [_cell(json_path(item, column["jsonPath"]), column["type"], now) for column in columns(wide=wide)]
    return ([metadata.get("namespace", "")] if all_namespaces else []) + [metadata.get("name", ""), *cells]


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]


def render_row(row: Sequence[str], widths: Sequence[int]) -> str:
    """One line of a table: cells padded to their column, three spaces apart (as kubectl's tabwriter)."""
    return COLUMN_GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


def resource_name(item: Mapping[str, Any]) -> str:
    """``-o name``: ``episode.episode-operator.dev/NAME``, as kubectl prints it."""
    return f"{SINGULAR}.{GROUP}/{item['metadata']['name']}"


def as_document(items: Sequence[Mapping[str, Any]], *, single: bool) -> Any:
    """``-o json|yaml``: the object when one was named, else a ``List`` as kubectl prints it."""
    if single:
        return items[0]
    return {"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {"resourceVersion": ""}}


def render_document(document: Any, output: OutputFormat) -> str:
    """One object or list as JSON (indented) or YAML, ending with a newline."""
    if output == "json":
        return json.dumps(document, indent=4) + "\n"
    return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
