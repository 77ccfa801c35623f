"""The seed, as one declared sequence: one row per stage, from the images to the agent's own setup.

Every attempt seeds its sandbox before the first turn (docs/task-format.md §3.2, "Gym image rule"):
the images it needs are built, the agent's sandbox starts, a Dockerfile is replayed in it, the
task's ``environment/`` files are placed, the replayed ``ENTRYPOINT`` starts, the environment
health check passes, and the agent kind sets itself up. For each stage the table says:

- **step** — the function that does the stage's work (each a no-op when the task needs none of it);
- **next** — the stage after it; a failure ends the attempt (an outage: registry, pod, exec…) or
  the episode (the task's failure: a failing ``RUN``, a broken build — terminal, not retried);
- **published** — when the stage is written to the attempt's status
  (``status.attempts[].seedStage``) before its step runs: where it can take long (a user sees
  what the attempt waits for) or where redoing the stages before it would cost — and only when
  the stage has work for the episode (a prebuilt image with nothing to build, replay or check
  costs no status write per stage);
- **restart** — what a restarted operator does when the status shows the stage. Every step is
  safe to redo; a restart resumes at the last published stage at or before the recorded one.

The attempt's ``readyAt`` marks the end of the seed: the episode's deadline starts there.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from episode_operator.api.vocabulary import FAILURE_AGENT_SETUP, FAILURE_ENVIRONMENT_BUILD, FAILURE_SEED, SeedStage
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.agents.base import with_agent_env
from episode_operator.runtime.archive import folder_tar
from episode_operator.runtime.episode_store import SEED_LOGS, safe
from episode_operator.runtime.replay_runner import (
    ReplayConfig,
    ReplayFailed,
    ReplayReady,
    ReplayRefused,
    ReplaySource,
    ReplayTimedOut,
    entrypoint_job,
    replay_dockerfile,
)
from episode_operator.runtime.sandbox_images import BuildFailed, BuildOutage, ImageBuild, ImageBuilder, ImagePlan
from episode_operator.runtime.sandbox_protocol import Sandbox, SandboxError, Waiting
from episode_operator.runtime.turn.context import TurnRun, TurnServices
from episode_operator.runtime.turn.prepare import describe
from episode_operator.runtime.turn.turn_failures import (
    Call,
    EpisodeEnds,
    Outage,
    check_started,
    sandbox_call,
    sandbox_lost,
)
from episode_operator.taskfolder.task_toml import EnvironmentConfig

# How long the ENTRYPOINT's start is watched: long enough to see it could not start at all.
ENTRYPOINT_START_SEC = 1.0


class SeedServices(TurnServices, Protocol):
    """What the runner offers the seed's steps, beyond what a turn's steps get."""

    @property
    def images(self) -> ImagePlan: ...

    @property
    def builder(self) -> ImageBuilder | None: ...

    @property
    def agent_replay(self) -> ReplayReady | None:
        """What the agent sandbox's replay left (read back from the pod after a restart); None: no replay."""
        ...

    def replay_config(self, *, turn: str, log_name: str, budget_sec: float) -> ReplayConfig: ...

    def replayed(self, ready: ReplayReady) -> None:
        """The agent sandbox's replay finished: its jobs run with the image's settings from now on."""
        ...

    def pin(self, image: str, pinned: str) -> None:
        """The built ``image`` (its tag) is ``pinned`` (by manifest digest): every pod made from now on runs that."""
        ...

    async def pod_waiting(self, report: Waiting | None) -> None:
        """Why a pod the episode needs does not run yet (None: it runs), for the status and an Event."""
        ...


SeedStep = Callable[[SeedServices], Awaitable[None]]


async def build_images(seed: SeedServices) -> None:
    """Stage ``images``: every image the episode builds in the cluster exists (built once per context digest),
    and the pods made after it name each by the manifest digest its build pushed."""
    for build in seed.images.builds():
        await _build(seed, build)


async def _build(seed: SeedServices, build: ImageBuild) -> None:
    assert seed.builder is not None, "admission plans builds only for an operator that has a builder"
    source = build.source
    outcome = await seed.builder.ensure_image(
        seed.files, source, timeout_sec=build.timeout_sec, waiting=seed.pod_waiting
    )
    if outcome.log:
        await seed.store.save_log(seed.attempt_number, SEED_LOGS, f"build-{safe(build.role)}", outcome.log)
    if isinstance(outcome, BuildFailed):
        raise EpisodeEnds("TerminalFailure", FAILURE_ENVIRONMENT_BUILD, f"{source.dockerfile}: {outcome.message}")
    if isinstance(outcome, BuildOutage):
        raise Outage("image_build", f"{source.dockerfile}: {outcome.message}")
    seed.pin(build.tag, outcome.pinned)
    verb = "built" if outcome.built else "reused"
    await seed.event("ImageBuilt" if outcome.built else "ImageReused", f"{build.role}: {outcome.pinned} {verb}")


