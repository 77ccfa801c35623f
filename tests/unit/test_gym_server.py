"""The Gym environment server over real HTTP on a local port, against an in-memory cluster.

The in-memory cluster keeps the rules of the real one the server relies on (kube/gym_catalogue.py, tested on
the cluster): a second create of the same name is the same Episode, a deleted Episode wakes
whoever waits on it with EpisodeGone, and an Episode is finished only once its status says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from episode_operator.api.episode_resource import AgentSpec
from episode_operator.api.export import GYM_IDENTITY_ANNOTATION, NO_EVIDENCE, EpisodeEvidence
from episode_operator.runtime.gym_protocol import TaskRef
from episode_operator.runtime.gym_server import (
    CAPTURE_KEY_ANNOTATION,
    SCOPE_LABEL,
    EpisodeGone,
    GymServer,
    GymSettings,
    RolloutRefused,
    load_settings,
    serve,
    try_manifest,
)
from tests.ports import free_port
from tests.unit.test_export import graded, turn
from tests.unit.test_gym_protocol import episode_request, flat_row

TOKEN = "s3cret-token"
AGENT = AgentSpec.model_validate(
    {"kind": "command", "command": "true", "model": {"name": "policy", "baseURL": "http://vllm.models:8000/v1"}}
)
CATALOGUE = {TaskRef("red-team", "answer"): {"configMap": {"name": "task-answer-0123456789ab"}}}


@dataclass
class Cluster:
    """Episodes by name; ``finish`` gives one its terminal status."""

    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    creates: int = 0
    deleted: list[str] = field(default_factory=list)
    refuse: str | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def task_source(self, task: TaskRef) -> dict[str, Any] | None:
        return CATALOGUE.get(task)

    async def create(self, manifest: dict[str, Any]) -> None:
        if self.refuse:
            raise RolloutRefused(self.refuse)
        self.creates += 1
        async with self.changed:
            self.episodes.setdefault(manifest["metadata"]["name"], {**manifest, "status": {}})
            self.changed.notify_all()

    async def finished(self, namespace: str, name: str) -> Mapping[str, Any]:
        async with self.changed:
            while True:
                episode = self.episodes.get(name)
                if episode is None:
                    raise EpisodeGone(name)
                if episode["status"].get("phase") in ("Succeeded", "Failed"):
                    return episode
                await self.changed.wait()

    async def delete(self, namespace: str, name: str) -> None:
        async with self.changed:
            self.deleted.append(name)
            self.episodes.pop(name, None)
            self.changed.notify_all()

    async def evidence(self, episode: Mapping[str, Any]) -> EpisodeEvidence:
        return NO_EVIDENCE

    async def created(self, count: int = 1) -> list[str]:
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.episodes) >= count)
            return list(self.episodes)

    async def finish(self, name: str, status: dict[str, Any]) -> None:
        async with self.changed:
            self.episodes[name]["status"] = status
            self.changed.notify_all()


@asynccontextmanager
async def running(cluster: Cluster, **settings: Any) -> AsyncIterator[str]:
    port = free_port()
    server = GymServer(GymSettings(namespace="evals", agent=AGENT, token=TOKEN, **settings), cluster)
    runner = await serve(server, "127.0.0.1", port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def scenario(body: Any) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout=60))


def test_every_request_needs_the_token() -> None:
    async def body() -> None:
        cluster = Cluster()
        async with running(cluster) as address, aiohttp.ClientSession() as http:
            for headers in ({}, bearer("wrong"), {"Authorization": "Basic !!"}):
                async with http.post(f"http://{address}/run", json=flat_row(), headers=headers) as reply:
                    assert reply.status == 401, headers
                    assert "token" in (await reply.json())["detail"]
                async with http.post(f"http://{address}/aggregate_metrics", json={}, headers=headers) as reply:
                    assert reply.status == 401
            assert cluster.creates == 0

    scenario(body)


def test_gyms_url_with_scope_and_token_authenticates() -> None:
    """Gym's server URL is http://{host}:{port}: a host of <scope>:<token>@<address> sends basic auth."""

    async def body() -> None:
        cluster = Cluster()
        async with running(cluster) as address, aiohttp.ClientSession() as http:
            request = asyncio.create_task(http.post(f"http://run-7:{TOKEN}@{address}/run", json=flat_row()))
            (name,) = await cluster.created()
            assert cluster.episodes[name]["metadata"]["labels"][SCOPE_LABEL] == "run-7"
            await cluster.finish(name, graded(turn("task", 1.0)))
            async with await request as reply:
                assert reply.status == 200 and (await reply.json())["reward"] == 1.0

    scenario(body)


