"""Dockerfile tasks through real Episodes, with the operator's mirrors and builds, and pods that wait.

The operator here runs as a user would configure it for a cluster that cannot reach Docker Hub:
``--image-mirror`` maps the public base images to the project's sandbox image (``ubuntu:24.04`` to
its copy in the cluster's registry, which in-cluster builds pull from; ``python:3.12`` to the image
the node already has), and ``--build-registry`` is the registry of ``hack/cluster``, where buildah
Jobs push. Each test has an operator of its own, watching the test's namespace. The tests cover the issue's cases
"tried as a new user would", mirrors wherever an image is named, builds shared and cached, bad
Dockerfiles refused at admission, and pods that cannot be scheduled saying why.
"""

from __future__ import annotations

import contextlib
import datetime
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from episode_operator.api.episodeset_resource import SET_PLURAL as SETS
from episode_operator.api.vocabulary import BUILD_LABEL, PODS_READY
from tests.cluster.conftest import (
    SANDBOX_IMAGE,
    delete_namespace_while_watched,
    namespace_name,
    namespace_prefix,
    wait_for_default_service_account,
    why_pods_stay,
)
from tests.cluster.harness import (
    GROUP,
    PLURAL,
    SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
    TASKS,
    VERSION,
    OperatorProcess,
    create_episode,
    episode_spec,
    folder_files,
    install_crd,
    read_episode,
    wait_for_episode,
)

REGISTRY = "198.18.255.1:5000"
NOTHING_LISTENS = "198.18.255.1:5999"
REGISTRY_SANDBOX = f"{REGISTRY}/episode-operator/sandbox:bookworm"
BUILDER = "episode-operator.local/builder:bookworm"
MIRRORS = (f"--image-mirror=ubuntu:24.04={REGISTRY_SANDBOX}", f"--image-mirror=python:3.12={SANDBOX_IMAGE}")
KUBECTL_EPISODE = str(Path(sys.executable).parent / "kubectl-episode")
SET_LABEL = "episode-operator.dev/set"


def make_namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"episode-operator.dev/test": "true"}))
    )
    wait_for_default_service_account(core, name)
    return name


@pytest.fixture(scope="module")
def build_namespace(core: client.CoreV1Api) -> Iterator[str]:
    """Where the build Jobs run (their pods are privileged: a namespace of their own)."""
    name = make_namespace(core, f"img-{namespace_prefix()}builds-{uuid.uuid4().hex[:6]}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def operator_with(
    kubeconfig: Path,
    root: Path,
    namespace: str,
    *extra: str,
    cpu_request_fraction: float | None = SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
) -> OperatorProcess:
    root.mkdir(parents=True, exist_ok=True)
    return OperatorProcess(
        kubeconfig,
        root / "data",
        root / "operator.log",
        namespace,
        extra_args=(*MIRRORS, *extra),
        cpu_request_fraction=cpu_request_fraction,
    )


@pytest.fixture
def image_namespace(core: client.CoreV1Api, api_client: client.ApiClient, request: pytest.FixtureRequest) -> str:
    install_crd(api_client)
    return make_namespace(core, f"img-{namespace_name(request.node.name.removeprefix('test_'))}")


@contextlib.contextmanager
def building_operator(
    kubeconfig: Path,
    core: client.CoreV1Api,
    namespace: str,
    build_namespace: str,
    root: Path,
    cpu_request_fraction: float | None,
) -> Iterator[OperatorProcess]:
    """An operator of ``namespace`` alone, named (no namespace glob to resolve): a cluster whose
    namespaces churn (other sessions' benchmarks) cannot delay its seeing the test's namespace."""
    operator = operator_with(
        kubeconfig,
        root,
        namespace,
        f"--build-registry={REGISTRY}",
        "--build-registry-insecure",
        f"--build-namespace={build_namespace}",
        f"--builder-image={BUILDER}",
        cpu_request_fraction=cpu_request_fraction,
    )
    operator.start()
    try:
        yield operator
    finally:
        delete_namespace_while_watched(core, namespace)
        operator.stop()


