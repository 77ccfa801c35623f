"""The operator under test: the CRD installed, the operator running as a real process, Episodes.

The operator runs as its console script (``episode-operator run``), a process of its own
with its pid recorded, so a test can kill it and start another as a crash would. It
watches namespaces by a glob (``<prefix>*`` for the shared one, see ``namespace_prefix``), so a test that needs an
operator to itself uses another prefix.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.vocabulary import GROUP, VERSION
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.pod_sandbox import KubeSandbox
from episode_operator.runtime.sandbox_protocol import JobSpec
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "episodes.episode-operator.dev.yaml"
SET_CRD_PATH = REPO / "crds" / "episodesets.episode-operator.dev.yaml"
TASKS = Path(__file__).resolve().parent / "tasks"
EXAMPLES = REPO / "examples" / "tasks"
TERMINAL = ("Succeeded", "Failed")


def install_crd(api: client.ApiClient, timeout: float = 60) -> None:
    """Create or update the Episode and EpisodeSet CRDs and wait until they are served."""
    for path in (CRD_PATH, SET_CRD_PATH):
        _install_crd_file(api, path, timeout)


# The digest of the CRD file a test installed, on the CRD: the same file is not installed again.
CRD_DIGEST_ANNOTATION = "tests.episode-operator.dev/crd-digest"


@functools.cache
def _crd_file(path: Path) -> tuple[str, dict[str, Any]]:
    """The CRD file's digest and manifest, read once per process (libyaml's loader: the files are large)."""
    text = path.read_text()
    manifest = yaml.load(text, Loader=yaml.CSafeLoader)
    digest = hashlib.sha256(text.encode()).hexdigest()
    manifest["metadata"].setdefault("annotations", {})[CRD_DIGEST_ANNOTATION] = digest
    return digest, manifest


def _read_crd(extensions: client.ApiextensionsV1Api, name: str) -> dict[str, Any] | None:
    """The CRD as JSON, None if there is none: not read into the client's models, which for a CRD of this size
    costs a test worker a third of a second each time."""
    try:
        response = extensions.read_custom_resource_definition(name, _preload_content=False)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    crd: dict[str, Any] = json.loads(response.data)
    return crd


def _install_crd_file(api: client.ApiClient, path: Path, timeout: float) -> None:
    """Replacing a CRD, even with the same content, makes a running kopf rediscover its API group,
    and a rediscovery while the API server re-registers the group can lose the resource: that
    operator then never sees an Episode again. So a CRD already as this file says is left alone."""
    extensions = client.ApiextensionsV1Api(api)
    digest, installed = _crd_file(path)
    manifest = copy.deepcopy(installed)
    name = manifest["metadata"]["name"]
    deadline = time.monotonic() + timeout
    # Several workers install the same file at once: the one whose create or replace loses the race (409)
    # reads again, and finds the file installed or tries again.
    current = _read_crd(extensions, name)
    while True:
        if current is None:
            try:
                extensions.create_custom_resource_definition(manifest)
                break
            except ApiException as error:
                if error.status != 409 or time.monotonic() > deadline:
                    raise
        elif (current["metadata"].get("annotations") or {}).get(CRD_DIGEST_ANNOTATION) == digest:
            break
        else:
            manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            try:
                extensions.replace_custom_resource_definition(name, manifest)
                break
            except ApiException as conflict:
                if conflict.status != 409 or time.monotonic() > deadline:
                    raise
        current = _read_crd(extensions, name)
    while time.monotonic() < deadline:
        conditions = ((_read_crd(extensions, name) or {}).get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions) and served(
            api, manifest["spec"]["group"], manifest["spec"]["versions"][0]["name"], manifest["spec"]["names"]["plural"]
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"CRD {name} not established and served after {timeout} s")


def served(api: client.ApiClient, group: str, version: str, plural: str) -> bool:
    """Whether the API server's discovery lists the resource (it lags a CRD's Established condition)."""
    try:
        listing = client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return any(resource.name == plural for resource in listing.resources)


# The operator's image as `hack/cluster images` builds it (its wheel is this checkout's).
OPERATOR_IMAGE = "episode-operator.local/operator:dev"

# What share of its CPU limit a sandbox pod of the tier's operators requests (--cpu-request-fraction;
# the Helm releases' cpuRequestFraction): the examples' `cpus = 1` asks for a whole CPU of the test
# node's two, and the workers' pods (docs/testing.md, "Workers") fit side by side only when they ask
# for little. Their limits stay what the task says. A test about capacity runs an operator with
# ``cpu_request_fraction=None`` (the operator's default: requests = limits).
SIDE_BY_SIDE_CPU_REQUEST_FRACTION = 0.05


class OperatorProcess:
    """``episode-operator run`` as a subprocess, started and stopped by its pid."""

    def __init__(
        self,
        kubeconfig: Path,
        data_dir: Path,
        log_path: Path,
        namespaces: str,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        program: tuple[str, ...] | None = None,
        cpu_request_fraction: float | None = SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
    ) -> None:
        """``program`` replaces the console script (e.g. the benchmarks' operator with a fake sandbox);
        ``cpu_request_fraction`` None runs the operator's own default."""
        self.extra_args = extra_args
        self.cpu_request_fraction = cpu_request_fraction
        # The process's environment: $KUBECONFIG names the same cluster as --kubeconfig unless a test says otherwise.
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})}
        self.program = program or (str(Path(sys.executable).parent / "episode-operator"),)
        self.kubeconfig = kubeconfig
        self.data_dir = data_dir
        self.log_path = log_path
        self.namespaces = namespaces
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.metrics_port = free_port()

    def start(self, timeout: float = 60) -> None:
        command = [
            *self.program,
            "run",
            "--namespace",
            self.namespaces,
            "--data-dir",
            str(self.data_dir),
            "--kubeconfig",
            str(self.kubeconfig),
            "--pull-grace",
            "5",
            "--poll-interval",
            "5",
            "--liveness",
            f"http://127.0.0.1:{self.port}/healthz",
            "--metrics-port",
            str(self.metrics_port),
            # Agent pods run the capture proxy from the operator's image as `hack/cluster images` built it.
            "--capture-image",
            OPERATOR_IMAGE,
            *(() if self.cpu_request_fraction is None else ("--cpu-request-fraction", str(self.cpu_request_fraction))),
            *self.extra_args,
        ]
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.process.returncode}:\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the operator did not become healthy in {timeout} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, as a crash: no cleanup runs."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def metrics(self) -> dict[str, float]:
        """The operator's /metrics, sample name (with labels) → value."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running_operator(kubeconfig: Path, data_dir: Path, log_path: Path, namespaces: str) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(kubeconfig, data_dir, log_path, namespaces)
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()


# Episodes --------------------------------------------------------------------------------------
def pack_examples(kubeconfig: Path, namespace: str) -> None:
    """The examples packed into ``namespace`` as the dataset ``examples``, as a user packs them."""
    kubectl_episode = Path(sys.executable).parent / "kubectl-episode"
    packed = subprocess.run(
        [str(kubectl_episode), "pack", str(EXAMPLES), "--dataset", "examples", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=120,
        env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert packed.returncode == 0, packed.stderr


@contextlib.contextmanager
def gym_operator(
    kubeconfig: Path, api: client.ApiClient, namespace: str, root: Path, agent: dict[str, Any], token: str
) -> Iterator[tuple[OperatorProcess, int]]:
    """An operator driving ``namespace`` with its Gym server on (docs/gym.md), and the server's port.

    The examples are packed into the namespace (``pack_examples``); the tries' Episodes run
    ``agent`` and Gym owns their retries.
    At the end the Episodes are deleted while the operator runs (they carry its finalizer).
    """
    pack_examples(kubeconfig, namespace)
    settings, token_file = root / "gym.yaml", root / "token"
    settings.write_text(yaml.safe_dump({"namespace": namespace, "agent": agent, "retryOwner": "gym"}))
    token_file.write_text(token + "\n")
    port = free_port()
    gym_args = ("--gym-port", str(port), "--gym-settings", str(settings), "--gym-token-file", str(token_file))
    process = OperatorProcess(kubeconfig, root / "data", root / "operator.log", namespace, extra_args=gym_args)
    process.start()
    try:
        yield process, port
    finally:
        custom = client.CustomObjectsApi(api)
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        deadline = time.monotonic() + 120
        while custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        process.stop()


def folder_files(folder: Path, edits: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """A task folder as the ``inline.files`` of an Episode; ``edits`` replace or (None) remove files."""
    files = {
        path.relative_to(folder).as_posix(): path.read_text() for path in sorted(folder.rglob("*")) if path.is_file()
    }
    for path, content in (edits or {}).items():
        if content is None:
            files.pop(path, None)
        else:
            files[path] = content
    return files


def episode_spec(
    folder: Path | None = None,
    *,
    files: dict[str, str] | None = None,
    edits: Mapping[str, str | None] | None = None,
    agent: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    inline = files if files is not None else folder_files(folder, edits) if folder else {}
    return {"task": {"inline": {"files": inline}}, "agent": agent or {"kind": "oracle"}, **extra}


def create_episode(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": name}, "spec": spec}
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def wait_for_namespace_gone(core: client.CoreV1Api, name: str, timeout: float) -> bool:
    """Wait until a namespace being deleted is gone; False if it is still there after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_namespace(name)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        time.sleep(0.5)
    return False


