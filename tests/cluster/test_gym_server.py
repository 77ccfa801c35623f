"""The operator's Gym environment server on the cluster, driven as Gym's collector drives it: over HTTP,
with the token in the URL, flat rows and episode requests, a re-sent /run, a cancelled one.

The catalogue is the examples packed as a user packs them (``kubectl episode pack --dataset``);
the agent is a command that solves ``hello``.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import unwatched_namespace
from tests.cluster.harness import OperatorProcess, gym_operator

KUBECTL_EPISODE = Path(sys.executable).parent / "kubectl-episode"
TOKEN = "gym-test-token-0123456789"
# Slow enough that a /run can be cancelled while its Episode runs; hello's test wants this file.
SOLVE = "sleep 3; echo 'Hello, world!' > /app/hello.txt"
GROUP, VERSION, PLURAL = "episode-operator.dev", "v1alpha1", "episodes"
HOLD = "tests.episode-operator.dev/hold"


class GymOperator:
    """An operator with its Gym server on, driving one namespace, and a client of that server."""

    def __init__(self, process: OperatorProcess, port: int) -> None:
        self.process = process
        self.port = port

    def post(self, path: str, body: Any, *, credentials: str | None = f"run-1:{TOKEN}", timeout: float = 300) -> Any:
        """POST as Gym's collector does, its server URL http://<scope>:<token>@host:port."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        if credentials:
            request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())


@pytest.fixture(scope="module")
def gym_server(
    kubeconfig: Path, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GymOperator, str]]:
    core = client.CoreV1Api(api_client)
    with unwatched_namespace(core, api_client, "gym-") as namespace:
        agent = {"kind": "command", "command": SOLVE}
        root = tmp_path_factory.mktemp("gym")
        with gym_operator(kubeconfig, api_client, namespace, root, agent, TOKEN) as (process, port):
            yield GymOperator(process, port), namespace


def episodes(api_client: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )["items"]
    return items


def row(task: int, rollout: int, instance: str = "examples::hello") -> dict[str, Any]:
    return {
        "instance_id": instance,
        "responses_create_params": {"input": []},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": "episode_agent"},
    }


def test_a_flat_row_runs_once_however_often_it_is_sent(
    gym_server: tuple[GymOperator, str], api_client: client.ApiClient
) -> None:
    gym, namespace = gym_server
    first = gym.post("/run", row(0, 0))
    assert first["reward"] == 1.0, first
    assert first["instance_id"] == "examples::hello" and not [key for key in first if key.startswith("_ng_")]
    again = gym.post("/run", row(0, 0))  # Gym re-sends /run after a dropped connection
    assert again["reward"] == 1.0 and again["episode"] == first["episode"]
    mine = [item for item in episodes(api_client, namespace) if item["metadata"]["name"].startswith("gym-0-0-")]
    assert len(mine) == 1, [item["metadata"]["name"] for item in mine]
    labels = mine[0]["metadata"]["labels"]
    assert labels["episode-operator.dev/gym-scope"] == "run-1"
    assert mine[0]["spec"]["retries"]["outages"] == 0, "Gym owns the retry: the Episode makes none"
    # Another scope (another `gym eval run`) is another Episode.
    other = gym.post("/run", row(0, 0), credentials=f"run-2:{TOKEN}")
    assert other["episode"] != first["episode"]


def test_an_episode_request_answers_gyms_episode_response(gym_server: tuple[GymOperator, str]) -> None:
    gym, _ = gym_server
    request = {
        "episode_id": {"rollout_id": "5-0", "attempt": 0},
        "task": {"task_id": {"taskset": "examples", "task_id": "hello"}, "task_input": {}},
    }
    reply = gym.post("/run", request)
    assert reply["episode_id"] == request["episode_id"] and reply["task_id"] == request["task"]["task_id"]
    assert reply["failure"] is None and reply["result"]["reward"] == 1.0, reply


