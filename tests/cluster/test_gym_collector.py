"""NeMo Gym's own rollout collection driving the operator's Gym server, in a pod of the cluster.

The collector is Gym's: ``nemo_gym.cli.eval.collect_rollouts`` (what ``gym eval run --no-serve`` runs:
its ``RolloutCollectionHelper``) from the nemo-gym wheel, in hack/cluster's gym-collector image (Debian
13's Python 3.13). Its config names the operator as an environment server fronting one agent, with the
run's scope and the server's token in the host (``<scope>:<token>@<address>``: aiohttp sends them as
Basic credentials). The operator runs on the node and serves Gym's protocol on a port the pod reaches at
the node's address; each try is an Episode of ``examples::hello`` that mini-swe-agent solves against the
scripted model, its calls captured with vLLM's token ids.

The injected failure: the collector is killed (SIGKILL) while tries are in flight, after some rows were
written. Its pod restarts it and it resumes from its own files (``resume_from_cache``), as Gym resumes any
interrupted run. What must hold: every rollout has one row with reward 1 and its token ids, the rows
validate against Gym's models, a try written before the kill is not run again, and no try has two
Episodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import unwatched_namespace
from tests.cluster.harness import GROUP, PLURAL, OperatorProcess, gym_operator, pod_file
from tests.reference import check_rollout_row
from tests.scripted_model.deploy import ScriptedModel, deploy_scripted_model

KUBECTL_EPISODE = Path(sys.executable).parent / "kubectl-episode"
COLLECTOR_IMAGE = "episode-operator.local/gym-collector:0.7.0"  # hack/cluster's IMAGES
NODE_ADDRESS = "198.18.255.1"  # hack/cluster's node address: where a pod reaches the node's processes
TOKEN = "gym-collector-token-8d1f0a"
SCOPE = "collect-1"
MODEL = "scripted-m1"
KEY = "sk-scripted-gym-4b21"
VERSION = "v1alpha1"
REPEATS = 4  # rollouts of examples::hello: two at a time, so some are in flight when the collector dies
HELLO = {
    "rules": [
        {
            "name": "hello",
            "when": {"prompt": "Hello, world!", "tools": True},
            "steps": [{"run": "printf 'Hello, world!\\n' > /app/hello.txt"}, {"finish": "Done."}],
        }
    ]
}
# The collector runs as the pod's child process, its pid kept, so that a test can kill it alone: the
# shell then exits 137 and the pod (restartPolicy OnFailure) starts the collector again on the same
# emptyDir, where Gym finds its materialized inputs and the rows already written. A collection that
# ends well leaves /work/done and the container running, for the test to read Gym's files.
COLLECT = (
    "cd /work; python3 -c 'from nemo_gym.cli.eval import collect_rollouts; collect_rollouts()' & "
    "echo $! > /work/collector.pid; wait $! || exit $?; echo collected > /work/done; exec sleep 3600"
)
OUTPUT = "/work/out/rollouts.jsonl"


def collector_config(port: int) -> dict[str, Any]:
    """Gym's global config for the collection: the operator as the environment server of one agent."""
    return {
        "head_server": {"host": "127.0.0.1", "port": 1},  # unused: the config is given whole, no head server
        "episode_agent": {"responses_api_agents": {"episode_operator_agent": {"host": "127.0.0.1", "port": 1}}},
        "episode_operator": {
            "environment_servers": {
                "legacy_agent": {
                    "host": f"{SCOPE}:{TOKEN}@{NODE_ADDRESS}",
                    "port": port,
                    "agent_server": {"type": "responses_api_agents", "name": "episode_agent"},
                }
            }
        },
        "input_jsonl_fpath": "/input/input.jsonl",
        "output_jsonl_fpath": OUTPUT,
        "num_repeats": REPEATS,
        "num_samples_in_parallel": 2,
        "resume_from_cache": True,  # a first run has nothing to resume and says so
        "disable_health_check": True,
    }


@pytest.fixture(scope="module")
def gym(
    kubeconfig: Path, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OperatorProcess, str, int, ScriptedModel]]:
    core = client.CoreV1Api(api_client)
    with unwatched_namespace(core, api_client, "gymc-") as namespace:
        model = deploy_scripted_model(core, namespace, HELLO, "episode-operator.local/sandbox:bookworm")
        core.create_namespaced_secret(
            namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="model-key"), string_data={"api-key": KEY})
        )
        endpoint = {
            "name": MODEL,
            "baseURL": f"{model.base_url}/v1",
            "api": "chat-completions",
            "apiKeySecretRef": {"name": "model-key"},
        }
        agent = {
            "kind": "harness",
            "harness": {"name": "mini-swe-agent"},
            "model": endpoint,
            "capture": {"tokenIds": True},
        }
        root = tmp_path_factory.mktemp("gym-collector")
        with gym_operator(kubeconfig, api_client, namespace, root, agent, TOKEN) as (process, port):
            yield process, namespace, port, model


