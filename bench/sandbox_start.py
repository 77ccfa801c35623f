"""Create → the agent's first command in its sandbox: cold, pre-pulled and from a warm pool (issue 26, item 5).

On the node of ``hack/cluster``, with the operator of this checkout (one process, started here), each
repeat runs these cases one after another (interleaved, so drift in the machine's load hits all alike),
each once the namespace holds no pod (the kubelet's teardown of the last case's pod would delay it):

- ``set, cold``: an EpisodeSet of one attempt whose task image is not on the node: a copy of the
  sandbox image whose one layer has an extra file (another layer digest, another diff_id), pushed to
  the cluster's registry under a fresh tag, so containerd downloads and unpacks the whole layer (it is
  removed from the node after its run, and from the registry at the end);
- ``set, pre-pulled``: the same, its image (one such copy, made once) already on the node: pulled by
  a pod that used it and was deleted before the first repeat;
- ``set, warm pool``: an EpisodeSet with ``spec.warmPool`` (target 1) created suspended; once its pool
  pod is ready (marked), ``suspend`` is set to false and the child claims the pool pod;
- baselines, the most direct way in the same run: ``pod + exec`` creates a bare pod of the image
  already on the node (no init container), waits for Running on a watch and execs one command;
  ``exec, running pod`` execs one command into that pod once it runs (the warm case's floor).

The agent (``kind: command``) runs ``date '+%s %N'`` first and keeps the answer; the task's test.sh
reports it in ``reward.json`` (``first_sec``, ``first_nsec``: integers), read from the Episode's
``status.verifierRewards``. The node is this machine: the pod's CLOCK_REALTIME is this process's
``time.time()``. Instants seen by watches in this process (a thread per kind): the child Episode's
ADDED event and, for the warm case, the first event showing its pod claimed (label
``claimed-from-pool``). Figures per case: applied → first command (the create call; for the warm case
the unsuspend patch), child seen → first command, claim seen → first command; p50 and p90 of
``--repeats``; ratios to the direct baseline of the same run.

Usage (cluster up, `hack/cluster images` run: the sandbox image in its cache and on the node):
``.venv/bin/python bench/sandbox_start.py [--repeats 5]``; writes ``bench/out/sandbox_start.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the cluster-test harness

from bench.suite.run_record import RunRecord
from kubernetes import client, config, watch
from kubernetes.stream import stream
from tests.cluster.harness import GROUP, PLURAL, TERMINAL, VERSION, OperatorProcess, install_crd

KUBECONFIG = Path("/var/lib/episode-operator/cluster/kubeconfig")
CONTAINERD_SOCKET = Path("/var/lib/episode-operator/cluster/containerd/containerd.sock")
OUT = Path(__file__).resolve().parent / "out"
IMAGE = "episode-operator.local/sandbox:bookworm"
REGISTRY = "198.18.255.1:5000"  # hack/cluster's REGISTRY
IMAGE_CACHE = Path("/var/cache/episode-operator/images")  # hack/cluster's IMAGE_CACHE
REPOSITORY = "bench-start/sandbox"
PREFIX = "bench-start-"
SETS = "episodesets"
CLAIMED_LABEL = "episode-operator.dev/claimed-from-pool"
EPISODE_LABEL = "episode-operator.dev/episode"
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
TIMEOUT = 600.0

# The agent's first command is the clock read; test.sh hands it back in reward.json (integers: exact).
AGENT = "date '+%s %N' > /tmp/first-command"
TEST_SH = """#!/bin/sh
read sec nsec < /tmp/first-command
printf '{"reward": 1, "first_sec": %s, "first_nsec": %s}' "$sec" "$(expr "$nsec" + 0)" > /logs/verifier/reward.json
"""
TASK_TOML = """schema_version = "1.4"

[agent]
timeout_sec = 600.0

[verifier]
timeout_sec = 60.0

