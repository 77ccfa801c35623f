"""Which Dockerfiles of a task folder give which sandbox its image (pure).

A task's images come from ``docker_image`` where one is declared, else from a Dockerfile:
``environment/Dockerfile`` for the agent's sandbox (context ``environment/``); for a separate
verifier, Harbor's precedence (``verifier_mode.resolve_verifier_environment_definition``): the
step's verifier environment's ``docker_image``, else a ``Dockerfile`` in the step's tests folder,
then the same for the task's ``[verifier.environment]`` and ``tests/``, else the task's own image
(the verifier's environment is then ``environment/``, its compose file included);
and a compose sidecar's ``build:``. Each is replayed (:mod:`episode_operator.taskfolder.replay_plan`)
or built in the cluster; ``validate`` warns of what replay would refuse, naming the line, since
only a configured build can take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from episode_operator.taskfolder.compose import ENVIRONMENT, ComposeSpec
from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.replay_plan import plan_replay
from episode_operator.taskfolder.sources import TaskFiles
from episode_operator.taskfolder.task_toml import StepConfig, TaskConfig

ENVIRONMENT_DOCKERFILE = "environment/Dockerfile"
# The files that make a tests folder a verifier's environment definition (Harbor's
# resolve_verifier_environment_definition looks for these names only).
VERIFIER_DEFINITION_FILES = ("Dockerfile", "docker-compose.yaml")


@dataclass(frozen=True)
class DockerfileSource:
    """One image to make from a Dockerfile: for ``role`` (``environment``, ``verifier``,
    ``verifier:<step>`` or ``sidecar:<name>``), with its context, build arguments and target."""

    role: str
    dockerfile: str
    context: str
    args: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None


@dataclass(frozen=True)
class VerifierImageSource:
    """Where a separate verifier's image comes from: a declared ``image``, a ``dockerfile``, or
    (both None) the task's own image, made as the agent sandbox's is; ``folder`` is Harbor's
    definition directory of the verifier's environment, where a ``docker-compose.yaml`` runs too
    (``environment`` when it falls back to the task's own)."""

    image: str | None = None
    dockerfile: DockerfileSource | None = None
    folder: str = ENVIRONMENT

    @property
    def in_task_environment(self) -> bool:
        """Harbor's verifier environment is ``environment/``: the task's compose file runs beside it."""
        return self.folder == ENVIRONMENT


def verifier_image_source(files: TaskFiles, config: TaskConfig, step: StepConfig | None) -> VerifierImageSource:
    """A separate verifier's image, by Harbor's precedence: step, then task; a declared image, then a Dockerfile."""
    candidates = []
    if step is not None:
        candidates.append((step.verifier.environment, f"steps/{step.name}/tests", f"verifier:{step.name}"))
    candidates.append((config.verifier.environment, "tests", "verifier"))
    for environment, folder, role in candidates:
        if environment is not None and environment.docker_image:
            return VerifierImageSource(image=environment.docker_image, folder=folder)
        dockerfile = f"{folder}/Dockerfile"
        if files.has_file(dockerfile):
            return VerifierImageSource(dockerfile=DockerfileSource(role, dockerfile, folder), folder=folder)
        if any(files.has_file(f"{folder}/{name}") for name in VERIFIER_DEFINITION_FILES):
            return VerifierImageSource(folder=folder)
    return VerifierImageSource()


def separate_steps(config: TaskConfig) -> list[StepConfig | None]:
    """The turns that verify in a separate sandbox: their steps (None: a single-step task's turn)."""
    if not config.steps:
        return [None] if config.task_verifier_mode() == "separate" else []
    return [step for step in config.steps if config.step_verifier_mode(step) == "separate"]


def dockerfile_sources(files: TaskFiles, config: TaskConfig, compose: ComposeSpec) -> list[DockerfileSource]:
    """Every image of the task that comes from a Dockerfile, agent sandbox first, each once."""
    sources: list[DockerfileSource] = []
    if not config.environment.docker_image and files.has_file(ENVIRONMENT_DOCKERFILE):
        sources.append(DockerfileSource("environment", ENVIRONMENT_DOCKERFILE, "environment"))
    for step in separate_steps(config):
        source = verifier_image_source(files, config, step).dockerfile
        if source is not None and source.dockerfile not in {known.dockerfile for known in sources}:
            sources.append(source)
    for sidecar in compose.sidecars:
        if sidecar.build is not None:
            build = sidecar.build
            sources.append(
                DockerfileSource(f"sidecar:{sidecar.name}", build.dockerfile, build.context, build.args, build.target)
            )
    return sources


def replay_warnings(files: TaskFiles, config: TaskConfig, compose: ComposeSpec) -> list[Problem]:
    """What replay would refuse in the task's Dockerfiles, as warnings.

    Warnings, not problems: an operator configured for in-cluster builds takes them. A sidecar
    is always built, so only what no build would take either is worth a warning there, and the
    Episode's admission says it.
    """
    warnings: list[Problem] = []
    for source in dockerfile_sources(files, config, compose):
        if source.role.startswith("sidecar:"):
            continue
        planning = plan_replay(files, source.dockerfile, source.context, build_args=source.args)
        warnings += [
            Problem(problem.file, problem.key, f"{problem.message} (replay cannot apply it)", line=problem.line)
            for problem in planning.problems
        ]
    return warnings
