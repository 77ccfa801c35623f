"""The chart's data API on the real cluster, and the chart's NOTES run exactly as printed.

One release of the chart serves the data API (the APIService is one per cluster): it is installed
here into its own ``inst-data-…`` namespace, watching one other, and its NOTES' commands are run
as a user would paste them. Then the protection is checked from inside the cluster: a pod whose
service account has no rights reads nothing (401 from the operator's port, 403 from the API
server), while ``/metrics`` and kopf's health endpoint stay open; a user with the RBAC the README
gives gets the logs and artifacts with ``kubectl episode``, and one without it is refused.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.conftest import CLUSTER_DIR
from tests.cluster.harness import EXAMPLES, create_episode, episode_spec, folder_files, install_crd
from tests.cluster.test_episodeset import create_set, read_set, without_resources
from tests.cluster.test_install import (
    RELEASE,
    Release,
    delete_namespace,
    new_namespace,
    operator_log,
    release_values,
    run_examples,
)
from tests.cluster.test_kubectl_plugin import Plugin, read_until
from tests.cluster.test_replicas import POD_NETWORK_GATEWAY
from tests.ports import free_port
from tests.s3server import CREDENTIALS, s3_server
from tests.unit.chromium import load
from tests.unit.png import read_png
from tests.unit.test_results_page import Parsed, cells
from tests.unit.test_view_browser import OUTPUT

# The module's tests share one release of the data API (one per cluster): one xdist group.
pytestmark = pytest.mark.xdist_group("test_data_api")

API_SERVICE = "v1alpha1.data.episode-operator.dev"
DISCOVERY_PATH = "/apis/data.episode-operator.dev/v1alpha1"
DATA_PATH = DISCOVERY_PATH + "/namespaces/{namespace}/episodes/{name}/{subresource}"
KUBECTL_EPISODE = Path(sys.executable).parent / "kubectl-episode"
HACK_IMAGES = Path(__file__).resolve().parents[2] / "hack" / "images"


def wait_for_the_api_service_to_be_free(api: client.ApiClient, timeout: float = 300) -> None:
    """The data API is one per cluster: another operator serving it (another session's test, a
    quickstart left installed) must go first. It is named when it does not."""
    registration = client.ApiregistrationV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        try:
            current = registration.read_api_service(API_SERVICE)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        if time.monotonic() > deadline:
            owner = f"{current.spec.service.namespace}/{current.spec.service.name}"
            pytest.fail(f"apiservice {API_SERVICE} still sends to Service {owner} after {timeout:.0f} s", False)
        time.sleep(2)


def wait_for_the_api_service_to_be_available(api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    registration = client.ApiregistrationV1Api(api)
    deadline = time.monotonic() + 120
    while True:
        conditions = registration.read_api_service(API_SERVICE).status.conditions or []
        if any(c.type == "Available" and c.status == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{API_SERVICE} not Available: {conditions}\n"
                f"{who_answers_discovery(core, namespace)}\n{operator_log(core, namespace)}"
            )
        time.sleep(1)


def who_answers_discovery(core: client.CoreV1Api, namespace: str) -> str:
    """What answers the API server's availability check (``GET /apis/GROUP/VERSION`` with the front
    proxy's client certificate, the server's certificate not verified, as the API server asks it) at
    the Service's address and at each of its endpoints, with the certificate each presents: a check
    that fails says whether the operator, or something else at that address, refused it."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    pki = CLUSTER_DIR / "pki"  # hack/cluster's: the API server's front-proxy client certificate
    context.load_cert_chain(pki / "front-proxy-client.crt", pki / "front-proxy-client.key")
    service = core.read_namespaced_service(RELEASE, namespace)
    endpoints = core.read_namespaced_endpoints(RELEASE, namespace)
    port_name = "data-api"  # the chart's name of the data API's port, on the Service and its endpoints
    addresses = [(service.spec.cluster_ip, port.port) for port in service.spec.ports if port.name == port_name] + [
        (address.ip, port.port)
        for subset in endpoints.subsets or []
        for address in subset.addresses or []
        for port in subset.ports or []
        if port.name == port_name
    ]
    lines = [f"endpoints of Service {namespace}/{RELEASE}: {endpoints.subsets}"]
    for host, port in addresses:
        connection = http.client.HTTPSConnection(host, port, context=context, timeout=10)
        try:
            connection.request("GET", DISCOVERY_PATH, headers={"X-Remote-User": "system:kube-aggregator"})
            response = connection.getresponse()
            presented = connection.sock.getpeercert(binary_form=True) if connection.sock else None
            subject = x509.load_der_x509_certificate(presented).subject.rfc4514_string() if presented else "?"
            lines.append(f"{host}:{port} ({subject}): {response.status} {response.read()[:300]!r}")
        except OSError as error:
            lines.append(f"{host}:{port}: {error!r}")
        finally:
            connection.close()
    return "\n".join(lines)


