"""The cluster side of the benchmarks: namespaces, timestamped watches and the operator process.

Times are taken by this process when a watch event *arrives* (``time.time()``, sub-millisecond
resolution; the watch adds a few milliseconds of delivery latency). The API's own timestamps
(``creationTimestamp``, conditions' ``lastTransitionTime``, ``status.turns[].startedAt``) have a
resolution of one second and are only kept as cross-checks. The operator under test runs as
its own process through the cluster-test harness, so ``/proc/<pid>`` tells its CPU time and
memory exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from tests.cluster.harness import GROUP, PLURAL, VERSION, OperatorProcess, wait_for_namespace_gone

DEFAULT_KUBECONFIG = Path("/var/lib/episode-operator/cluster/kubeconfig")
BENCH_LABEL = "episode-operator.dev/bench"
TERMINAL = ("Succeeded", "Failed")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def new_watch() -> Any:
    """A ``kubernetes.watch.Watch`` (the library leaves it untyped)."""
    return watch.Watch()  # type: ignore[no-untyped-call]


def connect(kubeconfig: Path) -> client.ApiClient:
    """A synchronous API client for the cluster (one per thread that execs: exec patches it)."""
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return api


# Watches ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodeView:
    """What one watch event said about an Episode, and when it arrived."""

    seen: float
    event: str
    name: str
    phase: str | None
    has_status: bool
    pod_name: str | None
    ready: bool
    stages: tuple[str | None, ...]
    failure_kind: str | None
    created: str | None

    @classmethod
    def of(cls, seen: float, event: str, body: dict[str, Any]) -> EpisodeView:
        status = body.get("status") or {}
        return cls(
            seen=seen,
            event=event,
            name=body["metadata"]["name"],
            phase=status.get("phase"),
            has_status=bool(status),
            pod_name=status.get("podName"),
            ready=bool(((status.get("attempts") or [{}])[-1]).get("readyAt")),
            stages=tuple(turn.get("stage") for turn in status.get("turns") or []),
            failure_kind=status.get("failureKind"),
            created=body["metadata"].get("creationTimestamp"),
        )

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL


@dataclass(frozen=True)
class PodView:
    """What one watch event said about a Pod, and when it arrived."""

    seen: float
    event: str
    name: str
    phase: str | None
    running: bool
    deleting: bool

    @classmethod
    def of(cls, seen: float, event: str, pod: Any) -> PodView:
        statuses = list(pod.status.container_statuses or []) if pod.status else []
        running = bool(statuses) and all(s.state is not None and s.state.running is not None for s in statuses)
        return cls(
            seen=seen,
            event=event,
            name=pod.metadata.name,
            phase=pod.status.phase if pod.status else None,
            running=running and pod.status.phase == "Running",
            deleting=pod.metadata.deletion_timestamp is not None,
        )


View = TypeVar("View", EpisodeView, PodView)


class Recorder(Generic[View]):
    """A watch in a thread that keeps every event of one namespace with its arrival time."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        args: Sequence[Any],
        view: Callable[[float, str, Any], View],
    ) -> None:
        self._list_call = list_call
        self._args = tuple(args)
        self._view: Callable[[float, str, Any], View] = view
        self._views: list[View] = []
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @classmethod
    def episodes(cls, api: client.ApiClient, namespace: str) -> Recorder[EpisodeView]:
        custom = client.CustomObjectsApi(api)
        return Recorder(custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL), EpisodeView.of)

    @classmethod
    def pods(cls, api: client.ApiClient, namespace: str) -> Recorder[PodView]:
        return Recorder(client.CoreV1Api(api).list_namespaced_pod, (namespace,), PodView.of)

    def __enter__(self) -> Recorder[View]:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the watch did not start within 30 s")
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        # Start from a list's resourceVersion: every later change arrives as an event.
        resource_version: str | None = None
        while not self._stopping.is_set():
            if resource_version is None:
                listing = self._list_call(*self._args, limit=1)
                metadata = listing["metadata"] if isinstance(listing, dict) else listing.metadata
                resource_version = (
                    metadata["resourceVersion"] if isinstance(metadata, dict) else metadata.resource_version
                )
                self._ready.set()
            stream = new_watch()
            try:
                for event in stream.stream(
                    self._list_call, *self._args, resource_version=resource_version, timeout_seconds=5
                ):
                    seen = time.time()
                    if event["type"] == "ERROR":
                        resource_version = None
                        break
                    view = self._view(seen, event["type"], event["object"])
                    resource_version = stream.resource_version
                    with self._changed:
                        self._views.append(view)
                        self._changed.notify_all()
                    if self._stopping.is_set():
                        break
            except ApiException as error:
                if error.status == 410:
                    resource_version = None
                else:
                    time.sleep(0.2)
            except Exception:  # a dropped connection: resume from the last version seen
                time.sleep(0.2)

    @property
    def views(self) -> list[View]:
        with self._changed:
            return list(self._views)

    def since(self, cursor: int, timeout: float) -> tuple[list[View], int]:
        """The events after the first ``cursor`` ones (waiting up to ``timeout`` for one), and the new cursor."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._views) <= cursor:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no watch event for {timeout:.0f} s")
                self._changed.wait(min(left, 1.0))
            return self._views[cursor:], len(self._views)

    def of(self, name: str) -> list[View]:
        return [view for view in self.views if view.name == name]

    def first(self, predicate: Callable[[View], bool]) -> View | None:
        return next((view for view in self.views if predicate(view)), None)

    def wait(self, predicate: Callable[[View], bool], timeout: float, what: str = "an event") -> View:
        """The first event (already seen or still to come) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        checked = 0
        with self._changed:
            while True:
                for view in self._views[checked:]:
                    if predicate(view):
                        return view
                checked = len(self._views)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waited {timeout:.0f} s for {what}")
                self._changed.wait(min(left, 1.0))

    def wait_all(self, names: Sequence[str], predicate: Callable[[View], bool], timeout: float) -> dict[str, View]:
        """For every name, its first event that satisfies ``predicate``."""
        found: dict[str, View] = {}
        deadline = time.monotonic() + timeout
        wanted = set(names)
        with self._changed:
            checked = 0
            while True:
                for view in self._views[checked:]:
                    if view.name in wanted and view.name not in found and predicate(view):
                        found[view.name] = view
                checked = len(self._views)
                if len(found) == len(wanted):
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(wanted - set(found))
                    raise TimeoutError(
                        f"{len(missing)} of {len(wanted)} not there after {timeout:.0f} s: {missing[:5]}"
                    )
                self._changed.wait(min(left, 1.0))