@pytest.fixture
def image_operator(
    kubeconfig: Path, core: client.CoreV1Api, image_namespace: str, build_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The test namespace's operator, its sandbox pods sized to fit beside the other workers'."""
    with building_operator(
        kubeconfig, core, image_namespace, build_namespace, tmp_path / "operator", SIDE_BY_SIDE_CPU_REQUEST_FRACTION
    ) as operator:
        yield operator


@pytest.fixture
def capacity_operator(
    kubeconfig: Path, core: client.CoreV1Api, image_namespace: str, build_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The test namespace's operator with the operator's default requests (= limits): for tests of capacity."""
    with building_operator(kubeconfig, core, image_namespace, build_namespace, tmp_path / "operator", None) as operator:
        yield operator


def cpu_holders(core: client.CoreV1Api, namespace: str) -> list[tuple[str, str]]:
    """Pods outside ``namespace`` that are placed and request CPU: what a test needing the whole node waits for."""
    holders = []
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.metadata.namespace == namespace or pod.status.phase in ("Succeeded", "Failed") or not pod.spec.node_name:
            continue
        requested = [(c.resources.requests or {}).get("cpu") for c in pod.spec.containers if c.resources]
        if any(requested):
            holders.append((pod.metadata.namespace, pod.metadata.name))
    return holders


# How long past its grace period a deleted pod of another test may stay before this test removes it.
STUCK_AFTER_SEC = 60


def stuck_in_teardown(core: client.CoreV1Api, holders: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Holders deleted more than STUCK_AFTER_SEC past their grace period: their containers are stopped
    and the kubelet cannot finish the sandbox's teardown (a CI run met `remove netns: unlinkat
    /var/run/netns/cni-…: device or resource busy` for 44 min), yet the scheduler counts their CPU."""
    stuck = []
    now = datetime.datetime.now(datetime.UTC)
    for namespace, name in holders:
        with contextlib.suppress(ApiException):
            pod = core.read_namespaced_pod(name, namespace)
            deleted = pod.metadata.deletion_timestamp
            grace = pod.metadata.deletion_grace_period_seconds or 0
            if deleted is not None and (now - deleted).total_seconds() > grace + STUCK_AFTER_SEC:
                stuck.append((namespace, name))
    return stuck


def wait_for_the_nodes_cpus(core: client.CoreV1Api, namespace: str, timeout: float = 180) -> None:
    """Wait until no other test's pod holds CPU on the node. One the kubelet cannot finish tearing down is
    removed from the API server (as `kubectl delete --force` would), said on stdout with what the node
    logged: this test is about the operator's capacity, not about the runtime's teardown."""
    deadline = time.monotonic() + timeout
    while holders := cpu_holders(core, namespace):
        for stuck in stuck_in_teardown(core, holders):
            print(f"removing a pod stuck in teardown:\n{why_pods_stay(core, [stuck])}")
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(stuck[1], stuck[0], grace_period_seconds=0)
        assert time.monotonic() < deadline, (
            f"pods other tests left hold the node's CPUs:\n{why_pods_stay(core, holders)}"
        )
        time.sleep(1)


class PodWatch:
    """Every pod of a namespace as the API server saw it (its images, its status), from before the test acts."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        listed = core.list_namespaced_pod(namespace)
        self.resource_version = listed.metadata.resource_version
        self.images: dict[str, dict[str, str]] = {}  # pod → container → image
        self.cpu: dict[str, dict[str, tuple[str | None, str | None]]] = {}  # pod → container → (request, limit)
        self.roles: dict[str, str] = {}
        self.phases: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    resource_version=self.resource_version,
                    timeout_seconds=5,
                ):
                    pod = event["object"]
                    self.resource_version = pod.metadata.resource_version
                    name = pod.metadata.name
                    self.images[name] = {c.name: c.image for c in pod.spec.containers}
                    self.cpu[name] = {
                        c.name: ((c.resources.requests or {}).get("cpu"), (c.resources.limits or {}).get("cpu"))
                        for c in pod.spec.containers
                    }
                    self.roles[name] = (pod.metadata.labels or {}).get("episode-operator.dev/role", "")
                    self.phases.setdefault(name, set()).add(pod.status.phase or "")
            except (ApiException, urllib3.exceptions.HTTPError):
                self.resource_version = self.core.list_namespaced_pod(self.namespace).metadata.resource_version

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def of(self, episode: str, role: str) -> list[dict[str, str]]:
        return [images for pod, images in self.images.items() if pod.startswith(episode) and self.roles[pod] == role]


def kubectl_episode(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL_EPISODE, *args, "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=900
    )


def episode_events(core: client.CoreV1Api, namespace: str, episode: str) -> list[tuple[str, str]]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={episode}").items
    return [(event.reason, event.message) for event in events]


def wait_all(
    api: client.ApiClient, namespace: str, names: list[str], operator: OperatorProcess, timeout: float = 900
) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    return {
        name: wait_for_episode(api, namespace, name, operator, max(deadline - time.monotonic(), 1)) for name in names
    }


# --- the cases, tried as a new user would ------------------------------------------------------
MIRRORED_TASK = {
    "task.toml": """schema_version = "1.4"
[agent]
timeout_sec = 60.0
[verifier]
environment_mode = "separate"
[verifier.environment]
docker_image = "ubuntu:24.04"
[environment]
docker_image = "python:3.12"
""",
    "environment/docker-compose.yaml": """services:
  cache:
    image: python:3.12
    command: ["python3", "-m", "http.server", "8081", "--bind", "127.0.0.1"]
""",
    "instruction.md": "Write ok to /logs/artifacts/ok.txt.\n",
    "solution/solve.sh": "#!/bin/bash\nmkdir -p /logs/artifacts && echo ok > /logs/artifacts/ok.txt\n",
    "tests/test.sh": "#!/bin/bash\ngrep -qx ok /logs/artifacts/ok.txt && echo 1 > /logs/verifier/reward.txt "
    "|| echo 0 > /logs/verifier/reward.txt\n",
}


def test_dockerfile_tasks_run_as_a_new_user_would_with_every_image_mirrored(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    image_namespace: str,
    image_operator: OperatorProcess,
    kubeconfig: Path,
) -> None:
    """The issue's five cases, as Episodes with no spec.image: each passes; every image named is mirrored.

    dockerfile-only: a user made by RUN is [agent].user (1), the ENTRYPOINT's service is what the
    health check waits for (3) and the ENTRYPOINT exports [environment.env] to a file test.sh reads
    (4); WORKDIR is where the agent and test.sh work, COPY placed the files. workdir-steps: a two-step
    task whose Dockerfile only says WORKDIR /app (2), its second verifier in a fresh pod that replays
    it too. built-sidecar: a compose sidecar with build: (5), built in the cluster.
    """
    namespace = image_namespace
    pods = PodWatch(core, namespace)
    names = {
        "dockerfile-only": episode_spec(TASKS / "dockerfile-only"),
        "workdir-steps": episode_spec(TASKS / "workdir-steps"),
        "built-sidecar": episode_spec(TASKS / "built-sidecar"),
        "mirrored": episode_spec(files=MIRRORED_TASK),
    }
    for name, spec in names.items():
        create_episode(api_client, namespace, name, spec)
    statuses = wait_all(api_client, namespace, list(names), image_operator)
    pods.stop()
    for name, status in statuses.items():
        assert (status["phase"], status.get("outcome"), status.get("reward")) == ("Succeeded", "Graded", 1.0), (
            name,
            status,
        )
    seeded = statuses["dockerfile-only"]["attempts"][0]
    assert seeded["seedStage"] == "agent-setup" and seeded["readyAt"]

    # Every image named went through the mirrors: FROM lines (replayed, and built), the task's
    # docker_image, a sidecar's image and a verifier environment's.
    assert pods.of("dockerfile-only", "agent")[0]["main"] == REGISTRY_SANDBOX
    assert pods.of("workdir-steps-a1-v2", "verifier")[0]["main"] == REGISTRY_SANDBOX
    (built,) = pods.of("built-sidecar", "agent")
    # A built image is named by the digest its push wrote, never by the tag (the tag can be pushed over).
    assert built["api"].startswith(f"{REGISTRY}/episode-operator/builds@sha256:"), built
    (mirrored,) = pods.of("mirrored", "agent")
    assert (mirrored["main"], mirrored["cache"]) == (SANDBOX_IMAGE, SANDBOX_IMAGE)
    assert pods.of("mirrored-a1-v1", "verifier")[0]["main"] == REGISTRY_SANDBOX

    # The replay's output is kept and shown like a turn's logs.
    data_dir = str(image_operator.data_dir)
    logs = kubectl_episode(kubeconfig, "logs", "dockerfile-only", "-n", namespace, "--data-dir", data_dir)
    assert logs.returncode == 0, logs.stderr
    assert "==> attempt 1 turn seed: replay <==" in logs.stdout
    assert "==> environment/Dockerfile:2: RUN useradd --create-home --uid 1234 agent" in logs.stdout
    assert "[exited with 0]" in logs.stdout
    verifier = kubectl_episode(kubeconfig, "logs", "workdir-steps", "-n", namespace, "--data-dir", data_dir)
    assert "turn 02-append: verifier-replay <==\n==> environment/Dockerfile:2: WORKDIR /app" in verifier.stdout
    sidecar = kubectl_episode(kubeconfig, "logs", "built-sidecar", "-n", namespace, "--data-dir", data_dir)
    assert "turn seed: build-sidecar_api <==" in sidecar.stdout
    assert any(reason == "ImageBuilt" for reason, _ in episode_events(core, namespace, "built-sidecar"))


# --- builds ---------------------------------------------------------------------------------------------
def multi_stage_task(marker: str, *, failing: bool = False) -> dict[str, str]:
    """A task replay cannot apply (a multi-stage build): only an in-cluster build makes its image."""
    run = f"echo {marker}-broken >&2; exit 3" if failing else f"echo {marker} > /out"
    return {
        "task.toml": 'schema_version = "1.4"\n[agent]\ntimeout_sec = 60.0\n',
        "environment/Dockerfile": f"FROM ubuntu:24.04 AS build\nRUN {run}\nFROM ubuntu:24.04\n"
        "COPY --from=build /out /built.txt\n",
        "instruction.md": "Copy /built.txt to /tmp/answer.txt.\n",
        "solution/solve.sh": "#!/bin/bash\ncp /built.txt /tmp/answer.txt\n",
        "tests/test.sh": f"#!/bin/bash\ngrep -qx {marker} /tmp/answer.txt && echo 1 > /logs/verifier/reward.txt "
        "|| echo 0 > /logs/verifier/reward.txt\n",
    }


def build_jobs(api: client.ApiClient, namespace: str) -> list[str]:
    jobs = client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=BUILD_LABEL)
    return sorted(job.metadata.name for job in jobs.items)


def test_a_dataset_builds_its_image_once_and_concurrent_episodes_share_the_build(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    image_namespace: str,
    image_operator: OperatorProcess,
    build_namespace: str,
) -> None:
    namespace = image_namespace
    before = build_jobs(api_client, build_namespace)
    task = {"name": "multi-stage", "inline": {"files": multi_stage_task(namespace)}}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EpisodeSet",
        "metadata": {"name": "builds"},
        "spec": {"dataset": {"tasks": [task]}, "agent": {"kind": "oracle"}, "attempts": 3, "parallelism": 3},
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, body)
    children = [f"builds-0-{attempt}" for attempt in (1, 2, 3)]
    deadline = time.monotonic() + 120
    while not all(episode_exists(api_client, namespace, child) for child in children):
        assert time.monotonic() < deadline, f"children not created:\n{image_operator.log_tail()}"
        time.sleep(0.5)
    statuses = wait_all(api_client, namespace, children, image_operator)
    assert [status["reward"] for status in statuses.values()] == [1.0, 1.0, 1.0], statuses
    new = sorted(set(build_jobs(api_client, build_namespace)) - set(before))
    assert len(new) == 1, new  # three Episodes at once, one build
    # A later Episode of the same task finds the build: no new Job, the image reused.
    later = wait_all_created(
        api_client, namespace, "later", episode_spec(files=multi_stage_task(namespace)), image_operator
    )
    assert later["reward"] == 1.0
    assert sorted(set(build_jobs(api_client, build_namespace)) - set(before)) == new
    assert any(reason == "ImageReused" for reason, _ in episode_events(core, namespace, "later"))


def episode_exists(api: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        read_episode(api, namespace, name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def wait_all_created(
    api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any], operator: OperatorProcess
) -> dict[str, Any]:
    create_episode(api, namespace, name, spec)
    return wait_for_episode(api, namespace, name, operator, timeout=600)


def test_a_failing_build_is_terminal_and_its_log_kept(
    api_client: client.ApiClient, image_namespace: str, image_operator: OperatorProcess, kubeconfig: Path
) -> None:
    namespace = image_namespace
    status = wait_all_created(
        api_client, namespace, "broken", episode_spec(files=multi_stage_task(namespace, failing=True)), image_operator
    )
    assert (status["phase"], status["outcome"], status["failureKind"], status["attempt"]) == (
        "Failed",
        "TerminalFailure",
        "environment:build_failed",
        1,
    ), status
    assert status["message"].startswith("environment/Dockerfile: build build-")
    assert "the Dockerfile failed to build" in status["message"]
    # As the README's troubleshooting says: kubectl episode logs NAME --turn seed.
    logs = kubectl_episode(
        kubeconfig, "logs", "broken", "--turn", "seed", "-n", namespace, "--data-dir", str(image_operator.data_dir)
    )
    assert logs.returncode == 0, logs.stderr
    assert "turn seed: build-environment <==" in logs.stdout and f"{namespace}-broken" in logs.stdout


# --- bad Dockerfiles -------------------------------------------------------------------------------------
def test_bad_dockerfiles_are_refused_at_admission_naming_the_line(
    api_client: client.ApiClient,
    image_namespace: str,
    image_operator: OperatorProcess,
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """Packed and run with kubectl episode as a user does; each refused before any pod, naming the line."""
    namespace = image_namespace
    hello = folder_files(TASKS / "dockerfile-only")
    bad: dict[str, bytes] = {
        "syntax-error": b"FROM ubuntu:24.04\nRUN <<EOF\necho never closed\n",
        "escapes-the-context": b"FROM ubuntu:24.04\nCOPY ../../etc/passwd /etc/passwd\n",
        "binary-garbage": bytes(range(256)) * 64,
        "ten-megabytes": b"FROM ubuntu:24.04\n" + b"RUN echo a line of a very long Dockerfile\n" * 250_000,
    }
    for name, dockerfile in bad.items():
        folder = tmp_path / name
        for path, text in hello.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
        (folder / "environment" / "Dockerfile").write_bytes(dockerfile)
        created = kubectl_episode(kubeconfig, "run", str(folder), "--name", name, "-n", namespace)
        assert created.returncode == 0, created.stderr
    expected = {
        "syntax-error": "environment/Dockerfile:2: syntax error: unterminated heredoc",
        "escapes-the-context": "environment/Dockerfile:2: COPY ../../etc/passwd /etc/passwd: ../../etc/passwd "
        "leaves the build context environment/",
        "binary-garbage": "environment/Dockerfile:1: contains a NUL byte: this is not a Dockerfile",
        "ten-megabytes": "environment/Dockerfile: 10500018 bytes: a replayed Dockerfile may hold at most 262144 bytes",
    }
    for name, message in expected.items():
        status = wait_for_episode(api_client, namespace, name, image_operator)
        assert (status["phase"], status["outcome"], status["failureKind"]) == (
            "Failed",
            "TerminalFailure",
            "harbor:seed_refused",
        ), status
        assert status["message"].startswith(f"refused at seed: {message}"), status["message"]
        assert "podName" not in status


# --- pods that wait ----------------------------------------------------------------------------------------
STALL_TASK = {
    "task.toml": """schema_version = "1.4"
[agent]
timeout_sec = 120.0
[verifier]
environment_mode = "separate"
timeout_sec = 60.0
[environment]
docker_image = "episode-operator.local/sandbox:bookworm"
workdir = "/app"
cpus = 1

[[steps]]
name = "one"
artifacts = ["/app/one.txt"]

[[steps]]
name = "two"
artifacts = ["/app/two.txt"]
""",
    "steps/one/instruction.md": "Write one.\n",
    "steps/one/solution/solve.sh": "#!/bin/bash\necho one > /app/one.txt\n",
    "steps/two/instruction.md": "Write two.\n",
    "steps/two/solution/solve.sh": "#!/bin/bash\necho two > /app/two.txt\n",
    "tests/test.sh": "#!/bin/bash\nls /app/*.txt > /dev/null && echo 1 > /logs/verifier/reward.txt "
    "|| echo 0 > /logs/verifier/reward.txt\n",
}


@pytest.mark.exclusive("its agent pods request the node's every CPU: any other pod would hold what they wait for")
def test_six_two_step_separate_verifier_tasks_on_two_cpus_all_finish_and_say_why_they_wait(
    api_client: client.ApiClient, core: client.CoreV1Api, image_namespace: str, capacity_operator: OperatorProcess
) -> None:
    """The issue's stall: each agent pod holds 2 CPUs (its own and its turn-1 verifier's), so the
    Episodes run one at a time and never deadlock; the others' pods are Pending, and their
    Episodes say why while they are. The operator's default requests (= limits): a request of a
    fraction would let them all run at once."""
    namespace = image_namespace
    # The node's every CPU is what the agent pods wait for: a pod another test left (one still
    # terminating, a release's operator) would hold them Pending for the whole timeout.
    wait_for_the_nodes_cpus(core, namespace)
    pods = PodWatch(core, namespace)
    tasks = [{"name": f"stall-{index}", "inline": {"files": STALL_TASK}} for index in range(6)]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EpisodeSet",
        "metadata": {"name": "stall"},
        "spec": {"dataset": {"tasks": tasks}, "agent": {"kind": "oracle"}, "parallelism": 6},
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, body)
    children = [f"stall-{index}-1" for index in range(6)]
    seen: dict[str, set[tuple[str, str]]] = {name: set() for name in children}  # (reason, message) while Pending

    def record() -> bool:
        listed = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, label_selector=f"{SET_LABEL}=stall"
        )["items"]
        done = 0
        for item in listed:
            status = item.get("status") or {}
            done += status.get("phase") in ("Succeeded", "Failed")
            for condition in status.get("conditions") or []:
                if condition["type"] == PODS_READY and condition["status"] == "False":
                    seen[item["metadata"]["name"]].add((condition["reason"], condition["message"]))
        return done == len(children)

    poll_until(record, "the six Episodes finished", capacity_operator, timeout=1500)
    pods.stop()
    statuses = {name: read_episode(api_client, namespace, name)["status"] for name in children}
    assert all(status["reward"] == 1.0 for status in statuses.values()), statuses
    assert "Pending" in {phase for phases in pods.phases.values() for phase in phases}
    waited = [name for name, reasons in seen.items() if reasons]
    assert len(waited) >= 5, seen  # all but the first to get its pod waited, and said why
    for name in waited:
        assert any(reason == "Unschedulable" and "Insufficient cpu" in message for reason, message in seen[name]), seen[
            name
        ]
        events = [message for reason, message in episode_events(core, namespace, name) if reason == "PodWaiting"]
        assert any("Insufficient cpu" in message for message in events), events
        assert len(events) == len(set(events)), events  # one Event per pod and reason, not one per poll
    # The rule: each agent pod reserved its turn-1 verifier's CPU, and that verifier ran on its node.
    for name in children:
        (agent,) = [images for pod, images in pods.images.items() if pod == f"{name}-a1"]
        assert "verifier-reservation" in agent
        # Whole CPUs asked for, as the task limits them: what made the node hold one Episode at a time.
        assert pods.cpu[f"{name}-a1"] == {"main": ("1", "1"), "verifier-reservation": ("1", "1")}, pods.cpu


def poll_until(predicate: Callable[[], bool], what: str, operator: OperatorProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}\noperator log:\n{operator.log_tail()}"
        time.sleep(0.5)


def test_an_unschedulable_pod_and_a_registry_down_end_as_clear_outages(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    kubeconfig: Path,
    build_namespace: str,
    tmp_path: Path,
) -> None:
    """Its own operator: unschedulable pods are given 15 s, and its build registry does not listen."""
    install_crd(api_client)
    namespace = make_namespace(core, f"img-{namespace_prefix()}bad-{uuid.uuid4().hex[:6]}")
    operator = operator_with(
        kubeconfig,
        tmp_path,
        namespace,
        "--unschedulable-timeout=15",
        f"--build-registry={NOTHING_LISTENS}",
        "--build-registry-insecure",
        f"--build-namespace={build_namespace}",
        f"--builder-image={BUILDER}",
        cpu_request_fraction=None,  # the scheduler's words about the CPUs the task asks for, in full
    )
    operator.start()
    try:
        huge = episode_spec(
            files={**MIRRORED_TASK, "task.toml": MIRRORED_TASK["task.toml"] + "cpus = 64\n"},
            retries={"outages": 0},
        )
        create_episode(api_client, namespace, "huge", huge)
        unreachable = episode_spec(files=multi_stage_task(namespace), retries={"outages": 0})
        create_episode(api_client, namespace, "unreachable", unreachable)
        waiting: list[dict[str, Any]] = []

        def huge_waits() -> bool:
            status = read_episode(api_client, namespace, "huge").get("status") or {}
            waiting.extend(c for c in status.get("conditions") or [] if c["type"] == PODS_READY)
            return status.get("phase") in ("Succeeded", "Failed")

        poll_until(huge_waits, "huge finished", operator, timeout=300)
        # While Pending it said why, from the scheduler's own words.
        assert any(
            (c["status"], c["reason"]) == ("False", "Unschedulable") and "Insufficient cpu" in c["message"]
            for c in waiting
        ), waiting
        status = read_episode(api_client, namespace, "huge")["status"]
        assert (status["outcome"], status["failureKind"]) == ("Ungraded", "outage:unschedulable"), status
        assert "could not be scheduled for 15 s: 0/1 nodes are available: 1 Insufficient cpu." in status["message"]
        down = wait_for_episode(api_client, namespace, "unreachable", operator, timeout=600)
        assert (down["outcome"], down["failureKind"]) == ("Ungraded", "outage:image_build"), down
        assert f"cannot push to {NOTHING_LISTENS}" in down["message"]
    finally:
        delete_namespace_while_watched(core, namespace)
        operator.stop()
