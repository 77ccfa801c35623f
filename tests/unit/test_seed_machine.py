"""The seed's declared sequence: the table's shape, and that what it declares holds.

The restart column is checked as the turn's is (``test_turn_machine.py``): the runner dies as
each seed stage begins, and a runner started on the status the dead one last wrote must resume
where the table says (:func:`seed_resumes_at`), build nothing twice, run no replay step, entrypoint
or setup job twice, and reach the same end. Episodes here go through admission with an image
policy (mirrors, a build registry), as the driver runs them, against the fake sandbox and a fake
builder; RUN lines are in the fake sandbox's line language.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeSpec, EpisodeStatus, RetryPolicy
from episode_operator.api.vocabulary import PODS_READY, SeedStage
from episode_operator.runtime import episode as episode_module
from episode_operator.runtime.admission import Admission, admit_task
from episode_operator.runtime.episode import EpisodeConfig, EpisodeRunner
from episode_operator.runtime.sandbox_images import BuildFailed, BuildOutage, BuildOutcome, BuildReady, ImagePolicy
from episode_operator.runtime.sandbox_protocol import Waiting, WaitingReport
from episode_operator.runtime.seed import SEED, SeedPublished, SeedRow, SeedWork, seed_resumes_at
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.buildcontext import BuildSource
from episode_operator.taskfolder.image_refs import ImageMirrors
from tests.unit.fake_sandbox import Crash, FakeProvider, FakeSandbox, FakeSink, MemoryStore, World, unkeyed

BASE_OUTPUT = b"x86_64\n" + b"\x00".join([b"PATH=/usr/bin:/bin", b"HOME=/root", b""])
MIRRORS = ImageMirrors.parse(["ubuntu:24.04=local/sandbox:1", "python:3.12=local/python:1"])
POLICY = ImagePolicy(MIRRORS, "registry.test/builds")

TASK_TOML = """\
schema_version = "1.4"
[agent]
timeout_sec = 60.0
[environment]
build_timeout_sec = 120.0
env = { TASK_VAR = "from-task-toml" }
[environment.healthcheck]
command = "pass-after 0"
"""
DOCKERFILE = """\
FROM ubuntu:24.04
ENV MODE=image
RUN write made-by-run yes
WORKDIR /srv/app
COPY data.txt ./data.txt
USER agent
ENTRYPOINT ["serve"]
"""
COMPOSE = "services:\n  api:\n    build: ./api\n"
AGENT = {"kind": "command", "command": "write answer.txt 42", "setup": "write setup.txt yes"}


def replayed_task(dockerfile: str = DOCKERFILE, **files: str) -> dict[str, str]:
    """A Dockerfile-only task with a compose sidecar built in the cluster, a health check, a command agent."""
    return {
        "task.toml": TASK_TOML,
        "instruction.md": "Write 42.\n",
        "tests/test.sh": "check answer.txt 42",
        "environment/Dockerfile": dockerfile,
        "environment/data.txt": "data\n",
        "environment/docker-compose.yaml": COMPOSE,
        "environment/api/Dockerfile": "FROM python:3.12\nRUN echo api\n",
        **files,
    }


def prebuilt_task() -> dict[str, str]:
    """``docker_image`` and no Dockerfile: environment/ is copied into the working directory."""
    return {
        "task.toml": TASK_TOML.replace("[environment]\n", '[environment]\ndocker_image = "python:3.12"\n'),
        "instruction.md": "Write 42.\n",
        "tests/test.sh": "check answer.txt 42",
        "environment/data.txt": "data\n",
    }


def pinned(tag: str) -> str:
    """The fake build of ``tag``, by the manifest digest its push wrote."""
    return tag.rsplit(":", 1)[0] + "@sha256:" + hashlib.sha256(tag.encode()).hexdigest()


@dataclass
class FakeBuilder:
    """In-cluster builds as the coordinator answers: once per context, then reused; or failing."""

    fail: str | None = None  # "build": the task's failure; "outage": the registry's
    waiting: list[Waiting] = field(default_factory=list)  # what the build pod says while it waits
    built: Counter[str] = field(default_factory=Counter)
    asked: int = 0

    async def ensure_image(
        self, files: TaskFiles, source: BuildSource, *, timeout_sec: float, waiting: WaitingReport | None = None
    ) -> BuildOutcome:
        self.asked += 1
        for report in self.waiting:
            if waiting is not None:
                await waiting(report)
        if waiting is not None:
            await waiting(None)
        if self.fail == "build":
            return BuildFailed("sha256:d", "build build-d: the Dockerfile failed to build: exit 1", b"step 2 failed\n")
        if self.fail == "outage":
            return BuildOutage("sha256:d", "registry", "build build-d: cannot push to registry.test: refused")
        first = source.dockerfile not in self.built
        self.built[source.dockerfile] += int(first)
        tag = f"registry.test/builds:{source.dockerfile}"
        return BuildReady(tag, "sha256:d", first, pinned(tag), b"built\n" if first else b"")


def admitted(
    folder: dict[str, str], agent: dict[str, Any] | None = None, *, set_child: bool = False
) -> tuple[Admission, TaskFiles]:
    files = TaskFiles.from_mapping(folder)
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": folder}}, "agent": agent or AGENT})
    admission = admit_task(spec, files, POLICY, set_child=set_child)
    assert isinstance(admission, Admission), admission
    return admission, files


def run(
    folder: dict[str, str],
    *,
    world: World | None = None,
    builder: FakeBuilder | None = None,
    status: EpisodeStatus | None = None,
    sink: FakeSink | None = None,
    store: MemoryStore | None = None,
    agent: dict[str, Any] | None = None,
    retries: int = 2,
    set_child: bool = False,
    provider: FakeProvider | None = None,
) -> tuple[EpisodeStatus, World, FakeSink, MemoryStore]:
    world = world or World()
    world.outputs.setdefault("replay.base", BASE_OUTPUT)
    sink, store = sink or FakeSink(), store or MemoryStore()
    admission, files = admitted(folder, agent, set_child=set_child)
    config = EpisodeConfig(
        plan=admission.plan,
        files=files,
        agent=admission.spec.agent,
        digest=admission.digest,
        retries=RetryPolicy(outages=retries),
        images=admission.images,
    )
    runner = EpisodeRunner(
        config,
        provider or FakeProvider(world),
        sink,
        store,
        clock=world.clock.time,
        monotonic=world.clock.monotonic,
        sleep=world.clock.sleep,
        builder=builder or FakeBuilder(),
    )
    return asyncio.run(runner.run(status)), world, sink, store


# The table ---------------------------------------------------------------------------------------
def test_every_seed_stage_has_one_row_and_the_rows_chain_to_ready() -> None:
    assert list(SEED) == list(SeedStage)
    chain, stage = [], SeedStage.IMAGES
    while stage is not None:
        chain.append(stage)
        stage = SEED[stage].next
    assert chain == list(SeedStage)
    assert all(row.restart for row in SEED.values())
    assert [stage for stage, row in SEED.items() if row.published is SeedPublished.NEVER] == [
        SeedStage.ENVIRONMENT_FILES,
        SeedStage.ENTRYPOINT,
    ]
    everything = SeedWork(builds=True, replay=True, healthcheck=True, agent_setup=True)
    assert seed_resumes_at(None, everything) == SeedStage.IMAGES
    assert seed_resumes_at(SeedStage.ENTRYPOINT, everything) == SeedStage.REPLAY
    # A prebuilt image, no health check, an agent without setup: nothing of the seed is published.
    nothing = SeedWork(builds=False, replay=False, healthcheck=False, agent_setup=False)
    assert seed_resumes_at(SeedStage.AGENT_SETUP, nothing) == SeedStage.IMAGES


def work_of(folder: dict[str, str]) -> SeedWork:
    admission, _ = admitted(folder)
    return SeedWork(
        builds=bool(admission.images.builds()),
        replay=admission.images.agent.replay is not None,
        healthcheck=admission.plan.environment.healthcheck is not None,
        agent_setup=True,  # AGENT has a setup command
    )


def plain_task() -> dict[str, str]:
    """A prebuilt image, no health check, a solution for the oracle: the seed has nothing to publish."""
    files = {**prebuilt_task(), "solution/solve.sh": "write answer.txt 42"}
    files["task.toml"] = files["task.toml"].split("[environment.healthcheck]")[0]
    return files


@pytest.mark.parametrize(
    ("folder", "agent", "writes"),
    [(plain_task, {"kind": "oracle"}, 0), (prebuilt_task, AGENT, 2), (replayed_task, AGENT, 5)],
    ids=["prebuilt-oracle", "prebuilt-setup", "replayed-built"],
)
def test_only_seed_stages_with_work_write_the_status(folder: Any, agent: dict[str, Any], writes: int) -> None:
    """Each published stage costs a status write (an API request per Episode): a stage with nothing to do
    for this episode is not published."""
    status, _, sink, _ = run(folder(), agent=agent)
    assert (status.phase, status.reward) == ("Succeeded", 1.0), status.message
    seeding = [s for s in sink.statuses if s.attempts and s.attempts[-1].ready_at is None]
    # Besides the published stages: the attempt's start, and its pod's PodsReady condition.
    assert len(seeding) == 2 + writes, [s.attempts[-1].seed_stage for s in seeding]


# Restarts ------------------------------------------------------------------------------------------
def crash_inside(monkeypatch: pytest.MonkeyPatch, stage: SeedStage) -> None:
    """The runner dies as seed ``stage`` begins, once."""
    original = SEED[stage]
    fired = {"done": False}

    async def dying_step(services: Any) -> None:
        if not fired["done"]:
            fired["done"] = True
            raise Crash(f"the operator died in seed stage {stage}")
        await original.step(services)

    table = dict(SEED)
    table[stage] = SeedRow(dying_step, original.next, original.published, original.restart)
    monkeypatch.setattr(episode_module, "SEED", table)


@pytest.mark.parametrize("folder", [replayed_task, prebuilt_task], ids=["replayed", "prebuilt"])
@pytest.mark.parametrize("stage", list(SeedStage))
def test_a_restart_inside_any_seed_stage_resumes_where_the_table_says(
    monkeypatch: pytest.MonkeyPatch, stage: SeedStage, folder: Any
) -> None:
    world, store, builder, dying = World(), MemoryStore(), FakeBuilder(), FakeSink()
    crash_inside(monkeypatch, stage)
    with pytest.raises(Crash):
        run(folder(), world=world, builder=builder, sink=dying, store=store)
    monkeypatch.undo()
    last_written = dying.statuses[-1]
    assert last_written.attempts[-1].ready_at is None
    work = work_of(folder())
    assert seed_resumes_at(last_written.attempts[-1].seed_stage, work) == seed_resumes_at(stage, work)
    status = run(folder(), world=world, builder=builder, status=last_written, store=store)[0]
    assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 1), status.message
    pod = world.sandboxes["pod-a1"]
    assert len(pod.starts) == len(set(pod.starts)), pod.starts
    assert pod.starts.count("a1.agent-setup") == 1
    files = pod.files["main"]
    if folder is replayed_task:
        assert [job for job in pod.starts if job.startswith("replay.")] == [
            "replay.base",
            "replay.001.run",
            "replay.002.mkdir",
            "replay.003.copy",
            "replay.start",
        ]
        assert files["/app/made-by-run"] == b"yes"
        assert builder.built == Counter({"environment/api/Dockerfile": 1})
        # The image's settings survive the restart: read back from the pod, not remembered.
        for job in ("a1.agent-setup", "a1.t1.agent", "a1.t1.verify"):
            spec = pod.job(job).spec
            assert (spec.user, spec.cwd, spec.env.get("MODE")) == ("agent", "/srv/app", "image"), job
    else:
        assert files["/app/data.txt"] == b"data\n" and not builder.asked


# What the seed does ----------------------------------------------------------------------------------
def test_a_replayed_image_gives_every_later_job_its_user_workdir_and_environment() -> None:
    status, world, sink, store = run(replayed_task())
    assert (status.phase, status.reward) == ("Succeeded", 1.0), status.message
    pod = world.sandboxes["pod-a1"]
    jobs = {unkeyed(job_id): record.spec for (_, job_id), record in pod.jobs.items()}
    for job_id in ("seed.", "a1.agent-setup", "a1.t1.agent", "a1.t1.verify"):
        spec = next(spec for name, spec in jobs.items() if name.startswith(job_id))
        assert (spec.user, spec.cwd) == ("agent", "/srv/app"), job_id
        assert (spec.env["MODE"], spec.env["TASK_VAR"]) == ("image", "from-task-toml"), job_id
    start = jobs["replay.start"]
    assert start.command.startswith("exec serve sh -c ") and (start.user, start.cwd) == ("agent", "/srv/app")
    assert status.attempts[0].seed_stage == SeedStage.AGENT_SETUP and status.attempts[0].ready_at
    built = pinned("registry.test/builds:environment/api/Dockerfile")
    assert ("ImageBuilt", f"sidecar:api: {built} built", False) in sink.events
    assert store.logs[(1, "seed", "build-sidecar_api")] == b"built\n"
    assert b"==> environment/Dockerfile:3: RUN write made-by-run yes" in store.logs[(1, "seed", "replay")]


def test_a_failing_run_line_is_terminal_and_names_its_line() -> None:
    status, world, _, store = run(replayed_task(DOCKERFILE.replace("RUN write made-by-run yes", "RUN exit 3")))
    assert (status.phase, status.outcome, status.failure_kind, status.attempt) == (
        "Failed",
        "TerminalFailure",
        "environment:build_failed",
        1,
    )
    assert status.message == "environment/Dockerfile:3: RUN exit 3: exited with 3"
    assert store.logs[(1, "seed", "replay")].endswith(b"[exited with 3]\n")
    assert "a1.t1.agent" not in world.sandboxes["pod-a1"].starts


def test_a_replay_past_build_timeout_sec_is_terminal() -> None:
    world = World()
    world.hooks["replay.001.run"] = lambda sandbox, spec: setattr(world.clock, "now", world.clock.now + 121)
    status = run(replayed_task(), world=world)[0]
    assert (status.outcome, status.failure_kind) == ("TerminalFailure", "environment:build_failed")
    assert "replay ran past build_timeout_sec (120 s)" in (status.message or "")


def test_a_failing_build_is_terminal_and_its_log_kept() -> None:
    status, _, _, store = run(replayed_task(), builder=FakeBuilder(fail="build"))
    assert (status.outcome, status.failure_kind, status.attempt) == ("TerminalFailure", "environment:build_failed", 1)
    assert status.message == "environment/api/Dockerfile: build build-d: the Dockerfile failed to build: exit 1"
    assert store.logs[(1, "seed", "build-sidecar_api")] == b"step 2 failed\n"


def test_a_registry_down_is_an_outage_retried_then_ungraded() -> None:
    builder = FakeBuilder(fail="outage")
    status = run(replayed_task(), builder=builder, retries=1)[0]
    assert (status.outcome, status.failure_kind, status.attempt) == ("Ungraded", "outage:image_build", 2)
    assert builder.asked == 2
    assert "cannot push to registry.test" in (status.attempts[0].reason or "")


def test_an_entrypoint_that_cannot_start_is_terminal() -> None:
    """Its USER does not exist (no RUN made it): the ENTRYPOINT, started as that user, cannot start."""
    status = run(replayed_task(), world=World(missing_users={"agent"}))[0]
    assert (status.outcome, status.failure_kind) == ("TerminalFailure", "environment:build_failed")
    assert status.message == "cannot start the ENTRYPOINT: no such user: agent"


def test_a_health_check_that_never_passes_keeps_the_entrypoints_output() -> None:
    folder = replayed_task()
    folder["task.toml"] = folder["task.toml"].replace('command = "pass-after 0"', 'command = "exit 1"\nretries = 1')
    status, _, _, store = run(folder, retries=0)
    assert (status.outcome, status.failure_kind) == ("Ungraded", "outage:environment_healthcheck")
    assert store.logs[(1, "seed", "entrypoint")] == b"ran replay.start\n"


def test_a_waiting_pod_says_why_in_one_condition_and_one_event() -> None:
    world = World()
    unschedulable = Waiting("pod-a1", "agent", "Unschedulable", "0/1 nodes are available: 1 Insufficient cpu.")
    later = Waiting("pod-a1", "agent", "Unschedulable", "0/1 nodes are available: 1 Insufficient memory.")
    world.pending["pod-a1"] = [unschedulable, unschedulable, later]
    builder = FakeBuilder(waiting=[Waiting("build-d-x", "build", "ErrImagePull", "registry down")])
    status, _, sink, _ = run(replayed_task(), world=world, builder=builder)
    assert status.phase == "Succeeded"
    waits = [event for event in sink.events if event[0] == "PodWaiting"]
    assert waits == [
        ("PodWaiting", "build pod build-d-x: registry down (ErrImagePull)", True),
        ("PodWaiting", "agent pod pod-a1: 0/1 nodes are available: 1 Insufficient cpu. (Unschedulable)", True),
    ]
    seen = [
        (c.status, c.reason, c.message, s.message)
        for s in sink.statuses
        for c in s.conditions
        if c.type == PODS_READY and s.phase == "Running"
    ]
    # Each change written once (the same report again writes nothing); a new message, no new Event.
    assert (
        seen.count(
            (
                "False",
                "Unschedulable",
                "agent pod pod-a1: 0/1 nodes are available: 1 Insufficient cpu.",
                "waiting: agent pod pod-a1: 0/1 nodes are available: 1 Insufficient cpu.",
            )
        )
        == 1
    )
    assert ("False", "Unschedulable", "agent pod pod-a1: 0/1 nodes are available: 1 Insufficient memory.") in [
        entry[:3] for entry in seen
    ]
    final = next(c for c in status.conditions if c.type == PODS_READY)
    assert (final.status, final.reason, final.message) == ("True", "PodsRunning", "agent pod pod-a1 runs")


def test_a_restarted_runner_told_the_same_wait_posts_no_second_event() -> None:
    world, sink = World(), FakeSink()
    report = Waiting("pod-a1", "agent", "Unschedulable", "0/1 nodes are available: 1 Insufficient cpu.")

    class Dying(FakeProvider):
        async def agent(
            self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None
        ) -> FakeSandbox:
            assert waiting is not None
            await waiting(report)
            raise Crash("the operator died while the pod waited")

    admission, files = admitted(replayed_task())
    config = EpisodeConfig(admission.plan, files, admission.spec.agent, admission.digest, images=admission.images)
    runner = EpisodeRunner(config, Dying(world), sink, MemoryStore(), clock=world.clock.time, builder=FakeBuilder())
    with pytest.raises(Crash):
        asyncio.run(runner.run(None))
    world.pending["pod-a1"] = [report]
    status, _, again, _ = run(replayed_task(), world=world, status=sink.statuses[-1])
    assert status.phase == "Succeeded"
    assert [event for event in again.events if event[0] == "PodWaiting"] == []


def test_a_separate_verifier_replays_the_environment_too() -> None:
    folder = replayed_task(
        **{
            "task.toml": TASK_TOML + '[verifier]\nenvironment_mode = "separate"\n',
            "tests/test.sh": "check /srv/app/answer.txt 42",
        }
    )
    folder["task.toml"] = folder["task.toml"].replace("[agent]", 'artifacts = ["/srv/app/answer.txt"]\n[agent]', 1)
    status, world, _, store = run(folder)
    assert (status.phase, status.reward, status.verifier_mode) == ("Succeeded", 1.0, "separate"), status.message
    verifier = world.sandboxes["pod-a1-v1"]
    assert [job for job in verifier.starts if job.startswith("replay.")] == [
        "replay.base",
        "replay.001.run",
        "replay.002.mkdir",
        "replay.003.copy",
        "replay.start",
    ]
    assert verifier.calls["start_job"] == len(verifier.starts)  # replayed once: verify re-attached to nothing
    test = verifier.job("a1.t1.verify").spec
    assert (test.user, test.cwd, test.env["MODE"]) == ("agent", "/srv/app", "image")
    assert (1, "task", "verifier-replay") in store.logs


def test_a_separate_verifiers_failing_replay_masks_the_episode() -> None:
    folder = replayed_task(
        **{
            "task.toml": TASK_TOML + '[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\n',
            "tests/Dockerfile": "FROM ubuntu:24.04\nRUN exit 4\n",
        }
    )
    status = run(folder)[0]
    assert (status.outcome, status.failure_kind) == ("Masked", "harbor:verifier_error")
    assert status.message == "turn task: the verifier's environment: tests/Dockerfile:2: RUN exit 4: exited with 4"


# Seed once ---------------------------------------------------------------------------------------------
def test_a_set_child_starts_from_the_built_digest_and_replays_nothing() -> None:
    world, builder = World(), FakeBuilder()
    provider = FakeProvider(world)
    status, world, _, _ = run(replayed_task(), world=world, builder=builder, set_child=True, provider=provider)
    assert (status.phase, status.reward) == ("Succeeded", 1.0), status.message
    pod = world.sandboxes["pod-a1"]
    assert not [job for job in pod.starts if job.startswith("replay.")], pod.starts
    assert builder.built == Counter({"environment/Dockerfile": 1, "environment/api/Dockerfile": 1})
    tag = admitted(replayed_task(), set_child=True)[0].images.agent.image
    built = pinned("registry.test/builds:environment/Dockerfile")  # what the fake build pushed
    assert tag.startswith("registry.test/builds:") and provider.pins[tag] == built  # pods name the digest
    assert status.image is not None and (status.image.ref, status.image.made) == (built, "built")
    assert status.image.message and "built once for the EpisodeSet's attempts" in status.image.message
    # The same task standalone replays in its pod, and says so.
    alone = run(replayed_task())[0]
    assert alone.image is not None and alone.image.made == "replayed"
    assert alone.image.ref == "docker.io/local/sandbox:1" and "standalone Episode" in (alone.image.message or "")


def test_a_runner_restarted_past_the_seed_pins_the_built_images_before_any_pod() -> None:
    """The runner dies as it writes readyAt; the next one makes no seed stage again, yet its pods (a later
    separate verifier's) must name the digest: it reads the builds back before anything else."""
    world, builder = World(), FakeBuilder()
    dying = FakeSink(crash_when=lambda status: bool(status.attempts and status.attempts[-1].ready_at))
    with pytest.raises(Crash):
        run(replayed_task(), world=world, builder=builder, sink=dying, set_child=True)
    provider = FakeProvider(world)
    asked = builder.asked
    status = run(
        replayed_task(), world=world, builder=builder, status=dying.statuses[-1], set_child=True, provider=provider
    )[0]
    assert (status.phase, status.attempt) == ("Succeeded", 1), status.message
    assert builder.asked == asked + 2 and sum(builder.built.values()) == 2  # asked again, nothing built again
    tag = admitted(replayed_task(), set_child=True)[0].images.agent.image
    assert provider.pins[tag] == pinned("registry.test/builds:environment/Dockerfile")
