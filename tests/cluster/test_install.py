"""The operator installed in the cluster: its image, the Helm chart and the kustomize install.

The image is the one `hack/cluster images` builds without Docker (the Dockerfile's image); the
chart is installed, upgraded and uninstalled with the real Helm library (helm-python-sdk), and
the operator runs the example tasks with exactly the chart's least-privilege RBAC.

Every install here watches only its own ``inst-*`` namespaces: the rest of the cluster tier runs
the operator as a local process watching ``t<checkout>-*``, and two operators must never drive one Episode.
The module's tests share one release (installed, upgraded, uninstalled in file order): one xdist group.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from episode_operator.api.vocabulary import is_terminal
from tests.chart import CHART, CRDS, INSTALL, hack_chart
from tests.cluster.conftest import (
    HACK_CLUSTER,
    in_ci,
    unavailable,
    wait_for_default_service_account,
    why_pods_stay,
)
from tests.cluster.harness import (
    EXAMPLES,
    OPERATOR_IMAGE,
    SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
    create_episode,
    episode_spec,
    install_crd,
    pack_examples,
    read_episode,
)
from tests.cluster.replicas import (
    agent_pod,
    agent_pod_uid,
    assert_counted_once,
    counting_task,
    duplicated_events,
    finished,
    status_of,
)

pytestmark = pytest.mark.xdist_group("test_install")

DATA_ROLE = "episode-operator-system-episode-operator-data-api"  # manifests/install's
RELEASE = "episode-operator"
SERVICE = "episode-operator"
GYM_DOC = Path(__file__).resolve().parents[2] / "docs" / "gym.md"


# Namespaces and the image ------------------------------------------------------------------------
def new_namespace(core: client.CoreV1Api, role: str) -> str:
    """A fresh ``inst-<role>-…`` namespace, labelled as a test's."""
    name = f"inst-{role}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"episode-operator.dev/test": "true"}))
    )
    wait_for_default_service_account(core, name)
    return name


def delete_namespace(core: client.CoreV1Api, name: str) -> None:
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture(scope="module")
def operator_image(kubeconfig: Path, api_client: client.ApiClient) -> str:
    """`hack/cluster images` builds the operator image (when its wheel changed) and loads it."""
    result = subprocess.run([str(HACK_CLUSTER), "images"], capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        if os.geteuid() != 0 and not in_ci():
            unavailable(f"`hack/cluster images` needs root here: {result.stderr.strip()[-300:]}")
        pytest.fail(f"`hack/cluster images` failed:\n{result.stderr[-4000:]}", pytrace=False)
    assert OPERATOR_IMAGE in result.stdout.split(), result.stdout
    install_crd(api_client)  # Helm installs crds/ only when the CRD is absent: make it this version's
    return OPERATOR_IMAGE


# The Helm release -----------------------------------------------------------------------------------
@dataclass
class Release:
    """One release of the chart, installed into ``namespace`` and watching ``watched``."""

    kubeconfig: Path
    namespace: str
    watched: str
    values: dict[str, Any] = field(default_factory=dict)
    installed: bool = False
    notes: str = ""

    def config(self) -> helm.Config:
        return helm.Config(kubeconfig_path=self.kubeconfig, namespace=self.namespace)

    def install(self) -> dict[str, Any]:
        with self.config() as config:
            release: dict[str, Any] = config.install(
                CHART, RELEASE, self.values, namespace=self.namespace, wait="watcher", timeout=240
            )
        self.installed = True
        return release

    def upgrade(self, values: dict[str, Any]) -> dict[str, Any]:
        self.values = values
        with self.config() as config:
            release: dict[str, Any] = config.upgrade(
                CHART, RELEASE, values, namespace=self.namespace, wait="watcher", timeout=240
            )
        return release

    def uninstall(self) -> None:
        with self.config() as config:
            config.uninstall(RELEASE, wait="watcher", timeout=120, ignore_not_found=True)
        self.installed = False


def release_values(watched: str, **extra: Any) -> dict[str, Any]:
    """The test cluster's images; no data API (one per cluster: tests/cluster/test_data_api.py has it);
    sandbox pods sized to fit beside the other workers' (harness.SIDE_BY_SIDE_CPU_REQUEST_FRACTION)."""
    return {
        **hack_chart.TEST_CLUSTER_VALUES,
        "dataApi": {"enabled": False},
        "watchNamespaces": [watched],
        "pullGrace": 30,
        "cpuRequestFraction": SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        **extra,
    }


@pytest.fixture(scope="module")
def release(kubeconfig: Path, core: client.CoreV1Api, operator_image: str) -> Iterator[Release]:
    """The chart installed into its own namespace, watching one other namespace."""
    operator_namespace, watched = new_namespace(core, "op"), new_namespace(core, "w")
    installed = Release(kubeconfig, operator_namespace, watched, release_values(watched))
    try:
        yield installed
    finally:
        installed.uninstall()
        delete_namespace(core, watched)
        delete_namespace(core, operator_namespace)


@pytest.fixture
def installed(release: Release) -> Release:
    """The release, installed (again, if a test before uninstalled it)."""
    if not release.installed:
        release.install()
    return release


# Helpers ---------------------------------------------------------------------------------------------
def operator_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={RELEASE}")
    return [pod for pod in pods.items if not pod.metadata.deletion_timestamp]


def operator_log(core: client.CoreV1Api, namespace: str) -> str:
    logs = []
    for pod in operator_pods(core, namespace):
        try:
            logs.append(core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=80))
        except ApiException as error:
            logs.append(f"(no log of {pod.metadata.name}: {error.reason})")
    return "\n".join(logs) or "(no operator pod)"