def read_episode(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return result


def wait_for_episode(
    api: client.ApiClient, namespace: str, name: str, operator: OperatorProcess, timeout: float = 240
) -> dict[str, Any]:
    """The Episode's status once it is Succeeded or Failed."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = read_episode(api, namespace, name).get("status") or {}
        if status.get("phase") in TERMINAL:
            return status
        time.sleep(0.5)
    raise TimeoutError(
        f"episode {namespace}/{name} not finished after {timeout} s: {status}\noperator log:\n{operator.log_tail()}"
    )


def run_episode(
    api: client.ApiClient,
    namespace: str,
    name: str,
    spec: dict[str, Any],
    operator: OperatorProcess,
    timeout: float = 240,
) -> dict[str, Any]:
    create_episode(api, namespace, name, spec)
    return wait_for_episode(api, namespace, name, operator, timeout)


def pod_file(core: client.CoreV1Api, namespace: str, pod: str, path: str) -> str | None:
    """The content of ``path`` in the pod's main container, None if it cannot be read (yet)."""
    command = ["sh", "-c", f"cat '{path}' 2>/dev/null || echo '<missing>'"]
    try:
        text: str = stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container="main",
            command=command,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )
    except ApiException:
        return None
    return None if text.strip() == "<missing>" else text


def pods_of(core: client.CoreV1Api, namespace: str, episode: str) -> list[str]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"episode-operator.dev/episode={episode}")
    return [pod.metadata.name for pod in pods.items if not pod.metadata.deletion_timestamp]