[environment]
docker_image = "{image}"
workdir = "/app"
cpus = 1
memory_mb = 256
"""


class BenchFailed(Exception):
    """A run could not be measured (named, never a bare traceback)."""


# --- images --------------------------------------------------------------------------------------------
def _registry(method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(f"http://{REGISTRY}{path}", data=data, method=method, headers=headers or {})
    return urllib.request.urlopen(request, timeout=300)


def _push_blob(repository: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _registry("POST", f"/v2/{repository}/blobs/uploads/", b"") as answer:
        location = answer.headers["Location"]
    path = location.split(REGISTRY, 1)[-1]
    separator = "&" if "?" in path else "?"
    headers = {"Content-Type": "application/octet-stream"}
    with _registry("PUT", f"{path}{separator}digest={digest}", data, headers):
        return digest


def sandbox_archive() -> Path:
    """The sandbox image as `hack/cluster images` built it: a docker-archive of one layer, in its cache."""
    found = sorted(IMAGE_CACHE.glob("episode-operator.local-sandbox-bookworm-*.tar"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BenchFailed(f"no sandbox image in {IMAGE_CACHE}: run `hack/cluster images` first")
    return found[-1]


def unique_image(tag: str, work: Path) -> tuple[str, int]:
    """A copy of the sandbox image whose one layer also holds ``/etc/bench-start``: another layer (its own
    diff_id), so no node has any of it. Pushed to the cluster's registry as ``REPOSITORY:tag``; its
    reference and the compressed layer's size."""
    with tarfile.open(sandbox_archive()) as archive:
        (entry,) = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        if len(entry["Layers"]) != 1:
            raise BenchFailed(f"the sandbox image has {len(entry['Layers'])} layers, one expected")
        image_config = json.loads(archive.extractfile(entry["Config"]).read())  # type: ignore[union-attr]
        tar_path = work / f"{tag}.tar"
        with archive.extractfile(entry["Layers"][0]) as layer, tar_path.open("wb") as copy:  # type: ignore[union-attr]
            shutil.copyfileobj(layer, copy)
    stamp = f"{tag} {uuid.uuid4()}\n".encode()
    with tarfile.open(tar_path, "a") as layer_tar:
        info = tarfile.TarInfo("etc/bench-start")
        info.size, info.mode, info.mtime = len(stamp), 0o644, int(time.time())
        with tempfile.TemporaryFile() as source:
            source.write(stamp)
            source.seek(0)
            layer_tar.addfile(info, source)
    uncompressed = tar_path.read_bytes()
    tar_path.unlink()
    diff_id = "sha256:" + hashlib.sha256(uncompressed).hexdigest()
    compressed = gzip.compress(uncompressed, compresslevel=1)
    del uncompressed
    image_config["rootfs"]["diff_ids"] = [diff_id]
    config_bytes = json.dumps(image_config).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "size": len(config_bytes), "digest": _push_blob(REPOSITORY, config_bytes)},
        "layers": [{"mediaType": LAYER_TYPE, "size": len(compressed), "digest": _push_blob(REPOSITORY, compressed)}],
    }
    with _registry(
        "PUT", f"/v2/{REPOSITORY}/manifests/{tag}", json.dumps(manifest).encode(), {"Content-Type": MANIFEST_TYPE}
    ):
        pass
    return f"{REGISTRY}/{REPOSITORY}:{tag}", len(compressed)


def remove_from_registry(reference: str) -> None:
    """Delete a pushed image's manifest and blobs from the cluster's registry (its storage allows deletes)."""
    tag = reference.rpartition(":")[2]
    with contextlib.suppress(urllib.error.URLError, OSError):
        with _registry("GET", f"/v2/{REPOSITORY}/manifests/{tag}", headers={"Accept": MANIFEST_TYPE}) as answer:
            digest = answer.headers["Docker-Content-Digest"]
            manifest = json.loads(answer.read())
        for blob in [manifest["config"], *manifest["layers"]]:
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                _registry("DELETE", f"/v2/{REPOSITORY}/blobs/{blob['digest']}"),
            ):
                pass
        with _registry("DELETE", f"/v2/{REPOSITORY}/manifests/{digest}"):
            pass


def node_images() -> set[str]:
    """The image references containerd holds (the CRI plugin's namespace)."""
    argv = ["ctr", "--address", str(CONTAINERD_SOCKET), "--namespace", "k8s.io", "images", "ls", "-q"]
    listed = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return set(listed.stdout.split())


def remove_from_node(reference: str) -> None:
    argv = ["ctr", "--address", str(CONTAINERD_SOCKET), "--namespace", "k8s.io", "images", "rm", reference]
    subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


