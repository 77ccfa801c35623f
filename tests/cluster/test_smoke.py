"""Smoke test of the real cluster: the pod features the operator is built on work end to end.

Sidecars reached by name through hostAliases, exec with separate stdout/stderr and exit code, an
upload through exec stdin, container logs, and a pod reaching the API server's Service IP (the
path an in-cluster operator takes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
import time
from collections.abc import Iterator, Sequence

import pytest
from kubernetes import client
from kubernetes.stream import stream

POD = "smoke"
WEB_PAGE = "hello-from-web\n"


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What a finished exec produced."""

    stdout: str
    stderr: str
    returncode: int


def exec_in(
    core: client.CoreV1Api,
    namespace: str,
    pod: str,
    container: str,
    command: Sequence[str],
    *,
    stdin: bytes | None = None,
    timeout: float = 60,
) -> ExecResult:
    """Run a command in a container and wait for it.

    A 1.20 API server speaks exec protocol v4, which cannot half-close stdin: a command given
    `stdin` must stop reading by itself (e.g. `head -c N`), never wait for end of file.
    """
    ws = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container=container,
        command=list(command),
        stdin=stdin is not None,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    try:
        if stdin is not None:
            ws.write_stdin(stdin)
        ws.run_forever(timeout=timeout)
        if ws.is_open():
            raise AssertionError(f"exec {list(command)} still running after {timeout}s")
        return ExecResult(ws.read_stdout(), ws.read_stderr(), ws.returncode)
    finally:
        ws.close()


def smoke_pod(image: str) -> client.V1Pod:
    """Main container plus an HTTP sidecar that the main one reaches as `web`."""
    main = client.V1Container(
        name="main",
        image=image,
        image_pull_policy="Never",
        command=["sh", "-c", "echo main-started; echo main-warning >&2; exec sleep infinity"],
    )
    sidecar = client.V1Container(
        name="web",
        image=image,
        image_pull_policy="Never",
        command=[
            "sh",
            "-c",
            f"mkdir -p /srv && printf '{WEB_PAGE}' > /srv/index.html"
            " && exec python3 -m http.server 8080 --directory /srv",
        ],
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=POD),
        spec=client.V1PodSpec(
            containers=[main, sidecar],
            host_aliases=[client.V1HostAlias(ip="127.0.0.1", hostnames=["web"])],
            automount_service_account_token=False,
            termination_grace_period_seconds=1,
        ),
    )


def wait_until_running(core: client.CoreV1Api, namespace: str, name: str, timeout: float = 90) -> None:
    """Wait until every container of the pod runs; fail with the containers' states otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        status = core.read_namespaced_pod(name, namespace).status or client.V1PodStatus()
        statuses = status.container_statuses or []
        states = {s.name: s.state or client.V1ContainerState() for s in statuses}
        if status.phase == "Running" and states and all(state.running for state in states.values()):
            return
        if time.monotonic() > deadline:
            hint = " (images missing? run `hack/cluster images`)" if "ErrImageNeverPull" in str(states) else ""
            details = {container: state.to_dict() for container, state in states.items()}
            pytest.fail(f"pod {namespace}/{name} not running after {timeout}s{hint}: {details}")
        time.sleep(0.25)


@pytest.fixture
def pod(core: client.CoreV1Api, namespace: str, sandbox_image: str) -> Iterator[str]:
    """The running smoke pod's name."""
    core.create_namespaced_pod(namespace, smoke_pod(sandbox_image))
    wait_until_running(core, namespace, POD)
    yield POD


def test_main_container_reaches_sidecar_by_name(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    script = (
        "import time, urllib.request\n"
        "for attempt in range(100):\n"
        "    try:\n"
        "        print(urllib.request.urlopen('http://web:8080/', timeout=2).read().decode(), end='')\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.2)\n"
        "else:\n"
        "    raise SystemExit('web:8080 never answered')\n"
    )
    result = exec_in(core, namespace, pod, "main", ["python3", "-c", script])
    assert result == ExecResult(stdout=WEB_PAGE, stderr="", returncode=0)


def test_exec_separates_stdout_stderr_and_exit_code(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    result = exec_in(core, namespace, pod, "main", ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert result == ExecResult(stdout="out\n", stderr="err\n", returncode=3)


def test_upload_tar_through_exec_stdin(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    files = {"hello.txt": b"hello upload\n", "nested/dir/data.bin": bytes(range(256)) * 64}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    payload = buffer.getvalue()

    upload = exec_in(
        core,
        namespace,
        pod,
        "main",
        ["sh", "-c", f"mkdir -p /dest && head -c {len(payload)} | tar -x -C /dest"],
        stdin=payload,
    )
    assert upload == ExecResult(stdout="", stderr="", returncode=0)

    check = exec_in(
        core,
        namespace,
        pod,
        "main",
        ["sh", "-c", "cat /dest/hello.txt && sha256sum /dest/nested/dir/data.bin | cut -d' ' -f1"],
    )
    expected = "hello upload\n" + hashlib.sha256(files["nested/dir/data.bin"]).hexdigest() + "\n"
    assert check == ExecResult(stdout=expected, stderr="", returncode=0)


def test_container_logs(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    deadline = time.monotonic() + 120  # a bound for a loaded machine, not a budget
    while True:
        logs = core.read_namespaced_pod_log(pod, namespace, container="main")
        if "main-started" in logs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # stdout and stderr both land in the log; their relative order is not guaranteed
    assert sorted(logs.splitlines()) == ["main-started", "main-warning"]


def test_pod_reaches_api_server_through_kubernetes_service(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    """kube-proxy makes the `kubernetes` Service IP work from pods, as the in-cluster operator needs."""
    script = (
        "import json, os, ssl, urllib.request\n"
        "url = 'https://%s:%s/version' % (os.environ['KUBERNETES_SERVICE_HOST'],"
        " os.environ['KUBERNETES_SERVICE_PORT'])\n"
        "context = ssl._create_unverified_context()\n"
        "print(json.load(urllib.request.urlopen(url, context=context, timeout=10))['gitVersion'])\n"
    )
    result = exec_in(core, namespace, pod, "main", ["python3", "-c", script])
    assert result.returncode == 0, result
    assert result.stdout.startswith("v1."), result
