"""What an agent kind is: the one place that says how it runs, what it needs and what it refuses."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from episode_operator.api.episode_resource import AgentSpec
from episode_operator.api.vocabulary import AgentFailure
from episode_operator.runtime.agents.model import SandboxNeeds
from episode_operator.runtime.sandbox_protocol import JobSpec, Upload
from episode_operator.runtime.turn.context import TurnRun
from episode_operator.runtime.turn.turn_failures import Call
from episode_operator.taskfolder import EpisodePlan, Problem

# The fields of ``spec.agent`` that every kind may use.
COMMON_FIELDS = frozenset({"kind", "env", "env_from"})


@dataclass(frozen=True)
class AgentJob:
    """The agent's work in one turn: a supervised job and the inputs its start places.

    ``inputs`` travel in the exec that starts the job, so a restarted runner that re-attaches
    never changes them under a running agent; ``placing`` names that upload for failures.
    """

    spec: JobSpec
    inputs: Upload
    placing: Call
    # What the agent's output says of its failures, when its model calls say nothing (first match wins).
    failure_patterns: tuple[tuple[re.Pattern[str], AgentFailure], ...] = ()


class AgentKind(Protocol):
    """One entry of the registry (``runtime/agents/__init__.py``)."""

    name: ClassVar[str]
    description: ClassVar[str]
    # ``spec.agent`` fields this kind uses (besides COMMON_FIELDS), and those it requires.
    fields: ClassVar[frozenset[str]]
    required: ClassVar[frozenset[str]]
    # Gym refuses a first step's trajectory.json for every agent but the oracle (it ignores it).
    accepts_prior_trajectory: ClassVar[bool]
    # It runs a job every turn (whose start can carry the previous turn's grading cleanup).
    acts: ClassVar[bool]

    def spec_problems(self, spec: AgentSpec) -> list[str]:
        """What is wrong with ``spec.agent`` for this kind beyond which fields it uses, each naming its field."""
        ...

    def seed_refusals(self, plan: EpisodePlan, spec: AgentSpec) -> list[Problem]:
        """What this kind refuses of a plan at seed (before any pod starts)."""
        ...

    def sandbox_needs(self, spec: AgentSpec) -> SandboxNeeds:
        """What the agent pod needs for this kind: toolchains, the capture proxy."""
        ...

    def seed_job(self, turn: TurnRun) -> JobSpec | None:
        """A job run once per sandbox before the first turn (``turn`` is the first), if any."""
        ...

    def turn_job(self, turn: TurnRun) -> AgentJob | None:
        """The agent's job for ``turn``; None when the agent does nothing."""
        ...


def with_agent_env(spec: JobSpec, agent_env: Mapping[str, str]) -> JobSpec:
    """``spec`` (an agent kind's job) with the agent's own variables under the kind's own, carried
    privately: ``spec.agent.env``/``envFrom`` reach the agent's jobs and no other process."""
    if not agent_env:
        return spec
    return replace(spec, env={**agent_env, **spec.env}, private=True)


def turn_env(turn: TurnRun) -> dict[str, str]:
    """What every agent process is told about the turn it runs in."""
    return {
        "EPISODE_TURN": str(turn.index + 1),
        "EPISODE_TURN_NAME": turn.name,
        "EPISODE_TURNS": str(len(turn.services.plan.turns)),
    }


def instruction_file(turn: TurnRun) -> str:
    """The name of the file holding ``turn``'s instruction under ``INSTRUCTIONS``."""
    return f"{turn.index + 1:02d}-{turn.name}.md"
