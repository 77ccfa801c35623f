"""The registry of agent kinds: adding a kind is adding one entry to :data:`AGENTS`.

Everything else follows from the entry: the CRD's enum of ``spec.agent.kind`` (generated
from the registry), the CLI's ``--agent`` choices, which ``spec.agent`` fields apply, the
seed-time refusals, the job a turn runs and its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from episode_operator.api.episode_resource import AgentSpec
from episode_operator.runtime.agents.base import COMMON_FIELDS, AgentJob, AgentKind
from episode_operator.runtime.agents.builtin import Command, Nop, Oracle
from episode_operator.runtime.agents.harness import Harness

AGENTS: Final[Mapping[str, AgentKind]] = {kind.name: kind for kind in (Oracle(), Nop(), Command(), Harness())}
AGENT_KINDS: Final[tuple[str, ...]] = tuple(AGENTS)


def agent_kind(spec: AgentSpec) -> AgentKind:
    """The registry entry of ``spec.kind`` (admission has refused unknown kinds)."""
    return AGENTS[spec.kind]


def spec_problems(spec: AgentSpec) -> list[str]:
    """What is wrong with ``spec.agent`` for its kind, each naming the field."""
    kind = AGENTS.get(spec.kind)
    if kind is None:
        return [f"spec.agent.kind: unknown kind {spec.kind!r}; one of {', '.join(AGENT_KINDS)}"]
    given = {
        name
        for name, field in AgentSpec.model_fields.items()
        if getattr(spec, name) != field.get_default(call_default_factory=True)
    }
    problems = [
        f"spec.agent.{AgentSpec.model_fields[name].alias or name} applies to kind "
        + " or ".join(other.name for other in AGENTS.values() if name in other.fields)
        + f" only, not {spec.kind}"
        for name in sorted(given - COMMON_FIELDS - kind.fields)
    ]
    problems += [
        f"spec.agent.{AgentSpec.model_fields[name].alias or name} is required when spec.agent.kind is {spec.kind}"
        for name in sorted(kind.required)
        if not str(getattr(spec, name) or "").strip()
    ]
    return problems + kind.spec_problems(spec)


__all__ = ["AGENTS", "AGENT_KINDS", "AgentJob", "AgentKind", "agent_kind", "spec_problems"]
