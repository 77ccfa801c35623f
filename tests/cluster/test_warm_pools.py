"""Warm pools on the real cluster (docs/warm-pools.md): an EpisodeSet's pool of ready sandbox pods, claimed
by its children's attempts, refilled, never handed to an attempt of another key or namespace, never
handed over once someone touched it.

Every claimer is checked against the pool's pods as the test saw them *before* the claim: a pod uid
in the pool's set is a claim, any other a fresh pod. A claimed pod's supervisor records are checked
to hold only jobs keyed by the claiming attempt's own job key (no earlier agent's job).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from episode_operator.api.episodeset_resource import SET_PLURAL as SETS
from tests.cluster.conftest import (
    SANDBOX_IMAGE,
    delete_namespace_while_watched,
    namespace_name,
    wait_for_default_service_account,
)
from tests.cluster.harness import GROUP, PLURAL, TERMINAL, VERSION, OperatorProcess, install_crd, read_episode
from tests.scripted_model.deploy import PORT, deploy_scripted_model

POOL_LABEL = "episode-operator.dev/pool"
CLAIMED_LABEL = "episode-operator.dev/claimed-from-pool"
EPISODE_LABEL = "episode-operator.dev/episode"
MARK_ANNOTATION = "episode-operator.dev/pool-mark"
WARM_POOL_ANNOTATION = "episode-operator.dev/warm-pool"
JOBS_DIR = "/episode-operator/jobs"
SUPERVISOR = "/episode-operator/supervisor.sh"
PLACED_ANNOTATION = "episode-operator.dev/pool-placed"

# The children's task: what the pool's pods are made for (image, cpus, memory, workdir).
TASK_TOML = """schema_version = "1.4"

[task]
name = "episode-operator-tests/{name}"

[agent]
timeout_sec = 240.0

[verifier]
timeout_sec = 30.0

[environment]
docker_image = "{image}"
workdir = "/app"
cpus = 1
memory_mb = {memory}
"""
POOL = {"image": SANDBOX_IMAGE, "cpus": 1, "memoryMb": 256, "workdir": "/app"}
# The first attempt of a set's task waits for /tmp/go (the test looks into its pod meanwhile); others end at once.
AGENT = (
    'if [ "${EPISODE_SET_ATTEMPT:-0}" = 1 ] || [ -n "${WAIT_FOR_GO:-}" ]; then '
    "i=0; while [ ! -e /tmp/go ] && [ $i -lt 1000 ]; do sleep 0.2; i=$((i+1)); done; fi; echo 1 > /app/earned.txt"
)


def task_files(name: str, memory: int = 256, image: str = SANDBOX_IMAGE) -> dict[str, str]:
    """A task that earns its reward when the agent wrote /app/earned.txt (the pre-pull tests' too, of their image)."""
    return {
        "task.toml": TASK_TOML.format(name=name, image=image, memory=memory),
        "instruction.md": "Earn the reward.\n",
        "tests/test.sh": "#!/bin/sh\ncat /app/earned.txt > /logs/verifier/reward.txt 2>/dev/null "
        "|| echo 0 > /logs/verifier/reward.txt\n",
    }


# --- helpers ------------------------------------------------------------------------------------------
CRD_CHECK_SEC = 2.0


class CrdKeeper:
    """Keeps this checkout's CRDs installed while a test waits. Sessions of other checkouts sharing the cluster
    install theirs as they start; one without spec.warmPool makes the API server prune it from every set read
    (the operator's included) until it is replaced. Replaced back only when it differs (the harness's digest)."""

    api: client.ApiClient | None = None
    checked = 0.0

    @classmethod
    def keep(cls) -> None:
        if cls.api is not None and time.monotonic() - cls.checked > CRD_CHECK_SEC:
            install_crd(cls.api)
            cls.checked = time.monotonic()


def wait_until(predicate: Callable[[], Any], what: str, operator: OperatorProcess, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        CrdKeeper.keep()
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}\noperator log:\n{operator.log_tail(80)}"
        time.sleep(0.3)


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create_set(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EpisodeSet", "metadata": {"name": name}, "spec": spec}
    created: dict[str, Any] = custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, body)
    return created


def set_status(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    body = custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, SETS, name)
    return dict(body.get("status") or {})


def set_spec(task_count: int, attempts: int, target: int, *, suspend: bool) -> dict[str, Any]:
    return {
        "dataset": {"tasks": [{"name": f"t{i}", "inline": {"files": task_files(f"t{i}")}} for i in range(task_count)]},
        "agent": {"kind": "command", "command": AGENT},
        "attempts": attempts,
        "parallelism": 1,
        "suspend": suspend,
        "warmPool": {"target": target, **POOL},
    }


def pool_pods(core: client.CoreV1Api, namespace: str, set_name: str) -> list[client.V1Pod]:
    listed = core.list_namespaced_pod(namespace, label_selector=f"{POOL_LABEL}={set_name}")
    return [pod for pod in listed.items if pod.metadata.deletion_timestamp is None]


def ready_pool(
    core: client.CoreV1Api, api: client.ApiClient, namespace: str, set_name: str, size: int
) -> dict[str, str]:
    """The pool's pods (uid → name) once ``size`` of them run, are marked and the status says so; else {}."""
    pods = [
        pod
        for pod in pool_pods(core, namespace, set_name)
        if pod.status.phase == "Running" and MARK_ANNOTATION in (pod.metadata.annotations or {})
    ]
    status = set_status(api, namespace, set_name).get("warmPool") or {}
    if len(pods) != size or status.get("ready") != size:
        return {}
    return {pod.metadata.uid: pod.metadata.name for pod in pods}


def agent_pod_record(api: client.ApiClient, namespace: str, episode: str) -> dict[str, Any] | None:
    try:
        status = read_episode(api, namespace, episode).get("status") or {}
    except ApiException:
        return None
    for attempt in status.get("attempts") or []:
        for pod in attempt.get("pods") or []:
            if pod.get("role") == "agent":
                return {**pod, "jobKey": attempt.get("jobKey")}
    return None


def exec_main(core: client.CoreV1Api, namespace: str, pod: str, command: str) -> str:
    text: str = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container="main",
        command=["sh", "-c", command],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    return text


def forged_child(api: client.ApiClient, namespace: str, name: str, owner: dict[str, Any], memory: int) -> None:
    """An Episode that says it is the set's child (its owner reference and the warm-pool annotation): what
    anyone who may create Episodes in the namespace can write."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Episode",
        "metadata": {
            "name": name,
            "annotations": {WARM_POOL_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "EpisodeSet",
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "task": {"inline": {"files": task_files(name, memory)}},
            "agent": {"kind": "command", "command": AGENT},
        },
    }
    custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def finished(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    status = read_episode(api, namespace, name).get("status") or {}
    return status if status.get("phase") in TERMINAL else None


@pytest.fixture(autouse=True)
def this_checkouts_crd(api_client: client.ApiClient) -> Iterator[None]:
    """The CRDs of this checkout (spec.warmPool), installed and kept so while the test runs (:class:`CrdKeeper`)."""
    install_crd(api_client)
    CrdKeeper.api = api_client
    try:
        yield
    finally:
        CrdKeeper.api = None


@contextlib.contextmanager
def watched_namespace(core: client.CoreV1Api, stem: str) -> Iterator[str]:
    """A namespace the session's operator watches, deleted (and waited for) while that operator still runs:
    the sets and Episodes carry kopf's finalizer, which only a running operator removes."""
    name = namespace_name(stem)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"episode-operator.dev/test": "true"}))
    )
    try:
        wait_for_default_service_account(core, name)
        yield name
    finally:
        delete_namespace_while_watched(core, name)