@pytest.fixture(scope="module")
def released_images(api_client: client.ApiClient) -> dict[str, str]:
    """The release's operator and sandbox images, built here from their Dockerfiles with buildah (from a
    base made of Debian packages: no registry is reachable) and imported into the cluster's containerd."""
    names = {}
    for name in ("episode-operator", "sandbox"):
        result = subprocess.run(
            [str(HACK_IMAGES), "load", name], capture_output=True, text=True, timeout=3000, check=False
        )
        if result.returncode != 0:
            pytest.fail(f"`hack/images load {name}` failed:\n{result.stderr[-4000:]}", pytrace=False)
        names[name] = result.stdout.split()[-1]
    install_crd(api_client)  # Helm installs crds/ only when the CRD is absent: make it this version's
    return names


def image_values(reference: str) -> dict[str, str]:
    repository, _, tag = reference.rpartition(":")
    return {"repository": repository, "tag": tag}


@pytest.fixture(scope="module")
def data_release(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, released_images: dict[str, str]
) -> Iterator[Release]:
    """The chart with the data API, running the operator image the Dockerfile makes."""
    operator_namespace, watched = new_namespace(core, "data"), new_namespace(core, "dw")
    values = release_values(watched, dataApi={"enabled": True})
    values["image"] = image_values(released_images["episode-operator"]) | {"pullPolicy": "Never"}
    values["sandboxImage"] = image_values(released_images["sandbox"])
    installed = Release(kubeconfig, operator_namespace, watched, values)
    wait_for_the_api_service_to_be_free(api_client)
    try:
        installed.notes = installed.install()["notes"]
        wait_for_the_api_service_to_be_available(api_client, core, operator_namespace)
        yield installed
    finally:
        try:
            installed.uninstall()
        finally:  # a failed install or uninstall must not leave its namespaces behind
            delete_namespace(core, watched)
            delete_namespace(core, operator_namespace)


def commands_of(notes: str) -> list[str]:
    """The commands NOTES print: indented lines starting with kubectl, with their here-documents."""
    commands: list[str] = []
    lines = iter(notes.splitlines())
    for line in lines:
        if not line.startswith("  kubectl "):
            continue
        command = line.strip()
        if command.endswith("<<'EOF'"):
            body = []
            for follow in lines:
                body.append(follow)
                if follow == "EOF":
                    break
            command += "\n" + "\n".join(body)
        commands.append(command)
    return commands


def test_the_notes_commands_work_as_printed(data_release: Release, kubeconfig: Path) -> None:
    commands = commands_of(data_release.notes)
    assert [c.split()[:3] for c in commands] == [
        ["kubectl", "-n", data_release.namespace],  # rollout status
        ["kubectl", "-n", data_release.watched],  # apply the example
        ["kubectl", "-n", data_release.watched],  # wait for it
        ["kubectl", "-n", data_release.watched],  # get it
        ["kubectl", "get", "--raw"],  # its logs, through the API server
    ], data_release.notes
    outputs = []
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=420,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            check=False,
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    assert "Succeeded" in outputs[3], outputs[3]
    assert re.search(r"==> attempt 1 turn .*: agent <==", outputs[4]), outputs[4]