def test_a_resent_run_is_the_same_episode_and_the_same_answer() -> None:
    async def body() -> None:
        cluster = Cluster()
        async with running(cluster) as address, aiohttp.ClientSession(headers=bearer()) as http:
            first = asyncio.create_task(http.post(f"http://{address}/run", json=episode_request()))
            again = asyncio.create_task(http.post(f"http://{address}/run", json=episode_request()))
            (name,) = await cluster.created()
            while cluster.creates < 2:
                await asyncio.sleep(0.01)  # both requests reached the cluster
            await cluster.finish(name, graded(turn("task", 1.0)))
            answers = [await (await reply).json() for reply in (first, again)]
            assert answers[0]["result"]["reward"] == answers[1]["result"]["reward"] == 1.0
            assert list(cluster.episodes) == [name] and cluster.episodes[name]["metadata"]["annotations"] == {
                CAPTURE_KEY_ANNOTATION: "3-1",
                GYM_IDENTITY_ANNOTATION: json.dumps(
                    {"_ng_task_id": episode_request()["task"]["task_id"]}, sort_keys=True
                ),
            }
            # Another attempt of the rollout is another Episode.
            retry = asyncio.create_task(http.post(f"http://{address}/run", json=episode_request(attempt=1)))
            names = await cluster.created(2)
            await cluster.finish(names[1], graded(turn("task", 0.0)))
            assert (await (await retry).json())["episode_id"] == {"rollout_id": "3-1", "attempt": 1}

    scenario(body)


def test_a_client_that_goes_away_cancels_its_episode() -> None:
    async def body() -> None:
        cluster = Cluster()
        async with running(cluster) as address:
            async with aiohttp.ClientSession(headers=bearer()) as http:
                request = asyncio.create_task(http.post(f"http://{address}/run", json=flat_row()))
                (name,) = await cluster.created()
                request.cancel()  # the connection closes
            async with cluster.changed:
                await cluster.changed.wait_for(lambda: bool(cluster.deleted))
            assert cluster.deleted == [name] and not cluster.episodes

    scenario(body)


def test_a_server_that_stops_leaves_the_episode_for_the_resent_run() -> None:
    async def body() -> None:
        cluster = Cluster()
        async with aiohttp.ClientSession(headers=bearer()) as http:
            async with running(cluster) as address:
                request = asyncio.create_task(http.post(f"http://{address}/run", json=flat_row()))
                (name,) = await cluster.created()
            with pytest.raises(aiohttp.ClientError):
                await request
        assert cluster.deleted == [] and name in cluster.episodes

    scenario(body)


def test_a_deleted_episode_is_a_failure_gym_may_retry() -> None:
    async def body() -> None:
        cluster = Cluster()
        async with running(cluster) as address, aiohttp.ClientSession(headers=bearer()) as http:
            request = asyncio.create_task(http.post(f"http://{address}/run", json=flat_row()))
            (name,) = await cluster.created()
            await cluster.delete("evals", name)
            reply = await (await request).json()
            assert reply["_ng_failure_terminal"] is False and "deleted" in reply["_ng_failure_message"]

    scenario(body)


@pytest.mark.parametrize(
    ("body", "refuse", "expected"),
    [
        ({**flat_row(), "instance_id": "red-team::missing"}, None, "dataset 'red-team' has no task 'missing'"),
        (flat_row(), "admission webhook denied the request", "admission webhook denied"),
    ],
)
def test_a_try_that_cannot_run_is_a_terminal_failure(body: Any, refuse: str | None, expected: str) -> None:
    async def run() -> None:
        cluster = Cluster(refuse=refuse)
        async with (
            running(cluster) as address,
            aiohttp.ClientSession(headers=bearer()) as http,
            http.post(f"http://{address}/run", json=body) as reply,
        ):
            assert reply.status == 200
            answer = await reply.json()
        assert answer["_ng_failure_terminal"] is True and expected in answer["_ng_failure_message"]
        assert answer["_ng_failure_stage"] == "admission" and not cluster.episodes

    scenario(run)


@pytest.mark.parametrize(
    ("payload", "detail"),
    [(b"{not json", "not JSON"), (b'{"instance_id": "a::b"}', "_ng_task_index"), (b"[]", "the body")],
)
def test_a_bad_body_is_refused_naming_the_key(payload: bytes, detail: str) -> None:
    async def body() -> None:
        async with (
            running(Cluster()) as address,
            aiohttp.ClientSession(headers=bearer()) as http,
            http.post(f"http://{address}/run", data=payload) as reply,
        ):
            assert reply.status == 422 and detail in (await reply.json())["detail"]

    scenario(body)


def test_aggregate_metrics_over_http() -> None:
    rows = [{"_ng_task_index": 0, "_ng_rollout_index": r, "reward": float(r == 0)} for r in range(2)]

    async def body() -> None:
        async with running(Cluster()) as address, aiohttp.ClientSession(headers=bearer()) as http:
            async with http.post(f"http://{address}/aggregate_metrics", json={"verify_responses": rows}) as reply:
                metrics = await reply.json()
            assert metrics["key_metrics"] == {
                "mean/reward": 0.5,
                "pass@2/accuracy": 100.0,
                "pass@1[avg-of-2]/accuracy": 50.0,
            }
            async with http.post(f"http://{address}/aggregate_metrics", json={"rows": []}) as reply:
                assert reply.status == 422 and "verify_responses" in (await reply.json())["detail"]

    scenario(body)