# --- watches -------------------------------------------------------------------------------------------
class Seen:
    """Instants this process saw things at, by watch: a child Episode's ADDED, its pod claimed."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.added: dict[str, float] = {}
        self.claimed: dict[str, float] = {}
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(self._episodes,), daemon=True),
            threading.Thread(target=self._loop, args=(self._pods,), daemon=True),
        ]

    def __enter__(self) -> Seen:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()

    def _loop(self, body: Callable[[], None]) -> None:
        while not self.stopped.is_set():
            with contextlib.suppress(Exception):
                body()

    def _episodes(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        for event in watch.Watch().stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, timeout_seconds=30
        ):
            now = time.time()
            name = event["object"]["metadata"]["name"]
            self.added.setdefault(name, now)
            if self.stopped.is_set():
                return

    def _pods(self) -> None:
        core = client.CoreV1Api(self.api)
        for event in watch.Watch().stream(core.list_namespaced_pod, self.namespace, timeout_seconds=30):
            now = time.time()
            labels = event["object"].metadata.labels or {}
            if CLAIMED_LABEL in labels and EPISODE_LABEL in labels:
                self.claimed.setdefault(labels[EPISODE_LABEL], now)
            if self.stopped.is_set():
                return


# --- cases ---------------------------------------------------------------------------------------------
def task_files(image: str) -> dict[str, str]:
    return {
        "task.toml": TASK_TOML.format(image=image),
        "instruction.md": "Benchmark: run one command.\n",
        "tests/test.sh": TEST_SH,
    }


def set_body(name: str, image: str, *, pool: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "dataset": {"tasks": [{"name": "t", "inline": {"files": task_files(image)}}]},
        "agent": {"kind": "command", "command": AGENT},
        "attempts": 1,
        "parallelism": 1,
    }
    if pool:
        spec["suspend"] = True
        spec["warmPool"] = {"target": 1, "image": image, "cpus": 1, "memoryMb": 256, "workdir": "/app"}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EpisodeSet", "metadata": {"name": name}, "spec": spec}


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = TIMEOUT, operator: OperatorProcess | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\noperator log:\n{operator.log_tail(40)}" if operator is not None else ""
            raise BenchFailed(f"{what}: not after {timeout:.0f} s{tail}")
        time.sleep(0.1)


def first_command(api: client.ApiClient, namespace: str, child: str) -> tuple[float, dict[str, Any]] | None:
    """The child's first command's instant (from its reward.json) once it has finished, and its status."""
    custom = client.CustomObjectsApi(api)
    try:
        body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, child)
    except client.exceptions.ApiException:
        return None
    status = body.get("status") or {}
    if status.get("phase") not in TERMINAL:
        return None
    rewards = status.get("verifierRewards") or {}
    if "first_sec" not in rewards:
        raise BenchFailed(f"{child} ended {status.get('phase')} with no first command: {json.dumps(status)[:1500]}")
    return int(rewards["first_sec"]) + int(rewards["first_nsec"]) / 1e9, status


def agent_pod(status: dict[str, Any]) -> str:
    for attempt in status.get("attempts") or []:
        for pod in attempt.get("pods") or []:
            if pod.get("role") == "agent":
                return str(pod.get("name"))
    return ""


def run_set(
    api: client.ApiClient, namespace: str, name: str, image: str, seen: Seen, operator: OperatorProcess, *, pool: bool
) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    install_crd(api)  # another checkout's session may have installed CRDs without spec.warmPool
    if pool:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, set_body(name, image, pool=True))

        def pool_ready() -> bool:
            status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SETS, name).get("status") or {}
            return bool((status.get("warmPool") or {}).get("ready") == 1)

        wait_for(f"{name}: its pool pod ready", pool_ready, operator=operator)
        applied = time.time()
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, SETS, name, {"spec": {"suspend": False}})
    else:
        applied = time.time()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, set_body(name, image, pool=False))
    child = f"{name}-0-1"
    first, status = wait_for(f"{child}: finished", lambda: first_command(api, namespace, child), operator=operator)
    if not applied < first:
        raise BenchFailed(f"{child}: first command at {first}, before the set was applied at {applied}")
    pod = agent_pod(status)
    figures: dict[str, Any] = {
        "applied_to_first_command": first - applied,
        "child_seen_to_first_command": first - seen.added[child] if child in seen.added else None,
        "agent_pod": pod,
        "phase": status.get("phase"),
    }
    if pool:
        figures["claimed"] = pod.startswith(f"{name}-pool-")
        if child in seen.claimed:
            figures["claim_seen_to_first_command"] = first - seen.claimed[child]
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SETS, name)
    return figures


def bare_pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "infinity"],
                    "resources": {
                        "requests": {"cpu": "1", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "256Mi"},
                    },
                }
            ],
        },
    }


def exec_clock(core: client.CoreV1Api, namespace: str, name: str) -> float:
    """Exec ``date`` in the pod's main container: the instant it ran."""
    text: str = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        namespace,
        container="main",
        command=["date", "+%s %N"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    sec, nsec = text.split()
    return int(sec) + int(nsec) / 1e9


def wait_running(core: client.CoreV1Api, namespace: str, name: str, resource_version: str) -> None:
    """Until the pod runs, on a watch from its creation (the quickest a client learns it)."""
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={name}",
        resource_version=resource_version,
        timeout_seconds=int(TIMEOUT),
    ):
        pod = event["object"]
        if pod.status.phase == "Running":
            return
        if pod.status.phase in ("Failed", "Succeeded"):
            raise BenchFailed(f"pod {name}: {pod.status.phase} before running")
    raise BenchFailed(f"pod {name}: not running after {TIMEOUT:.0f} s")