async def start_sandbox(seed: SeedServices) -> None:
    """Stage ``sandbox``: the agent's pod runs (why it waits, if it does, is in the status)."""
    await seed.agent_sandbox()


async def replay(seed: SeedServices) -> None:
    """Stage ``replay``: ``environment/Dockerfile`` applied in its FROM image, when the image is replayed."""
    source = seed.images.agent.replay
    if source is None:
        return
    sandbox = await seed.agent_sandbox()
    outcome = await replay_in(seed, sandbox, source, seed.plan.environment, turn=SEED_LOGS, log_name="replay")
    if isinstance(outcome, ReplayProblem):
        if outcome.refused:
            raise EpisodeEnds("TerminalFailure", FAILURE_SEED, f"refused at seed: {outcome.message}")
        raise EpisodeEnds("TerminalFailure", FAILURE_ENVIRONMENT_BUILD, outcome.message)
    seed.replayed(outcome)


@dataclass(frozen=True)
class ReplayProblem:
    """Why a replay did not finish: a step that failed or ran out of time, or (``refused``) a
    Dockerfile that cannot be replayed in this base image."""

    message: str
    refused: bool


async def replay_in(
    services: SeedServices,
    sandbox: Sandbox,
    source: ReplaySource,
    environment: EnvironmentConfig,
    *,
    turn: str,
    log_name: str,
) -> ReplayReady | ReplayProblem:
    """Replay ``source`` in ``sandbox`` (idempotent: it re-attaches), its log kept as ``turn``'s ``log_name``;
    a sandbox that fails under it is an outage."""
    config = services.replay_config(turn=turn, log_name=log_name, budget_sec=environment.build_timeout_sec)
    try:
        with sandbox_call(Call.REPLAY):
            outcome = await replay_dockerfile(
                sandbox, services.files, source, environment, services.store, config, clock=services.now
            )
    except SandboxError as error:
        raise sandbox_lost(error) from error
    if isinstance(outcome, ReplayRefused):
        return ReplayProblem("; ".join(problem.render() for problem in outcome.problems), refused=True)
    if isinstance(outcome, ReplayFailed | ReplayTimedOut):
        return ReplayProblem(outcome.message, refused=False)
    return outcome


async def place_environment_files(seed: SeedServices) -> None:
    """Stage ``environment-files``: with ``docker_image`` and no Dockerfile or compose file,
    ``environment/`` is copied into the working directory (docs/task-format.md §1.2)."""
    folder = seed.plan.environment_files
    if folder is None:
        return
    sandbox = await seed.agent_sandbox()
    with sandbox_call(Call.PLACE_ENVIRONMENT_FILES):
        await sandbox.upload(folder_tar(seed.files, folder), sandbox.workdir)


async def start_entrypoint(seed: SeedServices) -> None:
    """Stage ``entrypoint``: the replayed image's ENTRYPOINT, for the life of the pod."""
    ready = seed.agent_replay
    config = seed.replay_config(turn=SEED_LOGS, log_name="replay", budget_sec=seed.plan.environment.build_timeout_sec)
    spec = entrypoint_job(ready, config) if ready is not None else None
    if spec is None:
        return
    sandbox = await seed.agent_sandbox()
    with sandbox_call(Call.START_ENTRYPOINT):
        state = await sandbox.start_job(spec, wait_sec=ENTRYPOINT_START_SEC)
    check_started(Call.START_ENTRYPOINT, state)


async def check_environment(seed: SeedServices) -> None:
    """Stage ``healthcheck``: ``[environment.healthcheck]`` polled (only here, never per turn)."""
    check = seed.plan.environment.healthcheck
    if check is None:
        return
    sandbox = await seed.agent_sandbox()
    if await seed.healthcheck(sandbox, check, "seed", seed.plan.turns[0].agent.user):
        return
    ready = seed.agent_replay
    config = seed.replay_config(turn=SEED_LOGS, log_name="replay", budget_sec=seed.plan.environment.build_timeout_sec)
    entrypoint = entrypoint_job(ready, config) if ready is not None else None
    if entrypoint is not None:
        # What the services the health check waited for said: kept, as a turn's logs are.
        with sandbox_call(Call.START_ENTRYPOINT):
            state = await sandbox.wait_job(entrypoint, max_wait_sec=0)
        await seed.save_job_log(sandbox, SEED_LOGS, "entrypoint", state)
    raise Outage("environment_healthcheck", "[environment.healthcheck] never passed")


async def set_up_agent(seed: SeedServices) -> None:
    """Stage ``agent-setup``: the agent kind's own setup job, once per sandbox."""
    setup = agent_kind(seed.agent_spec).seed_job(TurnRun(seed, 0))
    if setup is None:
        return
    sandbox = await seed.agent_sandbox()
    state = await seed.run_job(sandbox, with_agent_env(setup, seed.agent_env))
    await seed.save_job_log(sandbox, SEED_LOGS, "agent-setup", state)
    check_started(Call.START_AGENT, state)
    if not state.succeeded:
        raise EpisodeEnds("Ungraded", FAILURE_AGENT_SETUP, f"the agent's setup {describe(state)}")