# Namespaces ------------------------------------------------------------------------------------
@dataclass
class Namespaces:
    """This run's namespaces: ``<prefix><suffix>``, all deleted at the end."""

    api: client.ApiClient
    prefix: str
    created: list[str] = field(default_factory=list)

    def create(self, suffix: str) -> str:
        core = client.CoreV1Api(self.api)
        name = f"{self.prefix}{suffix}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={BENCH_LABEL: "1"})))
        self.created.append(name)
        deadline = time.monotonic() + 60
        while True:  # pods are refused until the namespace's default service account exists
            try:
                core.read_namespaced_service_account("default", name)
                return name
            except ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def delete(self, name: str, timeout: float = 300) -> bool:
        """Delete one namespace and wait until it is gone; False if it is still there."""
        core = client.CoreV1Api(self.api)
        with contextlib.suppress(ApiException):
            core.delete_namespace(name, propagation_policy="Background")
        return wait_for_namespace_gone(core, name, timeout)

    def strip_finalizers(self, name: str) -> int:
        """Last resort when no operator is left to release them: remove Episodes' finalizers."""
        custom = client.CustomObjectsApi(self.api)
        stripped = 0
        listing: dict[str, Any] = custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)  # type: ignore[assignment]
        for item in listing["items"]:
            if item["metadata"].get("finalizers"):
                with contextlib.suppress(ApiException):
                    custom.patch_namespaced_custom_object(
                        GROUP, VERSION, name, PLURAL, item["metadata"]["name"], {"metadata": {"finalizers": None}}
                    )
                    stripped += 1
        return stripped


