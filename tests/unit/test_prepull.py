"""Pre-pull without a cluster (docs/prepull.md): which images a set pulls (the tasks' own docker_image, a
Dockerfile's FROM, verifiers', toolchains', the pool's), its DaemonSet, what its pods say per image, and the
preferred affinity of a child's pod."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from episode_operator.api.episodeset_resource import (
    EpisodeSetSpec,
    EpisodeSetStatus,
    PrePullImage,
    PrePullStatus,
    SetTaskStatus,
)
from episode_operator.api.vocabulary import PREPULL_ANNOTATION
from episode_operator.kube.client import NotFound
from episode_operator.kube.episodeset_controller import SetSettings, reconcile_episode_set
from episode_operator.kube.objects.children import child_manifest
from episode_operator.kube.objects.pods import AgentImages, OwnerRef
from episode_operator.kube.objects.prepull_plan import (
    HOSTNAME_LABEL,
    MAIN_WEIGHT,
    MAX_IMAGES,
    OTHER_WEIGHT,
    current,
    done,
    failing_images,
    holds,
    image_affinity,
    nodes_holding,
    prepull_daemon_set,
    progress,
    set_images,
)
from episode_operator.kube.prepull import PrePullSettings, agent_images, reconcile_prepull, task_images
from episode_operator.runtime.sandbox_images import ImagePolicy
from episode_operator.taskfolder.image_refs import ImageMirrors
from tests.unit.folders import single_step
from tests.unit.test_reruns import SetApi

SET = OwnerRef("pulled", "ns", "set-uid", kind="EpisodeSet")
COPIER = "episode-operator.local/episode-operator:dev"
TASK_IMAGE = "registry.example/task:1"
MODEL = {"name": "m", "baseURL": "http://198.19.0.9:8000/v1", "api": "chat-completions"}


def inline(files: dict[str, str], name: str) -> dict[str, Any]:
    return {"name": name, "inline": {"files": files}}


def set_spec(tasks: list[dict[str, Any]] | None = None, **extra: Any) -> EpisodeSetSpec:
    return EpisodeSetSpec.model_validate(
        {
            "dataset": {"tasks": tasks or [{"name": "t", "configMap": {"name": "t"}}]},
            "agent": {"kind": "nop"},
            "prePull": {},
            **extra,
        }
    )


# --- which images -----------------------------------------------------------------------------------
def test_images_are_each_tasks_own_a_dockerfiles_from_and_the_extras() -> None:
    """Each task's [environment] docker_image (read from its folder), the FROM a Dockerfile task replays in,
    a separate verifier's image; each once, sorted, with spec.prePull.images and the pool's image."""
    own = single_step("", {"task.toml": f'[environment]\ndocker_image = "{TASK_IMAGE}"\n'})
    again = single_step("", {"task.toml": f'[environment]\ndocker_image = "{TASK_IMAGE}"\n'})
    dockerfile = single_step(
        "",
        {
            "task.toml": "[environment]\n",
            "environment/Dockerfile": "FROM registry.example/base:3\nRUN echo hi > /x\n",
        },
    )
    verifier = single_step(
        "",
        {
            "task.toml": f'[environment]\ndocker_image = "{TASK_IMAGE}"\n[verifier]\nmode = "separate"\n'
            '[verifier.environment]\ndocker_image = "registry.example/grader:2"\n',
        },
    )
    tasks = [inline(own, "own"), inline(again, "again"), inline(dockerfile, "df"), inline(verifier, "sep")]
    spec = set_spec(
        tasks,
        prePull={"images": ["registry.example/extra:1"]},
        warmPool={"target": 1, "image": "registry.example/pool:1"},
    )
    statuses = [SetTaskStatus(index=i, name=t["name"]) for i, t in enumerate(tasks)]
    found, problems = asyncio.run(task_images(None, "ns", spec, statuses, PrePullSettings()))  # type: ignore[arg-type]
    assert problems == []
    images = set_images(spec, found, [])
    assert images == sorted(
        {
            TASK_IMAGE,
            "registry.example/base:3",
            "registry.example/grader:2",
            "registry.example/extra:1",
            "registry.example/pool:1",
        }
    )


def test_images_follow_the_operators_mirrors_and_the_template_image() -> None:
    """The images are the ones the children's pods name: mirrored, and the template's spec.image over the task's."""
    own = single_step("", {"task.toml": f'[environment]\ndocker_image = "{TASK_IMAGE}"\n'})
    statuses = [SetTaskStatus(index=0, name="own")]
    mirrored = PrePullSettings(policy=ImagePolicy(ImageMirrors.parse(["registry.example/=mirror.local:5000/"])))
    found, _ = asyncio.run(task_images(None, "ns", set_spec([inline(own, "own")]), statuses, mirrored))  # type: ignore[arg-type]
    assert found == ["mirror.local:5000/task:1"]
    templated = set_spec([inline(own, "own")], template={"image": "registry.example/prebuilt:9"})
    found, _ = asyncio.run(task_images(None, "ns", templated, statuses, PrePullSettings()))  # type: ignore[arg-type]
    assert found == ["registry.example/prebuilt:9"]