def run_examples(
    api: client.ApiClient, core: client.CoreV1Api, namespace: str, operator_namespace: str, *examples: str
) -> dict[str, dict[str, Any]]:
    """Episodes of examples/tasks/<example> (inline files, oracle agent), all at once: their final status."""
    names = {example: f"{example}-{uuid.uuid4().hex[:5]}" for example in examples}
    for example, name in names.items():
        create_episode(api, namespace, name, episode_spec(EXAMPLES / example))
    results: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 240
    while len(results) < len(names):
        for example, name in names.items():
            status = read_episode(api, namespace, name).get("status") or {}
            if is_terminal(status.get("phase")):
                results[example] = {"name": name, **status}
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"not finished in {namespace}: {sorted(set(names) - set(results))}\n"
                f"operator log:\n{operator_log(core, operator_namespace)}"
            )
        time.sleep(1)
    return results


def service_get(core: client.CoreV1Api, namespace: str, path: str) -> str:
    """GET a path of the operator's Service through the API server's proxy (as kubectl episode does)."""
    response = core.connect_get_namespaced_service_proxy_with_path(
        f"{SERVICE}:http", namespace, path.lstrip("/"), _preload_content=False
    )
    return str(response.data.decode())


def can(api: client.ApiClient, user: str, verb: str, resource: str, namespace: str = "", group: str = "") -> bool:
    """What the API server's authorizer answers for ``user`` (a SubjectAccessReview)."""
    resource, _, subresource = resource.partition("/")
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, subresource=subresource or None, namespace=namespace, group=group
            ),
        )
    )
    answer = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(answer.status.allowed)


