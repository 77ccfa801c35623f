"""Warm pools without a cluster (docs/warm-pools.md): the key an attempt matches on, every claim check, the
freshness probe, the refill decision, and claimers racing for one pod against a fake API's resourceVersion."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.api.episodeset_resource import EpisodeSetSpec, WarmPool, child_spec
from episode_operator.api.vocabulary import (
    EPISODE_LABEL,
    POOL_CLAIMED_LABEL,
    POOL_KEY_LABEL,
    POOL_LABEL,
    POOL_MARK_ANNOTATION,
    POOL_PLACED_ANNOTATION,
    precise_timestamp,
)
from episode_operator.kube.client import Conflict, NotFound
from episode_operator.kube.objects.pods import (
    AgentImages,
    OwnerRef,
    SandboxPod,
    SandboxRequests,
    sandbox_pod,
    verifier_reservation,
)
from episode_operator.kube.objects.warm_pool_plan import (
    CLAIM_CHECKS,
    PLACED_AFTER,
    PROBE,
    Mark,
    Probe,
    Wanted,
    candidates,
    container_images,
    fresh_after_claim,
    placed_annotation,
    placed_at_mark,
    plan_pool,
    pod_key,
    pool_placement,
    pool_pod,
    probed,
    split_probed,
    unclaimable,
)
from episode_operator.kube.upstream import pinned_needs, system_resolver
from episode_operator.kube.warm_pool import PoolRef, PoolSettings, claim, pool_needs, reconcile_pool
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.agents.model import CaptureBounds, SandboxNeeds
from episode_operator.taskfolder.task_toml import EnvironmentConfig

IMAGE = "registry.example/task:1"
SET = OwnerRef("pooled", "ns", "set-uid", kind="EpisodeSet")
REQUESTS = SandboxRequests(0.05)
STRIDE = 6  # the PIDs one exec costs runc on the project's cluster
POOL = {"target": 2, "image": IMAGE, "cpus": 1, "memoryMb": 256, "workdir": "/app"}


def set_spec(**pool: Any) -> EpisodeSetSpec:
    return EpisodeSetSpec.model_validate(
        {
            "dataset": {"tasks": [{"name": "t", "configMap": {"name": "t"}}]},
            "agent": {"kind": "command", "command": "true"},
            "warmPool": {**POOL, **pool},
        }
    )


def the_pool_pod(spec: EpisodeSetSpec | None = None, suffix: str = "a") -> dict[str, Any]:
    return pool_pod(SET, spec or set_spec(), SandboxNeeds(), requests=REQUESTS, images=AgentImages(), suffix=suffix)


def childs_pod(
    *, image: str = IMAGE, memory: int = 256, env: dict[str, str] | None = None, cpus: int = 1, workdir: str = "/app"
) -> dict[str, Any]:
    """The agent pod a child of the set would make (KubeProvider.agent's pod, a task with these settings)."""
    spec = child_spec(set_spec(), set_spec().dataset.tasks[0], {"EPISODE_SET": "pooled"})
    environment = EnvironmentConfig(docker_image=image, cpus=cpus, memory_mb=memory, workdir=workdir)
    pod = SandboxPod(role="agent", attempt=1, image=image, environment=environment, env=env or {}, requests=REQUESTS)
    child = OwnerRef("pooled-0-1", "ns", "child-uid")
    return sandbox_pod(child, spec, pod, extra_labels={}, images=AgentImages())


# --- the key -----------------------------------------------------------------------------------------
def test_a_childs_pod_of_the_pools_settings_has_the_pools_key() -> None:
    pool = the_pool_pod()
    assert pod_key(childs_pod()) == pool["metadata"]["labels"][POOL_KEY_LABEL]
    assert pool["metadata"]["ownerReferences"] == [SET.owner_reference()]
    assert EPISODE_LABEL not in pool["metadata"]["labels"], "a pool pod is no Episode's"


@pytest.mark.parametrize(
    "differs",
    [
        {"image": "registry.example/other:1"},
        {"memory": 512},
        {"cpus": 2},
        {"workdir": "/srv"},
        {"env": {"TASK_SECRET": "x"}},
    ],
    ids=["image", "memory", "cpus", "workdir", "env"],
)
def test_a_childs_pod_that_differs_in_anything_has_another_key(differs: dict[str, Any]) -> None:
    assert pod_key(childs_pod(**differs)) != pod_key(the_pool_pod())


def test_the_agents_toolchains_are_in_the_key() -> None:
    from episode_operator.runtime.agents.model import Toolchain

    needs = SandboxNeeds(toolchains=(Toolchain("node", "22"),))
    tooled = pool_pod(SET, set_spec(), needs, requests=REQUESTS, images=AgentImages(), suffix="a")
    assert pod_key(tooled) != pod_key(the_pool_pod())


def test_a_pool_pod_carries_the_sets_kueue_queue_and_keeps_its_key() -> None:
    queued = set_spec()
    queued.queue_name = "team-a"
    pod = the_pool_pod(queued)
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert pod_key(pod) == pod_key(the_pool_pod())


def test_a_quota_below_the_target_is_refused() -> None:
    with pytest.raises(ValueError, match="below its target"):
        WarmPool.model_validate({**POOL, "quota": 1})


# --- claim checks ---------------------------------------------------------------------------------------
def live(manifest: dict[str, Any], *, pid: int = 9, uid: str = "u1") -> dict[str, Any]:
    """The pool pod as the API returns it once it runs and was marked."""
    pod = copy.deepcopy(manifest)
    pod["metadata"].update(
        uid=uid,
        resourceVersion="1",
        creationTimestamp="2026-12-06T10:00:00Z",
        annotations={POOL_MARK_ANNOTATION: Mark(pid, STRIDE, frozenset({1, 7})).annotation()},
        managedFields=[
            {"manager": "episode-operator", "operation": "Update", "fieldsV1": {"f:metadata": {}, "f:spec": {}}},
            {"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}},
        ],
    )
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": c["name"], "ready": True, "restartCount": 0, "state": {"running": {}}}
            for c in pod["spec"]["containers"]
        ],
    }
    return pod


