"""Gym's replay in a real pod: a Dockerfile that creates a user, a workdir, files by COPY and an
entrypoint-started HTTP service, replayed in the mirrored FROM image; the health check waits for it.

This drives the parts directly (the kube layer's provider makes the pod, owned by a suspended
Episode; the runtime's replay applies the plan, then starts the ENTRYPOINT as the seed does);
``test_seed.py`` runs Dockerfile tasks through real Episodes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

from kubernetes import client

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.kube.client import KubeClient
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.runtime.episode_store import EpisodeBlobs
from episode_operator.runtime.replay_runner import (
    ReplayConfig,
    ReplayFailed,
    ReplayReady,
    ReplaySource,
    entrypoint_job,
    replay_dockerfile,
)
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from episode_operator.taskfolder.healthcheck import poll_healthcheck
from episode_operator.taskfolder.image_refs import ImageMirrors
from episode_operator.taskfolder.replay_plan import plan_replay
from tests.cluster.harness import episode_spec, run_sandbox_job, suspended_episode

TASK = Path(__file__).parent / "tasks" / "replay-service"
MIRRORS = ImageMirrors.parse(["ubuntu:24.04=episode-operator.local/sandbox:bookworm"])


def test_a_dockerfile_is_replayed_and_its_entrypoint_serves(
    api_client: client.ApiClient, kubeconfig: Path, quiet_namespace: str, tmp_path: Path
) -> None:
    files = TaskFiles.from_directory(TASK)
    task = load_task(files)
    plan = resolve_plan(task)
    planning = plan_replay(files, "environment/Dockerfile", "environment")
    assert planning.plan is not None and planning.plan.from_image == "ubuntu:24.04"
    image = MIRRORS.apply(planning.plan.from_image)
    assert image == "episode-operator.local/sandbox:bookworm"
    owner = suspended_episode(api_client, quiet_namespace, "replay")
    store = EpisodeBlobs.local(tmp_path)

    async def scenario() -> None:
        kube = await KubeClient.connect(str(kubeconfig))
        spec = EpisodeSpec.model_validate(episode_spec(files={"task.toml": "# not driven"}))
        provider = KubeProvider(kube, owner, spec, plan, image, plan.main_env)
        try:
            sandbox = await provider.agent(1)
            config = ReplayConfig(attempt=1, budget_sec=plan.environment.build_timeout_sec, poll_interval_sec=5)
            outcome = await replay_dockerfile(sandbox, files, ReplaySource(), plan.environment, store, config)
            assert isinstance(outcome, ReplayReady), outcome
            assert outcome.settings.user == "agent" and outcome.settings.workdir == "/srv/app"
            start = entrypoint_job(outcome, config)
            assert start is not None
            await sandbox.start_job(start)

            # The environment health check waits for the entrypoint's service, as it would for a container's.
            check = plan.environment.healthcheck
            assert check is not None
            numbers = itertools.count()

            async def attempt(timeout_sec: float) -> bool:
                code, _ = await run_sandbox_job(sandbox, check.command, name=f"health.{next(numbers)}")
                return code == 0

            assert await poll_healthcheck(check, attempt, time.monotonic, asyncio.sleep)

            # What the Dockerfile made: the user, the workdir, the files with their owners and modes.
            code, facts = await run_sandbox_job(
                sandbox,
                "id agent; stat -c '%U %a %n' /srv/app /srv/app/site /srv/app/site/index.html "
                "/opt/tools/bin/greet; cat /srv/app/site/greeting.txt /srv/app/site/whoami.txt /tmp/entrypoint.txt",
                name="facts",
            )
            assert code == 0, facts
            lines = facts.splitlines()
            assert lines[0].startswith("uid=1234(agent)")
            assert lines[1:5] == [
                "root 755 /srv/app",
                "agent 755 /srv/app/site",
                "agent 644 /srv/app/site/index.html",
                "root 755 /opt/tools/bin/greet",
            ]
            assert lines[5:7] == ["hello from replay", "agent"]
            # The entrypoint ran as USER, in WORKDIR, with [environment.env] over the Dockerfile's ENV.
            assert lines[7] == "agent /srv/app from-task-toml task hello from replay"

            log = (tmp_path / "attempt-1" / "seed" / "logs" / "replay.txt").read_text()
            assert "==> environment/Dockerfile:8: RUN useradd --create-home --uid 1234" in log
            assert log.rstrip().endswith("[exited with 0]")

            # A restarted operator re-attaches: useradd would fail if its line ran again, the service twice.
            again = await replay_dockerfile(sandbox, files, ReplaySource(), plan.environment, store, config)
            assert isinstance(again, ReplayReady)

            # A failing RUN is the task's failure, with the line, the output kept.
            broken = ReplaySource(dockerfile="environment/broken.Dockerfile")
            config = ReplayConfig(attempt=1, budget_sec=60, job_prefix="broken", log_name="broken")
            failed = await replay_dockerfile(sandbox, files, broken, plan.environment, store, config)
            assert isinstance(failed, ReplayFailed), failed
            assert failed.message == (
                'environment/broken.Dockerfile:3: RUN echo "no such thing" >&2; exit 7: exited with 7'
            )
            assert b"no such thing" in failed.output
            kept = (tmp_path / "attempt-1" / "seed" / "logs" / "broken.txt").read_text()
            assert "about to fail" in kept and "never" not in kept
        finally:
            await provider.release_all(keep=False)
            await kube.close()

    asyncio.run(scenario())
