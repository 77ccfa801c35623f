"""Fixtures for the cluster tier: the project's real Kubernetes, a client and a namespace per test.

The cluster comes from `hack/cluster` (or any cluster named by KUBECONFIG_EPISODE). Outside CI
a missing cluster skips these tests and says which command to run; in CI (env CI non-empty) the
session brings the cluster up itself, and a cluster that is still unavailable fails the tests:
CI must never pass by skipping them.

How the tier runs side by side (docs/testing.md, "Workers"): each pytest-xdist worker has its own
operator and namespace prefix; a module whose tests share a module-scoped fixture is one
``xdist_group`` (``--dist loadgroup`` keeps it on one worker); a test marked ``exclusive`` runs in
the phase after the parallel one, alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from episode_operator.api.episodeset_resource import SET_PLURAL
from tests.cluster.harness import GROUP, PLURAL, VERSION, OperatorProcess, install_crd, running_operator

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
HACK_CLUSTER = REPO_ROOT / "hack" / "cluster"
# hack/cluster's state: its kubeconfig, PKI, logs (EPISODE_CLUSTER_DIR moves it, as it moves hack/cluster's).
CLUSTER_DIR = Path(os.environ.get("EPISODE_CLUSTER_DIR") or "/var/lib/episode-operator/cluster")
START_COMMAND = "sudo hack/cluster up && sudo hack/cluster images"

SANDBOX_IMAGE = "episode-operator.local/sandbox:bookworm"


# Marks a test that nothing may run beside: `@pytest.mark.exclusive("why")`. hack/test runs these after
# the parallel phase, in one process (`-m exclusive`); the parallel phase deselects them.
EXCLUSIVE = "exclusive"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{EXCLUSIVE}(why): nothing may run beside this cluster test (it restarts a shared daemon, needs the "
        "node's every CPU, or changes what is one per cluster); run alone, after the parallel phase",
    )


# The side-by-side phase's longest tests, longest first, as `module::function` (CI's --durations).
# pytest-xdist hands tests out in collection order, each worker a few ahead; one of these handed out
# last keeps its worker busy minutes after the others have finished (the longest-first rule).
LONGEST_FIRST = (
    "test_load.py::test_two_hundred_episodes_at_once",
    "test_agents.py::test_a_failing_endpoint_ends_each_episode_in_its_class_and_every_one_exports_as_a_gym_row",
    "test_fault_matrix.py::test_a_fault_in_every_stage_ends_with_the_fault_free_reward_or_an_outage",
    "test_episodeset.py::test_dataset_of_20_tasks_times_2_attempts_at_parallelism_4",
    "test_agents.py::test_a_harness_solves_two_turns_with_every_call_captured",
    "test_prepull.py::test_an_image_that_cannot_be_pulled_is_named_and_the_children_start_anyway",
    "test_gym_collector.py::test_gyms_collector_collects_through_the_operator_and_resumes_without_a_second_episode",
    "test_gitops.py::test_the_gitops_page_runs_as_printed",
)


def longest_first_rank(item: pytest.Item) -> int:
    """Where ``item`` comes in LONGEST_FIRST (its parameters aside); after all of them if not there."""
    name = f"{Path(item.path).name}::{item.name.split('[')[0]}"
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/cluster with `cluster` (this hook sees the whole session), and put
    the longest first (a stable sort: the rest keep their order, every worker collects the same)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cluster)
    items.sort(key=longest_first_rank)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """An `exclusive` test says why, and fails rather than run where other workers run beside it."""
    mark = item.get_closest_marker(EXCLUSIVE)
    if mark is None:
        return
    if len(mark.args) != 1 or not str(mark.args[0]).strip():
        pytest.fail(f"@pytest.mark.{EXCLUSIVE} takes one argument, the reason", pytrace=False)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        pytest.fail(
            f"{EXCLUSIVE} ({mark.args[0]}), but run beside {workers - 1} other worker(s): run the parallel phase "
            f"with -m 'not {EXCLUSIVE}' and this alone with -m {EXCLUSIVE}, as hack/test does",
            pytrace=False,
        )


def in_ci() -> bool:
    """CI (or hack/test, which has brought the cluster up): a missing cluster fails the tests."""
    return bool(os.environ.get("CI") or os.environ.get("EPISODE_CLUSTER_REQUIRED"))


def session_brings_the_cluster_up() -> bool:
    """CI running pytest itself. Under hack/test (EPISODE_CLUSTER_REQUIRED) the cluster is up and the
    images loaded before any session starts: its sessions (a worker each, then the exclusive phase)
    would only queue on hack/cluster's lock to find nothing to do."""
    return bool(os.environ.get("CI")) and not os.environ.get("EPISODE_CLUSTER_REQUIRED")