# Callers ------------------------------------------------------------------------------------------------
def service_account(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """A ServiceAccount and its token (a 1.20 API server puts one in a Secret for each account)."""
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        account = core.read_namespaced_service_account(name, namespace)
        for secret in account.secrets or []:
            token = core.read_namespaced_secret(secret.name, namespace).data.get("token")
            if token:
                return base64.b64decode(token).decode()
        time.sleep(0.5)
    raise TimeoutError(f"no token for serviceaccount {namespace}/{name}")


def kubeconfig_for(admin_kubeconfig: Path, token: str, path: Path) -> Path:
    """The admin kubeconfig's cluster, with the token's user."""
    config = yaml.safe_load(admin_kubeconfig.read_text())
    config["users"] = [{"name": "reader", "user": {"token": token}}]
    config["contexts"] = [{"name": "reader", "context": {"cluster": config["clusters"][0]["name"], "user": "reader"}}]
    config["current-context"] = "reader"
    path.write_text(yaml.safe_dump(config))
    return path


def grant(api: client.ApiClient, namespace: str, account: str, rules: list[dict[str, Any]]) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": account}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )


def readme_reader_rules() -> list[dict[str, Any]]:
    """The rules of the README's example Role for a `kubectl episode logs|artifacts` user."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL):
        document = yaml.safe_load(block)
        if isinstance(document, dict) and document.get("kind") == "Role":
            rules: list[dict[str, Any]] = document["rules"]
            return rules
    raise AssertionError("the README shows no Role for kubectl episode users")


READER_RULES = readme_reader_rules()


PROBE = """
import json, os, ssl, sys, urllib.error, urllib.request
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()
insecure = ssl._create_unverified_context()
def get(url, headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=insecure, timeout=20) as r:
            return [r.status, r.read().decode()[:60000]]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode()[:2000]]
    except Exception as error:
        return [-1, repr(error)]
