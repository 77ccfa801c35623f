"""Resolve a loaded task into an episode plan: what each turn runs, as whom, for how long.

This is where docs/task-format.md §3 becomes data: per turn the canary-stripped instruction,
the agent's user and budget, the verifier's mode, sandbox, user, environment and budget,
the layered ``/tests`` files, the oracle's solution, the artifacts in collection order,
the step healthcheck and ``min_reward``; per episode the deadline of §3.11. The runtime
executes a plan and decides nothing these rules decide.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from episode_operator.taskfolder.compose import ComposeVolume, Sidecar
from episode_operator.taskfolder.dockerfiles import verifier_image_source
from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.loader import INSTRUCTION, TESTS, LoadedTask
from episode_operator.taskfolder.sources import TASK_CONFIG
from episode_operator.taskfolder.task_toml import (
    CAMEL_OUTPUT,
    MAIN_SERVICE,
    AgentConfig,
    ArtifactConfig,
    CollectHook,
    EnvironmentConfig,
    EnvironmentMode,
    Healthcheck,
    NetworkMode,
    PhaseNetwork,
    RewardStrategy,
    StepConfig,
    TaskConfig,
    is_address_entry,
)

# docs/task-format.md §7: the project's values where the sources leave a gap.
DEFAULT_AGENT_TIMEOUT_SEC = 28_800.0
HARNESS_SETUP_ALLOWANCE_SEC = 360.0
VERIFIER_GRACE_SEC = 30.0
DEFAULT_EPISODE_TIMEOUT_SEC = 21_600.0
INSTRUCTION_PLACEHOLDER = "{instruction}"  # where a prompt template puts the first turn's instruction
CONVENTION_ARTIFACTS = "/logs/artifacts"
SINGLE_STEP_TURN = "task"
CANARY_LINE = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)

ArtifactOrigin = Literal["convention", "task", "step"]


class PlanModel(BaseModel):
    model_config = ConfigDict(frozen=True, alias_generator=CAMEL_OUTPUT)


class NetworkPolicy(PlanModel):
    """The network a phase runs under: a sandbox's baseline, or a phase override of it."""

    mode: NetworkMode = "public"
    allowed_hosts: list[str] = Field(default_factory=list)


class AgentPlan(PlanModel):
    user: str | int | None
    timeout_sec: float
    network: NetworkPolicy


class VerifierPlan(PlanModel):
    mode: EnvironmentMode
    timeout_sec: float
    user: str | int | None
    env: dict[str, str]
    image: str | None = Field(
        description="The separate verifier's image; null = the image the episode runs the task with."
    )
    environment: EnvironmentConfig | None = Field(
        description="The separate verifier's sandbox (step's, else task's, else a copy of [environment])."
    )
    network: NetworkPolicy
    compose: bool = Field(
        default=False,
        description="The task's compose services and volumes run beside this separate verifier: Harbor's "
        "verifier environment is then environment/, its docker-compose.yaml included.",
    )


class ArtifactPlan(PlanModel):
    source: str
    destination: str
    origin: ArtifactOrigin
    service: str
    exclude: list[str] = Field(default_factory=list)


class TurnPlan(PlanModel):
    name: str
    instruction: str
    agent: AgentPlan
    verifier: VerifierPlan
    tests: dict[str, str] = Field(description="Path inside /tests → source path in the task folder.")
    solution: str | None = Field(description="Folder placed at /solution for the oracle.")
    solution_runnable: bool = Field(description="The solution folder has solve.sh.")
    artifacts: list[ArtifactPlan]
    collect: list[CollectHook]
    healthcheck: Healthcheck | None
    min_reward: float | dict[str, float] | None
    setup: bool = Field(description="workdir/setup.sh exists and runs before the agent.")
    setup_timeout_sec: float | None
    workdir: str | None = Field(description="Folder merged into the working directory before the agent.")
    trajectory: str | None = Field(description="A prior-context trajectory.json for this turn, if any.")


