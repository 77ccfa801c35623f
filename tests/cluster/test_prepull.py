"""Pre-pulled images on the real cluster (docs/prepull.md): an EpisodeSet's DaemonSet pulls an image the node
does not have yet (a fresh tag pushed to hack/cluster's registry), the set's status shows it on its way and
then on every node, the children wait for it, start with it already on the node (the kubelet says so) and prefer
that node; an image that cannot be pulled is named in the status and an Event, and the children start anyway,
long before the wait is over; the DaemonSet is gone once the set completes.

Every status the set goes through is read from a watch on it (not sampled), so "the children waited" is the
record of what the operator wrote, not of when the test happened to look.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from tests.cluster.conftest import SANDBOX_IMAGE
from tests.cluster.harness import GROUP, PLURAL, VERSION, OperatorProcess, install_crd, read_episode
from tests.cluster.test_builds import REGISTRY
from tests.cluster.test_node_images import ctr
from tests.cluster.test_warm_pools import (
    SETS,
    agent_pod_record,
    create_set,
    custom,
    exec_main,
    set_status,
    task_files,
    this_checkouts_crd,  # noqa: F401 - the autouse fixture keeping this checkout's CRDs (spec.prePull)
    wait_until,
    watched_namespace,
)

PREPULL_LABEL = "episode-operator.dev/prepull"
HOSTNAME_LABEL = "kubernetes.io/hostname"
LENT_BUSYBOX = "/episode-operator-prepull/busybox"
# What runs in a pre-pull container, asked with the lent busybox alone (the image's own tools are not trusted).
PROBE = "{busybox} tr '\\0' ' ' < /proc/1/cmdline; echo; {busybox} id -u; {busybox} ls /var/run/secrets 2>&1"
WAIT_SEC = 240  # longer than any wait below: a child started before it is not the wait running out

# The agent waits for /tmp/go when told (the test reads its pod meanwhile), then earns the reward.
AGENT = (
    'if [ -n "${WAIT_FOR_GO:-}" ]; then i=0; while [ ! -e /tmp/go ] && [ $i -lt 1000 ]; do sleep 0.2; i=$((i+1)); '
    "done; fi; echo 1 > /app/earned.txt"
)


def set_spec(image: str, *, wait_for_go: bool, extra: list[str] | None = None) -> dict[str, Any]:
    env = [{"name": "WAIT_FOR_GO", "value": "1"}] if wait_for_go else []
    return {
        "dataset": {"tasks": [{"name": "t0", "inline": {"files": task_files("t0", image=image)}}]},
        "agent": {"kind": "command", "command": AGENT, "env": env},
        "attempts": 2,
        "parallelism": 2,
        "prePull": {"waitSec": WAIT_SEC, "images": extra or []},
    }


def on_node(image: str) -> bool:
    """Whether the node's containerd holds the image (hack/cluster's one node)."""
    listed = ctr("images", "ls", "-q")
    assert listed.returncode == 0, listed.stderr
    return image in listed.stdout.split()


@pytest.fixture
def fresh_image() -> Iterator[str]:
    """A new name of the sandbox image that no node has: pushed to the cluster's registry from the node's containerd
    (tagged, pushed, the name removed again: the node keeps the layers, not the image), deleted after.

    A repository of its own, not a tag: the registry deletes a manifest by digest, with every tag of it in its
    repository, and every fresh image has the sandbox image's digest — one test's cleanup took the image of
    another running beside it (CI: `not found` while it pulled)."""
    image = f"{REGISTRY}/episode-operator/prepull-test-{uuid.uuid4().hex[:12]}:fresh"
    for step in (("tag", SANDBOX_IMAGE, image), ("push", "--plain-http", image), ("rm", image)):
        done = ctr("images", *step)
        assert done.returncode == 0, f"ctr images {' '.join(step)}: {done.stderr}"
    try:
        yield image
    finally:
        ctr("images", "rm", image)
        subprocess.run(["skopeo", "delete", "--tls-verify=false", f"docker://{image}"], timeout=120, check=False)


@pytest.fixture
def namespace(core: client.CoreV1Api, operator: OperatorProcess, request: pytest.FixtureRequest) -> Iterator[str]:
    with watched_namespace(core, request.node.name.removeprefix("test_")[:30]) as name:
        yield name


@contextlib.contextmanager
def statuses_of(api: client.ApiClient, namespace: str, name: str) -> Iterator[list[dict[str, Any]]]:
    """Every status of the set the API server hands out while the block runs (a watch in a thread)."""
    seen: list[dict[str, Any]] = []
    watcher = watch.Watch()

    def follow() -> None:
        with contextlib.suppress(Exception):  # the watch ends when the test stops it
            for event in watcher.stream(
                custom(api).list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                SETS,
                field_selector=f"metadata.name={name}",
                timeout_seconds=600,
            ):
                seen.append(dict(event["object"].get("status") or {}))

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        watcher.stop()


def daemon_set_gone(apps: client.AppsV1Api, namespace: str, name: str) -> bool:
    try:
        apps.read_namespaced_daemon_set(f"{name}-prepull", namespace)
    except ApiException as error:
        return error.status == 404
    return False


def kubelet_said(core: client.CoreV1Api, namespace: str, pod: str, reason: str) -> list[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod},reason={reason}")
    return [event.message or "" for event in events.items]


def prepull_pods(core: client.CoreV1Api, namespace: str, name: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"{PREPULL_LABEL}={name}").items)


def finished_set(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    status = set_status(api, namespace, name)
    return status if status.get("completionTime") else None


# --- the tests ------------------------------------------------------------------------------------------
def test_a_fresh_image_is_pulled_before_the_children_start_and_they_prefer_its_node(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    fresh_image: str,
) -> None:
    name = "pulled"
    assert not on_node(fresh_image), "the fresh tag is on the node already: the test would prove nothing"
    with statuses_of(api_client, namespace, name) as seen:
        install_crd(api_client)  # again: another checkout's tests may have installed theirs (no spec.prePull)
        create_set(api_client, namespace, name, set_spec(fresh_image, wait_for_go=True))
        ready = wait_until(
            lambda: (
                (set_status(api_client, namespace, name).get("prePull") or {}).get("ready") == "1/1"
                and set_status(api_client, namespace, name)["prePull"]
            ),
            "the image is on every node",
            operator,
        )
        children = [f"{name}-0-1", f"{name}-0-2"]
        pods = {
            child: wait_until(
                lambda child=child: agent_pod_record(api_client, namespace, child), f"{child}'s agent pod", operator
            )["name"]
            for child in children
        }
        # Read the agent pods while their agents wait, then let them finish.
        agent_pods = {child: core.read_namespaced_pod(pod, namespace) for child, pod in pods.items()}
        for pod in pods.values():
            exec_main(core, namespace, pod, "touch /tmp/go")
        done = wait_until(lambda: finished_set(api_client, namespace, name), "the set completes", operator, 300)

    assert on_node(fresh_image), "the node holds the fresh image"
    row = ready["images"][0]
    assert (row["image"], row["nodes"], row["of"]) == (fresh_image, 1, 1), ready
    assert ready["daemonSet"] == f"{name}-prepull"
    # The statuses the operator wrote: first the image on its way and the children held, then the image in.
    pulls = [status["prePull"] for status in seen if status.get("prePull")]
    waiting = [p for p in pulls if p["images"] and p["images"][0]["nodes"] == 0]
    assert waiting, f"no status showed the image on its way: {pulls}"
    assert any("2 children wait for their images" in (p.get("message") or "") for p in waiting), waiting
    assert not any(status.get("created") for status in seen if status.get("prePull") in waiting), (
        "a child was created while its image was on its way"
    )

    # The DaemonSet pulled it; the children found it there (the kubelet's own words).
    pulled = [
        message
        for event in core.list_namespaced_event(namespace, field_selector="reason=Pulled").items
        if (message := event.message or "")
        and fresh_image in message
        and event.involved_object.name.startswith(f"{name}-prepull-")
    ]
    assert any("Successfully pulled" in message for message in pulled), pulled
    for child, pod in pods.items():
        # The kubelet posts its Events at 5 a second (its default eventRecordQPS): on a busy node they come late.
        said = wait_until(
            lambda pod=pod: [m for m in kubelet_said(core, namespace, pod, "Pulled") if fresh_image in m],
            f"the kubelet's Pulled event of {child}'s pod",
            operator,
        )
        assert all("already present on machine" in m for m in said), f"{child}'s pod pulled: {said}"

    # Each child's pod prefers the node holding its image (never requires it), and ran there.
    for child, pod in agent_pods.items():
        node = core.read_node(pod.spec.node_name)
        preferred = pod.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
        assert pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution is None
        terms = [(t.weight, t.preference.match_expressions[0]) for t in preferred]
        assert [(w, e.key, e.operator, e.values) for w, e in terms] == [
            (100, HOSTNAME_LABEL, "In", [node.metadata.labels[HOSTNAME_LABEL]])
        ], f"{child}: {preferred}"

    for child in children:
        assert read_episode(api_client, namespace, child)["status"]["reward"] == 1.0
    assert done["outcomes"]["graded"] == 2
    apps = client.AppsV1Api(api_client)
    wait_until(lambda: daemon_set_gone(apps, namespace, name), "the complete set's DaemonSet is deleted", operator)
    assert "prePull" not in set_status(api_client, namespace, name)


def test_a_suspended_set_pulls_its_image_before_it_starts(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    fresh_image: str,
) -> None:
    """Created suspended (ready ahead of the step that starts it): the image comes onto the node while no child
    exists and no dataset is recorded; started, its child finds the image there (the kubelet's own words)."""
    name = "ahead"
    assert not on_node(fresh_image), "the fresh tag is on the node already: the test would prove nothing"
    install_crd(api_client)  # again: another checkout's tests may have installed theirs (no spec.prePull)
    spec = {**set_spec(fresh_image, wait_for_go=False), "attempts": 1, "parallelism": 1, "suspend": True}
    create_set(api_client, namespace, name, spec)
    ready = wait_until(
        lambda: (
            ((status := set_status(api_client, namespace, name)).get("prePull") or {}).get("ready") == "1/1" and status
        ),
        "the suspended set's image is on every node",
        operator,
    )
    assert on_node(fresh_image)
    assert (ready["phase"], ready["reason"], ready.get("created", 0), ready.get("tasks") or None) == (
        "Pending",
        "Suspended",
        0,
        None,
    ), ready
    assert custom(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"] == []

    custom(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, SETS, name, {"spec": {"suspend": False}}
    )
    child = f"{name}-0-1"
    pod = wait_until(lambda: agent_pod_record(api_client, namespace, child), f"{child}'s agent pod", operator)["name"]
    done = wait_until(lambda: finished_set(api_client, namespace, name), "the set completes", operator, 300)
    assert done["outcomes"]["graded"] == 1 and read_episode(api_client, namespace, child)["status"]["reward"] == 1.0
    said = wait_until(
        lambda: [m for m in kubelet_said(core, namespace, pod, "Pulled") if fresh_image in m],
        f"the kubelet's Pulled event of {child}'s pod",
        operator,
    )
    assert all("already present on machine" in m for m in said), f"{child}'s pod pulled: {said}"


def test_the_pre_pull_runs_nothing_of_the_image(
    operator: OperatorProcess, api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    """The attacker's image may carry anything: its pre-pull container runs the lent busybox's sleep, as nobody,
    and no service account token is mounted. The honest control beside it: the same image in a child runs the
    task as the task says (the child earns its reward)."""
    name = "nothing-runs"
    install_crd(api_client)  # again: another checkout's tests may have installed theirs (no spec.prePull)
    create_set(api_client, namespace, name, set_spec(SANDBOX_IMAGE, wait_for_go=True))
    pod = wait_until(
        lambda: next(
            (
                p
                for p in prepull_pods(core, namespace, name)
                if p.status.container_statuses and all(c.state.running for c in p.status.container_statuses)
            ),
            None,
        ),
        "the pre-pull pod runs",
        operator,
    )
    container = pod.spec.containers[0]
    assert container.image == SANDBOX_IMAGE
    cmdline = stream(
        core.connect_get_namespaced_pod_exec,
        pod.metadata.name,
        namespace,
        container=container.name,
        command=[LENT_BUSYBOX, "sh", "-c", PROBE.format(busybox=LENT_BUSYBOX)],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    ).split("\n")
    assert cmdline[0].strip() == f"{LENT_BUSYBOX} sleep 2147483647", cmdline
    assert cmdline[1].strip() == "65534", cmdline
    assert "No such file" in cmdline[2], cmdline
    # The honest control: the children of the same image run their task.
    children = [f"{name}-0-1", f"{name}-0-2"]
    for child in children:
        record = wait_until(
            lambda child=child: agent_pod_record(api_client, namespace, child), f"{child}'s agent pod", operator
        )
        wait_until(
            lambda record=record: exec_main(core, namespace, record["name"], "touch /tmp/go; echo ok").strip() == "ok",
            f"{child} told to go",
            operator,
        )
    wait_until(lambda: finished_set(api_client, namespace, name), "the set completes", operator, 300)
    for child in children:
        assert read_episode(api_client, namespace, child)["status"]["reward"] == 1.0


def test_an_image_that_cannot_be_pulled_is_named_and_the_children_start_anyway(
    operator: OperatorProcess, api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    name = "unpullable"
    missing = f"{REGISTRY}/episode-operator/no-such-image:{uuid.uuid4().hex[:12]}"
    install_crd(api_client)  # again: another checkout's tests may have installed theirs (no spec.prePull)
    create_set(api_client, namespace, name, set_spec(SANDBOX_IMAGE, wait_for_go=False, extra=[missing]))

    def rows() -> dict[str, dict[str, Any]]:
        images = (set_status(api_client, namespace, name).get("prePull") or {}).get("images") or []
        return {row["image"]: row for row in images}

    # The image that cannot be pulled is named with the kubelet's reason; the honest control beside it, the
    # image that can, is on the node.
    seen = wait_until(
        lambda: (
            (found := rows())
            and "cannot be pulled" in (found.get(missing, {}).get("message") or "")
            and found.get(SANDBOX_IMAGE, {}).get("nodes") == 1
            and found
        ),
        "the status names the image that cannot be pulled, and the other is on the node",
        operator,
    )
    failing = seen[missing]
    assert "ErrImagePull" in failing["message"] or "ImagePullBackOff" in failing["message"], failing
    assert failing["nodes"] == 0
    # The children start and finish well before prePull.waitSec: a failing pull holds nothing back.
    done = wait_until(lambda: finished_set(api_client, namespace, name), "the set completes", operator, WAIT_SEC - 60)
    assert done["outcomes"]["graded"] == 2, done
    for child in (f"{name}-0-1", f"{name}-0-2"):
        assert read_episode(api_client, namespace, child)["status"]["reward"] == 1.0
    # One Warning names it, however often the kubelet's back-off changes its words.
    warnings = core.list_namespaced_event(namespace, field_selector="reason=PrePullFailing").items
    named = [event for event in warnings if missing in (event.message or "") and event.type == "Warning"]
    assert len(named) == 1, [event.message for event in warnings]
    apps = client.AppsV1Api(api_client)
    wait_until(lambda: daemon_set_gone(apps, namespace, name), "the complete set's DaemonSet is deleted", operator)