targets = json.loads(sys.argv[1])
api = "https://%s:%s" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
targets = {name: [url.replace("https://API", api), forged_too] for name, (url, forged_too) in targets.items()}
bearer = {"Authorization": "Bearer " + token}
admin = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}
answers = {name: get(url, {**bearer, **admin} if forged else bearer) for name, (url, forged) in targets.items()}
print(json.dumps(answers))
"""


def run_probe(
    core: client.CoreV1Api, namespace: str, account: str, image: str, targets: dict[str, Any]
) -> dict[str, Any]:
    """Run PROBE in a pod of ``account`` and return what it printed."""
    name = f"probe-{account}"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": account,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "probe",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", PROBE, json.dumps(targets)],
                    }
                ],
            },
        },
    )
    deadline = time.monotonic() + 120
    while True:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"probe pod still {pod.status.phase}")
        time.sleep(0.5)
    log = core.read_namespaced_pod_log(name, namespace)
    assert pod.status.phase == "Succeeded", log
    result: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    return result


def test_a_pod_without_rights_reads_nothing_while_metrics_and_health_stay_open(
    data_release: Release, api_client: client.ApiClient, core: client.CoreV1Api, sandbox_image: str
) -> None:
    results = run_examples(api_client, core, data_release.watched, data_release.namespace, "hello")
    episode = results["hello"]["name"]
    path = DATA_PATH.format(namespace=data_release.watched, name=episode, subresource="log")
    service = core.read_namespaced_service("episode-operator", data_release.namespace)
    (operator_pod,) = core.list_namespaced_pod(
        data_release.namespace, label_selector="app.kubernetes.io/name=episode-operator"
    ).items
    service_account(core, data_release.watched, "nobody")
    targets = {
        # Straight to the operator's data API port, with a token and forged front-proxy headers.
        "direct": (f"https://{service.spec.cluster_ip}:443{path}", True),
        # Through the API server, as itself: RBAC says no.
        "api-server": (f"https://API{path}", False),
        "metrics": (f"http://{service.spec.cluster_ip}:8080/metrics", False),
        "healthz": (f"http://{operator_pod.status.pod_ip}:8081/healthz", False),
    }
    answers = run_probe(core, data_release.watched, "nobody", sandbox_image, targets)
    assert answers["direct"][0] == 401, answers["direct"]
    assert json.loads(answers["direct"][1])["reason"] == "Unauthorized"
    assert answers["api-server"][0] == 403, answers["api-server"]
    refusal = json.loads(answers["api-server"][1])["message"]
    assert 'cannot get resource "episodes/log" in API group "data.episode-operator.dev"' in refusal
    assert answers["metrics"][0] == 200
    for family in ("process_resident_memory_bytes", "process_cpu_seconds_total", "episode_operator_episodes_total"):
        assert f"\n{family}" in answers["metrics"][1], family
    assert answers["healthz"][0] == 200, answers["healthz"]


def test_a_user_with_the_rbac_gets_logs_and_artifacts_with_kubectl_episode(
    data_release: Release, api_client: client.ApiClient, core: client.CoreV1Api, kubeconfig: Path, tmp_path: Path
) -> None:
    name = "ledger"
    create_episode(api_client, data_release.watched, name, episode_spec(EXAMPLES / "three-step-ledger"))
    reader = kubeconfig_for(kubeconfig, service_account(core, data_release.watched, "reader"), tmp_path / "reader")
    grant(api_client, data_release.watched, "reader", READER_RULES)
    stranger = kubeconfig_for(
        kubeconfig, service_account(core, data_release.watched, "stranger"), tmp_path / "stranger"
    )
    # The stranger may read the Episode, not its data.
    grant(api_client, data_release.watched, "stranger", [r for r in READER_RULES if "episodes" in r["resources"]])
    wait_succeeded(api_client, data_release.watched, name)

    def kubectl_episode(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL_EPISODE), *args, "-n", data_release.watched, "--kubeconfig", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    logs = kubectl_episode(reader, "logs", name, "--turn", "03-report")
    assert logs.returncode == 0, logs.stderr
    assert "==> attempt 1 turn 03-report:" in logs.stdout and "turn 01-record" not in logs.stdout
    copied = kubectl_episode(reader, "artifacts", name, str(tmp_path / "out"))
    assert copied.returncode == 0, copied.stderr + operator_log(core, data_release.namespace)
    assert (tmp_path / "out" / "03-report" / "report.txt").is_file(), sorted((tmp_path / "out").rglob("*"))
    refused = kubectl_episode(stranger, "logs", name)
    assert refused.returncode == 1
    assert 'cannot get resource "episodes/log" in API group "data.episode-operator.dev"' in refused.stderr
    assert "Traceback" not in refused.stderr


def wait_succeeded(api: client.ApiClient, namespace: str, name: str) -> None:
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + 240
    while True:
        status = (
            custom.get_namespaced_custom_object("episode-operator.dev", "v1alpha1", namespace, "episodes", name).get(
                "status"
            )
            or {}
        )
        if status.get("phase") in ("Succeeded", "Failed"):
            assert status["phase"] == "Succeeded", status
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}/{name}: {status.get('phase')}")
        time.sleep(1)


# The results page (kubectl episode view) of a small set: two tasks × two attempts of the hello task with
# a command agent that prints markup and solves task 0 always and task 1 on its first attempt only.
VIEW_AGENT = """echo '<script>document.body.setAttribute("data-pwned", "log")</script>'
if [ "$EPISODE_SET_TASK_INDEX" = 0 ] || [ "$EPISODE_SET_ATTEMPT" = 1 ]; then echo 'Hello, world!' > /app/hello.txt; fi
"""
VIEW_TASKS = ("hello", "<i>once</i>")


def test_the_results_page_of_a_set_as_a_user_opens_it(
    data_release: Release, api_client: client.ApiClient, core: client.CoreV1Api, kubeconfig: Path, tmp_path: Path
) -> None:
    """``kubectl episode view NAME --port P`` as the README prints it, by a user with the README's Role, in
    the context of the set's namespace: the page it serves, and what Chromium shows of it."""
    namespace, name = data_release.watched, "viewed"
    task = {"inline": {"files": without_resources(folder_files(EXAMPLES / "hello"))}}
    create_set(
        api_client,
        namespace,
        name,
        {
            "dataset": {"tasks": [{"name": task_name, **task} for task_name in VIEW_TASKS]},
            "agent": {"kind": "command", "command": VIEW_AGENT},
            "attempts": 2,
            "parallelism": 2,
        },
    )
    reader = kubeconfig_for(kubeconfig, service_account(core, namespace, "viewer"), tmp_path / "viewer")
    grant(api_client, namespace, "viewer", READER_RULES)
    config = yaml.safe_load(reader.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace  # a user's context names its namespace
    reader.write_text(yaml.safe_dump(config))
    deadline = time.monotonic() + 300
    while not (read_set(api_client, namespace, name).get("status") or {}).get("completionTime"):
        assert time.monotonic() < deadline, f"set {name} unfinished: {read_set(api_client, namespace, name)}"
        time.sleep(1)

    port = free_port()
    with Plugin(reader).watching("view", name, "--port", str(port)) as lines:
        (line,) = read_until(lines, lambda line: "Ctrl-C stops it" in line, "printing the URL", timeout=60)[-1:]
        found = re.search(r"at (http://127\.0\.0\.1:(\d+)/[A-Za-z0-9_-]+/) ", line)
        assert found and found.group(2) == str(port), line
        url = found.group(1)
        with urllib.request.urlopen(url, timeout=60) as response:
            page = response.read().decode()
            assert response.headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'none';")
        text = Parsed(page).text
        assert f"EpisodeSet {namespace}/{name}" in text and VIEW_TASKS[1] in text
        assert cells(page, "pass-at-k") == [["1", "0.75", "2", "0"], ["2", "1", "2", "0"]]
        child = f"{name}-1-2"  # task 1's second attempt: the agent printed markup, and did not solve it
        assert f'href="{urlsplit(url).path}episodes/{child}"' in page
        shown = load(url, OUTPUT / "cluster-results.png")
        episode = load(f"{url}episodes/{child}", OUTPUT / "cluster-episode.png", height=2000)
        lines.process.send_signal(signal.SIGTERM)
        assert lines.process.wait(timeout=60) == 0
    for loaded in (shown, episode):
        assert [attrs for tag, attrs in Parsed(loaded.dom).tags if tag == "body"] == [{}], "a script ran"
        assert not [tag for tag, _ in Parsed(loaded.dom).tags if tag == "script"]
    episode_text = Parsed(episode.dom).text
    assert '<script>document.body.setAttribute("data-pwned", "log")</script>' in episode_text  # the agent's log
    assert "Kept data" not in episode_text, episode_text  # the data API answered the viewer
    image = read_png(shown.screenshot)
    assert image.where((0x2F, 0x85, 0x5A)) and image.where((0xDD, 0x6B, 0x20)), "the plot's green and orange bars"


def test_the_operator_runs_the_image_its_dockerfile_makes(
    data_release: Release, core: client.CoreV1Api, released_images: dict[str, str]
) -> None:
    selector = "app.kubernetes.io/name=episode-operator"
    (pod,) = core.list_namespaced_pod(data_release.namespace, label_selector=selector).items
    assert pod.spec.containers[0].image == released_images["episode-operator"]
    assert pod.status.container_statuses[0].ready and pod.status.container_statuses[0].restart_count == 0


def test_the_api_service_trusts_the_operators_own_certificate(
    data_release: Release, api_client: client.ApiClient
) -> None:
    api_service = client.ApiregistrationV1Api(api_client).read_api_service(API_SERVICE)
    (owner,) = api_service.metadata.owner_references
    assert (owner.kind, owner.name) == ("ClusterRole", f"{data_release.namespace}-{RELEASE}-data-api")
    spec = api_service.spec
    assert spec.ca_bundle and not spec.insecure_skip_tls_verify
    assert (spec.service.namespace, spec.service.name) == (data_release.namespace, RELEASE)


def operator_pods(core: client.CoreV1Api, namespace: str) -> list[Any]:
    selector = "app.kubernetes.io/name=episode-operator"
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)