def wanted() -> Wanted:
    child = childs_pod()
    return Wanted("pooled", "set-uid", pod_key(child), container_images(child))


def _other_owner(pod: dict[str, Any]) -> None:
    pod["metadata"]["ownerReferences"][0]["uid"] = "another-set"


def _second_owner(pod: dict[str, Any]) -> None:
    pod["metadata"]["ownerReferences"].append({"kind": "Episode", "uid": "e", "controller": False})


def _episode_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"][EPISODE_LABEL] = "someone"


def _other_key(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"][POOL_KEY_LABEL] = "0" * 40


def _labelled_by_hand(pod: dict[str, Any]) -> None:
    pod["metadata"]["managedFields"].append(
        {"manager": "kubectl-label", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}}
    )


def _unmarked(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"] = {}


def _not_ready(pod: dict[str, Any]) -> None:
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    pod["status"]["containerStatuses"][0]["ready"] = False


def _restarted(pod: dict[str, Any]) -> None:
    pod["status"]["containerStatuses"][0]["restartCount"] = 1


def _image_patched(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["image"] = "evil.example/backdoor:1"


TAMPERS = {
    "owner": [_other_owner, _second_owner],
    "labels": [_episode_label, _other_key],
    "untouched": [_labelled_by_hand],
    "marked": [_unmarked],
    "running": [_not_ready, _restarted],
    "images": [_image_patched],
}


def test_every_claim_check_has_its_tampering_case() -> None:
    assert [name for name, _ in CLAIM_CHECKS] == list(TAMPERS)


def test_an_untouched_marked_running_pool_pod_is_claimable() -> None:
    assert unclaimable(live(the_pool_pod()), wanted()) is None


@pytest.mark.parametrize(
    ("check", "tamper"),
    [(check, tamper) for check, tampers in TAMPERS.items() for tamper in tampers],
    ids=[tamper.__name__.strip("_") for tampers in TAMPERS.values() for tamper in tampers],
)
def test_a_pool_pod_tampered_with_is_not_claimable(check: str, tamper: Any) -> None:
    pod = live(the_pool_pod())
    tamper(pod)
    reason = unclaimable(pod, wanted())
    assert reason is not None and reason.startswith(f"{check}:"), reason


def test_candidates_come_oldest_first_and_without_the_unclaimable() -> None:
    old, new, bad = (live(the_pool_pod(suffix=s), uid=s) for s in ("o", "n", "b"))
    old["metadata"]["creationTimestamp"] = "2026-12-06T09:00:00Z"
    _labelled_by_hand(bad)
    assert [p["metadata"]["uid"] for p in candidates([new, bad, old], wanted())] == ["o", "n"]


# --- freshness ------------------------------------------------------------------------------------------
def test_probes_make_a_mark_of_the_least_stride_that_round_trips() -> None:
    probes = [Probe.read(b"9\n1\n7\n9\n"), Probe.read(b"15\n1\n7\n15\n"), Probe.read(b"20\n1\n7\n20\n")]
    assert all(probes)
    mark = Mark.of(probes)  # type: ignore[arg-type]
    assert mark == Mark(20, 5, frozenset({1, 7}))
    assert Mark.parse(mark.annotation()) == mark
    assert Probe.read(b"garbage") is None and Mark.parse("") is None and Mark.parse("15:0:1") is None


def test_probes_that_are_not_two_consecutive_execs_make_no_mark() -> None:
    assert Mark.of([Probe(15, frozenset({1})), Probe(9, frozenset({1}))]) is None
    assert Mark.of([Probe(9, frozenset({1})), Probe(15, frozenset({1, 12}))]) is None
    assert Mark.of([Probe(9, frozenset({1}))]) is None


MARK = Mark(15, STRIDE, frozenset({1, 7}))


@pytest.mark.parametrize("taken", [STRIDE - 1, STRIDE, STRIDE + STRIDE // 2])
def test_a_claim_probe_less_than_two_strides_after_the_mark_is_fresh(taken: int) -> None:
    # An exec costs runc 5 or 6 PIDs here: the claimer's probe alone takes about one stride.
    assert fresh_after_claim(MARK, Probe(15 + taken, frozenset({1, 7}))) is None


@pytest.mark.parametrize("taken", [0, STRIDE + STRIDE // 2 + 1, 3 * STRIDE])
def test_an_exec_since_the_mark_took_pids_and_is_found(taken: int) -> None:
    assert f"PID {15 + taken}" in str(fresh_after_claim(MARK, Probe(15 + taken, frozenset({1, 7}))))


def test_a_process_left_behind_is_found() -> None:
    assert "appeared" in str(fresh_after_claim(MARK, Probe(21, frozenset({1, 7, 19}))))


def test_a_process_that_ran_and_exited_since_the_mark_is_found_by_its_pids() -> None:
    """The claimer's probe plus someone's `kubectl exec … true` (which left nothing alive), each at the fewest
    PIDs an exec took here (5, below the mark's stride of 6)."""
    assert fresh_after_claim(MARK, Probe(15 + 5 + 5, frozenset({1, 7}))) is not None


# --- refill -----------------------------------------------------------------------------------------------
NOW = 1_796_551_200.0  # 2026-12-06T10:00:00Z + 0 s
KEY = pod_key(the_pool_pod())
WARM = WarmPool.model_validate(POOL)


def test_an_empty_pool_makes_its_target() -> None:
    plan = plan_pool(WARM, KEY, [], remaining=10, now=NOW)
    assert (plan.create, plan.target, plan.ready, plan.starting) == (2, 2, 0, 0)


def test_no_more_pods_than_children_remain() -> None:
    assert plan_pool(WARM, KEY, [], remaining=1, now=NOW).create == 1
    assert plan_pool(WARM, KEY, [], remaining=0, now=NOW).create == 0


def test_a_claimed_pod_is_replaced_and_a_full_pool_makes_none() -> None:
    one = live(the_pool_pod(suffix="a"), uid="a")
    assert plan_pool(WARM, KEY, [one], remaining=5, now=NOW).create == 1
    two = live(the_pool_pod(suffix="b"), uid="b")
    plan = plan_pool(WARM, KEY, [one, two], remaining=5, now=NOW)
    assert (plan.create, plan.ready, plan.delete) == (0, 2, ())


class RefillPods:
    """The pass's side of the API: the set's pods listed by selector, pool pods made."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.made: list[str] = []
        self.metrics = None

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in selector.split(","))
        return [pod for pod in self.pods if all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())]

    async def create_pool_pod(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        self.made.append(manifest["metadata"]["name"])
        self.pods.append(manifest)
        return manifest


def claimed_by(child: str, *, deleting: bool = False) -> dict[str, Any]:
    """A pool pod as a child's claim left it: the child's labels, the set's claimed mark."""
    pod = live(the_pool_pod(suffix=child), uid=f"claimed-{child}")
    pod["metadata"]["labels"] = {EPISODE_LABEL: child, POOL_CLAIMED_LABEL: "pooled"}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    return pod


@pytest.mark.parametrize(
    ("unfinished", "claimed", "made"),
    [
        (["pooled-0-1"], [claimed_by("pooled-0-1")], 0),
        (["pooled-0-1", "pooled-1-1"], [claimed_by("pooled-0-1")], 1),
        (["pooled-0-1"], [claimed_by("pooled-0-1", deleting=True)], 1),
        ([], [claimed_by("pooled-0-1")], 1),
    ],
    ids=["its-only-child-holds-one", "control-one-child-holds-none", "its-pod-is-going-a-retry-may-claim", "kept"],
)
def test_a_child_holding_a_claimed_pod_is_no_claimer(
    unfinished: list[str], claimed: list[dict[str, Any]], made: int
) -> None:
    """A set whose unfinished children all hold a claimed pod makes no pool pod for them: it would wait for no
    one, and start beside their agents' first commands. A child whose pod is going may claim again (a retry);
    a pod kept after its child finished holds no claimer (``remaining`` counts unfinished children only)."""
    fake = RefillPods(list(claimed))
    settings = PoolSettings(REQUESTS, AgentImages())
    remaining = max(1, len(unfinished))
    status = asyncio.run(
        reconcile_pool(fake, SET, set_spec(), remaining=remaining, unfinished=unfinished, settings=settings)  # type: ignore[arg-type]
    )
    assert (len(fake.made), status.target, status.claimed) == (made, made, len(claimed))


def test_a_running_unmarked_pod_is_marked_and_a_starting_one_waits() -> None:
    running = live(the_pool_pod(suffix="a"), uid="a")
    _unmarked(running)
    starting = live(the_pool_pod(suffix="b"), uid="b")
    _unmarked(starting)
    _not_ready(starting)
    plan = plan_pool(WARM, KEY, [running, starting], remaining=5, now=NOW)
    assert plan.mark == (running["metadata"]["name"],) and plan.starting == 2 and plan.create == 0


@pytest.mark.parametrize("tamper", [_labelled_by_hand, _restarted, _other_key], ids=["labelled", "restarted", "key"])
def test_a_touched_restarted_or_outdated_pod_is_deleted_and_replaced(tamper: Any) -> None:
    pod = live(the_pool_pod(suffix="a"), uid="a")
    tamper(pod)
    plan = plan_pool(WARM, KEY, [pod], remaining=5, now=NOW)
    # Replaced as it goes: the quota (2) counts it until it is gone, so one pod is made now.
    assert [name for name, _ in plan.delete] == [pod["metadata"]["name"]] and plan.create == 1


def test_an_old_pod_is_replaced_before_its_keep_alive_forks() -> None:
    pod = live(the_pool_pod(suffix="a"), uid="a")
    assert plan_pool(WARM, KEY, [pod], remaining=5, now=NOW + WARM.max_age_sec - 1).delete == ()
    assert plan_pool(WARM, KEY, [pod], remaining=5, now=NOW + WARM.max_age_sec + 1).delete != ()


def test_the_quota_counts_pods_still_being_deleted() -> None:
    going = live(the_pool_pod(suffix="g"), uid="g")
    going["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:01Z"
    assert plan_pool(WARM, KEY, [going], remaining=5, now=NOW).create == 1
    roomy = WarmPool.model_validate({**POOL, "quota": 3})
    assert plan_pool(roomy, KEY, [going], remaining=5, now=NOW).create == 2


def test_past_the_target_the_youngest_go() -> None:
    pods = [live(the_pool_pod(suffix=s), uid=s) for s in ("a", "b", "c")]
    pods[2]["metadata"]["creationTimestamp"] = "2026-12-06T10:00:05Z"
    plan = plan_pool(WARM, KEY, pods, remaining=5, now=NOW)
    assert [name for name, _ in plan.delete] == [pods[2]["metadata"]["name"]]


# --- the claim, against a fake API ---------------------------------------------------------------------------
PLACEMENT_ANSWER = b"version=1\nworkdir=/app\nuser=root\nuid=0\n"


class FakePods:
    """list/patch/delete/exec of pool pods, with the API server's resourceVersion test and a PID counter per pod."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {pod["metadata"]["name"]: pod for pod in pods}
        self.pids = {
            name: Mark.parse(pod["metadata"]["annotations"][POOL_MARK_ANNOTATION]).pid
            for name, pod in self.pods.items()
        }  # type: ignore[union-attr]
        self.deleted: list[str] = []
        self.placements: list[str] = []  # the pods the supervisor was placed in, by name
        self.metrics = None

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        await asyncio.sleep(0)  # every claimer lists before any patches: the race
        wanted = dict(term.split("=", 1) for term in selector.split(","))
        return [
            copy.deepcopy(pod)
            for pod in self.pods.values()
            if all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]

    async def patch_pool_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        await asyncio.sleep(0)
        if name not in self.pods:
            raise NotFound(name, status=404)
        pod = self.pods[name]
        for op in patch:
            field = op["path"].rsplit("/", 1)[1]
            if op["op"] == "test" and pod["metadata"][field] != op["value"]:
                raise Conflict("test failed", status=409)
            if op["op"] == "replace":
                pod["metadata"][field] = copy.deepcopy(op["value"])
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(pod)

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.pods.pop(name, None)

    def exec_into(self, name: str) -> None:
        """Someone's exec: it takes the PIDs an exec takes."""
        self.pids[name] += STRIDE

    async def exec(self, namespace: str, name: str, container: str, argv: Any, *, stdout: Any, **_: Any) -> int:
        self.pids[name] += STRIDE
        stdout.write(f"{self.pids[name]}\n1\n7\n{self.pids[name]}\n".encode())
        if tuple(argv) != PROBE:  # the probe, then the supervisor's placement in the same shell
            self.placements.append(name)
            stdout.write(f"{PLACED_AFTER}\n".encode() + PLACEMENT_ANSWER)
        return 0


def pool_of(count: int) -> FakePods:
    return FakePods([live(the_pool_pod(suffix=str(i)), uid=f"u{i}") for i in range(count)])


def claimer(number: int) -> OwnerRef:
    return OwnerRef(f"pooled-0-{number}", "ns", f"child-{number}")


async def claim_as(fake: FakePods, number: int) -> dict[str, Any] | None:
    manifest = childs_pod()
    manifest["metadata"]["labels"][EPISODE_LABEL] = f"pooled-0-{number}"
    claimed = await claim(fake, claimer(number), PoolRef("pooled", "set-uid"), manifest)  # type: ignore[arg-type]
    return claimed.pod if claimed is not None else None


def test_of_two_claimers_of_one_pod_one_wins_and_the_other_makes_a_fresh_pod() -> None:
    fake = pool_of(1)

    async def both() -> list[dict[str, Any] | None]:
        return list(await asyncio.gather(claim_as(fake, 1), claim_as(fake, 2)))

    results = asyncio.run(both())
    won = [r for r in results if r is not None]
    assert len(won) == 1 and results.count(None) == 1
    pod = fake.pods[won[0]["metadata"]["name"]]
    assert POOL_LABEL not in pod["metadata"]["labels"] and pod["metadata"]["labels"][POOL_CLAIMED_LABEL] == "pooled"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Episode"


def test_two_claimers_of_two_pods_get_one_each() -> None:
    fake = pool_of(2)

    async def both() -> list[dict[str, Any] | None]:
        return list(await asyncio.gather(claim_as(fake, 1), claim_as(fake, 2)))

    first, second = asyncio.run(both())
    assert first is not None and second is not None
    assert first["metadata"]["uid"] != second["metadata"]["uid"]


def test_a_pod_someone_execd_into_is_deleted_by_its_claimer_and_the_next_one_claimed() -> None:
    fake = pool_of(2)
    touched = sorted(fake.pods)[0]
    fake.exec_into(touched)
    result = asyncio.run(claim_as(fake, 1))
    assert result is not None and result["metadata"]["name"] != touched
    assert fake.deleted == [touched]


def test_a_claimed_pod_is_never_claimed_again() -> None:
    fake = pool_of(1)
    assert asyncio.run(claim_as(fake, 1)) is not None
    assert asyncio.run(claim_as(fake, 2)) is None


# --- the provider: claim, fall back, and find the claimed pod again after a restart -------------------------
class ProviderPods(FakePods):
    """FakePods plus what KubeProvider calls: read, create, the supervisor's placement, network policies."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        super().__init__(pods)
        self.created: list[str] = []
        self.reads: list[str] = []  # the pods read, by name
        self.execs: list[str] = []  # the pods exec'd into, by name
        self.lists: list[str] = []  # the selectors listed

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads.append(name)
        if name not in self.pods:
            raise NotFound(name, status=404)
        return copy.deepcopy(self.pods[name])

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        pod = live(manifest, uid=f"fresh-{len(self.created)}")
        self.pods[pod["metadata"]["name"]] = pod
        self.pids[pod["metadata"]["name"]] = 100
        self.created.append(pod["metadata"]["name"])
        return copy.deepcopy(pod)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.lists.append(selector)
        terms = [term.split("=", 1) for term in selector.split(",")]
        return [
            copy.deepcopy(pod)
            for pod in self.pods.values()
            if all(
                (pod["metadata"]["labels"].get(t[0]) == t[1]) if len(t) == 2 else t[0] in pod["metadata"]["labels"]
                for t in terms
            )
        ]

    async def apply_network_policy(self, manifest: dict[str, Any]) -> None:
        pass

    async def exec(self, namespace: str, name: str, container: str, argv: Any, *, stdout: Any, **_: Any) -> int:
        self.execs.append(name)
        if argv[2].startswith(PROBE[2]):
            return await super().exec(namespace, name, container, argv, stdout=stdout)
        self.placements.append(name)
        stdout.write(PLACEMENT_ANSWER)  # the supervisor's placement on its own
        return 0


def pooled_provider(fake: ProviderPods) -> Any:
    from episode_operator.kube.pod_sandbox import KubeProvider
    from tests.unit.folders import plan_of, single_step

    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": {}}}, "agent": {"kind": "oracle"}})
    episode = OwnerRef("pooled-0-1", "ns", "child-uid")
    return KubeProvider(fake, episode, spec, plan_of(single_step()), IMAGE, {}, pool=PoolRef("pooled", "set-uid"))  # type: ignore[arg-type]


def provider_pool_pod(provider: Any, suffix: str) -> dict[str, Any]:
    """A pool pod made for exactly the pod ``provider`` would make (its key), running and marked."""
    pod = SandboxPod(
        role="agent",
        attempt=1,
        image=provider.image,
        environment=provider.plan.environment,
        env=provider.main_env,
        sidecars=provider.plan.sidecars,
        needs=provider.needs,
        reservation=verifier_reservation(provider.plan, provider.sandbox_requests),
        requests=provider.sandbox_requests,
        volumes=provider.plan.main_volumes,
    )
    manifest = sandbox_pod(provider.episode, provider.spec, pod, extra_labels={}, images=provider.images)
    key = pod_key(manifest)
    manifest["metadata"] = {
        "name": f"pooled-pool-{suffix}",
        "namespace": "ns",
        "labels": {POOL_LABEL: "pooled", POOL_KEY_LABEL: key},
        "ownerReferences": [SET.owner_reference()],
    }
    return live(manifest, uid=f"pool-{suffix}")


def with_pool(count: int) -> tuple[ProviderPods, Any]:
    fake = ProviderPods([])
    pool = [provider_pool_pod(pooled_provider(fake), str(i)) for i in range(count)]
    fake = ProviderPods(pool)
    return fake, pooled_provider(fake)


def test_an_attempt_claims_a_pool_pod_and_makes_none() -> None:
    fake, provider = with_pool(1)
    sandbox = asyncio.run(provider.agent(1))
    assert (sandbox.name, sandbox.uid, fake.created) == ("pooled-pool-0", "pool-0", [])
    labels = fake.pods["pooled-pool-0"]["metadata"]["labels"]
    assert labels[EPISODE_LABEL] == "pooled-0-1" and POOL_LABEL not in labels


def test_a_claimed_pod_that_runs_is_not_read_again_before_the_supervisor_is_placed() -> None:
    """The claim's answer is the pod, running (only a running pod is claimed): reading it again costs a round
    trip between the claim and the agent's first command."""
    fake, provider = with_pool(1)
    sandbox = asyncio.run(provider.agent(1))
    assert sandbox.name == "pooled-pool-0" and fake.created == []
    assert sandbox.name not in fake.reads, fake.reads


def test_a_fresh_pod_is_still_waited_for_until_it_runs() -> None:
    """The control: a pod made (not yet running in its create answer) is read until it runs."""
    fake, provider = with_pool(0)
    made = fake.create_pod

    async def create_starting(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        pod = await made(namespace, manifest)
        starting = copy.deepcopy(pod)
        starting["status"] = {"phase": "Pending"}
        return starting

    fake.create_pod = create_starting  # type: ignore[method-assign]
    sandbox = asyncio.run(provider.agent(1))
    assert fake.reads.count(sandbox.name) >= 2, fake.reads  # the NotFound before the create, then until it runs


def test_an_attempt_in_a_pod_of_its_own_lists_no_pool_pods_again() -> None:
    """Once an attempt made its own pod, asking for its agent pod (its name, its node, its release, the sandbox
    again) neither lists the pool nor looks for a claimed pod."""
    fake, provider = with_pool(0)
    sandbox = asyncio.run(provider.agent(1))
    listed = len(fake.lists)
    provider._sandboxes.clear()
    again = asyncio.run(provider.agent(1, uid=sandbox.uid))
    asyncio.run(provider.release_agent(1))
    assert (again.name, fake.deleted) == (sandbox.name, [sandbox.name])
    assert fake.lists[listed:] == [], fake.lists[listed:]


def test_a_claimed_pod_gets_the_supervisor_placed_in_the_exec_of_its_probe() -> None:
    """One exec between the claim and the supervisor's first verb: the probe, then the placement in its shell."""
    fake, provider = with_pool(1)
    sandbox = asyncio.run(provider.agent(1))
    assert (sandbox.name, fake.placements, fake.execs) == ("pooled-pool-0", ["pooled-pool-0"], ["pooled-pool-0"])
    assert sandbox.workdir == "/app" and sandbox.facts["user"] == "root"


def test_a_pod_execd_into_is_found_out_by_the_probe_placed_with_and_the_next_one_claimed() -> None:
    fake, provider = with_pool(2)
    touched = sorted(fake.pods)[0]
    fake.exec_into(touched)
    sandbox = asyncio.run(provider.agent(1))
    assert sandbox.name != touched and fake.deleted == [touched] and fake.created == []


def test_a_fresh_pod_gets_the_supervisor_placed_on_its_own() -> None:
    fake, provider = with_pool(0)
    sandbox = asyncio.run(provider.agent(1))
    assert fake.placements == [sandbox.name] and sandbox.workdir == "/app"


def test_the_probe_placed_with_reads_the_pids_before_the_placement_runs() -> None:
    from episode_operator.runtime import supervisor

    placement = supervisor.placement(layout=("/logs/agent",))
    argv = probed(placement.argv)
    assert argv[:2] == ("sh", "-c") and argv[2].startswith(PROBE[2] + "\n") and argv[2].endswith(placement.argv[2])
    assert list(argv[3:]) == placement.argv[3:], "the placement's own arguments, unchanged"
    assert split_probed(f"12\n1\n12\n{PLACED_AFTER}\nworkdir=/app\n".encode()) == (b"12\n1\n12", b"workdir=/app\n")
    assert split_probed(b"12\n1\n12\n") == (b"12\n1\n12\n", None), "the placement did not start"


def placed_before_the_mark(fake: ProviderPods, name: str, script: bytes | None = None) -> None:
    """The pool pod's annotation of a placement made before its mark: this operator's, or another script's."""
    placement = pool_placement()
    if script is not None:
        placement = replace(placement, stdin=script)
    annotation = placed_annotation(placement, b"version=1\nworkdir=/srv\nuser=root\n")
    fake.pods[name]["metadata"]["annotations"][POOL_PLACED_ANNOTATION] = annotation


def test_a_pool_pod_placed_before_its_mark_is_only_probed_by_its_claimer() -> None:
    """The supervisor the pool placed (the same script and layout) is not placed again: between the claim and the
    agent's first job, one exec of shell builtins; the sandbox learns the pod's facts from the annotation."""
    fake, provider = with_pool(1)
    placed_before_the_mark(fake, "pooled-pool-0")
    sandbox = asyncio.run(provider.agent(1))
    assert (sandbox.name, fake.execs, fake.placements) == ("pooled-pool-0", ["pooled-pool-0"], [])
    assert sandbox.workdir == "/srv"


def test_a_pool_pod_placed_by_another_supervisor_gets_this_one_placed_with_the_probe() -> None:
    """The control: another operator's script (an upgrade between mark and claim) is placed again."""
    fake, provider = with_pool(1)
    placed_before_the_mark(fake, "pooled-pool-0", script=b"echo an older supervisor\n")
    sandbox = asyncio.run(provider.agent(1))
    assert (fake.execs, fake.placements, sandbox.workdir) == (["pooled-pool-0"], ["pooled-pool-0"], "/app")


def test_a_pool_pod_touched_after_its_placement_is_still_found_out() -> None:
    """Placing before the mark leaves the freshness check as it was: an exec since the mark is caught."""
    fake, provider = with_pool(2)
    for name in fake.pods:
        placed_before_the_mark(fake, name)
    touched = sorted(fake.pods)[0]
    fake.exec_into(touched)
    sandbox = asyncio.run(provider.agent(1))
    assert sandbox.name != touched and fake.deleted == [touched] and fake.placements == []


class MarkingPods(RefillPods):
    """A running pool pod not yet marked: its probes' PIDs one stride apart, its patches kept."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        super().__init__(pods)
        self.pid = 40
        self.argvs: list[tuple[str, ...]] = []
        self.patched: dict[str, Any] = {}

    async def exec(self, namespace: str, name: str, container: str, argv: Any, *, stdout: Any, **_: Any) -> int:
        self.argvs.append(tuple(argv))
        self.pid += STRIDE
        stdout.write(f"{self.pid}\n1\n7\n".encode())
        if tuple(argv) != PROBE:
            stdout.write(f"{PLACED_AFTER}\n".encode() + PLACEMENT_ANSWER)
        return 0

    async def patch_pool_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        self.patched[name] = patch[-1]["value"]
        return {}


def test_the_pool_places_the_supervisor_before_it_marks_a_pod() -> None:
    pod = live(the_pool_pod(suffix="a"), uid="a")
    pod["metadata"]["annotations"] = {}
    pod["metadata"]["creationTimestamp"] = precise_timestamp(time.time())  # young: not past the pool's max age
    fake = MarkingPods([pod])
    settings = PoolSettings(REQUESTS, AgentImages())
    asyncio.run(reconcile_pool(fake, SET, set_spec(), remaining=1, settings=settings))  # type: ignore[arg-type]
    assert fake.argvs[0] != PROBE and all(argv == PROBE for argv in fake.argvs[1:]), "placed, then probed"
    annotations = fake.patched[pod["metadata"]["name"]]
    marked = {"metadata": {"annotations": annotations}}
    assert Mark.parse(annotations[POOL_MARK_ANNOTATION]) is not None
    assert placed_at_mark(marked, pool_placement()) == PLACEMENT_ANSWER


def test_with_no_pool_pod_an_attempt_makes_a_fresh_pod_at_once() -> None:
    fake, provider = with_pool(0)
    sandbox = asyncio.run(provider.agent(1))
    assert fake.created == [sandbox.name] == ["pooled-0-1-a1"]


@pytest.mark.parametrize("pool", [1, 0], ids=["claimed", "fresh"])
def test_the_pods_session_opens_as_soon_as_the_supervisor_is_placed(pool: int) -> None:
    """Before any call: the exec that opens it runs while the runner writes the pod's record and its stage,
    so the agent's first job does not wait for it (kube/session.py)."""
    from episode_operator.runtime import supervisor
    from tests.unit.test_sessions import ScriptedStream

    fake, provider = with_pool(pool)
    opened: list[tuple[str, str, list[str]]] = []

    async def exec_stream(namespace: str, name: str, container: str, argv: list[str]) -> ScriptedStream:
        opened.append((name, container, list(argv)))
        return ScriptedStream(b"@@EO ready 1 exact\n")

    fake.exec_stream = exec_stream  # type: ignore[attr-defined]

    async def scenario() -> None:
        sandbox = await provider.agent(1)
        session = sandbox.sessions["main"]
        async with asyncio.timeout(5):
            while not session.open:
                await asyncio.sleep(0.01)
        assert opened == [(sandbox.name, "main", supervisor.serve().argv)] and session.calls == 0
        await sandbox.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("recorded", [True, False], ids=["uid-recorded", "before-the-uid-was-recorded"])
def test_a_restarted_operator_finds_the_claimed_pod_again_and_claims_or_makes_no_other(recorded: bool) -> None:
    fake, provider = with_pool(2)
    first = asyncio.run(provider.agent(1))
    again = asyncio.run(pooled_provider(fake).agent(1, uid=first.uid if recorded else None))
    assert (again.name, again.uid, fake.created) == (first.name, first.uid, [])
    assert POOL_LABEL in fake.pods["pooled-pool-1"]["metadata"]["labels"], "the other pool pod stays in the pool"


def test_a_claimed_pod_that_is_gone_is_lost_never_made_again() -> None:
    from episode_operator.runtime.sandbox_protocol import SandboxError

    fake, provider = with_pool(1)
    first = asyncio.run(provider.agent(1))
    del fake.pods[first.name]
    with pytest.raises(SandboxError) as lost:
        asyncio.run(pooled_provider(fake).agent(1, uid=first.uid))
    assert lost.value.kind == "pod_lost" and fake.created == []


def test_a_restarted_operator_releases_the_claimed_pod_by_its_name() -> None:
    fake, provider = with_pool(1)
    first = asyncio.run(provider.agent(1))
    asyncio.run(pooled_provider(fake).release_agent(1))
    assert first.name in fake.deleted


# --- an agent whose model calls go through a capture proxy -------------------------------------------------
MODEL_AGENT = {
    "kind": "command",
    "command": "true",
    "model": {"name": "policy", "baseURL": "http://198.18.0.9:8000/v1", "apiKeySecretRef": {"name": "model-key"}},
}
CAPTURING = PoolSettings(REQUESTS, AgentImages(capture="episode-operator.local/operator:1"))


class Keys:
    """The API as far as a model agent's pool asks it: the key's Secret (its keys), no Services."""

    def __init__(self, keys: set[str] | None) -> None:
        self.keys = keys

    async def secret_keys(self, namespace: str, name: str) -> set[str]:
        if self.keys is None:
            raise NotFound(f"secrets {name!r} not found", status=404)
        return self.keys

    async def service_cluster_ips(self, namespace: str, name: str) -> list[str]:
        raise NotFound(name, status=404)


def model_set(**agent: Any) -> EpisodeSetSpec:
    spec = set_spec()
    return EpisodeSetSpec.model_validate(
        {**spec.model_dump(by_alias=True, exclude_none=True), "agent": {**MODEL_AGENT, **agent}}
    )


def model_childs_pod(spec: EpisodeSetSpec, needs: SandboxNeeds) -> dict[str, Any]:
    child = child_spec(spec, spec.dataset.tasks[0], {"EPISODE_SET": "pooled"})
    environment = EnvironmentConfig(docker_image=IMAGE, cpus=1, memory_mb=256, workdir="/app")
    pod = SandboxPod(role="agent", attempt=1, image=IMAGE, environment=environment, needs=needs, requests=REQUESTS)
    return sandbox_pod(OwnerRef("pooled-0-1", "ns", "child-uid"), child, pod, extra_labels={}, images=CAPTURING.images)


def test_a_model_agents_child_has_the_pools_key_its_proxy_pinned_as_the_driver_pins_it() -> None:
    """The pool pins the proxy's upstream and gives it its settings by the driver's own function: a child's pod,
    proxy and all, is the pool's pod. A child whose upstream pinned elsewhere gets a fresh pod."""
    spec = model_set()
    needs, refusal = asyncio.run(pool_needs(Keys({"api-key"}), "ns", spec, CAPTURING))  # type: ignore[arg-type]
    assert refusal is None
    assert needs.capture is not None and needs.capture.upstream_addresses == ("198.18.0.9",)
    pool = pool_pod(SET, spec, needs, requests=REQUESTS, images=CAPTURING.images, suffix="a")
    assert "capture-proxy" in json.dumps(pool["spec"]), "the pool pod runs the proxy the child's pod runs"
    child_needs = asyncio.run(
        pinned_needs(
            Keys({"api-key"}), "ns", agent_kind(spec.agent).sandbox_needs(spec.agent), CaptureBounds(), system_resolver
        )  # type: ignore[arg-type]
    )
    assert pod_key(model_childs_pod(spec, child_needs)) == pool["metadata"]["labels"][POOL_KEY_LABEL]
    assert child_needs.capture is not None
    elsewhere = replace(child_needs, capture=replace(child_needs.capture, upstream_addresses=("198.18.0.10",)))
    assert pod_key(model_childs_pod(spec, elsewhere)) != pool["metadata"]["labels"][POOL_KEY_LABEL]


@pytest.mark.parametrize(
    ("keys", "images", "says"),
    [
        (None, CAPTURING.images, "spec.agent.model.apiKeySecretRef: secret ns/model-key not found"),
        ({"other"}, CAPTURING.images, "has no key 'api-key'"),
        ({"api-key"}, AgentImages(), "this operator has no capture image"),
    ],
    ids=["no-secret", "no-key", "no-capture-image"],
)
def test_a_model_agent_that_could_not_call_its_model_gets_no_pool_pods_and_the_status_says_why(
    keys: set[str] | None, images: AgentImages, says: str
) -> None:
    settings = PoolSettings(REQUESTS, images)
    needs, refusal = asyncio.run(pool_needs(Keys(keys), "ns", model_set(), settings))  # type: ignore[arg-type]
    assert refusal is not None and says in refusal
    assert needs.capture is None  # the key of a pod that is never made; no proxy without an image to build it from
