"""Replay execution against the fake sandbox: order, users, directories, environment, bounds, restarts.

RUN lines here are in the fake sandbox's line language (``write``, ``exit``, ``timeout``,
``unstartable``, ``lose-pod``); the cluster tier replays real shell in a real pod.
"""

from __future__ import annotations

import asyncio
import io
import math
import shlex
import tarfile

import pytest

from episode_operator.runtime.replay_runner import (
    ReplayConfig,
    ReplayedSandbox,
    ReplayFailed,
    ReplayReady,
    ReplayRefused,
    ReplaySource,
    ReplayTimedOut,
    entrypoint_job,
    replay_dockerfile,
    replayed_image,
)
from episode_operator.runtime.sandbox_protocol import KEEP_ALIVE, JobSpec, SandboxError
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.task_toml import EnvironmentConfig
from tests.unit.fake_sandbox import Crash, FakeSandbox, MemoryStore, World

BASE_OUTPUT = b"x86_64\n" + b"\x00".join([b"PATH=/usr/bin:/bin", b"HOME=/root", b"PWD=/", b"_EO_JOB=x", b""])

DOCKERFILE = """\
FROM ubuntu:24.04
ENV PATH=/opt/bin:$PATH MODE=image
RUN write created-by-run yes
WORKDIR /srv/app
COPY --chown=agent --chmod=700 serve.sh ./
COPY data /srv/data/
USER agent
RUN append log as-agent
ENTRYPOINT ["./serve.sh", "--port", "8000"]
"""


def task_files(dockerfile: str = DOCKERFILE) -> TaskFiles:
    return TaskFiles.from_mapping(
        {
            "environment/Dockerfile": dockerfile,
            "environment/serve.sh": "#!/bin/sh\nexec python3 -m http.server\n",
            "environment/data/one.txt": "1",
            "environment/data/sub/two.txt": "2",
        }
    )


def run(
    world: World,
    sandbox: FakeSandbox,
    files: TaskFiles,
    store: MemoryStore,
    *,
    budget: float = 600.0,
    environment: EnvironmentConfig | None = None,
) -> object:
    world.outputs.setdefault("replay.base", BASE_OUTPUT)
    return asyncio.run(
        replay_dockerfile(
            sandbox,
            files,
            ReplaySource(),
            environment or EnvironmentConfig(env={"MODE": "task", "TOKEN": "t"}),
            store,
            ReplayConfig(attempt=1, budget_sec=budget),
            clock=world.clock.time,
        )
    )


def setup() -> tuple[World, FakeSandbox, MemoryStore]:
    world = World()
    return world, world.sandbox("pod-a1"), MemoryStore()


def test_steps_run_in_order_as_the_build_would_run_them() -> None:
    world, sandbox, store = setup()
    result = run(world, sandbox, task_files(), store)
    assert isinstance(result, ReplayReady)
    assert sandbox.starts == [
        "replay.base",
        "replay.001.run",
        "replay.002.mkdir",
        "replay.003.copy",
        "replay.004.copy",
        "replay.005.run",
    ]
    jobs = {job_id: record.spec for (_, job_id), record in sandbox.jobs.items()}
    image_env = {"PATH": "/opt/bin:/usr/bin:/bin", "MODE": "image"}
    assert (jobs["replay.001.run"].user, jobs["replay.001.run"].cwd, dict(jobs["replay.001.run"].env)) == (
        None,
        None,
        image_env,
    )
    assert (jobs["replay.005.run"].user, jobs["replay.005.run"].cwd) == ("agent", "/srv/app")
    assert all(spec.shell == "sh" for spec in jobs.values())
    # The RUN lines really ran, each in its WORKDIR (the fake resolves relative paths in the job's cwd).
    assert sandbox.files["main"]["/app/created-by-run"] == b"yes"
    assert sandbox.files["main"]["/srv/app/log"] == b"as-agent\n"
    # COPY: the files travelled to a staging folder with the job that places them, modes kept.
    staged = {path: data for path, data in sandbox.files["main"].items() if "/tmp/replay.003.copy/" in path}
    assert staged == {"/episode-operator/tmp/replay.003.copy/s0": b"#!/bin/sh\nexec python3 -m http.server\n"}
    copy = jobs["replay.003.copy"].command
    assert "cp -p /episode-operator/tmp/replay.003.copy/s0 /srv/app/serve.sh" in copy
    assert "chown -R agent: /srv/app/serve.sh" in copy and "chmod -R 700 /srv/app/serve.sh" in copy
    assert copy.endswith("rm -rf /episode-operator/tmp/replay.003.copy")
    staged_tree = "/episode-operator/tmp/replay.004.copy/s0"
    assert f"cp -R -p {staged_tree}/one.txt {staged_tree}/sub /srv/data/" in jobs["replay.004.copy"].command
    # ENTRYPOINT (a seed stage of its own) runs under the supervisor, unbounded, with [environment.env]
    # over the image's ENV and the sandbox's keep-alive as its arguments: CMD is replaced, as Harbor does.
    start = entrypoint_job(result, ReplayConfig(attempt=1, budget_sec=600))
    assert start is not None and start.id == "replay.start" and math.isinf(start.timeout_sec)
    assert start.command == "exec ./serve.sh --port 8000 " + shlex.join(KEEP_ALIVE)
    assert (start.user, start.cwd) == ("agent", "/srv/app")
    assert dict(start.env) == {"PATH": "/opt/bin:/usr/bin:/bin", "MODE": "task", "TOKEN": "t"}
    assert result.settings.user == "agent" and result.settings.workdir == "/srv/app"
    log = store.logs[(1, "seed", "replay")].decode()
    assert "==> environment/Dockerfile:3: RUN write created-by-run yes\n" in log
    assert "==> environment/Dockerfile:8: RUN append log as-agent" in log and log.endswith("[exited with 0]\n")


