"""Admission: an Episode's spec and task folder → what to run, or why not (pure, no I/O).

Everything that can be refused is refused before any pod exists (docs/architecture.md): a spec
the models or the agent registry reject, a task folder the loader refuses, a seed-time
refusal (no image, a Dockerfile neither replay nor the operator's builds can take — naming
its line —, an oracle without solutions, an unresolvable ``${VAR}``, what the agent kind
refuses). Admission also decides every sandbox's image (``runtime/sandbox_images.py``): prebuilt,
replayed at seed, or built in the cluster, the operator's mirrors applied. Each refusal
carries the ``failureKind`` and a message naming the cause; the kube layer reads the task
source and writes the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeSpec, validation_message
from episode_operator.api.vocabulary import (
    FAILURE_INVALID_SPEC,
    FAILURE_INVALID_TASK,
    FAILURE_SEED,
    FailureKind,
)
from episode_operator.runtime.agents import AGENTS, spec_problems
from episode_operator.runtime.agents.model import TOOLCHAINS
from episode_operator.runtime.sandbox_images import ImagePlan, ImagePolicy, plan_images, with_images
from episode_operator.runtime.supervisor import SUPERVISOR_DIR
from episode_operator.runtime.turn.context import LOGS_VERIFIER, TESTS
from episode_operator.taskfolder import EpisodePlan, Problem, TaskFiles, resolve_plan, seed_refusals, validate_task
from episode_operator.taskfolder.compose import COMPOSE_FILES, ComposeSpec, sidecar_only_volumes
from episode_operator.taskfolder.envtemplates import UnresolvedTemplate, resolve_env_templates

# Status messages are bounded (an Episode's status lives in etcd with the object).
MESSAGE_LIMIT = 4000

# Paths the operator keeps for itself, which no compose volume may cover (at, above or below), and why.
SEALED = "sealed while test.sh runs, which a volume shared with another mount or service would outlive"
RESERVED_IN_EVERY_CONTAINER = {SUPERVISOR_DIR: "the operator's supervisor and its job records live there"}
RESERVED_IN_MAIN = {
    TESTS: f"the verifier's tests are placed there and {SEALED}",
    LOGS_VERIFIER: f"the verifier writes its reward there, {SEALED}",
    TOOLCHAINS: "the harnesses' toolchains are mounted there",
}

# A volume only sidecars mount is filled from a sidecar's image with the busybox the operator's own image
# lends (kube/objects/pods.py): an operator without that image cannot fill it as Docker does.
NO_COPIER = (
    "a volume only sidecars mount is filled from a sidecar's image by the copier the operator's own image "
    "lends, and this operator has none (episode-operator run --capture-image; the chart sets it to its own image)"
)


@dataclass(frozen=True)
class Refusal:
    """Why an Episode cannot run: its ``failureKind``, a message naming the cause, and the task's digest if read."""

    failure_kind: FailureKind
    message: str
    digest: str | None = None


@dataclass(frozen=True)
class Admission:
    """An Episode that can run: its spec, plan (templates resolved, images decided), the main container's
    env and image, and how every sandbox's image is made."""

    spec: EpisodeSpec
    plan: EpisodePlan
    main_env: dict[str, str]
    image: str
    digest: str
    task_name: str | None
    images: ImagePlan


def admit_spec(document: Mapping[str, Any]) -> EpisodeSpec | Refusal:
    """The Episode's spec, checked by its models and by its agent kind's registry entry."""
    try:
        spec = EpisodeSpec.model_validate(document)
    except ValidationError as error:
        return Refusal(FAILURE_INVALID_SPEC, "invalid spec: " + validation_message(error))
    problems = spec_problems(spec.agent)
    if problems:
        return Refusal(FAILURE_INVALID_SPEC, "invalid spec: " + "; ".join(problems))
    return spec


def admit_task(
    spec: EpisodeSpec,
    files: TaskFiles,
    policy: ImagePolicy | None = None,
    *,
    lends_copier: bool = True,
    set_child: bool = False,
) -> Admission | Refusal:
    """Load, validate and plan the task for ``spec`` under the operator's image ``policy``, with every
    seed-time refusal; ``lends_copier``: the operator has its own image, which lends sidecars a copier;
    ``set_child``: the Episode is a child of an EpisodeSet (its Dockerfile is built once, with a registry)."""
    digest = files.digest()
    validation = validate_task(files)
    if validation.task is None:
        return Refusal(FAILURE_INVALID_TASK, "task refused: " + render_problems(validation.problems), digest)
    agent = AGENTS[spec.agent.kind]
    plan = resolve_plan(
        validation.task, timeout_multiplier=spec.timeout_multiplier, settings=spec.harbor.server_settings()
    )
    images = plan_images(
        validation.task, plan, image_override=spec.image, policy=policy or ImagePolicy(), set_child=set_child
    )
    problems = [
        *validation.task.compose.mount_refusals(RESERVED_IN_EVERY_CONTAINER, RESERVED_IN_MAIN),
        *([] if lends_copier else copier_refusals(validation.task.compose)),
        *(images if isinstance(images, list) else []),
        *seed_refusals(plan, accepts_prior_trajectory=agent.accepts_prior_trajectory),
        *agent.seed_refusals(plan, spec.agent),
    ]
    try:
        plan, main_env = resolve_plan_env(plan, spec)
    except UnresolvedTemplate as error:
        problems.append(Problem("task.toml", "env", str(error)))
        main_env = {}
    if problems or isinstance(images, list):
        return Refusal(FAILURE_SEED, "refused at seed: " + render_problems(problems), digest)
    task = validation.task.config.task
    return Admission(
        spec, with_images(plan, images), main_env, images.agent.image, digest, task.name if task else None, images
    )


def copier_refusals(compose: ComposeSpec) -> list[Problem]:
    """Each mount of a volume only sidecars name, for an operator that has no copier to fill it with."""
    file = compose.file or COMPOSE_FILES[0]
    volumes = sidecar_only_volumes(compose.main_volumes, compose.sidecars)
    return [Problem(file, volume.key, NO_COPIER) for volume in volumes]


def resolve_plan_env(plan: EpisodePlan, spec: EpisodeSpec) -> tuple[EpisodePlan, dict[str, str]]:
    """Resolve ``${VAR}`` templates of the main, verifier and solution env from the agent's literal env."""
    source = {
        entry["name"]: entry["value"]
        for entry in spec.agent.env
        if isinstance(entry.get("name"), str) and isinstance(entry.get("value"), str)
    }
    main_env = resolve_env_templates(plan.main_env, source)
    turns = [
        turn.model_copy(
            update={
                "verifier": turn.verifier.model_copy(update={"env": resolve_env_templates(turn.verifier.env, source)})
            }
        )
        for turn in plan.turns
    ]
    solution_env = resolve_env_templates(plan.solution_env, source)
    return plan.model_copy(update={"turns": turns, "solution_env": solution_env, "main_env": main_env}), main_env


def render_problems(problems: Sequence[Problem]) -> str:
    """Problems in one bounded line, each naming its file and key."""
    text = "; ".join(problem.render() for problem in problems)
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."