class EpisodePlan(PlanModel):
    multi_step: bool
    reward_strategy: RewardStrategy | None
    deadline_sec: float
    timeout_multiplier: float
    environment: EnvironmentConfig
    environment_files: str | None = Field(
        description="A folder copied into the working directory at seed (docker_image set, no Dockerfile)."
    )
    main_env: dict[str, str] = Field(description="[environment].env over the compose file's main environment.")
    compose_env: dict[str, str] = Field(
        default_factory=dict,
        description="The compose file's main environment: a separate verifier beside the compose services has "
        "its own environment's env over it.",
    )
    main_volumes: list[ComposeVolume] = Field(
        default_factory=list,
        description="The compose file's volumes of main: the agent pod's main container mounts them.",
    )
    solution_env: dict[str, str]
    sidecars: list[Sidecar]
    turns: list[TurnPlan]
    warnings: list[str] = Field(default_factory=list)


def strip_canary(text: str) -> str:
    """Drop leading canary lines (HTML or ``#`` comments naming a canary) and the blank lines after."""
    lines = text.split("\n")
    index = 0
    while index < len(lines) and CANARY_LINE.match(lines[index].strip()):
        index += 1
    while index < len(lines) and not lines[index].strip():
        index += 1
    return "\n".join(lines[index:])


@dataclass(frozen=True)
class ServerSettings:
    """Gym's harbor server settings an episode is planned under (an Episode's ``spec.harbor``),
    with the seed's defaults.

    - ``step_setup_timeout_sec``: the bound of a step's ``setup.sh`` (None: the step's agent budget);
    - ``verifier_grace_sec``: added to each turn's verifier budget in the deadline;
    - ``enforce_task_timeouts``: the deadline is the task's summed bound (True), or simply
      ``default_episode_timeout_sec`` (False: a task that cannot fit one sandbox start in it is refused);
    - ``separate_verifier_for_artifacts``: a turn whose task or step declares ``artifacts`` verifies separately;
    - ``prompt_template``: wraps the first turn's instruction (``{instruction}`` stands for it).
    """

    step_setup_timeout_sec: float | None = None
    verifier_grace_sec: float = VERIFIER_GRACE_SEC
    enforce_task_timeouts: bool = True
    default_episode_timeout_sec: float = DEFAULT_EPISODE_TIMEOUT_SEC
    separate_verifier_for_artifacts: bool = False
    prompt_template: str | None = None


SEED_SETTINGS = ServerSettings()


def resolve_plan(
    task: LoadedTask, *, timeout_multiplier: float = 1.0, settings: ServerSettings = SEED_SETTINGS
) -> EpisodePlan:
    """The plan of an episode of ``task``; ``timeout_multiplier`` scales agent and verifier budgets.

    The multiplier stands in for Gym's dataset ``timeout_multiplier``: it scales every agent
    and verifier budget (the implicit 600 s included) and ``setup.sh``'s bound (the agent
    budget), never collect hooks, healthchecks or the server settings' own seconds.
    """
    if not (math.isfinite(timeout_multiplier) and timeout_multiplier > 0):
        raise ValueError(f"timeout multiplier must be a positive number, not {timeout_multiplier!r}")
    config = task.config
    resolver = _TurnResolver(task, timeout_multiplier, settings)
    if config.is_multi_step:
        turns = [resolver.step_turn(step, first=index == 0) for index, step in enumerate(config.steps or [])]
        strategy: RewardStrategy | None = config.multi_step_reward_strategy or "mean"
    else:
        turns = [resolver.single_turn()]
        strategy = None
    if settings.prompt_template is not None:
        first = turns[0]
        wrapped = settings.prompt_template.replace(INSTRUCTION_PLACEHOLDER, first.instruction)
        turns[0] = first.model_copy(update={"instruction": wrapped})
    deadline = episode_deadline(config, turns, settings.verifier_grace_sec)
    warnings = [warning.render() for warning in task.warnings]
    default = settings.default_episode_timeout_sec
    if not settings.enforce_task_timeouts:
        deadline = default
    elif deadline > default:
        warnings.append(
            f"{TASK_CONFIG}: the episode deadline ({deadline:.0f} s) exceeds the default "
            f"{default:.0f} s; the task's own bound applies"
        )
    return EpisodePlan(
        multi_step=config.is_multi_step,
        reward_strategy=strategy,
        deadline_sec=deadline,
        timeout_multiplier=timeout_multiplier,
        environment=config.environment,
        environment_files=_environment_files(task),
        main_env={**task.compose.main_env, **config.environment.env},
        compose_env=task.compose.main_env,
        main_volumes=task.compose.main_volumes,
        solution_env=config.solution.env,
        sidecars=task.compose.sidecars,
        turns=turns,
        warnings=warnings,
    )


