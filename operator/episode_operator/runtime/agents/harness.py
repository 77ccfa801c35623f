"""The ``harness`` agent kind: a real agent harness (a preset) against ``spec.agent.model``."""

from __future__ import annotations

from typing import Any, ClassVar, Final

from episode_operator.api.episode_resource import AgentSpec
from episode_operator.api.vocabulary import Stage
from episode_operator.runtime.agents.base import AgentJob, instruction_file, turn_env
from episode_operator.runtime.agents.harnesses import LOGS, PRESETS, HarnessPreset, harness_run
from episode_operator.runtime.agents.model import SandboxNeeds, Toolchain, capture_of
from episode_operator.runtime.archive import text_tar
from episode_operator.runtime.sandbox_protocol import JobSpec, Upload
from episode_operator.runtime.turn.context import INSTRUCTIONS, TurnRun
from episode_operator.runtime.turn.turn_failures import Call
from episode_operator.taskfolder import EpisodePlan, Problem

# The preset options every harness takes: the harness's own cap on a turn's agent budget.
OPTIONS: Final = frozenset({"timeoutSec"})


class Harness:
    """Runs ``spec.agent.harness`` each turn, its model calls recorded by the pod's capture proxy."""

    name: ClassVar[str] = "harness"
    description: ClassVar[str] = "runs an agent harness preset (" + ", ".join(PRESETS) + ") against spec.agent.model"
    fields: ClassVar[frozenset[str]] = frozenset({"harness", "model", "turn_sessions", "capture"})
    required: ClassVar[frozenset[str]] = frozenset({"harness", "model"})
    accepts_prior_trajectory: ClassVar[bool] = False
    acts: ClassVar[bool] = True

    def spec_problems(self, spec: AgentSpec) -> list[str]:
        if spec.harness is None or spec.model is None:
            return []  # the required fields are reported by the registry
        preset = PRESETS.get(spec.harness.name)
        if preset is None:
            return [f"spec.agent.harness.name: unknown harness {spec.harness.name!r}; one of {', '.join(PRESETS)}"]
        problems = []
        if spec.model.api not in preset.apis:
            problems.append(
                f"spec.agent.model.api: {preset.name} speaks {' or '.join(sorted(preset.apis))}, not {spec.model.api}"
            )
        for option in sorted(set(spec.harness.options) - OPTIONS):
            problems.append(f"spec.agent.harness.options.{option}: unknown option; known: {', '.join(sorted(OPTIONS))}")
        cap = spec.harness.options.get("timeoutSec")
        if cap is not None and not (isinstance(cap, int | float) and not isinstance(cap, bool) and cap > 0):
            problems.append(f"spec.agent.harness.options.timeoutSec: a positive number of seconds, not {cap!r}")
        return problems

    def seed_refusals(self, plan: EpisodePlan, spec: AgentSpec) -> list[Problem]:
        """Gym's seed rules for ``continue``: a harness that can continue one session, and one agent user."""
        if spec.turn_sessions != "continue" or spec.harness is None:
            return []
        problems = []
        preset = PRESETS[spec.harness.name]
        if not preset.continues:
            problems.append(Problem("spec.agent", "turnSessions", f"{preset.name} cannot continue a session"))
        users = {turn.agent.user for turn in plan.turns}
        if len(users) > 1:
            problems.append(
                Problem("task.toml", "steps.agent.user", "turnSessions continue: the steps switch agent users")
            )
        return problems

    def sandbox_needs(self, spec: AgentSpec) -> SandboxNeeds:
        assert spec.harness is not None
        preset = PRESETS[spec.harness.name]
        return SandboxNeeds(
            toolchains=(toolchain(preset, spec),),
            capture=capture_of(spec.model, token_ids=spec.capture.token_ids),
        )

    def seed_job(self, turn: TurnRun) -> JobSpec | None:
        # The harness's log and session state live under /logs/agent, written as the turn's user.
        return JobSpec(
            id=f"a{turn.services.attempt_number}.harness-setup",
            command=f"mkdir -p {LOGS} && chmod 0777 {LOGS}",
            timeout_sec=60.0,
        )

    def turn_job(self, turn: TurnRun) -> AgentJob:
        spec = turn.services.agent_spec
        assert spec.harness is not None and spec.model is not None
        preset = PRESETS[spec.harness.name]
        run = harness_run(
            toolchain(preset, spec), spec.model, continue_session=spec.turn_sessions == "continue" and not turn.first
        )
        file = instruction_file(turn)
        return AgentJob(
            JobSpec(
                id=turn.job_id(Stage.AGENT),
                command=preset.command(run, f"{INSTRUCTIONS}/{file}"),
                timeout_sec=budget(turn.plan.agent.timeout_sec, spec.harness.options),
                user=turn.plan.agent.user,
                env={**preset.env(run), **turn_env(turn)},
                output=f"{LOGS}/{preset.name}.txt",
            ),
            Upload(text_tar({file: turn.plan.instruction}), INSTRUCTIONS),
            Call.PLACE_INSTRUCTION,
            failure_patterns=preset.failure_patterns,
        )


def toolchain(preset: HarnessPreset, spec: AgentSpec) -> Toolchain:
    assert spec.harness is not None
    return Toolchain(preset.name, spec.harness.version or preset.version)


def budget(turn_budget: float, options: dict[str, Any]) -> float:
    """The turn's agent budget, capped by the harness's own (``options.timeoutSec``), as Gym caps it."""
    cap = options.get("timeoutSec")
    return min(turn_budget, float(cap)) if cap is not None else turn_budget