# Episodes --------------------------------------------------------------------------------------
def create_episode(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> float:
    """Create an Episode; returns the wall time just before the request was sent."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": name}, "spec": spec}
    sent = time.time()
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return sent


def delete_episode(api: client.ApiClient, namespace: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def wait_no_pods(api: client.ApiClient, namespace: str, timeout: float = 180) -> None:
    """Until the namespace has no pods left (terminating ones included)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods still in {namespace} after {timeout:.0f} s")
        time.sleep(0.5)


# The operator under test -----------------------------------------------------------------------
@dataclass(frozen=True)
class ProcSample:
    """CPU seconds (user + system, 10 ms ticks) and memory (KiB) of a process at one moment."""

    at: float
    cpu_sec: float
    rss_kib: int
    hwm_kib: int


def proc_sample(pid: int) -> ProcSample:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After "pid (comm)": state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    memory = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            memory[key] = int(value.split()[0])
    return ProcSample(time.time(), cpu, memory.get("VmRSS", 0), memory.get("VmHWM", 0))


class Operator:
    """``episode-operator run`` through the harness, watching only this run's namespaces."""

    def __init__(
        self,
        kubeconfig: Path,
        root: Path,
        namespaces: str,
        label: str,
        *,
        program: tuple[str, ...] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.label = label
        self.data_dir = root / f"data-{label}"
        self.log_path = root / f"operator-{label}.log"
        # Requests as the operator's default sets them (requests = limits): what the figures measure.
        self.process = OperatorProcess(
            kubeconfig, self.data_dir, self.log_path, namespaces, program=program, env=env, cpu_request_fraction=None
        )
        self.started_at = 0.0
        self.healthy_after_sec = 0.0

    def __enter__(self) -> Operator:
        self.started_at = time.time()
        self.process.start()
        self.healthy_after_sec = time.time() - self.started_at
        return self

    def __exit__(self, *_: object) -> None:
        self.process.stop()

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def sample(self) -> ProcSample:
        return proc_sample(self.pid)

    def metrics(self) -> str:
        """The operator's Prometheus text (its phase histograms say where its time went)."""
        return metrics_text(self.process.metrics_port)

    def agent_log(self, namespace: str, name: str, turn: str, log: str = "agent") -> str | None:
        """A job log the operator kept for an Episode (``<data>/<ns>/<name>/<uid>/attempt-1/<turn>/logs``)."""
        for path in (self.data_dir / namespace / name).glob(f"*/attempt-1/{turn}/logs/{log}.txt"):
            return path.read_text()
        return None


def phase_means(metrics_text: str) -> dict[str, dict[str, float]]:
    """``{phase: {count, mean_ms}}`` from the operator's phase-duration histogram."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in metrics_text.splitlines():
        for suffix, target in (("_sum{", sums), ("_count{", counts)):
            prefix = "episode_operator_phase_duration_seconds" + suffix
            if line.startswith(prefix):
                labels, _, value = line[len(prefix) :].partition("} ")
                phase = labels.split('phase="', 1)[1].split('"', 1)[0]
                target[phase] = float(value)
    return {
        phase: {"count": counts[phase], "mean_ms": 1000 * sums[phase] / counts[phase]}
        for phase in sums
        if counts.get(phase)
    }


def other_operators(own: Sequence[int] = ()) -> list[str]:
    """Other ``episode-operator run`` processes on this machine (they share its CPUs), as ``pid (namespaces)``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        with contextlib.suppress(OSError):
            argv = [part.decode(errors="replace") for part in (entry / "cmdline").read_bytes().split(b"\0") if part]
            if not any(part.endswith("episode-operator") for part in argv) or "run" not in argv:
                continue
            if any("/bench/out/" in part for part in argv):
                continue  # this suite's own
            namespaces = [
                value for flag, value in zip(argv, [*argv[1:], ""], strict=True) if flag in ("--namespace", "-n")
            ] + [part.split("=", 1)[1] for part in argv if part.startswith("--namespace=")]
            found.append(f"{entry.name} ({','.join(namespaces) or 'all namespaces'})")
    return found


def machine(api: client.ApiClient) -> dict[str, Any]:
    """Where the figures come from."""
    memory_kib = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    version = client.VersionApi(api).get_code()
    node: Any = client.CoreV1Api(api).list_node().items[0]
    repo = Path(__file__).resolve().parents[2]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "operator"], cwd=repo, capture_output=True, text=True)
    sources = hashlib.sha256()
    for path in sorted((repo / "operator" / "episode_operator").rglob("*")):
        if path.suffix in (".py", ".sh"):
            sources.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes())
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "operator_sources_sha256": sources.hexdigest()[:16],
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "kernel": os.uname().release,
        "kubernetes": version.git_version,
        "container_runtime": node.status.node_info.container_runtime_version,
        "commit": commit.strip() + ("+operator-changes" if dirty.stdout.strip() else ""),
        "loadavg_at_start": os.getloadavg(),
    }