def episode_deadline(
    config: TaskConfig, turns: list[TurnPlan], verifier_grace_sec: float = VERIFIER_GRACE_SEC
) -> float:
    """The episode's bound (docs/task-format.md §3.11 with the §7 allowances), from sandbox start.

    Per turn: harness setup allowance, setup.sh bound, step healthcheck worst case, agent
    and verifier budgets, verifier grace and collect hooks; plus one sandbox start for the
    agent pod and one per separate turn, and the seed-time healthcheck's worst case.
    """
    environment = config.environment
    total = environment.build_timeout_sec
    if environment.healthcheck is not None:
        total += environment.healthcheck.worst_case_sec()
    for turn in turns:
        total += HARNESS_SETUP_ALLOWANCE_SEC + turn.agent.timeout_sec
        total += turn.verifier.timeout_sec + verifier_grace_sec
        total += turn.setup_timeout_sec or 0.0
        total += turn.healthcheck.worst_case_sec() if turn.healthcheck else 0.0
        total += sum(hook.timeout_sec for hook in turn.collect)
        if turn.verifier.mode == "separate":
            total += environment.build_timeout_sec
    return total


def seed_refusals(plan: EpisodePlan, *, accepts_prior_trajectory: bool) -> list[Problem]:
    """What refuses an episode of this plan when it starts here (docs/task-format.md §4, "Seed").

    These depend on the Episode, not on the folder, so ``validate`` only warns of them.
    ``accepts_prior_trajectory``: the agent may be given a first step's ``trajectory.json``
    (Gym: the oracle alone, which ignores it). Which images the sandboxes run, and whether a
    Dockerfile can make them, depends on the operator too: ``runtime/sandbox_images.py`` decides it.
    """
    problems: list[Problem] = []
    if plan.deadline_sec < plan.environment.build_timeout_sec:
        problems.append(
            Problem(
                TASK_CONFIG,
                "environment.build_timeout_sec",
                f"one sandbox start ({plan.environment.build_timeout_sec:.0f} s) does not fit the episode "
                f"deadline of {plan.deadline_sec:.0f} s (spec.harbor.defaultEpisodeTimeoutSec, "
                "with enforceTaskTimeouts false)",
            )
        )
    if plan.environment.os != "linux":
        problems.append(Problem(TASK_CONFIG, "environment.os", "the operator runs Linux pods only"))
    first = plan.turns[0]
    if plan.multi_step and first.trajectory and not accepts_prior_trajectory:
        problems.append(
            Problem(
                first.trajectory,
                None,
                "a first step's trajectory.json is refused for every agent but the oracle",
            )
        )
    problems.extend(hostname_refusals(plan))
    users = {turn.agent.user for turn in plan.turns} | {turn.verifier.user for turn in plan.turns}
    for user in sorted(str(user) for user in users if isinstance(user, str) and ":" in user):
        problems.append(Problem(TASK_CONFIG, None, f"user {user!r}: a user with a group runs on Docker only"))
    return problems