def test_a_task_that_cannot_be_read_is_named_and_the_others_still_pulled() -> None:
    good = single_step("", {"task.toml": f'[environment]\ndocker_image = "{TASK_IMAGE}"\n'})
    bad = single_step("", {"task.toml": "[environment]\n"})  # no image, no Dockerfile: refused at seed
    spec = set_spec([inline(good, "good"), inline(bad, "bad")])
    statuses = [SetTaskStatus(index=0, name="good"), SetTaskStatus(index=1, name="bad")]
    found, problems = asyncio.run(task_images(None, "ns", spec, statuses, PrePullSettings()))  # type: ignore[arg-type]
    assert found == [TASK_IMAGE]
    assert len(problems) == 1 and problems[0].startswith("task bad: ") and "docker_image" in problems[0]


def test_a_harness_agents_toolchain_image_is_pulled() -> None:
    spec = set_spec(agent={"kind": "harness", "harness": {"name": "opencode"}, "model": MODEL})
    images = agent_images(spec, AgentImages(capture=COPIER, toolchain_repository="tools.local"))
    assert any(image.startswith("tools.local/toolchain-opencode:") for image in images), images


# --- the DaemonSet -------------------------------------------------------------------------------------
def test_the_daemon_set_runs_every_image_as_its_own_container_with_the_lent_busybox() -> None:
    images = ["a.example/one:1", "b.example/two:2"]
    spec = set_spec(template={"nodeSelector": {"pool": "gpu"}, "tolerations": [{"operator": "Exists"}]})
    manifest = prepull_daemon_set(SET, spec, images, COPIER)
    pod = manifest["spec"]["template"]["spec"]
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "set-uid"
    assert [c["image"] for c in pod["containers"]] == images  # containers: a failing pull blocks no other image
    assert pod["initContainers"][0]["image"] == COPIER
    for container in pod["containers"]:
        assert container["command"][0] == "/episode-operator-prepull/busybox"  # nothing of the image runs
        assert container["securityContext"]["runAsNonRoot"] is True
        assert container["resources"]["requests"] == {"cpu": "1m", "memory": "4Mi"}
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["automountServiceAccountToken"] is False
    assert current(manifest, images) and not current(manifest, [*images, "c.example/three:3"])


# --- progress --------------------------------------------------------------------------------------------
def ds_pod(node: str, states: dict[str, dict[str, Any]], image_ids: dict[str, str] | None = None) -> dict[str, Any]:
    names = list(states)
    return {
        "metadata": {"name": f"p-{node}"},
        "spec": {"nodeName": node, "containers": [{"name": f"image-{i}", "image": n} for i, n in enumerate(names)]},
        "status": {
            "containerStatuses": [
                {"name": f"image-{i}", "image": n, "imageID": (image_ids or {}).get(n, ""), "state": states[n]}
                for i, n in enumerate(names)
            ]
        },
    }


RUNNING = {"running": {"startedAt": "2026-12-07T00:00:00Z"}}
PULLING = {"waiting": {"reason": "ContainerCreating"}}
BACKOFF = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "bad.example/x:1"'}}
DS = {"metadata": {"name": "pulled-prepull"}, "status": {"desiredNumberScheduled": 2}}


def test_progress_counts_nodes_per_image_and_names_a_failing_pull() -> None:
    images = ["bad.example/x:1", "good.example/y:1"]
    pods = [
        ds_pod("n1", {"good.example/y:1": RUNNING, "bad.example/x:1": BACKOFF}),
        ds_pod("n2", {"good.example/y:1": PULLING, "bad.example/x:1": BACKOFF}),
    ]
    status = progress(images, DS, pods)
    by_image = {row.image: row for row in status.images}
    assert (by_image["good.example/y:1"].nodes, by_image["good.example/y:1"].of) == (1, 2)
    assert by_image["good.example/y:1"].message == "pulling on n2"
    assert by_image["bad.example/x:1"].nodes == 0
    assert by_image["bad.example/x:1"].message is not None and "ImagePullBackOff" in by_image["bad.example/x:1"].message
    assert status.message is not None and status.message.startswith("bad.example/x:1 cannot be pulled on n1, n2")
    assert status.ready == "0/2" and not done(status)


