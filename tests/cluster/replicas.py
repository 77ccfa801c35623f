"""Several operator replicas as local processes (pids recorded, killed by pid), sharing the Episodes out.

Each replica is ``episode-operator run`` with ``--lease-namespace`` (the test's namespace holds
the member Leases too), a group of the test's own and a name (``r0``, ``r1``…); they share one data
directory, which is the local store working across processes of one machine. Which replica
drives an Episode is read from the Episode's ``episode-operator.dev/driver`` annotation.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.cluster.conftest import CLUSTER_DIR, SANDBOX_IMAGE
from tests.cluster.harness import GROUP, TERMINAL, VERSION, OperatorProcess, read_episode

DRIVER = "episode-operator.dev/driver"
ROUTE = "episode-operator.dev/replica"
# hack/cluster's API server audits pod deletions and Episode writes here (the User-Agent names the replica).
AUDIT_LOG = CLUSTER_DIR / "logs" / "audit.log"
# Short leases: a SIGKILLed driver's Episodes are taken over within ~5 s, so a chaos run stays short.
FAST_LEASES = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")


@dataclass
class Replicas:
    """Named replicas of one operator, watching ``namespace``."""

    kubeconfig: Path
    root: Path
    namespace: str
    names: tuple[str, ...]
    leases: tuple[str, ...] = FAST_LEASES
    extra_args: tuple[str, ...] = ()
    processes: dict[str, OperatorProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.names:
            args = (
                "--lease-namespace", self.namespace, "--replica-group", "chaos", "--replica-name", name,
                *self.leases, *self.extra_args,
            )  # fmt: skip
            self.processes[name] = OperatorProcess(
                self.kubeconfig, self.root / "data", self.root / f"{name}.log", self.namespace, extra_args=args
            )

    def start(self, *names: str) -> None:
        for name in names:
            self.processes[name].start()

    def start_all(self) -> None:
        self.start(*self.names)

    def stop(self, *names: str) -> None:
        for name in names or self.names:
            self.processes[name].stop()

    def kill(self, name: str) -> None:
        self.processes[name].kill()

    def alive(self, name: str) -> bool:
        process = self.processes[name].process
        return process is not None and process.poll() is None

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"--- {name} ---\n{process.log_tail(lines)}" for name, process in self.processes.items())


def route_of(body: dict[str, Any]) -> str | None:
    """The replica whose watch sees an object (its route label), if any."""
    return (body["metadata"].get("labels") or {}).get(ROUTE) or None


def driver_of(body: dict[str, Any]) -> str | None:
    """The replica name in an object's claim (``<name>.<incarnation>``), if any."""
    holder = (body["metadata"].get("annotations") or {}).get(DRIVER)
    return str(holder).rsplit(".", 1)[0] if holder else None


def objects(api: client.ApiClient, namespace: str, plural: str) -> list[dict[str, Any]]:
    listed: dict[str, Any] = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, plural
    )  # type: ignore[assignment]
    return list(listed["items"])


def events_of(core: client.CoreV1Api, namespace: str, name: str) -> list[tuple[str, str, int]]:
    """(reason, message, count) of every Event on an object."""
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [(event.reason, event.message, event.count or 1) for event in events]


def duplicated_events(core: client.CoreV1Api, namespace: str, name: str) -> list[tuple[str, str]]:
    """Events of the operator's posted more than once (two objects, or a count above 1)."""
    seen: dict[tuple[str, str], int] = {}
    for reason, message, count in events_of(core, namespace, name):
        seen[(reason, message)] = seen.get((reason, message), 0) + count
    return [key for key, count in seen.items() if count > 1]


def audit_trail(namespace: str, prefixes: list[str]) -> list[str]:
    """Who deleted a pod or wrote an Episode named with one of ``prefixes``, and when (the API
    server's audit log): what a failing test says about who acted on what."""
    found = []
    with contextlib.suppress(FileNotFoundError), AUDIT_LOG.open() as lines:
        for line in lines:
            entry = json.loads(line)
            ref = entry.get("objectRef", {})
            if ref.get("namespace") == namespace and any(ref.get("name", "").startswith(p) for p in prefixes):
                what = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
                found.append(
                    f"{entry['requestReceivedTimestamp']} {entry['verb']} {what} {ref['name']}"
                    f" by {entry.get('userAgent')}: {entry.get('responseStatus', {}).get('code')}"
                )
    return found


def wait_for(predicate: Callable[[], Any], what: str, replicas: Replicas, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} after {timeout:.0f} s\n{replicas.logs()}"
        time.sleep(0.2)
    return value


@contextlib.contextmanager
def running(replicas: Replicas) -> Iterator[Replicas]:
    replicas.start_all()
    try:
        yield replicas
    finally:
        replicas.stop()


# --- a task that counts its jobs ------------------------------------------------------------------
def counting_task(steps: int, *, solve: str = "sleep 3", setup: str | None = None) -> dict[str, str]:
    """``steps`` steps; step k's solve.sh appends ``k`` to /app/turns.txt (after ``solve``); its verifier
    gives 1 only if the file then holds exactly 1…k, one line each: a job run twice or skipped gives 0."""
    lines = [
        'schema_version = "1.4"',
        'multi_step_reward_strategy = "mean"',
        "[environment]",
        f'docker_image = "{SANDBOX_IMAGE}"',
        'workdir = "/app"',
    ]
    files = {"instruction.md": "Count the steps.\n"}
    for step in range(1, steps + 1):
        lines += ["[[steps]]", f'name = "s{step}"']
        files[f"steps/s{step}/instruction.md"] = f"Step {step}.\n"
        files[f"steps/s{step}/solution/solve.sh"] = f"{solve}\necho {step} >> /app/turns.txt\n"
        expected = "\\n".join(str(k) for k in range(1, step + 1))
        files[f"steps/s{step}/tests/test.sh"] = (
            f'if [ "$(cat /app/turns.txt)" = "$(printf \'{expected}\')" ]; then echo 1; else echo 0; fi '
            "> /logs/verifier/reward.txt\n"
        )
        if setup is not None:
            files[f"steps/s{step}/workdir/setup.sh"] = f"{setup}\necho {step} >> /app/setups.txt\n"
    files["task.toml"] = "\n".join(lines) + "\n"
    return files


def status_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return read_episode(api, namespace, name).get("status") or {}


def finished(api: client.ApiClient, namespace: str, name: str) -> bool:
    return status_of(api, namespace, name).get("phase") in TERMINAL


def agent_pod(core: client.CoreV1Api, namespace: str, episode: str) -> client.V1Pod | None:
    pods = core.list_namespaced_pod(namespace, label_selector=f"episode-operator.dev/episode={episode}").items
    agents = [pod for pod in pods if (pod.metadata.labels or {}).get("episode-operator.dev/role") == "agent"]
    return agents[0] if agents else None


def agent_pod_uid(core: client.CoreV1Api, namespace: str, episode: str) -> str | None:
    pod = agent_pod(core, namespace, episode)
    return pod.metadata.uid if pod else None


def assert_counted_once(status: dict[str, Any], steps: int) -> None:
    """Succeeded, attempt 1, every turn's verifier saw exactly its jobs."""
    assert (status["phase"], status["attempt"]) == ("Succeeded", 1), status
    assert [turn["reward"] for turn in status["turns"]] == [1.0] * steps, status["turns"]
    assert status["reward"] == 1.0