def hostname_refusals(plan: EpisodePlan) -> list[Problem]:
    """Harbor's rule for an allowlist: enforce it or refuse the task. A NetworkPolicy allows
    addresses and CIDR ranges only; a hostname entry would be a policy that blocks the host it
    names (the sandbox gets a measured 0 for want of it), so each one refuses the episode."""
    policies: dict[str, NetworkPolicy] = {"environment.allowed_hosts": baseline_policy(plan.environment)}
    for turn in plan.turns:
        policies.setdefault("agent.allowed_hosts", turn.agent.network)
        policies.setdefault("verifier.allowed_hosts", turn.verifier.network)
        if turn.verifier.environment is not None:
            policies.setdefault("verifier.environment.allowed_hosts", baseline_policy(turn.verifier.environment))
    problems: list[Problem] = []
    seen: set[str] = set()
    for key, policy in policies.items():
        for host in policy.allowed_hosts if policy.mode == "allowlist" else []:
            if is_address_entry(host) or host in seen:
                continue
            seen.add(host)
            problems.append(
                Problem(
                    TASK_CONFIG,
                    key,
                    f"{host!r} is a hostname: the operator's NetworkPolicies allow addresses and CIDR ranges "
                    "only, so the host would be unreachable; list its addresses instead",
                )
            )
    return problems