def unavailable(reason: str) -> NoReturn:
    """Fail in CI, skip elsewhere."""
    if in_ci():
        pytest.fail(f"test cluster unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"test cluster unavailable: {reason}; start it with `{START_COMMAND}`")


def hack_cluster(verb: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `hack/cluster <verb>`, capturing its output."""
    return subprocess.run([str(HACK_CLUSTER), verb], capture_output=True, text=True, timeout=timeout, check=False)


def last_line(text: str) -> str:
    """The last non-empty line of a command's output, for short messages."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@pytest.fixture(scope="session")
def kubeconfig() -> Path:
    """Path of the admin kubeconfig of a running cluster (brought up here in CI)."""
    explicit = os.environ.get("KUBECONFIG_EPISODE")
    if explicit:
        if not Path(explicit).is_file():
            unavailable(f"KUBECONFIG_EPISODE={explicit} is not a file")
        return Path(explicit)
    status = hack_cluster("status", timeout=60)
    if session_brings_the_cluster_up():
        # The session owns the cluster: `up` reuses a healthy one, `images` is a no-op when the
        # cached images are already loaded.
        for verb in ("up", "images") if status.returncode != 0 else ("images",):
            result = hack_cluster(verb, timeout=3600)
            if result.returncode != 0:
                unavailable(f"`hack/cluster {verb}` failed:\n{result.stderr[-4000:]}")
    elif status.returncode != 0:
        unavailable(last_line(status.stderr + status.stdout).removeprefix("hack/cluster status: error: "))
    return CLUSTER_DIR / "kubeconfig"


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    """A Kubernetes client for the test cluster, checked to answer."""
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as error:  # any failure to talk to it means "unavailable"
        api.close()
        unavailable(f"API server of {kubeconfig} does not answer: {error}")
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    """The core/v1 API of the test cluster."""
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The Debian test image `hack/cluster images` loads; pods must use imagePullPolicy: Never."""
    return SANDBOX_IMAGE


def namespace_prefix() -> str:
    """Prefix of this session's namespaces: ``t<checkout>-``, unless EPISODE_TEST_NAMESPACE_PREFIX says,
    and in a pytest-xdist worker that followed by the worker's id: ``t<checkout>-gw0-``.

    The session's operator watches ``<prefix>*``, so another checkout's test session sharing the
    cluster (a second worktree, a second CI job) never drives this session's Episodes, nor this
    one theirs: the default is derived from the checkout's path. Each worker is a session of its
    own, with its own operator: the worker's id keeps their namespaces apart too (a worker's
    ``t1a2b-gw1-*`` takes no namespace of ``gw10``'s). A session without workers (the exclusive
    phase after the parallel one) watches ``t<checkout>-*``, the workers' namespaces included:
    what they left being deleted (an Episode's finalizer needs an operator) it finishes off.
    """
    checkout = hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:4]
    prefix = os.environ.get("EPISODE_TEST_NAMESPACE_PREFIX", f"t{checkout}-")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{prefix}{worker}-" if worker else prefix


def namespace_name(test_name: str) -> str:
    """A fresh DNS-1123 namespace name that still says which test made it."""
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"{namespace_prefix()}{stem}-{uuid.uuid4().hex[:6]}"


def wait_for_default_service_account(core: client.CoreV1Api, namespace: str, timeout: float = 60) -> None:
    """Pods are refused until the controller-manager has created the namespace's default SA."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@pytest.fixture
def namespace(core: client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace for one test, deleted afterwards (the deletion is not awaited)."""
    name = namespace_name(request.node.name.removeprefix("test_"))
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"episode-operator.dev/test": "true"}))
    )
    try:
        wait_for_default_service_account(core, name)
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@contextlib.contextmanager
def unwatched_namespace(core: client.CoreV1Api, api_client: client.ApiClient, stem: str) -> Iterator[str]:
    """A new namespace ``<stem><random>`` outside the session operator's prefix, the CRDs installed:
    only what the test starts drives Episodes in it. Deleted afterwards (not awaited)."""
    install_crd(api_client)
    name = f"{stem}{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        wait_for_default_service_account(core, name)
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def quiet_namespace(core: client.CoreV1Api, api_client: client.ApiClient) -> Iterator[str]:
    """A namespace no operator of the session watches (``quiet-<prefix><random>``), for a test that
    drives the kube layer itself: the session's operator would take the pods of its suspended owner
    Episode away (a suspended Episode is held without pods), a race the test would lose now and then."""
    with unwatched_namespace(core, api_client, f"quiet-{namespace_prefix()}") as name:
        yield name


@pytest.fixture(scope="session")
def operator(
    kubeconfig: Path, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator as its own process, watching this session's namespaces, the CRD installed."""
    install_crd(api_client)
    root = tmp_path_factory.mktemp("operator")
    with running_operator(kubeconfig, root / "data", root / "operator.log", f"{namespace_prefix()}*") as process:
        yield process


def delete_namespace_while_watched(core: client.CoreV1Api, name: str, timeout: float = 120) -> None:
    """Delete a namespace and wait until its Episodes and EpisodeSets are gone, while their operator
    still runs.

    They carry kopf's finalizer: a namespace deleted after its operator stopped would stay Terminating
    for ever. The rest (pods, ConfigMaps) the namespace controller removes without an operator, retrying
    with a back-off, so waiting for the namespace itself cost a test over a minute (CI's --durations).
    """
    core.delete_namespace(name, propagation_policy="Background")
    custom = client.CustomObjectsApi(core.api_client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            left = [
                f"{plural}/{item['metadata']['name']}"
                for plural in (PLURAL, SET_PLURAL)
                for item in custom.list_namespaced_custom_object(GROUP, VERSION, name, plural)["items"]
            ]
        except ApiException as error:
            if error.status == 404:  # the namespace, or the CRD, is gone: nothing holds a finalizer
                return
            raise
        if not left:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {name}: still there after {timeout} s: {', '.join(left)}")
        time.sleep(0.5)


def why_pods_stay(core: client.CoreV1Api, pods: list[tuple[str, str]], lines: int = 25) -> str:
    """What the API server and the node say of pods that should be gone: for a failing test's message.

    A pod stuck terminating is the kubelet's or the runtime's story (a sandbox that does not stop, a
    network teardown that fails), told only in the node's logs; the CI output is all a failed run keeps.
    """
    report = []
    for namespace, name in pods:
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            report.append(f"{namespace}/{name}: {error.status} {error.reason}")
            continue
        statuses = [(c.name, c.state.to_dict() if c.state else None) for c in (pod.status.container_statuses or [])]
        report.append(
            f"{namespace}/{name}: phase {pod.status.phase}, deleted at {pod.metadata.deletion_timestamp}, "
            f"grace {pod.metadata.deletion_grace_period_seconds}, finalizers {pod.metadata.finalizers}, "
            f"containers {statuses}"
        )
        for log in ("kubelet.log", "containerd.log"):
            path = CLUSTER_DIR / "logs" / log
            if path.exists():
                mentions = [line for line in path.read_text(errors="replace").splitlines() if name in line]
                report.append(f"-- the last {lines} lines of {log} naming {name}:\n" + "\n".join(mentions[-lines:]))
    return "\n".join(report)