def served_certificate(pod_ip: str) -> bytes:
    """The certificate a replica's data API port presents (DER): a TLS handshake from this machine,
    which routes the pod network (a client certificate is optional there)."""
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((pod_ip, 8443), timeout=10))


def registered_certificate(api: client.ApiClient) -> bytes:
    ca_bundle = client.ApiregistrationV1Api(api).read_api_service(API_SERVICE).spec.ca_bundle
    return ssl.PEM_cert_to_DER_cert(base64.b64decode(ca_bundle).decode())


def wait_for_replicas(core: client.CoreV1Api, namespace: str, count: int, *, not_named: set[str]) -> list[Any]:
    """Exactly ``count`` operator pods, all ready, none of ``not_named``, nothing terminating."""
    deadline = time.monotonic() + 240
    while True:
        pods = operator_pods(core, namespace)
        ready = [
            pod
            for pod in pods
            if pod.metadata.deletion_timestamp is None
            and pod.metadata.name not in not_named
            and all(status.ready for status in pod.status.container_statuses or [])
            and pod.status.container_statuses
        ]
        if len(ready) == len(pods) == count:
            return ready
        if time.monotonic() > deadline:
            raise TimeoutError(f"operator pods: {[(p.metadata.name, p.status.phase) for p in pods]}")
        time.sleep(1)