def test_gym_owns_the_retry_or_the_operator_does_never_both() -> None:
    from episode_operator.runtime.gym_protocol import parse_run

    source = CATALOGUE[TaskRef("red-team", "answer")]
    run = parse_run(flat_row())
    settings = GymSettings(namespace="evals", agent=AGENT, token=TOKEN)
    assert try_manifest(settings, "s", run, source)["spec"]["retries"]["outages"] == 0
    operator = GymSettings(namespace="evals", agent=AGENT, token=TOKEN, retry_owner="operator")
    assert try_manifest(operator, "s", run, source)["spec"]["retries"]["outages"] == 2


def test_model_calls_go_through_gyms_model_server_when_it_is_set() -> None:
    from episode_operator.runtime.gym_protocol import parse_run

    source = CATALOGUE[TaskRef("red-team", "answer")]
    run = parse_run(flat_row(_ng_attempt_index=2))
    routed = GymSettings(namespace="evals", agent=AGENT, token=TOKEN, model_server="http://gym-model:8000/")
    manifest = try_manifest(routed, "s", run, source)
    assert manifest["spec"]["agent"]["model"]["baseURL"] == "http://gym-model:8000/ng-rollout/3-1-a2/v1"
    direct = try_manifest(GymSettings(namespace="evals", agent=AGENT, token=TOKEN), "s", run, source)
    assert direct["spec"]["agent"]["model"]["baseURL"] == "http://vllm.models:8000/v1"
    # Gym's training capture (its run's token_id_capture) records the calls on a route of its own.
    training = load_settings(
        "namespace: evals\nagent: {kind: command, command: x}\n"
        "modelServer: http://gym-model:8000\nmodelServerCapture: training\n",
        TOKEN,
        "gym.yaml",
    )
    trained = try_manifest(replace(training, agent=AGENT), "s", run, source)
    assert trained["spec"]["agent"]["model"]["baseURL"] == (
        "http://gym-model:8000/ng-rollout/3-1-a2/training-token-capture/v1"
    )
    labels = manifest["metadata"]["labels"]
    assert (labels["episode-operator.dev/task-index"], labels["episode-operator.dev/set-attempt"]) == ("3", "2")


def test_the_harbor_settings_of_the_server_are_every_trys() -> None:
    from episode_operator.runtime.gym_protocol import parse_run

    text = (
        "namespace: evals\nagent: {kind: command, command: x}\nharbor: {stepSetupTimeoutSec: 30, verifierGraceSec: 5}\n"
    )
    settings = load_settings(text, TOKEN, "gym.yaml")
    spec = try_manifest(settings, "s", parse_run(flat_row()), CATALOGUE[TaskRef("red-team", "answer")])["spec"]
    assert (spec["harbor"]["stepSetupTimeoutSec"], spec["harbor"]["verifierGraceSec"]) == (30.0, 5.0)
    assert spec["harbor"]["enforceTaskTimeouts"] is True  # the seed's default for what it does not set


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("namespace: evals\n", "gym.yaml: agent: Field required"),
        (
            "namespace: evals\nagent: {kind: command, command: x}\nharbor: {promptTemplate: no placeholder}\n",
            "gym.yaml: harbor.promptTemplate",
        ),
        ("namespace: evals\nagent: {kind: command, command: x}\nretryOwner: both\n", "gym.yaml: retryOwner"),
        ("namespace: evals\nagent: {kind: command, command: x}\nmodelServer: gym:8000\n", "gym.yaml: modelServer"),
        (
            "namespace: evals\nagent: {kind: command, command: x}\nmodelServerCapture: training\n",
            "gym.yaml: modelServerCapture: training is a capture of Gym's model server",
        ),
        # A misspelled key is refused, never dropped: the setting it meant would silently be the default.
        ("namespace: evals\nagent: {kind: command, command: x}\nmodelServr: http://g:1\n", "gym.yaml: modelServr"),
        ("[", "gym.yaml: not YAML"),
    ],
)
def test_the_operator_refuses_bad_gym_settings_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    settings = tmp_path / "gym.yaml"
    settings.write_text(text)
    program = Path(sys.executable).parent / "episode-operator"
    started = subprocess.run(
        [str(program), "run", "--gym-port", "8090", "--gym-settings", str(settings)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "EPISODE_GYM_TOKEN": TOKEN, "KUBECONFIG": str(tmp_path / "none")},
        check=False,
    )
    assert started.returncode == 2, started.stderr
    assert message in started.stderr and "Traceback" not in started.stderr


def test_the_gym_server_needs_a_token(tmp_path: Path) -> None:
    settings = tmp_path / "gym.yaml"
    settings.write_text("namespace: evals\nagent: {kind: command, command: x}\n")
    with pytest.raises(ValueError, match="needs a token"):
        load_settings(settings.read_text(), "", str(settings))