def run_direct(core: client.CoreV1Api, namespace: str, name: str, image: str) -> dict[str, Any]:
    """Baselines: create a bare pod, wait Running, exec one command; then exec once more into it, running."""
    started = time.time()
    created = core.create_namespaced_pod(namespace, bare_pod(name, image))
    wait_running(core, namespace, name, created.metadata.resource_version)
    first = exec_clock(core, namespace, name)
    exec_started = time.time()
    again = exec_clock(core, namespace, name)
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return {"create_to_first_command": first - started, "exec_to_command": again - exec_started}


def wait_no_pods(core: client.CoreV1Api, namespace: str) -> None:
    """Until the namespace holds no pod: the last case's pods are gone (their teardown by the kubelet would
    otherwise delay the next case's start)."""
    wait_for(f"{namespace}: the last case's pods gone", lambda: not core.list_namespaced_pod(namespace).items)


def pre_pull(core: client.CoreV1Api, namespace: str, image: str) -> None:
    """Make the image present on the node: a pod that uses it runs, then is deleted."""
    name = f"puller-{uuid.uuid4().hex[:6]}"
    created = core.create_namespaced_pod(namespace, bare_pod(name, image))
    wait_running(core, namespace, name, created.metadata.resource_version)
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


# --- the run -------------------------------------------------------------------------------------------
CASES = (
    ("pod + exec (image present)", "direct", "create_to_first_command"),
    ("exec, running pod", "direct", "exec_to_command"),
    ("set, cold", "cold", "applied_to_first_command"),
    ("set, pre-pulled", "pre-pulled", "applied_to_first_command"),
    ("set, warm pool", "warm", "applied_to_first_command"),
)
SOURCES = ("direct", "cold", "pre-pulled", "warm")
SIDE_FIGURES = (
    ("child seen → first", "child_seen_to_first_command"),
    ("claim seen → first", "claim_seen_to_first_command"),
)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = fraction * (len(ordered) - 1)
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    summary: dict[str, dict[str, float | None]] = {}
    for case, source, key in CASES:
        values = [run[key] for run in runs.get(source, []) if run.get(key) is not None]
        row: dict[str, float | None] = {
            "p50": percentile(values, 0.5) if values else None,
            "p90": percentile(values, 0.9) if values else None,
            "n": float(len(values)),
        }
        for _, side in SIDE_FIGURES:
            side_values = [run[side] for run in runs.get(source, []) if run.get(side) is not None]
            row[f"{side}_p50"] = statistics.median(side_values) if side_values else None
        summary[case] = row
    for case, baseline in (
        ("set, cold", "pod + exec (image present)"),
        ("set, pre-pulled", "pod + exec (image present)"),
        ("set, warm pool", "exec, running pod"),
    ):
        p50, base = summary[case]["p50"], summary[baseline]["p50"]
        summary[case]["ratio"] = p50 / base if p50 is not None and base else None
    warm = summary["set, warm pool"]
    pod_exec = summary["pod + exec (image present)"]["p50"]
    warm["ratio_to_pod_exec"] = warm["p50"] / pod_exec if warm["p50"] is not None and pod_exec else None
    return summary


