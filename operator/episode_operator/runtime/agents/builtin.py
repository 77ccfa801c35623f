"""The built-in agent kinds: the oracle, nop and a command."""

from __future__ import annotations

from typing import ClassVar

from episode_operator.api.episode_resource import AgentSpec
from episode_operator.api.vocabulary import Stage
from episode_operator.runtime.agents.base import AgentJob, instruction_file, turn_env
from episode_operator.runtime.agents.model import SandboxNeeds, capture_of, model_env
from episode_operator.runtime.archive import folder_tar, text_tar
from episode_operator.runtime.sandbox_protocol import JobSpec, Upload, sealed
from episode_operator.runtime.turn.context import INSTRUCTIONS, LOGS_AGENT, SOLUTION, TurnRun
from episode_operator.runtime.turn.turn_failures import Call
from episode_operator.taskfolder import EpisodePlan, Problem

ORACLE_OUTPUT = f"{LOGS_AGENT}/oracle.txt"
SOLVE = "solve.sh"


class Oracle:
    """Runs each turn's ``/solution/solve.sh`` (the step's ``solution/``, else the task's), as Harbor's oracle."""

    name: ClassVar[str] = "oracle"
    description: ClassVar[str] = "runs the turn's /solution/solve.sh"
    fields: ClassVar[frozenset[str]] = frozenset()
    required: ClassVar[frozenset[str]] = frozenset()
    accepts_prior_trajectory: ClassVar[bool] = True
    acts: ClassVar[bool] = True

    def spec_problems(self, spec: AgentSpec) -> list[str]:
        return []

    def sandbox_needs(self, spec: AgentSpec) -> SandboxNeeds:
        return SandboxNeeds()

    def seed_refusals(self, plan: EpisodePlan, spec: AgentSpec) -> list[Problem]:
        return [
            Problem(
                f"{turn.solution or 'solution'}/solve.sh", None, f"the oracle needs a solve.sh for turn {turn.name!r}"
            )
            for turn in plan.turns
            if not turn.solution_runnable
        ]

    def seed_job(self, turn: TurnRun) -> JobSpec | None:
        return None

    def turn_job(self, turn: TurnRun) -> AgentJob:
        plan = turn.plan
        assert plan.solution is not None
        return AgentJob(
            JobSpec(
                id=turn.job_id(Stage.AGENT),
                command=f"bash {SOLUTION}/{SOLVE}",
                timeout_sec=plan.agent.timeout_sec,
                user=plan.agent.user,
                # [solution].env is authoritative (Harbor's oracle), with a non-interactive apt.
                env={**turn.services.plan.solution_env, "DEBIAN_FRONTEND": "noninteractive"},
                output=ORACLE_OUTPUT,
            ),
            # Root's 0755 with solve.sh executable, as Harbor's `docker compose cp` and `chmod +x` leave them.
            Upload(folder_tar(turn.services.files, plan.solution, script=SOLVE), SOLUTION, (sealed(f"{SOLUTION}/"),)),
            Call.PLACE_SOLUTION,
        )


class Nop:
    """Does nothing: the verifier grades the sandbox as the task left it."""

    name: ClassVar[str] = "nop"
    description: ClassVar[str] = "does nothing"
    fields: ClassVar[frozenset[str]] = frozenset()
    required: ClassVar[frozenset[str]] = frozenset()
    accepts_prior_trajectory: ClassVar[bool] = False
    acts: ClassVar[bool] = False

    def spec_problems(self, spec: AgentSpec) -> list[str]:
        return []

    def sandbox_needs(self, spec: AgentSpec) -> SandboxNeeds:
        return SandboxNeeds()

    def seed_refusals(self, plan: EpisodePlan, spec: AgentSpec) -> list[Problem]:
        return []

    def seed_job(self, turn: TurnRun) -> JobSpec | None:
        return None

    def turn_job(self, turn: TurnRun) -> AgentJob | None:
        return None


class Command:
    """Runs ``spec.agent.command`` with bash in the working directory each turn; its ``setup`` once per sandbox.

    The turn's instruction is in the file named by ``$EPISODE_INSTRUCTION_FILE``. With
    ``spec.agent.model``, the model's coordinates are in ``$EPISODE_MODEL*`` and the common
    clients' variables, pointing at the pod's capture proxy, which records every call.
    """

    name: ClassVar[str] = "command"
    description: ClassVar[str] = "runs spec.agent.command in the sandbox every turn"
    fields: ClassVar[frozenset[str]] = frozenset({"command", "setup", "model", "capture"})
    required: ClassVar[frozenset[str]] = frozenset({"command"})
    accepts_prior_trajectory: ClassVar[bool] = False
    acts: ClassVar[bool] = True

    def spec_problems(self, spec: AgentSpec) -> list[str]:
        return []

    def sandbox_needs(self, spec: AgentSpec) -> SandboxNeeds:
        return SandboxNeeds(capture=capture_of(spec.model, token_ids=spec.capture.token_ids))

    def seed_refusals(self, plan: EpisodePlan, spec: AgentSpec) -> list[Problem]:
        return []

    def seed_job(self, turn: TurnRun) -> JobSpec | None:
        setup = turn.services.agent_spec.setup
        if not setup:
            return None
        return JobSpec(
            id=f"a{turn.services.attempt_number}.agent-setup",
            command=setup,
            timeout_sec=turn.plan.agent.timeout_sec,
            user=turn.plan.agent.user,
            env=_env(turn),
        )

    def turn_job(self, turn: TurnRun) -> AgentJob:
        command = turn.services.agent_spec.command
        assert command is not None
        file = instruction_file(turn)
        return AgentJob(
            JobSpec(
                id=turn.job_id(Stage.AGENT),
                command=command,
                timeout_sec=turn.plan.agent.timeout_sec,
                user=turn.plan.agent.user,
                env={**_env(turn), "EPISODE_INSTRUCTION_FILE": f"{INSTRUCTIONS}/{file}"},
            ),
            Upload(text_tar({file: turn.plan.instruction}), INSTRUCTIONS),
            Call.PLACE_INSTRUCTION,
        )


def _env(turn: TurnRun) -> dict[str, str]:
    model = turn.services.agent_spec.model
    return {**turn_env(turn), **(model_env(model) if model is not None else {})}