def test_a_failing_run_is_the_tasks_failure_and_stops_replay() -> None:
    world, sandbox, store = setup()
    result = run(world, sandbox, task_files(DOCKERFILE.replace("RUN write created-by-run yes", "RUN exit 3")), store)
    assert result == ReplayFailed(
        3, "RUN exit 3", "environment/Dockerfile:3: RUN exit 3: exited with 3", b"ran replay.001.run\n"
    )
    assert sandbox.starts == ["replay.base", "replay.001.run"]
    assert store.logs[(1, "seed", "replay")].endswith(b"[exited with 3]\n")


def test_a_user_that_does_not_exist_fails_the_step() -> None:
    world, sandbox, store = setup()
    result = run(world, sandbox, task_files("FROM x\nUSER ghost\nRUN unstartable\n"), store)
    assert isinstance(result, ReplayFailed) and result.line == 3
    assert "could not start (bash: not found)" in result.message


def test_a_restarted_operator_reattaches_and_never_runs_a_line_twice() -> None:
    world, sandbox, store = setup()
    world.crash_after = {"replay.004.copy"}
    with pytest.raises(Crash):
        run(world, sandbox, task_files(), store)
    uploads_before = list(sandbox.uploads)
    result = run(world, sandbox, task_files(), MemoryStore())
    assert isinstance(result, ReplayReady)
    assert len(sandbox.starts) == len(set(sandbox.starts)) == 6
    assert sandbox.uploads == [*uploads_before]  # no step's files were uploaded again
    assert sandbox.files["main"]["/srv/app/log"] == b"as-agent\n"


def test_replay_is_bounded_by_build_timeout_sec_from_its_first_job() -> None:
    world, sandbox, store = setup()
    world.hooks["replay.002.mkdir"] = lambda sandbox, spec: setattr(world.clock, "now", world.clock.now + 601)
    result = run(world, sandbox, task_files(), store)
    assert isinstance(result, ReplayTimedOut) and result.line == 5
    assert "replay ran past build_timeout_sec (600 s)" in result.message
    assert "replay.003.copy" not in sandbox.starts
    # Each job's own bound is what is left of the budget.
    first = sandbox.job("replay.001.run").spec
    assert first.timeout_sec == 600.0


def test_a_restart_past_the_bound_still_counts_the_steps_that_ran_in_time() -> None:
    """Replay finished within its bound; the operator restarts later: nothing new runs, nothing times out."""
    world, sandbox, store = setup()
    assert isinstance(run(world, sandbox, task_files(), store), ReplayReady)
    ran = list(sandbox.starts)
    world.clock.now += 3600
    assert isinstance(run(world, sandbox, task_files(), store), ReplayReady)
    assert sandbox.starts == ran
    # A step that never started is not started past the bound.
    world2, sandbox2, store2 = setup()
    world2.crash_after = {"replay.002.mkdir"}
    with pytest.raises(Crash):
        run(world2, sandbox2, task_files(), store2)
    world2.clock.now += 3600
    result = run(world2, sandbox2, task_files(), store2)
    assert isinstance(result, ReplayTimedOut) and result.line == 5
    assert "replay.003.copy" not in sandbox2.starts


