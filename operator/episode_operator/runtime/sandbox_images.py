"""Which image each sandbox of an episode runs and how it is made (pure), and the builder it may need.

The task's images (docs/task-format.md "Gym image rule", §2.13, §7), decided at admission:

- **the agent's sandbox**: ``spec.image`` (a prebuilt image of the task) over
  ``[environment].docker_image``; else ``environment/Dockerfile``, made as :data:`DOCKERFILE_MAKING`
  says: for a child of an EpisodeSet on an operator with a build registry, built once in the
  cluster and every attempt started from the digest the build pushed (seed once); else replayed in
  its ``FROM`` image at seed when replay can mean what a build means, else built in the cluster
  when the operator has a build registry, else refused naming the instruction and its line;
- **a separate verifier**, by Harbor's precedence (step, then task): a declared verifier
  environment's ``docker_image``, else the ``Dockerfile`` of the tests folder (``steps/<name>/tests``,
  then ``tests``), replayed or built as above; else the agent sandbox's image, made the same way
  (a verifier that replays starts from the same FROM);
- **a compose sidecar**: its ``image``; else its ``build:``, built in the cluster (replay runs in
  the main container only, and a sidecar's readiness cannot wait for it), else refused.

Every image named passes through the operator's mirrors: prebuilt images, ``FROM`` lines
(replayed, or rewritten in a built context), sidecar and verifier images. A built image's name
is the digest of its packed context, known before it is built, so the plan is a function of the
task, the spec and the operator's settings: a restarted operator computes the same one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from episode_operator.api.episode_resource import ImageMade
from episode_operator.runtime.replay_runner import ReplaySource
from episode_operator.runtime.sandbox_protocol import WaitingReport
from episode_operator.taskfolder import EpisodePlan, LoadedTask, Problem
from episode_operator.taskfolder.buildcontext import BuildSource, pack_build_context
from episode_operator.taskfolder.compose import Sidecar
from episode_operator.taskfolder.dockerfiles import (
    ENVIRONMENT_DOCKERFILE,
    DockerfileSource,
    dockerfile_sources,
    verifier_image_source,
)
from episode_operator.taskfolder.image_refs import ImageMirrors, InvalidImageReference
from episode_operator.taskfolder.replay_plan import plan_replay
from episode_operator.taskfolder.sources import TASK_CONFIG, TaskFiles

# Harbor runs a verifier environment defined by a tests folder with that folder's compose file; the
# operator runs compose services from environment/docker-compose.yaml only (docs/harbor-layout.md).
VERIFIER_COMPOSE_FILE = "docker-compose.yaml"
VERIFIER_OWN_COMPOSE = (
    "Harbor runs turn {turn}'s separate verifier in an environment made from this folder, this compose "
    "file's services and volumes included; the operator runs no verifier's own compose file, only "
    "environment/docker-compose.yaml (beside the agent, and beside a separate verifier whose environment "
    "is environment/)"
)


class Takes(enum.Enum):
    """What can make an image from a Dockerfile (taskfolder/replay_plan.py says)."""

    REPLAY = "replay or a build"  # replay can mean what a build means (and the role may replay)
    BUILD = "only a build"  # multi-stage, a target, a sidecar's build:, what replay refuses but a build takes
    NEITHER = "neither"  # a Dockerfile no build takes either (its problems name the line)


@dataclass(frozen=True)
class Making:
    """How an image is made from a Dockerfile (None: refused) and why, as the status's message says."""

    made: ImageMade | None
    why: str