def suspended_episode(api: client.ApiClient, namespace: str, name: str) -> OwnerRef:
    """An Episode no operator drives (suspended), to own pods a test makes through the kube layer.

    The garbage collector deletes pods whose owner does not exist, so a test's pods need a real one.
    """
    install_crd(api)
    create_episode(api, namespace, name, episode_spec(files={"task.toml": "# not driven"}, suspend=True))
    return OwnerRef(name, namespace, read_episode(api, namespace, name)["metadata"]["uid"])


async def run_sandbox_job(sandbox: KubeSandbox, command: str, *, name: str) -> tuple[int | None, str]:
    """Run ``command`` (sh) as a supervised job in ``sandbox`` to its end: its exit code and output."""
    spec = JobSpec(id=f"test.{name}", command=command, timeout_sec=60, shell="sh", tail=4096)
    state = await sandbox.start_job(spec, wait_sec=60)
    while not state.done:
        state = await sandbox.wait_job(spec, max_wait_sec=30)
    return state.exit_code, (state.output or b"").decode()


def context_kubeconfig(admin: Path, path: Path, namespaces: dict[str, str]) -> Path:
    """The admin kubeconfig with one context per (name -> namespace), the first one current."""
    document = yaml.safe_load(admin.read_text())
    current = next(c for c in document["contexts"] if c["name"] == document["current-context"])["context"]
    document["contexts"] = [
        {"name": name, "context": {**current, "namespace": namespace}} for name, namespace in namespaces.items()
    ]
    document["current-context"] = next(iter(namespaces))
    path.write_text(yaml.safe_dump(document))
    return path