def test_a_finished_replay_is_read_back_with_one_job_and_its_settings_apply_to_later_jobs() -> None:
    world, sandbox, store = setup()
    done = run(world, sandbox, task_files(), store)
    assert isinstance(done, ReplayReady)
    ran = list(sandbox.starts)
    again = asyncio.run(
        replayed_image(
            sandbox,
            task_files(),
            ReplaySource(),
            EnvironmentConfig(env={"MODE": "task", "TOKEN": "t"}),
            ReplayConfig(attempt=1, budget_sec=600),
        )
    )
    assert again == done and sandbox.starts == ran  # the base job re-attached: nothing ran
    replayed = ReplayedSandbox(sandbox, done.settings)
    assert replayed.workdir == "/srv/app" and replayed.name == sandbox.name

    async def later() -> None:
        await replayed.start_job(JobSpec(id="later", command="write x y", timeout_sec=5))
        await replayed.start_job(JobSpec(id="root", command="write x y", timeout_sec=5, user="root", env={"A": "1"}))
        await replayed.start_job(JobSpec(id="side", command="write x y", timeout_sec=5, container="db"))

    asyncio.run(later())
    later_spec = sandbox.job("later").spec
    assert (later_spec.user, later_spec.cwd, later_spec.env["MODE"]) == ("agent", "/srv/app", "task")
    root = sandbox.job("root").spec
    assert (root.user, root.env["A"], root.env["TOKEN"]) == ("root", "1", "t")
    side = sandbox.job("side", "db").spec  # a sidecar is not the replayed image
    assert (side.user, side.cwd, dict(side.env)) == (None, None, {})


def test_a_run_that_runs_out_of_time_times_replay_out() -> None:
    world, sandbox, store = setup()
    result = run(world, sandbox, task_files("FROM x\nRUN timeout\n"), store, budget=30)
    assert isinstance(result, ReplayTimedOut) and result.line == 2


def test_a_dockerfile_replay_cannot_apply_is_refused() -> None:
    world, sandbox, store = setup()
    result = run(world, sandbox, task_files("FROM x\nCOPY --from=build /a /b\n"), store)
    assert isinstance(result, ReplayRefused)
    assert result.problems[0].render().startswith("environment/Dockerfile:2: COPY --from=build")
    assert sandbox.starts == ["replay.base"]


def test_a_lost_pod_is_an_outage() -> None:
    world, sandbox, store = setup()
    with pytest.raises(SandboxError) as raised:
        run(world, sandbox, task_files("FROM x\nRUN lose-pod\nRUN write never x\n"), store)
    assert raised.value.kind == "pod_lost"


def test_a_heredoc_script_travels_as_an_executable_file() -> None:
    world, sandbox, store = setup()
    script = "#!/usr/bin/env python3\nprint('hi')\n"
    result = run(world, sandbox, task_files(f"FROM x\nRUN <<EOF\n{script}EOF\n"), store)
    assert isinstance(result, ReplayReady) and result.plan.entrypoint is None
    spec = sandbox.job("replay.001.run").spec
    assert spec.command == "exec /episode-operator/tmp/replay.001.run/script"
    assert sandbox.files["main"]["/episode-operator/tmp/replay.001.run/script"] == script.encode()


def test_the_staging_tar_keeps_modes() -> None:
    files = TaskFiles.from_tar(
        _tar({"environment/Dockerfile": (b"FROM x\nCOPY tool /usr/bin/\n", 0o644), "environment/tool": (b"x", 0o755)})
    )
    world, sandbox, store = setup()
    uploaded: list[bytes] = []
    original = sandbox._upload

    def spy(archive: bytes, destination: str, container: str, clear: object, user: object = None) -> None:
        uploaded.append(archive)
        original(archive, destination, container, clear, user)  # type: ignore[arg-type]

    sandbox._upload = spy  # type: ignore[method-assign]
    assert isinstance(run(world, sandbox, files, store), ReplayReady)
    with tarfile.open(fileobj=io.BytesIO(uploaded[0])) as archive:
        assert archive.getmember("s0").mode == 0o755


def _tar(entries: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, (data, mode) in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