# How a Dockerfile's image is made: by what can take it, whether the operator has a build registry,
# and whether the Episode is a child of an EpisodeSet (its attempts share one task: seed once).
# A standalone Episode runs one attempt (and its retries): replay in its pod costs less than a build
# pod, a push and a pull, so it replays as before; a set's children build once and all start from
# the pushed digest, so no attempt replays.
_NO_REGISTRY = Making("replayed", "replayed in the attempt's pod: this operator has no build registry")
_BUILD_ONLY = Making("built", "built in the cluster (replay cannot apply this Dockerfile), once per build context")
_UNBUILT = Making(None, "only a build can make it, and this operator builds no images")
_NEITHER = Making(None, "neither replay nor a build can make it")
DOCKERFILE_MAKING: Final[Mapping[tuple[Takes, bool, bool], Making]] = {
    # (what can make it, the operator has a build registry, a child of an EpisodeSet): how, and why
    (Takes.REPLAY, True, True): Making(
        "built",
        "built once for the EpisodeSet's attempts (the operator has a build registry); every attempt starts "
        "from the manifest digest the build pushed, none replays",
    ),
    (Takes.REPLAY, True, False): Making(
        "replayed",
        "replayed in the attempt's pod: a standalone Episode runs one attempt, for which a build would cost a "
        "build pod, a push and a pull more",
    ),
    (Takes.REPLAY, False, True): _NO_REGISTRY,
    (Takes.REPLAY, False, False): _NO_REGISTRY,
    (Takes.BUILD, True, True): _BUILD_ONLY,
    (Takes.BUILD, True, False): _BUILD_ONLY,
    (Takes.BUILD, False, True): _UNBUILT,
    (Takes.BUILD, False, False): _UNBUILT,
    (Takes.NEITHER, True, True): _NEITHER,
    (Takes.NEITHER, True, False): _NEITHER,
    (Takes.NEITHER, False, True): _NEITHER,
    (Takes.NEITHER, False, False): _NEITHER,
}


