"""EpisodeSets on the real cluster: a dataset × attempts as child Episodes, at most `parallelism` active.

The acceptance test runs 20 task folders × 2 attempts at parallelism 4 with its own operator,
SIGKILLs that operator mid-run and starts another, and then checks the set's roll-up against
values computed here from the children, that no child was created twice or lost, and — two
independent ways — that never more than 4 children were active at once:

1. the API server's own order of writes: a watch on the namespace's Episodes, opened before
   the set exists, delivers every creation and every change to a terminal phase in etcd
   revision order; replaying it counts the active children exactly, trusting no clock and
   nothing the operator wrote about itself;
2. precise timestamps: each child's ``created-at`` annotation (stamped before the create call)
   and the set's ``observedFinishedAt`` (stamped after the listing that showed it finished)
   bound the child's active life; they are cross-checked against the API server's own
   ``creationTimestamp`` and the child's ``finishedAt`` (both whole seconds).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from episode_operator.api.episodeset_resource import SET_PLURAL as SETS
from episode_operator.api.vocabulary import parse_timestamp
from tests.cluster.conftest import SANDBOX_IMAGE, namespace_prefix, unwatched_namespace
from tests.cluster.harness import (
    EXAMPLES,
    GROUP,
    PLURAL,
    TERMINAL,
    VERSION,
    OperatorProcess,
    context_kubeconfig,
    folder_files,
    pods_of,
    read_episode,
)
from tests.cluster.test_gitops import Shell
from tests.gym_row_schema import check_rows

KUBECTL_EPISODE = str(Path(sys.executable).parent / "kubectl-episode")
SET_LABEL = "episode-operator.dev/set"
TASKS, ATTEMPTS, PARALLELISM = 20, 2, 4
INFRA_TASK = 19  # its image does not exist: both attempts end Ungraded (an outage)


# --- the dataset ----------------------------------------------------------------------------------
def designed_reward(index: int, attempt: int) -> float | None:
    """What the oracle of task ``index`` earns on ``attempt`` (None: an infrastructure failure)."""
    if index == INFRA_TASK:
        return None
    kind = index % 5
    return {
        0: 1.0,  # always solved
        1: 0.0,  # never
        2: 1.0 if attempt == 1 else 0.0,  # flaky: first attempt only
        3: 0.5,  # partial credit: never a success at threshold 1.0
        4: 1.0 if attempt == 2 else 0.0,  # flaky: second attempt only
    }[kind]


TASK_TOML = """schema_version = "1.4"

[task]
name = "set-test/{name}"

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 30.0

[environment]
docker_image = "{image}"
workdir = "/app"
"""


def write_dataset(root: Path) -> None:
    """20 tiny task folders; the oracle's reward depends on the task and on $EPISODE_SET_ATTEMPT."""
    for index in range(TASKS):
        folder = root / f"task-{index:02d}"
        (folder / "solution").mkdir(parents=True)
        (folder / "tests").mkdir()
        image = "episode-operator.local/does-not-exist:1" if index == INFRA_TASK else SANDBOX_IMAGE
        (folder / "task.toml").write_text(TASK_TOML.format(name=folder.name, image=image))
        (folder / "instruction.md").write_text(f"Earn the reward of task {index}.\n")
        first, second = (designed_reward(index, attempt) or 0.0 for attempt in (1, 2))
        (folder / "solution" / "solve.sh").write_text(
            f'#!/usr/bin/env bash\ncase "$EPISODE_SET_ATTEMPT" in 1) echo {first} ;; *) echo {second} ;; esac '
            "> /app/earned.txt\n"
        )
        (folder / "tests" / "test.sh").write_text(
            "#!/usr/bin/env bash\ncat /app/earned.txt > /logs/verifier/reward.txt 2>/dev/null "
            "|| echo 0 > /logs/verifier/reward.txt\n"
        )