def test_progress_is_done_when_every_node_holds_every_image() -> None:
    images = ["good.example/y:1"]
    pods = [ds_pod("n1", {"good.example/y:1": RUNNING}), ds_pod("n2", {"good.example/y:1": RUNNING})]
    status = progress(images, DS, pods)
    assert status.ready == "1/1" and status.message is None and done(status)
    # A node the DaemonSet wants but whose pod is not scheduled yet: not done.
    assert not done(progress(images, {**DS, "status": {"desiredNumberScheduled": 3}}, pods))


def test_a_pulled_image_whose_container_waits_for_another_reason_is_on_the_node() -> None:
    """The kubelet records the imageID once the image is there: that is what counts, not the container running."""
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    pods = [ds_pod("n1", {"img:1": waiting}, {"img:1": "sha256:abc"})]
    assert nodes_holding(pods) == {"img:1": {"n1"}}


# --- a child's pod -------------------------------------------------------------------------------------------
def child_pod(image: str = TASK_IMAGE, init: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": image}]}
    if init:
        spec["initContainers"] = [{"name": "tool", "image": init}]
    return {"metadata": {"name": "c"}, "spec": spec}


def test_a_childs_pod_prefers_the_nodes_holding_its_images_never_requires_them() -> None:
    holding = {TASK_IMAGE: {"n2", "n1"}, "tools.local/toolchain-x:1": {"n3"}}
    pod = image_affinity(child_pod(init="tools.local/toolchain-x:1"), holding)
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    terms = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [
        {
            "weight": MAIN_WEIGHT,
            "preference": {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": ["n1", "n2"]}]},
        },
        {
            "weight": OTHER_WEIGHT,
            "preference": {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": ["n3"]}]},
        },
    ]


def test_a_childs_pod_whose_image_is_nowhere_is_unchanged() -> None:
    pod = child_pod()
    assert image_affinity(pod, {"other:1": {"n1"}}) == pod


def test_children_of_a_pre_pulling_set_are_marked() -> None:
    task = SetTaskStatus(index=0, name="t", config_map="t")
    marked = child_manifest(SET, set_spec(), task, 1, "2026-12-07T00:00:00.000000Z")
    assert marked["metadata"]["annotations"][PREPULL_ANNOTATION] == "true"
    plain = set_spec().model_copy(update={"pre_pull": None})
    assert PREPULL_ANNOTATION not in child_manifest(SET, plain, task, 1, "x")["metadata"]["annotations"]


@pytest.mark.parametrize("images", [["x:1"], []])
def test_progress_of_no_pods_yet_is_not_done(images: list[str]) -> None:
    assert not done(progress(images, None, []))


def test_children_wait_for_images_on_their_way_never_for_a_failing_one_nor_past_the_wait() -> None:
    images = ["bad.example/x:1", "good.example/y:1"]
    pulling = progress(images, DS, [ds_pod("n1", {"good.example/y:1": PULLING, "bad.example/x:1": BACKOFF})])
    assert holds(pulling, 60, 5)  # good.example/y:1 is on its way
    assert not holds(pulling, 60, 60)  # the wait is over
    assert not holds(pulling, 0, 0)  # no wait asked for
    failed_only = progress(
        images,
        {**DS, "status": {"desiredNumberScheduled": 1}},
        [ds_pod("n1", {"good.example/y:1": RUNNING, "bad.example/x:1": BACKOFF})],
    )
    assert not holds(failed_only, 60, 5)  # only a failing pull is left: it holds nothing
    assert not holds(progress([], DS, []), 60, 5)


# --- one pass, against a fake API ------------------------------------------------------------------------------
class FakeApps:
    """The calls a pre-pull pass makes, answered from memory (kube/client.py's names), each counted."""

    def __init__(self) -> None:
        self.daemon_sets: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.calls: list[str] = []

    async def read_daemon_set(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append("read")
        if name not in self.daemon_sets:
            raise NotFound(name)
        return self.daemon_sets[name]

    async def create_daemon_set(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        self.daemon_sets[manifest["metadata"]["name"]] = manifest
        return manifest

    async def delete_daemon_set(self, namespace: str, name: str) -> None:
        self.calls.append("delete")
        self.daemon_sets.pop(name, None)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append("list")
        return self.pods


def one_pass(fake: FakeApps, spec: EpisodeSetSpec, previous: PrePullStatus | None) -> PrePullStatus:
    settings = PrePullSettings(images=AgentImages(capture=COPIER))
    return asyncio.run(reconcile_prepull(fake, SET, spec, previous, [], settings))  # type: ignore[arg-type]


def test_a_pass_makes_the_daemon_set_once_and_a_complete_pre_pull_is_not_read_on_every_pass() -> None:
    fake = FakeApps()
    spec = set_spec([], prePull={"images": ["x.example/a:1"]})
    first = one_pass(fake, spec, None)
    assert fake.calls == ["read", "create", "list"] and first.daemon_set == "pulled-prepull"
    assert [row.image for row in first.images] == ["x.example/a:1"] and not done(first)
    fake.pods = [ds_pod("n1", {"x.example/a:1": RUNNING})]
    fake.daemon_sets["pulled-prepull"]["status"] = {"desiredNumberScheduled": 1}
    second = one_pass(fake, spec, first)
    assert done(second) and fake.calls[3:] == ["read", "list"]
    fake.calls.clear()
    assert one_pass(fake, spec, second) == second and fake.calls == []  # complete: nothing read until recheck
    # Other images (a spec changed under a running set): the DaemonSet is replaced.
    other = PrePullStatus(images=[PrePullImage(image="x.example/b:1")])
    one_pass(fake, spec, other)
    assert fake.calls == ["read", "delete", "create", "list"]


def test_images_past_one_pods_bound_are_said_and_left_to_the_childrens_pods() -> None:
    extra = [f"x.example/img-{index:03}:1" for index in range(MAX_IMAGES + 6)]
    status = one_pass(FakeApps(), set_spec([], prePull={"images": extra}), None)
    assert [row.image for row in status.images] == extra[:MAX_IMAGES] and status.left_out == 6
    assert status.message is not None and f"6 more images than one pre-pull pod runs ({MAX_IMAGES})" in status.message


def test_a_failing_image_is_one_event_not_one_per_pass() -> None:
    """Named once when it starts failing; the kubelet's reason going ErrImagePull → ImagePullBackOff and back is
    the same failure."""
    images = ["bad.example/x:1", "good.example/y:1"]
    err = {"waiting": {"reason": "ErrImagePull", "message": "not found"}}
    first = progress(images, DS, [ds_pod("n1", {"good.example/y:1": RUNNING, "bad.example/x:1": err})])
    later = progress(images, DS, [ds_pod("n1", {"good.example/y:1": RUNNING, "bad.example/x:1": BACKOFF})])
    assert failing_images(first) == failing_images(later) == {"bad.example/x:1"}
    assert first.message != later.message


def test_a_pre_pull_pod_the_scheduler_cannot_place_is_said() -> None:
    """Seen on the shared test node: every CPU requested, the DaemonSet's pod Pending, nothing pulled."""
    pending = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "image-0", "image": "x:1"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes: cpu"}
            ],
        },
    }
    status = progress(["x:1"], {**DS, "status": {"desiredNumberScheduled": 1}}, [pending])
    assert status.message == "the pre-pull pod is not scheduled: 0/1 nodes: cpu"
    assert holds(status, 60, 5)  # the wait still bounds it


# --- a suspended set, through the set's pass, against a fake API -------------------------------------------------
class PullingSetApi(SetApi, FakeApps):
    """One EpisodeSet, its children and its pre-pull DaemonSet as the API server keeps them; no ConfigMap."""

    def __init__(self, spec: dict[str, Any]) -> None:
        SetApi.__init__(self, spec)
        FakeApps.__init__(self)

    async def get_config_map(self, namespace: str, name: str) -> None:
        raise NotFound(f"configmaps {name!r} not found", status=404)

    def pulled(self, *images: str) -> None:
        """The DaemonSet's pod on the one node holds ``images``."""
        self.daemon_sets["s-prepull"]["status"] = {"desiredNumberScheduled": 1}
        self.pods = [ds_pod("n1", dict.fromkeys(images, RUNNING))]

    def pulling(self) -> list[str]:
        containers = self.daemon_sets["s-prepull"]["spec"]["template"]["spec"]["containers"]
        return [container["image"] for container in containers]


def task_of(image: str) -> dict[str, Any]:
    return inline(single_step("", {"task.toml": f'[environment]\ndocker_image = "{image}"\n'}), "t")


def suspended_set(tasks: list[dict[str, Any]]) -> PullingSetApi:
    return PullingSetApi({"dataset": {"tasks": tasks}, "agent": {"kind": "nop"}, "prePull": {}, "suspend": True})


async def set_pass(api: PullingSetApi) -> tuple[float | None, EpisodeSetStatus]:
    settings = SetSettings(prepull=PrePullSettings(images=AgentImages(capture=COPIER), recheck_sec=0))
    delay = await reconcile_episode_set(api, "ns", "s", logging.getLogger("test"), settings)  # type: ignore[arg-type]
    assert await api.event_recorder.flush(OwnerRef("s", "ns", "set-uid", kind="EpisodeSet"), 5)
    return delay, EpisodeSetStatus.model_validate(api.set["status"])


def test_a_suspended_set_pulls_its_images_before_it_starts_and_records_no_dataset() -> None:
    """The set is created suspended to be ready when an RL step needs it: its images come in meanwhile."""

    async def scenario() -> None:
        api = suspended_set([task_of(TASK_IMAGE)])
        delay, status = await set_pass(api)
        assert api.pulling() == [TASK_IMAGE] and api.created == []
        assert (status.phase, status.reason, status.tasks, status.definition) == ("Pending", "Suspended", [], None)
        assert status.pre_pull is not None and status.pre_pull.ready == "0/1"
        assert delay == SetSettings().prepull_poll_sec  # looked at again soon: its pods are not watched
        api.pulled(TASK_IMAGE)
        delay, status = await set_pass(api)
        assert status.pre_pull is not None and status.pre_pull.ready == "1/1" and api.events == ["PrePulled"]
        assert delay == SetSettings().resync_sec and api.created == []

        api.set["spec"]["suspend"] = False
        api.calls.clear()
        _, status = await set_pass(api)
        assert status.phase == "Running" and api.created == ["s-0-1"]
        assert "delete" not in api.calls and status.pre_pull is not None and status.pre_pull.ready == "1/1"
        assert api.events.count("PrePulled") == 1  # said once, not again when the set starts

    asyncio.run(scenario())


def test_images_pulled_while_suspended_are_found_again_from_the_dataset_the_set_starts_with() -> None:
    async def scenario() -> None:
        api = suspended_set([task_of(TASK_IMAGE)])
        await set_pass(api)
        api.pulled(TASK_IMAGE)
        await set_pass(api)
        api.set["spec"]["dataset"]["tasks"] = [task_of("registry.example/task:2")]  # edited while it waited
        api.set["spec"]["suspend"] = False
        _, status = await set_pass(api)
        assert api.pulling() == ["registry.example/task:2"]
        assert status.pre_pull is not None and [row.image for row in status.pre_pull.images] == [
            "registry.example/task:2"
        ]

    asyncio.run(scenario())


def test_a_suspended_set_whose_dataset_is_not_there_yet_pulls_nothing_and_says_why() -> None:
    async def scenario() -> None:
        api = suspended_set([{"name": "t", "configMap": {"name": "later"}}])
        delay, status = await set_pass(api)
        assert api.daemon_sets == {} and status.pre_pull is not None and status.pre_pull.message is not None
        assert status.pre_pull.message.startswith("nothing pulled: the dataset cannot be resolved yet: ")
        assert "configmap ns/later not found" in status.pre_pull.message
        assert delay == SetSettings().prepull_poll_sec  # it may appear: looked for again soon

    asyncio.run(scenario())


def test_a_dataset_larger_than_a_set_holds_pulls_nothing_while_suspended_and_fails_the_set_when_started() -> None:
    """51 tasks × 100 attempts: the set fails when it starts, so its task folders are never read for it."""

    async def scenario() -> None:
        tasks = [task_of(f"registry.example/task:{index}") | {"name": f"t{index}"} for index in range(51)]
        api = suspended_set(tasks)
        api.set["spec"]["attempts"] = 100
        _, status = await set_pass(api)
        too_large = "51 tasks × 100 attempts = 5100 children, more than a set holds (5000)"
        assert api.daemon_sets == {} and status.pre_pull is not None
        assert status.pre_pull.message == f"nothing pulled: {too_large}; split the dataset into several sets"
        api.set["spec"]["suspend"] = False
        delay, status = await set_pass(api)
        assert delay is None and (status.phase, status.reason) == ("Failed", "DatasetTooLarge")
        assert status.message is not None and status.message.startswith(too_large) and api.created == []

    asyncio.run(scenario())