def table(summary: dict[str, dict[str, float | None]], repeats: int) -> str:
    header = ["case", "p50", "p90", "÷ baseline", "child seen → first", "claim seen → first", "n"]
    rows = []
    for case, figures in summary.items():

        def cell(key: str, fmt: str = "{:.3f}", figures: dict[str, float | None] = figures) -> str:
            value = figures.get(key)
            return "--" if value is None else fmt.format(value)

        rows.append(
            [
                case,
                cell("p50"),
                cell("p90"),
                cell("ratio", "{:.2f}"),
                cell("child_seen_to_first_command_p50"),
                cell("claim_seen_to_first_command_p50"),
                cell("n", "{:.0f}"),
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join("-" * (w - 1) + (":" if i else "-") for i, w in enumerate(widths)) + " |"
    note = (
        f"(seconds; {repeats} repeats; ÷ baseline: cold and pre-pulled over `pod + exec`, "
        "warm pool over `exec, running pod`)"
    )
    return "\n".join([line(header), rule, *(line(row) for row in rows)]) + "\n" + note


@contextlib.contextmanager
def bench_namespace(core: client.CoreV1Api) -> Iterator[str]:
    name = f"{PREFIX}{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        wait_for("the namespace's default service account", lambda: core.list_namespaced_service_account(name).items)
        yield name
    finally:
        # Deleted and waited for while the operator still runs (every path): the sets and Episodes carry
        # kopf's finalizer, which only a running operator removes.
        core.delete_namespace(name, propagation_policy="Background")
        wait_for(f"namespace {name} deleted", lambda: namespace_gone(core, name), timeout=300)


def namespace_gone(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespace(name)
    except client.exceptions.ApiException as error:
        return error.status == 404
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--operator-program",
        default="",
        help="the command that runs the operator instead of `episode-operator` (e.g. a profiling wrapper)",
    )
    parser.add_argument("--cases", default=",".join(SOURCES), help=f"of {','.join(SOURCES)} (default: all)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    if set(cases) - set(SOURCES):
        parser.error(f"no such case: {', '.join(sorted(set(cases) - set(SOURCES)))} (cases: {', '.join(SOURCES)})")
    api = config.new_client_from_config(config_file=str(KUBECONFIG))  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api)
    install_crd(api)
    record = RunRecord.start()
    runs: dict[str, list[dict[str, Any]]] = {}
    pushed: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        OUT.mkdir(exist_ok=True)
        (OUT / "sandbox_start-operator.log").unlink(missing_ok=True)
        prepulled, layer_bytes = unique_image(f"pre-{uuid.uuid4().hex[:8]}", work)
        pushed.append(prepulled)
        operator = OperatorProcess(
            KUBECONFIG,
            work / "data",
            OUT / "sandbox_start-operator.log",
            f"{PREFIX}*",
            ("--pull-grace", "300"),
            cpu_request_fraction=None,
            program=tuple(args.operator_program.split()) if args.operator_program else None,
        )
        operator.start()
        try:
            with bench_namespace(core) as namespace, Seen(api, namespace) as seen:
                if "pre-pulled" in cases:
                    pre_pull(core, namespace, prepulled)
                for index in range(args.repeats):
                    if "cold" in cases:
                        cold, _ = unique_image(f"cold-{uuid.uuid4().hex[:8]}", work)
                        pushed.append(cold)
                        if cold in node_images():
                            raise BenchFailed(f"{cold} is on the node before its run")
                    if "direct" in cases:
                        wait_no_pods(core, namespace)
                        runs.setdefault("direct", []).append(run_direct(core, namespace, f"direct-{index}", IMAGE))
                    if "cold" in cases:
                        wait_no_pods(core, namespace)
                        runs.setdefault("cold", []).append(
                            run_set(api, namespace, f"cold-{index}", cold, seen, operator, pool=False)
                        )
                        wait_no_pods(core, namespace)
                        remove_from_node(cold)
                    if "pre-pulled" in cases:
                        wait_no_pods(core, namespace)
                        runs.setdefault("pre-pulled", []).append(
                            run_set(api, namespace, f"pre-{index}", prepulled, seen, operator, pool=False)
                        )
                    if "warm" in cases:
                        wait_no_pods(core, namespace)
                        warm = run_set(api, namespace, f"warm-{index}", IMAGE, seen, operator, pool=True)
                        if not warm["claimed"]:
                            raise BenchFailed(f"warm-{index}: the child made a fresh pod {warm['agent_pod']}, no claim")
                        runs.setdefault("warm", []).append(warm)
                    print(
                        f"repeat {index}: "
                        + ", ".join(
                            f"{case} {runs[source][-1][key]:.3f}" for case, source, key in CASES if source in runs
                        ),
                        flush=True,
                    )
        finally:
            operator.stop()
    except BenchFailed as failure:
        print(f"sandbox_start: {failure}", file=sys.stderr)
        return 1
    finally:
        for reference in pushed:
            remove_from_node(reference)
            remove_from_registry(reference)
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(runs)
    printed = table(summary, args.repeats)
    print(printed)
    record.write(
        OUT / "sandbox_start.json",
        repeats=args.repeats,
        cold_layer_bytes_compressed=layer_bytes,
        clock="time.time() of this process and `date` in the pod (one kernel: CLOCK_REALTIME)",
        summary=summary,
        runs=runs,
        table=printed,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
