"""Which Dockerfiles of a task folder give which sandbox its image (pure).

A task's images come from ``docker_image`` where one is declared, else from a Dockerfile:
``environment/Dockerfile`` for the agent's sandbox (context ``environment/``), the tests folder's
``Dockerfile`` for a separate verifier whose environment declares no image (Harbor's way of
baking the tests in; context the tests folder), and a compose sidecar's ``build:``. Each is
replayed (:mod:`episode_operator.taskfolder.replay`) or built in the cluster; ``validate``
warns of what replay would refuse, naming the line, since only a configured build can take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from episode_operator.taskfolder.compose import ComposeSpec
from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.models import TaskConfig
from episode_operator.taskfolder.replay import plan_replay
from episode_operator.taskfolder.sources import TaskFiles

ENVIRONMENT_DOCKERFILE = "environment/Dockerfile"


@dataclass(frozen=True)
class DockerfileSource:
    """One image to make from a Dockerfile: for ``role`` (``environment``, ``verifier``,
    ``verifier:<step>`` or ``sidecar:<name>``), with its context, build arguments and target."""

    role: str
    dockerfile: str
    context: str
    args: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None


def dockerfile_sources(files: TaskFiles, config: TaskConfig, compose: ComposeSpec) -> list[DockerfileSource]:
    """Every image of the task that comes from a Dockerfile, agent sandbox first."""
    sources: list[DockerfileSource] = []
    if not config.environment.docker_image and files.has_file(ENVIRONMENT_DOCKERFILE):
        sources.append(DockerfileSource("environment", ENVIRONMENT_DOCKERFILE, "environment"))
    task_verifier = config.verifier.environment
    if task_verifier is not None and not task_verifier.docker_image and files.has_file("tests/Dockerfile"):
        sources.append(DockerfileSource("verifier", "tests/Dockerfile", "tests"))
    for step in config.steps or []:
        declared = step.verifier.environment
        folder = f"steps/{step.name}/tests"
        if declared is not None and not declared.docker_image and files.has_file(f"{folder}/Dockerfile"):
            sources.append(DockerfileSource(f"verifier:{step.name}", f"{folder}/Dockerfile", folder))
    for sidecar in compose.sidecars:
        if sidecar.build is not None:
            build = sidecar.build
            sources.append(
                DockerfileSource(f"sidecar:{sidecar.name}", build.dockerfile, build.context, build.args, build.target)
            )
    return sources


def replay_warnings(files: TaskFiles, config: TaskConfig, compose: ComposeSpec) -> list[Problem]:
    """What replay would refuse in the agent sandbox's and the sidecars' Dockerfiles, as warnings.

    Warnings, not problems: an operator configured for in-cluster builds takes them.
    """
    warnings: list[Problem] = []
    for source in dockerfile_sources(files, config, compose):
        if source.role.startswith("verifier") or source.target is not None:
            continue  # verifier images are the task image's business (TASK-FORMAT §7); a target means a build
        planning = plan_replay(files, source.dockerfile, source.context, build_args=source.args)
        warnings += [
            Problem(problem.file, problem.key, f"{problem.message} (replay cannot apply it)", line=problem.line)
            for problem in planning.problems
        ]
    return warnings