# --- independent arithmetic -------------------------------------------------------------------------
def enumerated_pass_at_k(outcomes: list[bool], k: int) -> Fraction:
    """pass@k by enumerating every k-subset of the samples (no closed form)."""
    subsets = list(itertools.combinations(outcomes, k))
    return Fraction(sum(1 for subset in subsets if any(subset)), len(subsets))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals holding one instant; a start and an end at the same instant overlap."""
    points = sorted([(start, 0) for start, _ in intervals] + [(end, 1) for _, end in intervals])
    active = peak = 0
    for _, kind in points:
        active += 1 if kind == 0 else -1
        peak = max(peak, active)
    return peak


# --- watching the namespace ---------------------------------------------------------------------------
class EpisodeWatch:
    """Every Episode event of a namespace, in the API server's order, from before the set exists."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        assert listed["items"] == [], "the namespace must start without Episodes"
        self.resource_version: str = listed["metadata"]["resourceVersion"]
        self.events: list[tuple[str, str, str, str | None]] = []  # type, name, uid, phase
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    resource_version=self.resource_version,
                    timeout_seconds=5,
                    allow_watch_bookmarks=False,
                )
                for event in stream:
                    item = event["object"]
                    metadata = item["metadata"]
                    self.resource_version = metadata["resourceVersion"]
                    phase = (item.get("status") or {}).get("phase")
                    self.events.append((event["type"], metadata["name"], metadata["uid"], phase))
                    if self._stop.is_set():
                        break
        except (ApiException, urllib3.exceptions.HTTPError, ValueError) as error:
            self.error = error  # e.g. 410 Gone: the record would have a hole, the proof fails

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def peak_active(self) -> int:
        """Replay the events: created children count until their first terminal phase (or deletion)."""
        active: dict[str, bool] = {}
        peak = 0
        for kind, name, _, phase in self.events:
            if kind == "ADDED":
                active[name] = phase not in TERMINAL
            elif (kind == "MODIFIED" and active.get(name) and phase in TERMINAL) or kind == "DELETED":
                active[name] = False
            peak = max(peak, sum(active.values()))
        return peak


# --- helpers ------------------------------------------------------------------------------------------
def read_set(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, SETS, name
    )
    return result


def create_set(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EpisodeSet", "metadata": {"name": name}, "spec": spec}
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, body)


def children_of(api: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{SET_LABEL}={name}"
    )
    return list(listed["items"])


def wait_until(predicate: Any, what: str, operator: OperatorProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}\noperator log:\n{operator.log_tail()}"
        time.sleep(0.3)