def test_replicas_serve_one_certificate_and_a_rolling_update_keeps_the_registration(
    data_release: Release, api_client: client.ApiClient, core: client.CoreV1Api, kubeconfig: Path, tmp_path: Path
) -> None:
    """Two replicas (a bucket every one reads: moto's server, where pods reach this machine) present
    the certificate the APIService trusts, whichever the Service picks; a rolling restart — each old
    pod stops while a new one runs — leaves the group registered, with the same certificate, and
    the logs readable through the API server."""
    values = data_release.values
    core.create_namespaced_secret(
        data_release.namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="s3-credentials"), string_data=CREDENTIALS),
    )
    with s3_server(tmp_path / "moto.log", host=POD_NETWORK_GATEWAY) as s3:
        s3.create_bucket("kept")
        bucket = {"url": "s3://kept/episodes", "endpoint": s3.endpoint, "allowHttp": True}
        try:
            data_release.upgrade(
                values | {"replicas": 2, "objectStore": bucket | {"credentialsSecret": "s3-credentials"}}
            )
            pods = wait_for_replicas(core, data_release.namespace, 2, not_named=set())
            wait_for_the_api_service_to_be_available(api_client, core, data_release.namespace)
            trusted = registered_certificate(api_client)
            assert [served_certificate(pod.status.pod_ip) for pod in pods] == [trusted, trusted]
            secret = core.read_namespaced_secret(f"{RELEASE}-data-api-serving", data_release.namespace)
            assert secret.type == "kubernetes.io/tls"
            assert ssl.PEM_cert_to_DER_cert(base64.b64decode(secret.data["tls.crt"]).decode()) == trusted

            restarted_at = {"kubectl.kubernetes.io/restartedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            client.AppsV1Api(api_client).patch_namespaced_deployment(
                RELEASE, data_release.namespace, {"spec": {"template": {"metadata": {"annotations": restarted_at}}}}
            )
            old = {pod.metadata.name for pod in pods}
            pods = wait_for_replicas(core, data_release.namespace, 2, not_named=old)
            wait_for_the_api_service_to_be_available(api_client, core, data_release.namespace)
            assert registered_certificate(api_client) == trusted
            assert [served_certificate(pod.status.pod_ip) for pod in pods] == [trusted, trusted]
            results = run_examples(api_client, core, data_release.watched, data_release.namespace, "hello")
            logs = subprocess.run(
                [str(KUBECTL_EPISODE), "logs", results["hello"]["name"], "-n", data_release.watched],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                check=False,
            )
            assert logs.returncode == 0, logs.stderr + operator_log(core, data_release.namespace)
            assert "==> attempt 1 turn" in logs.stdout, logs.stdout
        finally:
            data_release.upgrade(values)
    wait_for_replicas(core, data_release.namespace, 1, not_named=set())
    wait_for_the_api_service_to_be_available(api_client, core, data_release.namespace)


def test_uninstalling_removes_the_registration(data_release: Release, api_client: client.ApiClient) -> None:
    """No APIService is left pointing at nothing (which would hold up every namespace deletion of the
    cluster): its owner, the release's ClusterRole, goes, and the operator unregisters at exit."""
    data_release.uninstall()
    registration = client.ApiregistrationV1Api(api_client)
    deadline = time.monotonic() + 90  # the pod's grace period: the operator unregisters as it stops
    while True:
        try:
            registration.read_api_service(API_SERVICE)
        except ApiException as error:
            assert error.status == 404
            return
        assert time.monotonic() < deadline, f"apiservice {API_SERVICE} left behind"
        time.sleep(1)