def render_making_table() -> str:
    """:data:`DOCKERFILE_MAKING` as Markdown, for docs/runtime.md (tests/doc_tables.py)."""
    lines = [
        "| what can make it | build registry | EpisodeSet child | made | why |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (takes, registry, set_child), making in DOCKERFILE_MAKING.items():
        made = making.made or "refused"
        yes = {True: "yes", False: "no"}
        lines.append(f"| {takes.value} | {yes[registry]} | {yes[set_child]} | {made} | {making.why} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ImagePolicy:
    """The operator's image settings: its mirrors, and where built images are pulled from (None: no builds)."""

    mirrors: ImageMirrors = field(default_factory=ImageMirrors)
    build_repository: str | None = None

    def making(self, takes: Takes, *, set_child: bool) -> Making:
        """How this operator makes a Dockerfile's image (:data:`DOCKERFILE_MAKING`)."""
        return DOCKERFILE_MAKING[takes, self.build_repository is not None, set_child]


@dataclass(frozen=True)
class ImageBuild:
    """An image built in the cluster before any pod needs it: ``role`` names it in logs and messages,
    ``tag`` is the image as the plan names it (the build's tag), which pods run by its digest instead."""

    role: str
    source: BuildSource
    timeout_sec: float
    tag: str = ""


@dataclass(frozen=True)
class SandboxImage:
    """The image a sandbox's main container (or a sidecar) runs, and how it is made.

    ``replay``: the Dockerfile applied in the started container (``image`` is its mirrored FROM);
    ``build``: built in the cluster first (``image`` is the build's tag, which pods never name:
    they run the digest the build pushed); neither: prebuilt. ``origin`` says where it came from,
    ``why`` why it is made so, for messages.
    """

    image: str
    origin: str
    replay: ReplaySource | None = None
    build: ImageBuild | None = None
    why: str = ""

    @property
    def made(self) -> ImageMade:
        return "built" if self.build is not None else "replayed" if self.replay is not None else "prebuilt"


@dataclass(frozen=True)
class ImagePlan:
    """Every image of an episode: the agent's sandbox, each separate turn's verifier, each sidecar."""

    agent: SandboxImage
    verifiers: tuple[SandboxImage | None, ...]
    sidecars: Mapping[str, SandboxImage] = field(default_factory=dict)

    def verifier(self, turn: int) -> SandboxImage | None:
        """Turn ``turn``'s separate verifier's image (None: it verifies in the agent's sandbox)."""
        return self.verifiers[turn] if turn < len(self.verifiers) else None

    def builds(self) -> list[ImageBuild]:
        """The in-cluster builds the episode needs, once each, agent first."""
        images = [self.agent, *(image for image in self.verifiers if image), *self.sidecars.values()]
        found: dict[str, ImageBuild] = {}
        for image in images:
            if image.build is not None:
                found.setdefault(image.image, image.build)
        return list(found.values())


def plan_images(
    task: LoadedTask, plan: EpisodePlan, *, image_override: str | None, policy: ImagePolicy, set_child: bool = False
) -> ImagePlan | list[Problem]:
    """Decide every image of an episode of ``plan``; the problems name the file and line when refused.

    ``set_child``: the Episode is a child of an EpisodeSet (:data:`DOCKERFILE_MAKING`)."""
    planner = _Planner(task.files, policy, set_child)
    sources = {source.role: source for source in dockerfile_sources(task.files, task.config, task.compose)}
    agent = planner.agent(plan, image_override, sources.get("environment"))
    verifiers: list[SandboxImage | None] = []
    steps = task.config.steps or []
    for index, turn in enumerate(plan.turns):
        if turn.verifier.mode != "separate" or agent is None:
            verifiers.append(None)
            continue
        environment = turn.verifier.environment
        assert environment is not None
        found = verifier_image_source(task.files, task.config, steps[index] if steps else None)
        own_compose = f"{found.folder}/{VERIFIER_COMPOSE_FILE}"
        if not found.in_task_environment and task.files.has_file(own_compose):
            planner.problems.append(Problem(own_compose, None, VERIFIER_OWN_COMPOSE.format(turn=turn.name)))
        if found.image is not None:
            verifiers.append(planner.prebuilt(found.image, f"the verifier environment of {turn.name}"))
        elif found.dockerfile is not None:
            verifiers.append(planner.dockerfile(found.dockerfile, environment.build_timeout_sec, replayable=True))
        else:
            verifiers.append(agent)
    sidecars = {sidecar.name: planner.sidecar(sidecar, plan) for sidecar in plan.sidecars}
    if planner.problems or agent is None:
        return planner.problems
    return ImagePlan(
        agent,
        tuple(verifiers),
        {name: image for name, image in sidecars.items() if image is not None},
    )


def with_images(plan: EpisodePlan, images: ImagePlan) -> EpisodePlan:
    """``plan`` with every image decided: each separate verifier's and each sidecar's, as pods name them."""
    turns = [
        turn
        if image is None
        else turn.model_copy(update={"verifier": turn.verifier.model_copy(update={"image": image.image})})
        for turn, image in zip(plan.turns, images.verifiers, strict=True)
    ]
    sidecars = [
        sidecar.model_copy(update={"image": images.sidecars[sidecar.name].image})
        if sidecar.name in images.sidecars
        else sidecar
        for sidecar in plan.sidecars
    ]
    return plan.model_copy(update={"turns": turns, "sidecars": sidecars})


class _Planner:
    def __init__(self, files: TaskFiles, policy: ImagePolicy, set_child: bool) -> None:
        self.files = files
        self.policy = policy
        self.set_child = set_child
        self.problems: list[Problem] = []

    def mirrored(self, image: str, where: str, file: str = TASK_CONFIG) -> str | None:
        try:
            return self.policy.mirrors.apply(image)
        except InvalidImageReference as error:
            self.problems.append(Problem(file, None, f"{where}: {error}"))
            return None

    def prebuilt(self, image: str, origin: str) -> SandboxImage | None:
        mirrored = self.mirrored(image, origin)
        return SandboxImage(mirrored, origin, why=f"prebuilt: {origin}") if mirrored is not None else None

    def agent(self, plan: EpisodePlan, override: str | None, source: DockerfileSource | None) -> SandboxImage | None:
        if override:
            return self.prebuilt(override, "spec.image")
        if plan.environment.docker_image:
            return self.prebuilt(plan.environment.docker_image, "environment.docker_image")
        if source is None:
            self.problems.append(
                Problem(
                    TASK_CONFIG,
                    "environment.docker_image",
                    f"not set, no {ENVIRONMENT_DOCKERFILE} to make the image from, and the Episode gives no spec.image",
                )
            )
            return None
        return self.dockerfile(source, plan.environment.build_timeout_sec, replayable=True)

    def dockerfile(self, source: DockerfileSource, timeout_sec: float, *, replayable: bool) -> SandboxImage | None:
        """Replay ``source`` or build it, as :data:`DOCKERFILE_MAKING` says, else refuse it naming why."""
        planning = plan_replay(self.files, source.dockerfile, source.context, build_args=source.args)
        if replayable and source.target is None and planning.plan is not None:
            takes = Takes.REPLAY
        elif planning.plan is not None or planning.needs_build:
            takes = Takes.BUILD
        else:
            takes = Takes.NEITHER
        making = self.policy.making(takes, set_child=self.set_child)
        if making.made == "replayed" and planning.plan is not None:
            from_image = self.mirrored(planning.plan.from_image, "FROM", source.dockerfile)
            if from_image is None:
                return None
            replay = ReplaySource(source.dockerfile, source.context, dict(source.args))
            return SandboxImage(from_image, source.dockerfile, replay=replay, why=making.why)
        if making.made == "built" and self.policy.build_repository is not None:
            build = BuildSource(source.dockerfile, source.context, dict(source.args), source.target)
            packed = pack_build_context(self.files, build, self.policy.mirrors)
            image = f"{self.policy.build_repository}:{packed.hex}"
            made = ImageBuild(source.role, build, timeout_sec, image)
            return SandboxImage(image, source.dockerfile, build=made, why=making.why)
        self.problems += planning.problems
        if takes is Takes.BUILD:
            if replayable:
                why = "replay cannot apply this Dockerfile, and this operator builds no images: set docker_image"
            else:
                service = source.role.removeprefix("sidecar:")
                why = f"service {service!r} is built from this Dockerfile, and this operator builds no images: "
                why += "give it an image"
            self.problems.append(Problem(source.dockerfile, None, f"{why}, or run the operator with --build-registry"))
        return None

    def sidecar(self, sidecar: Sidecar, plan: EpisodePlan) -> SandboxImage | None:
        if sidecar.image is not None:
            return self.prebuilt(sidecar.image, f"service {sidecar.name!r}")
        if sidecar.build is None:
            return None  # the task's own image, as the agent's sandbox runs it
        build = sidecar.build
        source = DockerfileSource(f"sidecar:{sidecar.name}", build.dockerfile, build.context, build.args, build.target)
        return self.dockerfile(source, plan.environment.build_timeout_sec, replayable=False)


# In-cluster builds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildReady:
    """The image exists; ``built`` is False when an earlier build of the same digest was reused.

    ``image`` is the build's tag (named by the context digest), ``pinned`` the same image by the
    manifest digest the build pushed (``repository@sha256:…``): what pods run, so that whoever
    pushes under the tag later (an agent that reaches the registry) changes nothing they start from.
    """

    image: str
    digest: str
    built: bool
    pinned: str
    log: bytes = b""


@dataclass(frozen=True)
class BuildFailed:
    """The task's failure (terminal): a broken Dockerfile, a missing base image, a build past its bound."""

    digest: str
    message: str
    log: bytes = b""


@dataclass(frozen=True)
class BuildOutage:
    """Not the task's fault: the registry, the builder or the API failed; retrying may succeed."""

    digest: str
    kind: str
    message: str
    log: bytes = b""


BuildOutcome = BuildReady | BuildFailed | BuildOutage


class ImageBuilder(Protocol):
    """Makes sure the image of a build context exists (the kube layer's build coordinator)."""

    async def ensure_image(
        self, files: TaskFiles, source: BuildSource, *, timeout_sec: float, waiting: WaitingReport | None = None
    ) -> BuildOutcome:
        """The image of ``source``, built once per context digest; ``waiting`` hears why its build pod waits."""
        ...