def set_status(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = read_set(api, namespace, name).get("status") or {}
    return status


def kubectl_episode(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL_EPISODE, *args, "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def own_namespace(core: client.CoreV1Api, api_client: client.ApiClient) -> Iterator[str]:
    """A namespace only this test's own operator watches (the session's does not)."""
    with unwatched_namespace(core, api_client, f"eset-{namespace_prefix()}") as name:
        yield name


# --- acceptance -----------------------------------------------------------------------------------------
def test_dataset_of_20_tasks_times_2_attempts_at_parallelism_4(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, own_namespace: str, tmp_path: Path
) -> None:
    namespace, name = own_namespace, "acceptance"
    write_dataset(tmp_path / "dataset")
    glob = f"eset-{namespace_prefix()}*"
    first = OperatorProcess(kubeconfig, tmp_path / "data", tmp_path / "operator.log", glob)
    first.start()
    events = EpisodeWatch(api_client, namespace)
    second: OperatorProcess | None = None
    try:
        created = kubectl_episode(
            "eval",
            str(tmp_path / "dataset"),
            "-n",
            namespace,
            "--name",
            name,
            "--attempts",
            str(ATTEMPTS),
            "--parallelism",
            str(PARALLELISM),
            "--queue-name",
            "evals",
            "--outage-retries",
            "0",
            kubeconfig=kubeconfig,
        )
        assert created.returncode == 0, created.stdout + created.stderr
        assert f"episodeset/{name} created in {namespace}: 20 task(s) × 2 attempt(s)" in created.stdout

        # Kill the operator mid-run: some children finished, some active, most not yet created.
        wait_until(lambda: set_status(api_client, namespace, name).get("finished", 0) >= 10, "10 finished", first)
        first.kill()
        at_kill = set_status(api_client, namespace, name)
        children_at_kill = len(children_of(api_client, namespace, name))
        assert 10 <= at_kill["finished"] < 40 and children_at_kill < 40, at_kill
        time.sleep(3)  # children finish while no operator runs
        second = OperatorProcess(kubeconfig, tmp_path / "data", tmp_path / "operator.log", glob)
        second.start()
        wait_until(
            lambda: bool(set_status(api_client, namespace, name).get("completionTime")),
            "the set completes",
            second,
            400,
        )
    finally:
        events.stop()
        first.stop()
        if second is not None:
            second.stop()
    item = read_set(api_client, namespace, name)
    status, uid = item["status"], item["metadata"]["uid"]
    children = {child["metadata"]["name"]: child for child in children_of(api_client, namespace, name)}

    # Every (task, attempt) has exactly one child, created once, owned by the set, finished once.
    expected_names = {f"{name}-{index}-{attempt}" for index in range(TASKS) for attempt in (1, 2)}
    assert set(children) == expected_names
    assert events.error is None, f"the watch broke: {events.error}"
    added = [event for event in events.events if event[0] == "ADDED"]
    assert sorted(event[1] for event in added) == sorted(expected_names)  # no child created twice
    assert [event for event in events.events if event[0] == "DELETED"] == []  # none lost or replaced
    for child_name, child in children.items():
        metadata, child_status = child["metadata"], child["status"]
        assert [owner["uid"] for owner in metadata["ownerReferences"]] == [uid]
        assert metadata["uid"] == next(event[2] for event in added if event[1] == child_name)
        index, attempt = (int(part) for part in child_name.rsplit("-", 2)[1:])
        labels = metadata["labels"]
        assert (labels["episode-operator.dev/task-index"], labels["episode-operator.dev/set-attempt"]) == (
            str(index),
            str(attempt),
        )
        assert labels["episode-operator.dev/task"] == f"task-{index:02d}"
        assert labels["kueue.x-k8s.io/queue-name"] == "evals"
        assert child_status["phase"] in TERMINAL and len(child_status["attempts"]) == 1, child_status
        reward = designed_reward(index, attempt)
        if reward is None:
            assert (child_status["outcome"], child_status["failureKind"]) == ("Ungraded", "outage:image_pull")
        else:
            assert (child_status["outcome"], child_status["reward"]) == ("Graded", reward), child_name

    # The roll-up, computed here from the children alone.
    graded: dict[int, list[float]] = {index: [] for index in range(TASKS)}
    for child_name, child in children.items():
        if child["status"]["outcome"] == "Graded":
            graded[int(child_name.rsplit("-", 2)[1])].append(child["status"]["reward"])
    rewards = [reward for values in graded.values() for reward in values]
    mean = sum(rewards) / len(rewards)
    # pass@k counts an Ungraded attempt as a miss (it never solved the task), so the task whose
    # image never pulls is in the table with 0 successes of 2, not left out of it.
    solved: dict[int, list[bool]] = {index: [] for index in range(TASKS)}
    for child_name, child in children.items():
        outcome = child["status"]["outcome"]
        success = outcome == "Graded" and child["status"]["reward"] >= 1.0
        solved[int(child_name.rsplit("-", 2)[1])].append(success)
    passes = {k: [enumerated_pass_at_k(values, k) for values in solved.values() if len(values) >= k] for k in (1, 2)}
    assert (len(rewards), len(passes[1]), len(passes[2])) == (38, 20, 20)
    pass_at = {k: float(sum(values) / len(values)) for k, values in passes.items()}
    # …and, as a check of the check, from the design of the dataset.
    assert mean == pytest.approx((4 * 1.0 + 4 * 0.0 + 4 * 0.5 + 4 * 0.5 + 3 * 0.5) / 19)
    assert pass_at == {1: pytest.approx(7.5 / 20), 2: pytest.approx(11 / 20)}
    assert (status["phase"], status["progress"], status["created"], status["active"]) == ("Succeeded", "40/40", 40, 0)
    assert status["meanReward"] == pytest.approx(mean, abs=1e-12)
    assert [(row["k"], row["value"], row["tasks"], row.get("ungraded", 0)) for row in status["passAtK"]] == [
        (1, pytest.approx(pass_at[1], abs=1e-12), 20, 2),
        (2, pytest.approx(pass_at[2], abs=1e-12), 20, 2),
    ]
    assert status["outcomes"] == {"graded": 38, "masked": 0, "terminalFailure": 0, "ungraded": 2}
    assert status["phases"] == {"pending": 0, "running": 0, "succeeded": 38, "failed": 2}
    for task in status["tasks"]:
        values = graded[task["index"]]
        assert (task["name"], task["graded"]) == (f"task-{task['index']:02d}", len(values))
        assert task.get("meanReward") == (pytest.approx(sum(values) / len(values)) if values else None)

    # Never more than 4 active: (1) from the API server's order of writes.
    assert events.peak_active() == PARALLELISM
    # (2) from precise timestamps, checked against the API server's and the children's own clocks.
    records = {record["name"]: record for task in status["tasks"] for record in task["children"]}
    assert set(records) == expected_names
    intervals = []
    for child_name, child in children.items():
        created_at = parse_timestamp(child["metadata"]["annotations"]["episode-operator.dev/created-at"])
        observed = parse_timestamp(records[child_name]["observedFinishedAt"])
        created_by_server = parse_timestamp(child["metadata"]["creationTimestamp"])
        finished_by_child = parse_timestamp(child["status"]["finishedAt"])
        assert math.floor(created_at) <= created_by_server <= created_at + 5, child_name
        assert finished_by_child <= observed <= finished_by_child + 60, child_name
        assert records[child_name]["createdAt"] == child["metadata"]["annotations"]["episode-operator.dev/created-at"]
        intervals.append((created_at, observed))
    assert max_overlap(intervals) == PARALLELISM

    # The set's rows, Gym's format.
    out = tmp_path / "export"
    exported = kubectl_episode(
        "export", "--set", name, "-n", namespace, "--output-dir", str(out), kubeconfig=kubeconfig
    )
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    failures = [json.loads(line) for line in (out / "rollouts_failures.jsonl").read_text().splitlines()]
    check_rows(rows, failures)
    assert (len(rows), len(failures)) == (38, 2)
    assert sorted((row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows + failures) == sorted(
        (index, attempt - 1) for index in range(TASKS) for attempt in (1, 2)
    )
    assert sum(row["reward"] for row in rows) / len(rows) == pytest.approx(mean)

    # Deleting the set deletes its children.
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, SETS, name)
    deadline = time.monotonic() + 90
    while children_of(api_client, namespace, name):
        assert time.monotonic() < deadline, "children outlived their set"
        time.sleep(0.5)


# --- the shared operator --------------------------------------------------------------------------------
def without_resources(files: dict[str, str]) -> dict[str, str]:
    """A task folder without [environment] cpus and memory: the test node has two CPUs for every session."""
    toml = re.sub(r"(?m)^(cpus|memory_mb) = .*\n", "", files["task.toml"])
    return {**files, "task.toml": toml}


def hello_task() -> dict[str, Any]:
    return {"inline": {"files": without_resources(folder_files(EXAMPLES / "hello"))}}


def write_folder(files: dict[str, str], root: Path) -> Path:
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(content)
    return root


def test_deleting_a_set_deletes_its_running_children_and_their_pods(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    spec = {
        "dataset": {"tasks": [{"name": f"sleeper-{index}", **hello_task()} for index in range(3)]},
        "agent": {"kind": "command", "command": "sleep 600"},
        "parallelism": 2,
    }
    create_set(api_client, namespace, "doomed", spec)
    names = ["doomed-0-1", "doomed-1-1"]
    wait_until(lambda: all(pods_of(core, namespace, child) for child in names), "two children's pods", operator)
    # The set's own count is its answer: it has seen both run and holds the third back.
    wait_until(lambda: set_status(api_client, namespace, "doomed").get("active") == 2, "two active", operator)
    assert sorted(child["metadata"]["name"] for child in children_of(api_client, namespace, "doomed")) == names
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, SETS, "doomed")
    wait_until(
        lambda: (
            not children_of(api_client, namespace, "doomed")
            and not any(pods_of(core, namespace, child) for child in names)
        ),
        "children and pods gone",
        operator,
        timeout=90,
    )


def test_suspend_holds_the_set_and_its_children_and_kueue_labels_reach_the_pods(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """The dataset comes from packed ConfigMaps by a label selector; suspended before and during the run."""
    hello = without_resources(folder_files(EXAMPLES / "hello"))
    for stem in ("beta", "alpha"):
        folder = write_folder({**hello, "instruction.md": f"Greet ({stem}).\n"}, tmp_path / stem)
        packed = kubectl_episode("pack", str(folder), "-n", namespace, kubeconfig=kubeconfig)
        assert packed.returncode == 0, packed.stderr
    command = "echo run >> /app/runs.txt; sleep 8; echo 'Hello, world!' > /app/hello.txt"
    spec = {
        "dataset": {"selector": {"matchExpressions": [{"key": "episode-operator.dev/task", "operator": "Exists"}]}},
        "agent": {"kind": "command", "command": command},
        "parallelism": 2,
        "queueName": "evals",
        "suspend": True,
    }
    create_set(api_client, namespace, "held", spec)
    sets = client.CustomObjectsApi(api_client)

    def patch(suspend: bool) -> None:
        sets.patch_namespaced_custom_object(GROUP, VERSION, namespace, SETS, "held", {"spec": {"suspend": suspend}})

    wait_until(lambda: set_status(api_client, namespace, "held").get("reason") == "Suspended", "held", operator)
    assert children_of(api_client, namespace, "held") == []
    assert set_status(api_client, namespace, "held")["phase"] == "Pending"
    patch(False)
    children = ("held-0-1", "held-1-1")
    wait_until(lambda: all(pods_of(core, namespace, child) for child in children), "the children's pods", operator)
    status = set_status(api_client, namespace, "held")
    # Selected ConfigMaps are ordered by task ID (their episode-operator.dev/task label).
    assert [task["name"] for task in status["tasks"]] == ["alpha", "beta"]
    assert all(task["configMap"].startswith(f"task-{task['name']}-") for task in status["tasks"])
    for child in children:
        pods = core.list_namespaced_pod(namespace, label_selector=f"episode-operator.dev/episode={child}").items
        assert pods and all(pod.metadata.labels["kueue.x-k8s.io/queue-name"] == "evals" for pod in pods)
    for child in children_of(api_client, namespace, "held"):
        assert child["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "evals"
    patch(True)  # e.g. a queue preempting the whole set mid-turn

    def held() -> bool:
        listed = children_of(api_client, namespace, "held")
        return len(listed) == 2 and all(
            c["spec"].get("suspend")
            and c["metadata"]["annotations"].get("episode-operator.dev/suspended-by-set") == "true"
            and (c.get("status") or {}).get("phase") == "Pending"
            and not pods_of(core, namespace, c["metadata"]["name"])
            for c in listed
        )

    wait_until(held, "active children suspended, their pods gone", operator)
    patch(False)
    wait_until(
        lambda: bool(set_status(api_client, namespace, "held").get("completionTime")),
        "the set completes",
        operator,
        180,
    )
    final = set_status(api_client, namespace, "held")
    assert (final["phase"], final["progress"], final["meanReward"]) == ("Succeeded", "2/2", 1.0), final
    for child in children_of(api_client, namespace, "held"):
        assert not child["spec"].get("suspend")
        assert "episode-operator.dev/suspended-by-set" not in (child["metadata"].get("annotations") or {})


def test_bad_sets_end_in_a_clear_status_and_the_operator_keeps_serving(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    good_task = hello_task()
    bad = {
        "empty": {"dataset": {"tasks": []}, "agent": {"kind": "oracle"}},
        "missing-configmap": {"dataset": {"tasks": [{"configMap": {"name": "nope"}}]}, "agent": {"kind": "oracle"}},
        "no-match": {"dataset": {"selector": {"matchLabels": {"dataset": "none"}}}, "agent": {"kind": "oracle"}},
        "twice": {
            "dataset": {"tasks": [{"name": "same", **good_task}, {"name": "same", **good_task}]},
            "agent": {"kind": "oracle"},
        },
        "bad-selector": {"dataset": {"selector": {"matchLabels": {"a": "not a value!"}}}, "agent": {"kind": "oracle"}},
    }
    for name, spec in bad.items():
        create_set(api_client, namespace, name, spec)
    with pytest.raises(ApiException) as zero:
        create_set(
            api_client,
            namespace,
            "zero",
            {"dataset": {"tasks": [good_task]}, "agent": {"kind": "oracle"}, "parallelism": 0},
        )
    assert zero.value.status == 422 and "spec.parallelism" in zero.value.body

    expected = {
        "empty": ("InvalidSpec", "spec.dataset is empty"),
        "missing-configmap": ("DatasetUnavailable", f"configmap {namespace}/nope not found"),
        "no-match": ("DatasetUnavailable", "matches no ConfigMap"),
        "twice": ("DatasetUnavailable", "task ID 'same' appears twice"),
        "bad-selector": ("DatasetUnavailable", "spec.dataset.selector"),
    }
    for name, (reason, fragment) in expected.items():
        wait_until(
            lambda name=name: bool(set_status(api_client, namespace, name).get("completionTime")),
            f"{name} fails",
            operator,
            timeout=90,
        )
        status = set_status(api_client, namespace, name)
        assert (status["phase"], status["reason"]) == ("Failed", reason), status
        assert fragment in status["message"], status["message"]
        assert children_of(api_client, namespace, name) == []
    create_set(api_client, namespace, "fine", {"dataset": {"tasks": [good_task]}, "agent": {"kind": "oracle"}})
    wait_until(
        lambda: set_status(api_client, namespace, "fine").get("phase") == "Succeeded", "the good set succeeds", operator
    )


def test_eval_command_packs_a_nested_dataset_and_follows_it(
    kubeconfig: Path, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    dataset = tmp_path / "nested"
    for relative in ("easy/hello", "hard/deeper/ledger", ".hidden/skipped"):
        source = EXAMPLES / ("three-step-ledger" if "ledger" in relative else "hello")
        write_folder(without_resources(folder_files(source)), dataset / relative)
    result = kubectl_episode(
        "eval", str(dataset), "-n", namespace, "--attempts", "2", "--parallelism", "2", "--wait", kubeconfig=kubeconfig
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 task(s) × 2 attempt(s)" in result.stdout
    assert "Succeeded: 4/4 finished, mean reward 1 over 4 graded; pass@1 1 (2 tasks), pass@2 1 (2 tasks)" in (
        " ".join(result.stdout.split())
    )
    empty = kubectl_episode(
        "eval", str(tmp_path / "nested" / "easy" / "hello" / "solution"), "-n", namespace, kubeconfig=kubeconfig
    )
    assert empty.returncode == 1 and "no task folders" in empty.stderr, empty.stderr
    (dataset / "easy" / "hello" / "task.toml").write_text("[oops\n")
    refused = kubectl_episode("eval", str(dataset), "-n", namespace, kubeconfig=kubeconfig)
    assert refused.returncode == 1 and "nothing was created" in refused.stderr and "Traceback" not in refused.stderr
    assert "task.toml" in refused.stderr


# --- datasets by name, reruns (README) -----------------------------------------------------------------------------
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(name: str) -> str:
    """The README's ``sh`` block between ``<!-- BEGIN name -->`` and ``<!-- END name -->``, as printed."""
    return README.read_text().split(f"<!-- BEGIN {name} -->\n```sh\n")[1].split("```\n<!-- END")[0]


def test_the_readme_evaluates_a_dataset_by_name_as_printed(
    kubeconfig: Path, namespace: str, api_client: client.ApiClient, operator: OperatorProcess, tmp_path: Path
) -> None:
    """README's "eval-by-name" block: examples/registry.json's examples@1.0, packed as `pack` packs, run as a set."""
    shell = Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace}), tmp_path / "repo")
    transcript = " ".join(shell(readme_block("eval-by-name"), timeout=900).split())
    assert "2 task(s) × 2 attempt(s)" in transcript, transcript
    assert "Succeeded: 4/4 finished, mean reward 1 over 4 graded" in transcript, transcript
    [episode_set] = client.CustomObjectsApi(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, SETS)[
        "items"
    ]
    annotations = episode_set["metadata"]["annotations"]
    assert annotations == {"episode-operator.dev/dataset": "examples@1.0", "episode-operator.dev/registry": "examples"}
    assert [task["name"] for task in episode_set["status"]["tasks"]] == ["hello", "report-artifact"]
    # A version the registry does not have: refused naming the file and the key, nothing created.
    refused = kubectl_episode(
        "eval",
        "examples@2.0",
        "--registry",
        str(tmp_path / "repo" / "examples"),
        "-n",
        namespace,
        kubeconfig=kubeconfig,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "registry.json: dataset 'examples' version '2.0': not in the registry (its versions: 0.9, 1.0)" in (
        refused.stderr
    )
    assert (
        len(client.CustomObjectsApi(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, SETS)["items"])
        == 1
    )


# The first attempt's agent waits until the test deletes its pod (an outage, with no retry left: Ungraded);
# the second attempt's, and a rerun's ($EPISODE_SET_RERUN), write the greeting at once.
WAITS_FIRST_TIME = (
    '[ -n "${EPISODE_SET_RERUN:-}" ] || [ "$EPISODE_SET_ATTEMPT" = 2 ] || sleep 600; '
    "echo 'Hello, world!' > /app/hello.txt"
)


def test_the_readme_reruns_the_ungraded_children_of_a_set_as_printed(
    kubeconfig: Path,
    namespace: str,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    """README's "rerun" block against the set it names: a child lost to an outage is re-run in place, the
    other kept; the set's status, pass@k and the export are the re-run child's, the replaced one listed."""
    spec = {
        "dataset": {"tasks": [{"name": "hello", **hello_task()}]},
        "agent": {"kind": "command", "command": WAITS_FIRST_TIME},
        "attempts": 2,
        "parallelism": 2,
        "template": {"retries": {"outages": 0}},
    }
    create_set(api_client, namespace, "nightly", spec)

    def agent_runs() -> bool:
        try:
            status = read_episode(api_client, namespace, "nightly-0-1").get("status") or {}
        except ApiException:
            return False
        return any(turn.get("stage") == "agent" for turn in status.get("turns") or [])

    wait_until(agent_runs, "nightly-0-1's agent runs", operator, timeout=300)
    for pod in pods_of(core, namespace, "nightly-0-1"):
        core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    wait_until(
        lambda: bool(set_status(api_client, namespace, "nightly").get("completionTime")),
        "the set finishes with one outage",
        operator,
        timeout=300,
    )
    before = set_status(api_client, namespace, "nightly")
    assert (before["outcomes"]["ungraded"], before["outcomes"]["graded"], before["passAtK"][0]["value"]) == (1, 1, 0.5)

    shell = Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace}), tmp_path / "repo")
    transcript = shell(readme_block("rerun"), timeout=900)
    assert "episodeset/nightly rerun generation 1: re-running 1 child(ren): nightly-0-1" in transcript, transcript
    assert "Succeeded: 2/2 finished, mean reward 1 over 2 graded" in " ".join(transcript.split()), transcript
    # `kubectl get episodes -l …,episode-operator.dev/set-replaced` lists the replaced child only.
    listed = [line.split()[0] for line in transcript.splitlines() if line.startswith("nightly-")]
    assert listed == ["nightly-0-1"], transcript
    after = set_status(api_client, namespace, "nightly")
    assert (after["outcomes"]["ungraded"], after["outcomes"]["graded"], after["passAtK"][0]["value"]) == (0, 2, 1.0)
    assert [(child["name"], child["outcome"], child["rerun"]) for child in after["tasks"][0]["replaced"]] == [
        ("nightly-0-1", "Ungraded", 1)
    ]
    assert [record["generation"] for record in after["reruns"]] == [1]
    assert sorted(child["name"] for child in after["tasks"][0]["children"]) == ["nightly-0-1-r1", "nightly-0-2"]
    # The export of the set is its counted children: the re-run one, not the one it replaced.
    rows = [json.loads(line) for line in (tmp_path / "repo" / "results" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(row["_ng_rollout_index"] for row in rows) == [0, 1] and all(row["reward"] == 1.0 for row in rows)
    assert (tmp_path / "repo" / "results" / "rollouts_failures.jsonl").read_text() == ""
    # Asked again: nothing matches any more, nothing is changed.
    again = kubectl_episode("rerun", "nightly", "--outcome", "Ungraded", "-n", namespace, kubeconfig=kubeconfig)
    assert again.returncode == 1 and "no finished child matches; nothing to re-run" in again.stderr, again.stderr
    assert read_set(api_client, namespace, "nightly")["spec"]["rerun"]["generation"] == 1