class SeedPublished(enum.Enum):
    """When a seed stage is written to the status before its step runs."""

    NEVER = "never"
    BUILDS = "when the episode builds an image in the cluster"
    REPLAY = "when the agent's image is replayed from environment/Dockerfile"
    HEALTHCHECK = "when [environment.healthcheck] is set"
    AGENT_SETUP = "when the agent kind has a setup job"


@dataclass(frozen=True)
class SeedWork:
    """What the seed has to do for one episode (from its plan): the stages without work are not published."""

    builds: bool
    replay: bool
    healthcheck: bool
    agent_setup: bool

    def publishes(self, published: SeedPublished) -> bool:
        return {
            SeedPublished.NEVER: False,
            SeedPublished.BUILDS: self.builds,
            SeedPublished.REPLAY: self.replay,
            SeedPublished.HEALTHCHECK: self.healthcheck,
            SeedPublished.AGENT_SETUP: self.agent_setup,
        }[published]


def seed_work(seed: SeedServices) -> SeedWork:
    return SeedWork(
        builds=bool(seed.images.builds()),
        replay=seed.images.agent.replay is not None,
        healthcheck=seed.plan.environment.healthcheck is not None,
        agent_setup=agent_kind(seed.agent_spec).seed_job(TurnRun(seed, 0)) is not None,
    )


@dataclass(frozen=True)
class SeedRow:
    step: SeedStep
    next: SeedStage | None
    published: SeedPublished
    restart: str


SEED: Final[Mapping[SeedStage, SeedRow]] = {
    SeedStage.IMAGES: SeedRow(
        build_images,
        SeedStage.SANDBOX,
        SeedPublished.BUILDS,
        "Asks for every build again: a finished build's Job is found by its context digest and reused, a "
        "running one is waited for, a failed one answers with its cached verdict; nothing is built twice.",
    ),
    SeedStage.SANDBOX: SeedRow(
        start_sandbox,
        SeedStage.REPLAY,
        SeedPublished.BUILDS,  # after builds, the status moves on from images; else the attempt's start says it
        "Re-attaches to the attempt's agent pod (created if the attempt recorded none: a recorded one gone or "
        "replaced is an outage) and waits until it runs, saying why it "
        "waits in the status.",
    ),
    SeedStage.REPLAY: SeedRow(
        replay,
        SeedStage.ENVIRONMENT_FILES,
        SeedPublished.REPLAY,
        "Re-attaches to the replay's jobs by their ids: a RUN line that ran is never run again, the running "
        "one is waited for, the bound still counts from the first job's start (read back from the pod).",
    ),
    SeedStage.ENVIRONMENT_FILES: SeedRow(
        place_environment_files,
        SeedStage.ENTRYPOINT,
        SeedPublished.NEVER,
        "Not published: resumes at replay (a task with environment/ files has no Dockerfile, so nothing "
        "replays) and copies the files again, replacing the same names.",
    ),
    SeedStage.ENTRYPOINT: SeedRow(
        start_entrypoint,
        SeedStage.HEALTHCHECK,
        SeedPublished.NEVER,
        "Not published: resumes at replay, whose jobs all exist (re-attached, one exec each), then re-attaches "
        "to the ENTRYPOINT's job by its id: it is never started twice.",
    ),
    SeedStage.HEALTHCHECK: SeedRow(
        check_environment,
        SeedStage.AGENT_SETUP,
        SeedPublished.HEALTHCHECK,
        "Polls [environment.healthcheck] afresh (new job ids); the replayed image's settings are read back "
        "from the pod.",
    ),
    SeedStage.AGENT_SETUP: SeedRow(
        set_up_agent,
        None,
        SeedPublished.AGENT_SETUP,
        "Re-attaches to the agent kind's setup job by its id (or harvests its end); then readyAt is written "
        "and the first turn starts.",
    ),
}


def seed_resumes_at(stage: SeedStage | None, work: SeedWork) -> SeedStage:
    """Where a restart resumes when the attempt was last seen in ``stage``: the last stage at or before
    it that is published for this work (the stages between have nothing to redo, or redo safely)."""
    order = list(SEED)
    if stage is None:
        return order[0]
    for candidate in reversed(order[: order.index(stage) + 1]):
        if work.publishes(SEED[candidate].published):
            return candidate
    return order[0]


def seed_passed(stage: SeedStage | None, done: SeedStage) -> bool:
    """Whether an attempt whose seed is at ``stage`` has finished stage ``done``."""
    order = list(SEED)
    return stage is not None and order.index(stage) > order.index(done)


def render_table() -> str:
    """The table as Markdown, for the docs (``python -m episode_operator.runtime.seed``)."""
    lines = ["| stage | step | next | published | after a restart |", "| --- | --- | --- | --- | --- |"]
    for stage, row in SEED.items():
        following = f"`{row.next}`" if row.next else "— (`readyAt`)"
        published = row.published.value
        lines.append(f"| `{stage}` | `{row.step.__name__}` | {following} | {published} | {row.restart} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