@pytest.fixture
def namespace(core: client.CoreV1Api, operator: OperatorProcess, request: pytest.FixtureRequest) -> Iterator[str]:
    with watched_namespace(core, request.node.name.removeprefix("test_")) as name:
        yield name


@pytest.fixture
def other_namespace(core: client.CoreV1Api, operator: OperatorProcess) -> Iterator[str]:
    with watched_namespace(core, "warm-pool-other") as name:
        yield name


# --- the tests ------------------------------------------------------------------------------------------
def test_a_pool_fills_before_any_child_a_child_claims_a_pod_no_agent_ran_in_and_it_refills(
    operator: OperatorProcess, api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    name = "pooled"
    create_set(api_client, namespace, name, set_spec(1, 3, 2, suspend=True))
    pool = wait_until(lambda: ready_pool(core, api_client, namespace, name, 2), "the pool of 2 is ready", operator)
    listed = custom(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    assert listed["items"] == [], "the set is suspended: no child before the pool is ready"
    for pod in pool_pods(core, namespace, name):  # the supervisor placed before the mark (no exec here: it is fresh)
        assert "placement" in json.loads((pod.metadata.annotations or {})[PLACED_ANNOTATION])

    unsuspended_at = time.time()
    custom(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, SETS, name, {"spec": {"suspend": False}}
    )
    first = f"{name}-0-1"
    record = wait_until(lambda: agent_pod_record(api_client, namespace, first), "the first child's agent pod", operator)
    assert record["uid"] in pool, f"the child made a fresh pod {record} instead of claiming one of {pool}"
    assert record["name"] == pool[record["uid"]]

    pod = core.read_namespaced_pod(record["name"], namespace)
    labels = pod.metadata.labels or {}
    assert labels.get(EPISODE_LABEL) == first and labels.get(CLAIMED_LABEL) == name
    assert POOL_LABEL not in labels, "a claimed pod left the pool"
    assert [(o.kind, o.name) for o in pod.metadata.owner_references] == [("Episode", first)]
    # The supervisor's records hold only jobs keyed by this attempt's key: no earlier agent ran in the pod.
    jobs = wait_until(
        lambda: exec_main(core, namespace, record["name"], f"ls {JOBS_DIR} 2>/dev/null").split(),
        "the agent's job in the claimed pod",
        operator,
    )
    for job in jobs:
        job_id, _, digest = job.rpartition(".")
        expected = hmac.new(record["jobKey"].encode(), job_id.encode(), hashlib.sha256).hexdigest()[:16]
        assert digest == expected, f"job {job} in the claimed pod is not this attempt's"
    # Its jobs ran on the supervisor the pool placed: the claimer placed none (the node's clock is this machine's).
    placed_at = float(exec_main(core, namespace, record["name"], f"date -r {SUPERVISOR} +%s.%N"))
    assert placed_at < unsuspended_at, f"the supervisor was placed at {placed_at}, after the claim"

    # The pool refills to 2 with new pods while the child runs.
    refilled = wait_until(lambda: ready_pool(core, api_client, namespace, name, 2), "the pool refilled to 2", operator)
    assert record["uid"] not in refilled and set(refilled) != set(pool)
    wait_until(
        lambda: (set_status(api_client, namespace, name).get("warmPool") or {}).get("claimed") == 1,
        "the status counts the claimed pod",
        operator,
    )
    exec_main(core, namespace, record["name"], "touch /tmp/go")

    # The next children claim pods too, and the complete set leaves no pool pod behind.
    wait_until(
        lambda: set_status(api_client, namespace, name).get("completionTime"), "the set completes", operator, 300
    )
    for attempt in (1, 2, 3):
        child = read_episode(api_client, namespace, f"{name}-0-{attempt}")
        assert child["status"]["reward"] == 1.0, child["status"]
        pod = agent_pod_record(api_client, namespace, f"{name}-0-{attempt}")
        assert pod is not None and pod["name"].startswith(f"{name}-pool-"), f"child {attempt} made a fresh pod: {pod}"
    wait_until(lambda: not pool_pods(core, namespace, name), "the complete set's pool pods are deleted", operator)


def test_an_episode_of_other_resources_or_another_namespace_never_gets_the_pools_pod(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    other_namespace: str,
) -> None:
    name = "guarded"
    owner = create_set(api_client, namespace, name, set_spec(1, 5, 2, suspend=True))
    pool = wait_until(lambda: ready_pool(core, api_client, namespace, name, 2), "the pool of 2 is ready", operator)
    # The same Episode in another namespace, owned by a set of the same name there, and one of other resources here.
    twin_spec = set_spec(1, 1, 0, suspend=True)
    del twin_spec["warmPool"]
    twin = create_set(api_client, other_namespace, name, twin_spec)
    forged_child(api_client, other_namespace, "elsewhere", twin, 256)
    forged_child(api_client, namespace, "bigger", owner, 512)
    # The honest control: the same forged child with the pool's resources does claim (the forgery itself works).
    forged_child(api_client, namespace, "matching", owner, 256)
    records = {
        (ns, episode): wait_until(
            lambda ns=ns, episode=episode: agent_pod_record(api_client, ns, episode), episode, operator
        )
        for ns, episode in ((other_namespace, "elsewhere"), (namespace, "bigger"), (namespace, "matching"))
    }
    assert records[other_namespace, "elsewhere"]["uid"] not in pool, "another namespace's Episode got the pool's pod"
    assert records[namespace, "bigger"]["uid"] not in pool, "an Episode of other resources got the pool's pod"
    assert records[namespace, "matching"]["uid"] in pool, "the control: a matching Episode claims a pool pod"
    for ns, episode in records:
        status = wait_until(lambda ns=ns, episode=episode: finished(api_client, ns, episode), episode, operator)
        assert status.get("reward") == 1.0, status


def test_a_pool_pod_someone_execd_into_or_labelled_is_never_claimed(
    operator: OperatorProcess, api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, kubeconfig: Path
) -> None:
    name = "tampered"
    owner = create_set(api_client, namespace, name, set_spec(1, 5, 3, suspend=True))
    pool = wait_until(lambda: ready_pool(core, api_client, namespace, name, 3), "the pool of 3 is ready", operator)
    execd, labelled, honest = sorted(pool.items(), key=lambda item: item[1])
    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig), "-n", namespace]
    subprocess.run([*kubectl, "exec", execd[1], "-c", "main", "--", "true"], check=True, timeout=60)
    subprocess.run([*kubectl, "label", "pod", labelled[1], "touched=by-hand"], check=True, timeout=60)
    before = operator.metrics().get('episode_operator_warm_pool_claims_total{result="stale"}', 0)

    got = []
    for claimer in ("first", "second"):
        forged_child(api_client, namespace, claimer, owner, 256)
        record = wait_until(lambda c=claimer: agent_pod_record(api_client, namespace, c), claimer, operator)
        got.append(record)
        assert record["uid"] not in (execd[0], labelled[0]), f"{claimer} got a touched pod: {record}"
    assert honest[0] in [record["uid"] for record in got], "the control: the untouched pool pod is claimed"
    # The exec'd pod was found out by its claimer (and deleted), the labelled one by the pool.
    after = operator.metrics().get('episode_operator_warm_pool_claims_total{result="stale"}', 0)
    assert after >= before + 1
    gone = {execd[1], labelled[1]}
    wait_until(
        lambda: not gone & {pod.metadata.name for pod in pool_pods(core, namespace, name)},
        "the touched pods leave the pool",
        operator,
    )
    for claimer in ("first", "second"):
        status = wait_until(lambda c=claimer: finished(api_client, namespace, c), claimer, operator)
        assert status.get("reward") == 1.0, status