def collector_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [
                {
                    "name": "main",
                    "image": COLLECTOR_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", COLLECT],
                    "env": [
                        {
                            "name": "NEMO_GYM_CONFIG_DICT",
                            "valueFrom": {"configMapKeyRef": {"name": name, "key": "config.json"}},
                        }
                    ],
                    "resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "1", "memory": "2Gi"}},
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "input", "mountPath": "/input"}],
                }
            ],
            "volumes": [{"name": "work", "emptyDir": {}}, {"name": "input", "configMap": {"name": name}}],
        },
    }


def episodes(api_client: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )["items"]
    return items


def rows_written(core: client.CoreV1Api, namespace: str, pod: str) -> list[dict[str, Any]]:
    text = pod_file(core, namespace, pod, OUTPUT) or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def is_terminal(episode: dict[str, Any]) -> bool:
    return (episode.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def logs(core: client.CoreV1Api, namespace: str, pod: str, previous: bool = False, lines: int | None = 40) -> str:
    try:
        text: str = core.read_namespaced_pod_log(pod, namespace, container="main", previous=previous, tail_lines=lines)
    except client.ApiException as error:
        return f"(no log: {error.reason})"
    return text


def test_gyms_collector_collects_through_the_operator_and_resumes_without_a_second_episode(
    gym: tuple[OperatorProcess, str, int, ScriptedModel], api_client: client.ApiClient
) -> None:
    operator, namespace, port, model = gym
    core = client.CoreV1Api(api_client)
    name = "gym-collector"
    row = {
        "instance_id": "examples::hello",
        "responses_create_params": {"input": []},
        "agent_ref": {"name": "episode_agent"},
    }
    config = {"input.jsonl": json.dumps(row) + "\n", "config.json": json.dumps(collector_config(port))}
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=config)
    )
    core.create_namespaced_pod(namespace, collector_pod(name))

    def why() -> str:
        pod = core.read_namespaced_pod(name, namespace)
        return (
            f"pod {pod.status.phase} {[s.to_dict() for s in pod.status.container_statuses or []]}\n"
            f"collector now:\n{logs(core, namespace, name)}\nbefore its restart:\n"
            f"{logs(core, namespace, name, previous=True)}\noperator:\n{operator.log_tail()}"
        )

    # The failure: once a row is written and a try is still running, kill the collector (its pid, in the pod).
    deadline = time.monotonic() + 600
    while True:
        assert time.monotonic() < deadline, f"no row was written with a try in flight\n{why()}"
        written = rows_written(core, namespace, name)
        running = [e for e in episodes(api_client, namespace) if not is_terminal(e)]
        assert len(written) < REPEATS, f"every try ended before the collector could be killed\n{why()}"
        if written and running:
            break
        time.sleep(0.5)
    before = {e["metadata"]["name"]: e["metadata"]["uid"] for e in episodes(api_client, namespace) if is_terminal(e)}
    killed = subprocess.run(
        [
            "kubectl",
            "exec",
            "-n",
            namespace,
            name,
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            'kill -9 "$(cat /work/collector.pid)"',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        # kubectl keeps its discovery cache under $HOME/.kube: the operator's folder, not the checkout.
        env={
            "KUBECONFIG": str(operator.kubeconfig),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(operator.data_dir.parent),
        },
        check=False,
    )
    assert killed.returncode == 0, killed.stderr

    while (pod_file(core, namespace, name, "/work/done") or "").strip() != "collected":
        assert time.monotonic() < deadline, f"the resumed collection did not finish\n{why()}"
        time.sleep(1)
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.status.container_statuses[0].restart_count == 1, why()
    assert "Resumed from cache" in logs(core, namespace, name, lines=None), why()

    rows = rows_written(core, namespace, name)
    failures = pod_file(core, namespace, name, "/work/out/rollouts_failures.jsonl")
    indexes = sorted(r["_ng_rollout_index"] for r in rows)
    assert indexes == list(range(REPEATS)), f"rows of {indexes}; failures: {failures}\n{why()}"
    for result in rows:
        assert result["reward"] == 1.0, result
        assert result["instance_id"] == "examples::hello"
        check_rollout_row(result, collector_keys=None)  # the operator's answer has no _ng_ key (test_gym_server)
        # mini-swe-agent's calls went through the capture, which asked the model for vLLM's token ids.
        trained = [item for item in result["response"]["output"] if item.get("generation_token_ids")]
        assert trained, f"no output item carries token ids: {result['response']['output']}"
        assert all(item["prompt_token_ids"] and item["generation_log_probs"] for item in trained)

    # One Episode per try: the tries written before the kill are the same objects, not run again.
    after = episodes(api_client, namespace)
    names = [e["metadata"]["name"] for e in after]
    assert len(names) == len(set(names)) == REPEATS, names
    uids = {e["metadata"]["name"]: e["metadata"]["uid"] for e in after}
    assert all(uids[episode] == uid for episode, uid in before.items()), (before, uids)
    assert all(e["metadata"]["labels"]["episode-operator.dev/gym-scope"] == SCOPE for e in after)
    # Every model call of every try was the harness's, answered by the script.
    assert {r["rule"] for r in model.model_requests()} == {"hello"}

    metrics = json.loads(pod_file(core, namespace, name, "/work/out/rollouts_aggregate_metrics.json") or "{}")
    assert metrics, "Gym wrote no aggregate metrics (the operator's /aggregate_metrics)"