class _TurnResolver:
    def __init__(self, task: LoadedTask, multiplier: float, settings: ServerSettings) -> None:
        self.task = task
        self.files = task.files
        self.config = task.config
        self.multiplier = multiplier
        self.settings = settings

    def instruction(self, path: str) -> str:
        return strip_canary(self.files[path].data.decode("utf-8"))

    def agent(self, step_agent: AgentConfig | None) -> AgentPlan:
        task_agent = self.config.agent
        budget = (step_agent.timeout_sec if step_agent else None) or task_agent.timeout_sec
        user = step_agent.user if step_agent and step_agent.user is not None else task_agent.user
        return AgentPlan(
            user=user,
            timeout_sec=(budget or DEFAULT_AGENT_TIMEOUT_SEC) * self.multiplier,
            network=_phase_network(self.config.environment, self.config.agent),
        )

    def verifier(self, step: StepConfig | None) -> VerifierPlan:
        task_verifier = self.config.verifier
        if step is None:
            mode = self.config.task_verifier_mode()
            timeout, user, env = task_verifier.timeout_sec, task_verifier.user, dict(task_verifier.env)
            declared = task_verifier.environment
        else:
            mode = self.config.step_verifier_mode(step)
            # Gym: a step's verifier budget defaults to 600 s, never to [verifier].timeout_sec.
            timeout = step.verifier.timeout_sec
            user = step.verifier.user if step.verifier.user is not None else task_verifier.user
            env = {**task_verifier.env, **step.verifier.env}
            declared = step.verifier.environment or task_verifier.environment
        declares_artifacts = bool(self.config.artifacts or (step is not None and step.artifacts))
        if self.settings.separate_verifier_for_artifacts and declares_artifacts:
            mode = "separate"  # Gym's separate_verifier_for_artifacts
        sandbox: EnvironmentConfig | None = None
        image: str | None = None
        baseline = self.config.environment
        compose = False
        if mode == "separate":
            sandbox = declared or self.config.environment.model_copy(deep=True)
            image = sandbox.docker_image
            baseline = sandbox
            compose = verifier_image_source(self.files, self.config, step).in_task_environment
        return VerifierPlan(
            mode=mode,
            timeout_sec=timeout * self.multiplier,
            user=user,
            env=env,
            image=image,
            environment=sandbox,
            network=_phase_network(baseline, task_verifier),
            compose=compose,
        )

    def tests(self, step_folder: str | None) -> dict[str, str]:
        layered = {relative: f"{TESTS}/{relative}" for relative in self.files.files_under(TESTS)}
        if step_folder is not None:
            step_tests = f"{step_folder}/{TESTS}"
            layered.update({relative: f"{step_tests}/{relative}" for relative in self.files.files_under(step_tests)})
        return dict(sorted(layered.items()))

    def solution(self, step_folder: str | None) -> tuple[str | None, bool]:
        candidates = [f"{step_folder}/solution"] if step_folder else []
        for folder in [*candidates, "solution"]:
            if self.files.has_dir(folder):
                script = "solve.bat" if self.config.environment.os == "windows" else "solve.sh"
                return folder, self.files.has_file(f"{folder}/{script}")
        return None, False

    def artifacts(self, step: StepConfig | None) -> list[ArtifactPlan]:
        declared: list[tuple[ArtifactOrigin, ArtifactConfig]] = [("task", a) for a in self.config.artifacts]
        if step is not None:
            declared += [("step", a) for a in step.artifacts]
        convention_declared = any(
            a.effective_service == MAIN_SERVICE and a.source.rstrip("/") == CONVENTION_ARTIFACTS for _, a in declared
        )
        if not convention_declared:
            declared.insert(0, ("convention", ArtifactConfig(source=CONVENTION_ARTIFACTS)))
        return [
            ArtifactPlan(
                source=artifact.source,
                destination=artifact.effective_destination,
                origin=origin,
                service=artifact.effective_service,
                exclude=artifact.exclude,
            )
            for origin, artifact in declared
        ]

    def single_turn(self) -> TurnPlan:
        solution, runnable = self.solution(None)
        trajectory = "trajectory.json" if self.files.has_file("trajectory.json") else None
        return TurnPlan(
            name=SINGLE_STEP_TURN,
            instruction=self.instruction(INSTRUCTION),
            agent=self.agent(None),
            verifier=self.verifier(None),
            tests=self.tests(None),
            solution=solution,
            solution_runnable=runnable,
            artifacts=self.artifacts(None),
            collect=list(self.config.verifier.collect),
            healthcheck=None,
            min_reward=None,
            setup=False,
            setup_timeout_sec=None,
            workdir=None,
            trajectory=trajectory,
        )

    def step_turn(self, step: StepConfig, *, first: bool) -> TurnPlan:
        folder = f"steps/{step.name}"
        solution, runnable = self.solution(folder)
        agent = self.agent(step.agent)
        workdir = f"{folder}/workdir" if self.files.has_dir(f"{folder}/workdir") else None
        setup = self.files.has_file(f"{folder}/workdir/setup.sh")
        trajectory = f"{folder}/trajectory.json"
        return TurnPlan(
            name=step.name,
            instruction=self.instruction(f"{folder}/{INSTRUCTION}"),
            agent=agent,
            verifier=self.verifier(step),
            tests=self.tests(folder),
            solution=solution,
            solution_runnable=runnable,
            artifacts=self.artifacts(step),
            collect=[*self.config.verifier.collect, *step.verifier.collect],
            healthcheck=step.healthcheck,
            min_reward=step.min_reward,
            setup=setup,
            # Gym: the server's step_setup_timeout_s, else the step's agent budget.
            setup_timeout_sec=(self.settings.step_setup_timeout_sec or agent.timeout_sec) if setup else None,
            workdir=workdir,
            trajectory=trajectory if first and self.files.has_file(trajectory) else None,
        )


def baseline_policy(environment: EnvironmentConfig) -> NetworkPolicy:
    """A sandbox's own network: its environment's ``network_mode`` and ``allowed_hosts``."""
    return NetworkPolicy(mode=environment.network_mode, allowed_hosts=environment.allowed_hosts or [])


def _phase_network(baseline: EnvironmentConfig, phase: PhaseNetwork) -> NetworkPolicy:
    if phase.network_mode is not None:
        return NetworkPolicy(mode=phase.network_mode, allowed_hosts=phase.allowed_hosts or [])
    return baseline_policy(baseline)


def _environment_files(task: LoadedTask) -> str | None:
    """Harbor copies environment/ into the working directory when an image is given and nothing builds."""
    files = task.files
    if not task.config.environment.docker_image:
        return None
    if files.has_file("environment/Dockerfile") or task.compose.file is not None:
        return None
    return "environment" if files.files_under("environment") else None