# --- an agent whose model calls go through the capture proxy ------------------------------------------
MODEL_KEY = "sk-warm-pool-7e57"
MODEL_ANSWER = "the pooled proxy's answer"
# One chat call through the pod's capture proxy; the reward is whether the scripted model's answer came back.
MODEL_AGENT = (
    "python3 - <<'EOF'\n"
    "import json, os, urllib.request\n"
    'body = json.dumps({"model": os.environ["EPISODE_MODEL"], "messages": [{"role": "user", "content": "hi"}]})\n'
    'headers = {"content-type": "application/json", "authorization": "Bearer " + os.environ["EPISODE_MODEL_API_KEY"]}\n'
    'url = os.environ["EPISODE_MODEL_BASE_URL"] + "/chat/completions"\n'
    "request = urllib.request.Request(url, body.encode(), headers)\n"
    'answer = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]\n'
    f'open("/app/earned.txt", "w").write("1\\n" if {MODEL_ANSWER!r} in answer else "0\\n")\n'
    "EOF\n"
)


def test_a_model_agents_pool_runs_its_proxy_and_a_childs_calls_through_it_are_its_own(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    sandbox_image: str,
) -> None:
    """A pool for an agent with a model endpoint: its pods carry the capture proxy an attempt's pod would carry
    (pinned to the same upstream, the same key's Secret), so a child claims one; its one call is captured as
    its own and reaches the model with the key. Before the key's Secret exists the pool makes no pod and says
    why (a pod that could never start would only hold the quota)."""
    name = "modelled"
    endpoint = {"name": "m", "baseURL": f"http://scripted-model:{PORT}/v1", "apiKeySecretRef": {"name": "model-key"}}
    spec = {**set_spec(1, 1, 1, suspend=True), "agent": {"kind": "command", "command": MODEL_AGENT, "model": endpoint}}
    script = {"rules": [{"name": "any", "steps": [{"say": MODEL_ANSWER}]}]}
    model = deploy_scripted_model(core, namespace, script, sandbox_image)
    create_set(api_client, namespace, name, spec)
    message = wait_until(
        lambda: (set_status(api_client, namespace, name).get("warmPool") or {}).get("message"),
        "the pool says why it makes no pod",
        operator,
    )
    assert f"secret {namespace}/model-key not found" in message, message
    assert pool_pods(core, namespace, name) == []

    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="model-key"), string_data={"api-key": MODEL_KEY})
    )
    pool = wait_until(lambda: ready_pool(core, api_client, namespace, name, 1), "the pool of 1 is ready", operator)
    [pod_name] = pool.values()
    containers = [c.name for c in core.read_namespaced_pod(pod_name, namespace).spec.containers]
    assert "capture" in containers, containers
    assert model.model_requests() == [], "nothing called the model before a child claimed the pod"

    custom(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, SETS, name, {"spec": {"suspend": False}}
    )
    child = f"{name}-0-1"
    record = wait_until(lambda: agent_pod_record(api_client, namespace, child), "the child's agent pod", operator)
    status = wait_until(lambda: finished(api_client, namespace, child), "the child finishes", operator, 300)
    assert record is not None and record["uid"] in pool, f"the child made a fresh pod {record} instead of {pool}"
    assert status.get("reward") == 1.0, status
    uid = read_episode(api_client, namespace, child)["metadata"]["uid"]
    calls = (operator.data_dir / namespace / child / uid / "attempt-1" / "task" / "model-calls.jsonl").read_text()
    captured = [json.loads(line) for line in calls.splitlines() if line and not line.startswith('{"begun"')]
    assert [call["response_source"] for call in captured if call.get("dialect")] == ["upstream"]
    [received] = model.model_requests()
    assert received["api_key"] == MODEL_KEY