def test_what_cannot_run_is_refused_without_an_episode(
    gym_server: tuple[GymOperator, str], api_client: client.ApiClient
) -> None:
    gym, namespace = gym_server
    before = len(episodes(api_client, namespace))
    refused = gym.post("/run", row(9, 0, "examples::no-such-task"))
    assert refused["_ng_failure_terminal"] is True
    assert "dataset 'examples' has no task 'no-such-task'" in refused["_ng_failure_message"]
    with pytest.raises(urllib.error.HTTPError) as unauthorized:
        gym.post("/run", row(9, 1), credentials=None)
    assert unauthorized.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as bad:
        gym.post("/run", {"instance_id": "examples::hello"})
    assert bad.value.code == 422 and "_ng_task_index" in json.loads(bad.value.read())["detail"]
    assert len(episodes(api_client, namespace)) == before


def test_a_cancelled_run_deletes_its_episode(gym_server: tuple[GymOperator, str], api_client: client.ApiClient) -> None:
    gym, namespace = gym_server

    def mine() -> list[dict[str, Any]]:
        return [item for item in episodes(api_client, namespace) if item["metadata"]["name"].startswith("gym-7-0-")]

    connection = http.client.HTTPConnection("127.0.0.1", gym.port, timeout=60)
    credentials = base64.b64encode(f"run-1:{TOKEN}".encode()).decode()
    connection.request(
        "POST",
        "/run",
        json.dumps(row(7, 0)),
        {"Content-Type": "application/json", "Authorization": f"Basic {credentials}"},
    )
    deadline = time.monotonic() + 60
    while not mine():
        assert time.monotonic() < deadline, f"the try's Episode was never made\n{gym.process.log_tail()}"
        time.sleep(0.2)
    assert not is_terminal(mine()[0]), "the Episode finished before the try could be cancelled"
    # The test's own finalizer holds the cancelled Episode in its deletion while the try is sent again.
    custom = client.CustomObjectsApi(api_client)
    name = mine()[0]["metadata"]["name"]
    while not mine()[0]["metadata"].get("finalizers"):  # the operator's first: a merge patch replaces the list
        assert time.monotonic() < deadline, f"the operator never took the Episode\n{gym.process.log_tail()}"
        time.sleep(0.2)
    finalizers = [*mine()[0]["metadata"]["finalizers"], HOLD]
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": finalizers}}
    )
    connection.close()  # Gym gives up on the rollout
    while not mine()[0]["metadata"].get("deletionTimestamp"):
        assert time.monotonic() < deadline, f"the cancelled try's Episode stays\n{gym.process.log_tail()}"
        time.sleep(0.2)
    # Gym sends the try again (a resumed run) while its cancelled Episode is being deleted: it runs afresh
    # once that one is gone, and is not answered with the cancelled one's end.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        again = pool.submit(gym.post, "/run", row(7, 0))
        while mine()[0]["metadata"].get("finalizers") != [HOLD]:  # the operator has let go of it
            assert time.monotonic() < deadline, f"the operator keeps its finalizer\n{gym.process.log_tail()}"
            time.sleep(0.2)
        while f"{name} of a cancelled try is being deleted: the try runs again" not in gym.process.log_tail(400):
            assert time.monotonic() < deadline, f"the try sent again did not wait\n{gym.process.log_tail()}"
            time.sleep(0.2)
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": []}})
        answer = again.result(timeout=300)
    assert answer["reward"] == 1.0, answer
    assert len(mine()) == 1 and not mine()[0]["metadata"].get("deletionTimestamp")


def is_terminal(episode: dict[str, Any]) -> bool:
    return (episode.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def test_aggregate_metrics_of_the_collected_rows(gym_server: tuple[GymOperator, str]) -> None:
    gym, _ = gym_server
    rows = [
        {**gym.post("/run", row(0, rollout)), "_ng_task_index": 0, "_ng_rollout_index": rollout} for rollout in (0, 1)
    ]
    metrics = gym.post("/aggregate_metrics", {"verify_responses": rows})
    assert metrics["key_metrics"]["mean/reward"] == 1.0
    assert metrics["key_metrics"]["pass@2/accuracy"] == 100.0