def api_requests(api: client.ApiClient) -> Counter[str]:
    """The API server's own request counters (``apiserver_request_total``) as ``VERB resource[/sub]``.

    They count every client's requests: a delta is the operator's only while nothing else runs.
    """
    answer = api.rest_client.pool_manager.request("GET", api.configuration.host + "/metrics")
    counts: Counter[str] = Counter()
    for line in answer.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
        labels = {key: raw.strip('"') for key, raw in labels.items()}
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[f"{labels.get('verb', '')} {resource}"] += int(float(value))
    return counts


def metrics_text(port: int) -> str:
    """A local operator's Prometheus text, from its /metrics on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
    return text


def operator_requests(metrics_text: str) -> Counter[str]:
    """The operator's own request counter (``episode_operator_api_requests_total``) as ``VERB resource``."""
    counts: Counter[str] = Counter()
    prefix = "episode_operator_api_requests_total{"
    for line in metrics_text.splitlines():
        if line.startswith(prefix):
            labels_text, _, value = line[len(prefix) :].rpartition("} ")
            labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
            labels = {key: raw.strip('"') for key, raw in labels.items()}
            counts[f"{labels['verb']} {labels['resource']}"] += int(float(value))
    return counts


CLUSTER_PIDS = Path("/var/lib/episode-operator/cluster/pids")


def daemon_cpu_sec(name: str) -> float | None:
    """CPU seconds (user + system) of one of hack/cluster's daemons (``kube-apiserver``, ``etcd``), from
    the pid it records; None if it is not running (or is not the process recorded)."""
    try:
        pid_text, start_text = (CLUSTER_PIDS / f"{name}.pid").read_text().split()
        fields = Path(f"/proc/{pid_text}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    if fields[19] != start_text:  # field 22, starttime: the pid was recycled
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def request_delta(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in sorted(after) if after[key] - before[key] > 0}


def wait_pods_gone(api: client.ApiClient, namespace: str, episode: str, timeout: float = 120) -> None:
    """Until no pod of one Episode is left."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace, label_selector=f"episode-operator.dev/episode={episode}").items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {episode} still in {namespace} after {timeout:.0f} s")
        time.sleep(0.3)


def apiserver_started(api: client.ApiClient) -> float | None:
    """When the API server process started (its ``process_start_time_seconds``): a change means a restart."""
    try:
        answer = api.rest_client.pool_manager.request("GET", api.configuration.host + "/metrics")
    except Exception:
        return None
    for line in answer.data.decode().splitlines():
        if line.startswith("process_start_time_seconds "):
            return float(line.split()[1])
    return None