# The chart -------------------------------------------------------------------------------------------
def test_the_operator_runs_as_installed_with_least_privilege(
    installed: Release, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    deployment = client.AppsV1Api(api_client).read_namespaced_deployment(RELEASE, installed.namespace)
    assert deployment.status.available_replicas == 1
    # Without a ReadWriteOnce volume it rolls, the new pod first: the replicas' claims make the overlap safe.
    assert (deployment.spec.strategy.type, deployment.spec.strategy.rolling_update.max_unavailable) == (
        "RollingUpdate",
        0,
    )
    (pod,) = operator_pods(core, installed.namespace)
    container = pod.spec.containers[0]
    assert container.image == OPERATOR_IMAGE
    assert (pod.spec.security_context.run_as_user, container.security_context.read_only_root_filesystem) == (
        65532,
        True,
    )
    assert pod.status.container_statuses[0].ready
    whoami = stream(
        core.connect_get_namespaced_pod_exec,
        pod.metadata.name,
        installed.namespace,
        command=["sh", "-c", "id -u; touch /probe 2>/dev/null && echo writable || echo read-only"],
        stderr=True,
        stdout=True,
        stdin=False,
        tty=False,
    )
    assert whoami.split() == ["65532", "read-only"]

    account = f"system:serviceaccount:{installed.namespace}:{RELEASE}"
    watched = installed.watched
    allowed = [
        ("create", "pods", watched, ""),
        ("create", "pods/exec", watched, ""),
        ("patch", "episodes/status", watched, "episode-operator.dev"),
        ("watch", "episodes", watched, "episode-operator.dev"),
        ("get", "secrets", watched, ""),  # that a model endpoint's key Secret exists (kube/rbac.py)
    ]
    denied = [
        ("create", "pods", installed.namespace, ""),  # its own namespace is not watched
        ("create", "pods", "default", ""),
        ("list", "episodes", "", "episode-operator.dev"),  # nothing cluster-wide with named namespaces
        ("list", "namespaces", "", ""),
        ("list", "customresourcedefinitions", "", "apiextensions.k8s.io"),
        ("list", "secrets", watched, ""),
        ("update", "pods", watched, ""),
        ("delete", "configmaps", watched, ""),
    ]
    assert [can(api_client, account, *check) for check in allowed] == [True] * len(allowed)
    assert [can(api_client, account, *check) for check in denied] == [False] * len(denied)


def test_the_examples_reach_their_rewards_in_cluster(
    installed: Release, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    results = run_examples(api_client, core, installed.watched, installed.namespace, "hello", "three-step-ledger")
    summary = {example: (status["phase"], status.get("reward")) for example, status in results.items()}
    assert summary == {"hello": ("Succeeded", 1.0), "three-step-ledger": ("Succeeded", 1.0)}, results
    assert results["three-step-ledger"]["progress"] == "3/3"

    # The Service serves /metrics, through the API server's proxy; the kept logs are not there.
    metrics = service_get(core, installed.namespace, "/metrics")
    graded = [
        line
        for line in metrics.splitlines()
        if line.startswith('episode_operator_episodes_total{failure_kind="",outcome="Graded"}')
    ]
    assert graded and float(graded[0].split()[-1]) >= 2, metrics[:2000]
    ledger = read_episode(api_client, installed.watched, results["three-step-ledger"]["name"])
    name = ledger["metadata"]["name"]
    path = f"/apis/data.episode-operator.dev/v1alpha1/namespaces/{installed.watched}/episodes/{name}/log"
    with pytest.raises(ApiException) as refused:
        service_get(core, installed.namespace, path)
    assert refused.value.status == 404

    # Exactly the chart's permissions were enough: nothing was refused.
    log = "\n".join(
        core.read_namespaced_pod_log(p.metadata.name, installed.namespace)
        for p in operator_pods(core, installed.namespace)
    )
    assert "forbidden" not in log.lower(), log[-4000:]


def test_an_upgrade_with_an_episode_running_hands_it_over_and_episodes_still_run(
    installed: Release, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    """``helm upgrade`` while a 6-step Episode runs: the Deployment's rolling update starts a new
    operator pod and stops the old one (SIGTERM), which hands the Episode over at a safe point. Each
    job ran once, on the sandbox pod it started on, each Event was posted once, the reward is right;
    and the new pod runs the examples.

    Every step's solve waits for a file the test writes into the sandbox once the old operator pod
    is gone: how long a rolling update takes (a pod scheduled, started, ready; the old one stopped)
    is the machine's, and an Episode that merely sleeps could end first (it did, in CI)."""
    apps = client.AppsV1Api(api_client)
    before = apps.read_namespaced_deployment(RELEASE, installed.namespace)
    (old_pod,) = operator_pods(core, installed.namespace)
    running = f"upgraded-{uuid.uuid4().hex[:5]}"
    released = "/app/upgraded"  # what the test writes once the upgrade is done
    gate = f"until [ -e {released} ]; do sleep 0.2; done"
    create_episode(api_client, installed.watched, running, episode_spec(files=counting_task(6, solve=gate)))
    deadline = time.monotonic() + 180
    while not (sandbox := agent_pod_uid(core, installed.watched, running)) or not status_of(
        api_client, installed.watched, running
    ).get("turns"):
        assert time.monotonic() < deadline, f"no turn began:\n{operator_log(core, installed.namespace)}"
        time.sleep(1)

    values = release_values(
        installed.watched, maxActiveEpisodes=1, logLevel="verbose", podLabels={"episode-operator.dev/upgraded": "yes"}
    )
    upgraded = installed.upgrade(values)
    assert upgraded["status"] == "deployed" and upgraded["revision"] >= 2, upgraded

    after = apps.read_namespaced_deployment(RELEASE, installed.namespace)
    assert after.metadata.generation > before.metadata.generation
    container = after.spec.template.spec.containers[0]
    assert "--max-active-episodes=1" in container.args
    assert {env.name: env.value for env in container.env}["EPISODE_OPERATOR_VERBOSE"] == "1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(installed.namespace, label_selector=f"app.kubernetes.io/name={RELEASE}").items
        if [p.metadata.labels.get("episode-operator.dev/upgraded") for p in pods] == ["yes"] and all(
            s.ready for s in pods[0].status.container_statuses or []
        ):
            break  # the old pod is gone, not only terminating
        time.sleep(1)
    (new_pod,) = operator_pods(core, installed.namespace)
    assert new_pod.metadata.name != old_pod.metadata.name
    assert new_pod.metadata.labels["episode-operator.dev/upgraded"] == "yes"
    # The old operator stopped with the Episode still running (its first job waits for the test):
    # the new one finishes it.
    assert not finished(api_client, installed.watched, running), status_of(api_client, installed.watched, running)
    agent = agent_pod(core, installed.watched, running)
    assert agent is not None and agent.metadata.uid == sandbox, agent
    stream(
        core.connect_get_namespaced_pod_exec, agent.metadata.name, installed.watched, container="main",
        command=["touch", released], stderr=True, stdout=True, stdin=False, tty=False,
    )  # fmt: skip

    deadline = time.monotonic() + 240
    while not finished(api_client, installed.watched, running):
        assert time.monotonic() < deadline, f"{running} not finished:\n{operator_log(core, installed.namespace)}"
        time.sleep(1)
    assert_counted_once(status_of(api_client, installed.watched, running), 6)
    assert agent_pod_uid(core, installed.watched, running) in (None, sandbox)
    assert duplicated_events(core, installed.watched, running) == []

    status = run_examples(api_client, core, installed.watched, installed.namespace, "hello")["hello"]
    assert (status["phase"], status.get("reward")) == ("Succeeded", 1.0), status


def gym_post(url: str, body: Any, token: str | None) -> tuple[int, Any]:
    """POST to the Gym server as Gym's collector does (``http://<scope>:<token>@host:port``)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"chart:{token}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=240) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def documented_gym_values() -> dict[str, Any]:
    """docs/gym.md's ``gym-values.yaml``, as printed."""
    text = GYM_DOC.read_text()
    block = text.split("<!-- BEGIN gym-values -->\n```yaml\n")[1].split("```\n<!-- END gym-values -->")[0]
    values: dict[str, Any] = yaml.safe_load(block)
    return values


def test_gym_enabled_serves_gyms_rollout_protocol_on_the_service(
    installed: Release, kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    """``gym.enabled`` as docs/gym.md prints it: the token from a Secret, the settings from the values,
    the Service's port ``gym``; a /run of the packed ``examples::hello`` reaches its reward, a request
    without the token is refused, and without a token Secret the chart refuses to render."""
    token = uuid.uuid4().hex
    core.create_namespaced_secret(
        installed.namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="gym-token"), string_data={"token": token}),
    )
    pack_examples(kubeconfig, installed.watched)
    gym = documented_gym_values()["gym"]
    gym["settings"]["namespace"] = installed.watched
    with pytest.raises(Exception, match=re.escape("gym.enabled needs gym.tokenSecret.name")):
        installed.upgrade(release_values(installed.watched, gym={**gym, "tokenSecret": {"name": ""}}))
    upgraded = installed.upgrade(release_values(installed.watched, gym=gym))
    assert upgraded["status"] == "deployed", upgraded
    service = core.read_namespaced_service(SERVICE, installed.namespace)
    (port,) = [port.port for port in service.spec.ports if port.name == "gym"]
    url = f"http://{service.spec.cluster_ip}:{port}/run"
    row = {"instance_id": "examples::hello", "responses_create_params": {"input": []}, "_ng_task_index": 0,
           "_ng_rollout_index": 0}  # fmt: skip
    # kube-proxy and the endpoints controller learn of the new port and the new pod after the rollout
    # Helm waited for: until they do, the address refuses connections. Wait for an answer, any answer.
    deadline = time.monotonic() + 120
    while True:
        try:
            refused = gym_post(url, row, token=None)
            break
        except urllib.error.URLError as error:
            if time.monotonic() > deadline:
                log = operator_log(core, installed.namespace)
                raise AssertionError(f"{url} never answered: {error}", log) from error
            time.sleep(0.5)
    assert refused[0] == 401, refused
    assert gym_post(url, row, token="not-" + token)[0] == 401
    status, answer = gym_post(url, row, token=token)
    assert status == 200 and answer["reward"] == 1.0, (answer, operator_log(core, installed.namespace))


def test_uninstall_leaves_nothing_but_the_crd(
    installed: Release, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    installed.uninstall()
    rbac, apps = client.RbacAuthorizationV1Api(api_client), client.AppsV1Api(api_client)
    selector = f"app.kubernetes.io/instance={RELEASE}"
    deadline = time.monotonic() + 90
    while True:
        left = {
            "deployments": [d.metadata.name for d in apps.list_namespaced_deployment(installed.namespace).items],
            # Pods are Helm's to delete and the kubelet's to end: one being deleted is Helm's work done.
            "pods": [
                p.metadata.name
                for p in core.list_namespaced_pod(installed.namespace).items
                if not p.metadata.deletion_timestamp
            ],
            "serviceaccounts": [
                a.metadata.name
                for a in core.list_namespaced_service_account(installed.namespace).items
                if a.metadata.name != "default"
            ],
            "services": [s.metadata.name for s in core.list_namespaced_service(installed.namespace).items],
            "configmaps+secrets": [
                o.metadata.name
                for o in core.list_namespaced_secret(installed.namespace, label_selector="owner=helm").items
                + core.list_namespaced_config_map(installed.namespace, label_selector="owner=helm").items
            ],
            "roles": [r.metadata.name for r in rbac.list_namespaced_role(installed.watched).items],
            "rolebindings": [r.metadata.name for r in rbac.list_namespaced_role_binding(installed.watched).items],
            "clusterroles": [
                r.metadata.name
                for r in rbac.list_cluster_role(label_selector=selector).items
                if r.metadata.name.startswith(installed.namespace)
            ],
            "clusterrolebindings": [
                r.metadata.name
                for r in rbac.list_cluster_role_binding(label_selector=selector).items
                if r.metadata.name.startswith(installed.namespace)
            ],
        }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert left == {kind: [] for kind in left}
    # A pod the kubelet does not end within the grace period and a minute more is the node's fault, not
    # the chart's (a cold CI run once kept the operator's pod terminating for minutes): say what the
    # node said, and force it out so that it holds no CPU the next tests need.
    while terminating := core.list_namespaced_pod(installed.namespace).items:
        if time.monotonic() > deadline + 60:
            stuck = [(installed.namespace, pod.metadata.name) for pod in terminating]
            warnings.warn(f"pods stay terminating after the uninstall:\n{why_pods_stay(core, stuck)}", stacklevel=1)
            for namespace, name in stuck:
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            break
        time.sleep(1)
    # Helm never deletes what crds/ installed: the CRD, and so every Episode, stays (README).
    extensions = client.ApiextensionsV1Api(api_client)
    assert extensions.read_custom_resource_definition("episodes.episode-operator.dev").metadata.name


# The kustomize install -------------------------------------------------------------------------------
def kubectl(kubeconfig: Path, *args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_kubectl_apply_k_installs_a_working_operator(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, operator_image: str, tmp_path: Path
) -> None:
    """manifests/install through an overlay: its own namespace and ClusterRole names, one watched
    namespace, and the CRDs left out (cluster-wide, shared with the other tests: deleting them
    would delete every Episode), and the data API's rules too (one data API per cluster: test_data_api.py's)."""
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed (hack/cluster up installs it): manifests/install cannot be checked")
    suffix = uuid.uuid4().hex[:6]
    operator_namespace, watched = f"inst-k-{suffix}", new_namespace(core, "kw")
    cluster_name = f"{operator_namespace}-episode-operator"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": operator_namespace,
        "resources": [os.path.relpath(INSTALL, overlay)],
        # The test cluster's image instead of the released one, as a mirror would be named.
        "images": [
            {
                "name": yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"],
                "newName": OPERATOR_IMAGE.split(":")[0],
                "newTag": OPERATOR_IMAGE.split(":")[1],
            }
        ],
        "patches": [
            *(
                {
                    "patch": yaml.safe_dump(
                        {
                            "$patch": "delete",
                            "apiVersion": "apiextensions.k8s.io/v1",
                            "kind": "CustomResourceDefinition",
                            "metadata": {"name": path.name.removesuffix(".yaml")},
                        }
                    )
                }
                for path in sorted(CRDS.glob("*.yaml"))
            ),
            *(
                {
                    "patch": yaml.safe_dump(
                        {
                            "$patch": "delete",
                            "apiVersion": "rbac.authorization.k8s.io/v1",
                            "kind": kind,
                            "metadata": {"name": DATA_ROLE},
                        }
                    )
                }
                for kind in ("ClusterRole", "ClusterRoleBinding")
            ),
            {
                "target": {"kind": "Deployment", "name": RELEASE},
                "patch": yaml.safe_dump(
                    [
                        {
                            "op": "add",
                            "path": "/spec/template/spec/containers/0/args/-",
                            "value": f"--namespace={watched}",
                        },
                        {
                            "op": "add",
                            "path": "/spec/template/spec/containers/0/args/-",
                            "value": f"--cpu-request-fraction={SIDE_BY_SIDE_CPU_REQUEST_FRACTION}",
                        },
                    ]
                ),
            },
            {
                "target": {"kind": "ClusterRole"},
                "patch": yaml.safe_dump([{"op": "replace", "path": "/metadata/name", "value": cluster_name}]),
            },
            {
                "target": {"kind": "ClusterRoleBinding"},
                "patch": yaml.safe_dump(
                    [
                        {"op": "replace", "path": "/metadata/name", "value": cluster_name},
                        {"op": "replace", "path": "/roleRef/name", "value": cluster_name},
                    ]
                ),
            },
        ],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    built = list(yaml.safe_load_all(kubectl(kubeconfig, "kustomize", str(overlay))))
    assert sorted(o["kind"] for o in built) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Namespace",
        "Role",  # the replicas' Leases, in the operator's namespace (kustomize's)
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    try:
        kubectl(kubeconfig, "apply", "-k", str(overlay))
        kubectl(kubeconfig, "-n", operator_namespace, "rollout", "status", f"deployment/{RELEASE}", "--timeout=180s")
        status = run_examples(api_client, core, watched, operator_namespace, "hello")["hello"]
        assert (status["phase"], status.get("reward")) == ("Succeeded", 1.0), status
    finally:
        kubectl(kubeconfig, "delete", "-k", str(overlay), "--ignore-not-found", "--wait=false")
        delete_namespace(core, watched)
    assert (
        not client.RbacAuthorizationV1Api(api_client)
        .list_cluster_role(field_selector=f"metadata.name={cluster_name}")
        .items
    )
