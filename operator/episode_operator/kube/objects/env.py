"""The agent's ``env``/``envFrom``, read as a kubelet reads a container's, into the values its jobs get.

``spec.agent.env`` and ``envFrom`` are the agent's: typically its own API keys. On the main
container's environment they would be inherited by everything that runs there — the task's own
``setup.sh``, its ENTRYPOINT, a shared ``test.sh``, all of them task code, possibly from a
dataset nobody audited. So the operator reads them itself (this module, pure: the Secrets and
ConfigMaps they name are fetched by the driver) and gives them to the agent's own jobs only.

Kubernetes' rules, kept: ``envFrom`` sources in order, then ``env`` entries over them; a
``prefix``; a name that is no valid variable name is skipped (the kubelet records an Event, so
does the operator); ``$(NAME)`` in a value expands to a variable defined before it (the
container's own ``[environment].env`` included), ``$$`` is a literal ``$``, and an unknown
reference stays as written. A Secret, ConfigMap or key that is missing and not ``optional``
refuses the Episode before any pod, naming the field. ``fieldRef``/``resourceFieldRef`` entries
name the pod itself and hold no secret: they stay on the container (:func:`pod_entries`).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

SourceKind = Literal["secret", "configmap"]
# A kubelet takes any C identifier-ish name; a shell job can only export these (the supervisor's rule).
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
POD_FIELDS = ("fieldRef", "resourceFieldRef")


@dataclass(frozen=True)
class Sources:
    """The Secrets' (decoded) and ConfigMaps' ``data`` the entries name; a name absent here does not exist
    (a ConfigMap's ``binaryData`` never reaches an environment, as with the kubelet)."""

    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def of(self, kind: SourceKind) -> Mapping[str, Mapping[str, str]]:
        return self.secrets if kind == "secret" else self.config_maps


@dataclass(frozen=True)
class AgentEnv:
    """What the agent's jobs get, what was skipped (and why), and what refuses the Episode."""

    values: dict[str, str]
    skipped: list[str]
    problems: list[str]


def referenced(env: Sequence[Mapping[str, Any]], env_from: Sequence[Mapping[str, Any]]) -> set[tuple[SourceKind, str]]:
    """The Secrets and ConfigMaps the entries name, to fetch before :func:`resolve_agent_env`."""
    named: set[tuple[SourceKind, str]] = set()
    for source in env_from:
        for kind, key in (("secret", "secretRef"), ("configmap", "configMapRef")):
            name = (source.get(key) or {}).get("name")
            if isinstance(name, str):
                named.add((kind, name))  # type: ignore[arg-type]
    for entry in env:
        value_from = entry.get("valueFrom") or {}
        for kind, key in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
            name = (value_from.get(key) or {}).get("name")
            if isinstance(name, str):
                named.add((kind, name))  # type: ignore[arg-type]
    return named


def pod_entries(env: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The entries that name the pod itself (``fieldRef``, ``resourceFieldRef``): the container keeps them."""
    return [dict(entry) for entry in env if any(key in (entry.get("valueFrom") or {}) for key in POD_FIELDS)]


def resolve_agent_env(
    env: Sequence[Mapping[str, Any]],
    env_from: Sequence[Mapping[str, Any]],
    sources: Sources,
    container_env: Mapping[str, str],
) -> AgentEnv:
    """The values of ``spec.agent.envFrom`` then ``spec.agent.env``, as the kubelet would give them."""
    values: dict[str, str] = {}
    skipped: list[str] = []
    problems: list[str] = []
    for index, source in enumerate(env_from):
        where = f"spec.agent.envFrom[{index}]"
        found = _source_of(source)
        if found is None:
            problems.append(f"{where}: names neither a secretRef nor a configMapRef")
            continue
        kind, reference = found
        data = sources.of(kind).get(str(reference.get("name")))
        if data is None:
            if not reference.get("optional"):
                problems.append(f"{where}: {kind} {reference.get('name')!r} not found")
            continue
        prefix = str(source.get("prefix") or "")
        for key in sorted(data):
            name = prefix + key
            if VARIABLE_NAME.fullmatch(name):
                values[name] = data[key]
            else:
                skipped.append(f"{where}: {kind} {reference.get('name')!r} key {key!r} is no variable name")
    for index, entry in enumerate(env):
        where = f"spec.agent.env[{index}]"
        named = entry.get("name")
        if not isinstance(named, str) or not VARIABLE_NAME.fullmatch(named):
            problems.append(f"{where}: name {named!r} is no variable name")
            continue
        name = named
        value_from = entry.get("valueFrom")
        if value_from is None:
            values[name] = _expand(str(entry.get("value") or ""), {**container_env, **values})
            continue
        if any(key in value_from for key in POD_FIELDS):
            continue  # the pod's own fields: on the container (pod_entries)
        value = _key_value(value_from, sources, f"{where}.valueFrom", problems)
        if value is not None:
            values[name] = value
    return AgentEnv(values, skipped, problems)


def _source_of(source: Mapping[str, Any]) -> tuple[SourceKind, Mapping[str, Any]] | None:
    for kind, key in (("secret", "secretRef"), ("configmap", "configMapRef")):
        reference = source.get(key)
        if isinstance(reference, Mapping) and isinstance(reference.get("name"), str):
            return kind, reference  # type: ignore[return-value]
    return None


def _key_value(value_from: Mapping[str, Any], sources: Sources, where: str, problems: list[str]) -> str | None:
    for kind, key in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
        selector = value_from.get(key)
        if not isinstance(selector, Mapping):
            continue
        name, wanted = selector.get("name"), selector.get("key")
        data = sources.of(kind).get(str(name))  # type: ignore[arg-type]
        if data is not None and wanted in data:
            return data[str(wanted)]
        if not selector.get("optional"):
            missing = f"{kind} {name!r} not found" if data is None else f"{kind} {name!r} has no key {wanted!r}"
            problems.append(f"{where}.{key}: {missing}")
        return None
    problems.append(f"{where}: names no secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef")
    return None


def _expand(value: str, defined: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return defined[name] if name in defined else match.group(0)

    return _REFERENCE.sub(replace, value)


def secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's values (the API's JSON: base64 ``data``, plain ``stringData``), as the kubelet gives them."""
    data = secret.get("data") or {}
    decoded = {key: base64.b64decode(value).decode("utf-8", "replace") for key, value in data.items()}
    return {**decoded, **(secret.get("stringData") or {})}
