"""Replicas without a cluster: the hash, membership by observed Lease changes, claims, and the fence.

The Lease API is an in-memory stand-in that honours what the real one does for these calls:
resourceVersion preconditions on replace and delete (409), 404 for what is gone, a new
resourceVersion on every write. Time is a fake monotonic clock, so expiry is exact.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
from collections import Counter
from typing import Any

import pytest
from kopf._cogs.structs.bodies import Body

from episode_operator.api.episode_resource import AgentSpec, EpisodeStatus
from episode_operator.api.vocabulary import DRIVER_ANNOTATION, ROUTE_LABEL, Stage
from episode_operator.kube.client import Conflict, KubeError, NotFound
from episode_operator.kube.replicas import (
    EPISODES,
    Claim,
    Claimable,
    Departed,
    Membership,
    Replicas,
    ReplicaSettings,
    RoutedAway,
    owner_of,
)
from episode_operator.runtime.episode import EpisodeConfig, EpisodeRunner
from episode_operator.runtime.fencing import Fenced, FencedProvider, FencedSandbox, HandOver
from episode_operator.runtime.sandbox_protocol import JobSpec
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from tests.unit.fake_sandbox import FakeProvider, FakeSandbox, FakeSink, MemoryStore, World
from tests.unit.test_runtime import SEPARATE, ledger_steps

LOG = logging.getLogger("test")
SETTINGS = ReplicaSettings(namespace="ops", group="g", lease_duration_sec=10, renew_deadline_sec=7, retry_period_sec=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LeaseApi:
    """The coordination API as far as Membership uses it, and Episodes' get and merge patch."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.episodes: dict[str, dict[str, Any]] = {}
        self.version = 0

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    async def create_lease(self, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        if name in self.leases:
            raise Conflict("exists", status=409)
        self.leases[name] = copy.deepcopy(manifest)
        return self._stamp(self.leases[name])

    async def replace_lease(self, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        if name not in self.leases:
            raise NotFound("gone", status=404)
        if self.leases[name]["metadata"]["resourceVersion"] != manifest["metadata"]["resourceVersion"]:
            raise Conflict("changed", status=409)
        self.leases[name] = copy.deepcopy(manifest)
        return self._stamp(self.leases[name])

    async def delete_lease(self, namespace: str, name: str, resource_version: str) -> None:
        if name in self.leases:
            if self.leases[name]["metadata"]["resourceVersion"] != resource_version:
                raise Conflict("changed", status=409)
            del self.leases[name]

    async def list_leases(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(lease) for lease in self.leases.values()]

    def add_episode(self, name: str, uid: str) -> dict[str, Any]:
        self.episodes[name] = {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": {}}}
        return self._stamp(self.episodes[name])

    async def get_episode(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.episodes[name])

    async def patch_episode(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        current = self.episodes[name]["metadata"]
        wanted = patch["metadata"]
        if "resourceVersion" in wanted and wanted["resourceVersion"] != current["resourceVersion"]:
            raise Conflict("changed", status=409)
        for key, value in wanted.get("annotations", {}).items():
            if value is None:
                current["annotations"].pop(key, None)
            else:
                current["annotations"][key] = value
        self._stamp(self.episodes[name])


FAKE_EPISODES = Claimable("episode", LeaseApi.get_episode, LeaseApi.patch_episode)  # type: ignore[arg-type]


def member(api: LeaseApi, clock: Clock, name: str) -> Membership:
    settings = ReplicaSettings(**{**SETTINGS.__dict__, "name": name})
    return Membership(api, settings, LOG, monotonic=clock, clock=clock)  # type: ignore[arg-type]


# --- the hash ------------------------------------------------------------------------------------------
def test_the_hash_moves_only_the_share_of_a_replica_that_leaves_or_joins() -> None:
    keys = [f"uid-{index}" for index in range(3000)]
    three = {key: owner_of(key, {"a", "b", "c"}) for key in keys}
    assert set(Counter(three.values())) == {"a", "b", "c"}
    assert all(700 < count < 1300 for count in Counter(three.values()).values())
    two = {key: owner_of(key, {"a", "b"}) for key in keys}
    assert all(two[key] == owner for key, owner in three.items() if owner != "c")  # only c's share moved
    four = {key: owner_of(key, {"a", "b", "c", "d"}) for key in keys}
    moved = [key for key in keys if four[key] != three[key]]
    assert all(four[key] == "d" for key in moved) and 500 < len(moved) < 1000
    assert owner_of("x", set()) is None


# --- membership ----------------------------------------------------------------------------------------
def test_a_replica_is_alive_while_its_lease_changes_and_dead_a_lease_duration_after() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = member(api, clock, "a"), member(api, clock, "b")

    async def scenario() -> None:
        await a.join()
        await b.join()
        await a.observe()
        assert set(a.members.values()) == {"a", "b"} and a.is_live(b.identity)
        for _ in range(4):  # b renews every 2 s: alive however long
            clock.now += 2
            await a.renew()
            await b.renew()
            await a.observe()
        assert a.is_live(b.identity)
        for _ in range(4):  # b stops renewing (dead): alive for 10 s as a saw it, then not
            clock.now += 2
            await a.renew()
            await a.observe()
        assert a.is_live(b.identity)
        clock.now += 2.5
        await a.renew()
        await a.observe()
        assert not a.is_live(b.identity) and set(a.members.values()) == {"a"}
        assert a.owns("anything") and not b.fresh()  # b stopped acting 7 s after its last renewal
        for _ in range(6):  # twice the duration: a removes b's Lease
            clock.now += 2
            await a.renew()
            await a.observe()
        assert [lease["spec"]["holderIdentity"] for lease in api.leases.values()] == [a.identity]

    asyncio.run(scenario())


def test_a_replica_stops_acting_before_the_others_take_over() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = member(api, clock, "a"), member(api, clock, "b")

    async def scenario() -> None:
        await a.join()
        await b.join()
        await b.observe()
        clock.now += 6.9
        assert a.fresh()
        clock.now += 0.2  # past the renew deadline: a must not act any more ...
        assert not a.fresh() and not a.owns("k") and not a.is_live(a.identity)
        await b.renew()
        await b.observe()
        assert b.is_live(a.identity)  # ... while b still counts it alive (until 10 s)

    asyncio.run(scenario())


def test_a_replica_whose_lease_was_removed_joins_again_as_a_new_incarnation() -> None:
    api, clock = LeaseApi(), Clock()
    a = member(api, clock, "a")
    changes: list[str] = []
    a.listeners.append(lambda: changes.append(a.identity))

    async def scenario() -> None:
        await a.join()
        first = a.identity
        api.leases.clear()  # others found it stale and removed it
        await a.renew()
        assert a.identity != first and a.identity.startswith("a.") and a.fresh()
        assert changes and [lease["spec"]["holderIdentity"] for lease in api.leases.values()] == [a.identity]
        await a.leave()
        assert api.leases == {} and not a.fresh()

    asyncio.run(scenario())


@pytest.mark.parametrize("order", ["a first", "b first"])
def test_of_replicas_stopping_together_the_last_to_ask_finds_nobody_staying(order: str) -> None:
    """Who removes the data API's registration as the operator stops: a replica stopping while
    another stays leaves it (a rolling update); of several stopping together (a scale to zero),
    the last to ask. Each marks its Lease before it asks, and the mark survives its renewals."""
    api, clock = LeaseApi(), Clock()
    a, b, c = member(api, clock, "a"), member(api, clock, "b"), member(api, clock, "c")

    async def scenario() -> None:
        for replica in (a, b, c):
            await replica.join()
        await a.announce_leaving()
        await a.renew()  # a renewal keeps the mark
        assert await a.others_staying() == sorted([b.identity, c.identity])
        assert await b.others_staying() == [c.identity]  # b still counts itself out, a is leaving
        await c.leave()
        # Interleaved: the first asks before the second marked its Lease; the second then sees the mark.
        first, second = (a, b) if order == "a first" else (b, a)
        await first.announce_leaving()
        assert await first.others_staying() == ([b.identity] if first is a else [])
        await second.announce_leaving()
        assert await second.others_staying() == []
        assert a.fresh() and b.fresh()  # marked, still members: they drive until they leave

    asyncio.run(scenario())


def test_a_replica_that_rejoins_while_leaving_keeps_the_mark() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = member(api, clock, "a"), member(api, clock, "b")

    async def scenario() -> None:
        await a.join()
        await b.join()
        await a.announce_leaving()
        (gone,) = [name for name, lease in api.leases.items() if lease["spec"]["holderIdentity"] == a.identity]
        del api.leases[gone]
        await a.renew()  # its Lease was gone: a new incarnation, still leaving
        assert await b.others_staying() == []

    asyncio.run(scenario())


def test_the_settings_refuse_a_deadline_that_outlives_the_lease() -> None:
    assert ReplicaSettings(lease_duration_sec=10, renew_deadline_sec=7, retry_period_sec=2).problems() == []
    assert ReplicaSettings(lease_duration_sec=5, renew_deadline_sec=7, retry_period_sec=2).problems()
    assert ReplicaSettings(lease_duration_sec=10, renew_deadline_sec=7, retry_period_sec=8).problems()


# --- claims ----------------------------------------------------------------------------------------------
def replicas_on(api: LeaseApi, membership: Membership) -> Replicas:
    replicas = Replicas(api, membership, LOG)  # type: ignore[arg-type]
    return replicas


def uid_owned_by(owner: str, names: set[str]) -> str:
    return next(f"uid-{index}" for index in range(1000) if owner_of(f"uid-{index}", names) == owner)


def test_only_the_owner_claims_and_it_takes_over_from_a_dead_holder_only() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = member(api, clock, "a"), member(api, clock, "b")
    uid = uid_owned_by("a", {"a", "b"})
    body = api.add_episode("e", uid)

    async def scenario() -> None:
        await a.join()
        await b.join()
        await a.observe()
        on_a, on_b = replicas_on(api, a), replicas_on(api, b)
        assert await on_b._acquire(FAKE_EPISODES, body) is None  # not b's
        api.episodes["e"]["metadata"]["annotations"][DRIVER_ANNOTATION] = b.identity  # b holds it by mistake
        fresh = await api.get_episode("ns", "e")
        assert await on_a._acquire(FAKE_EPISODES, fresh) is None  # held by a live replica: not taken
        for _ in range(6):  # b dies
            clock.now += 2
            await a.renew()
            await a.observe()
        claim = await on_a._acquire(FAKE_EPISODES, fresh)
        assert isinstance(claim, Claim) and claim.replaced == b.identity
        assert api.episodes["e"]["metadata"]["annotations"][DRIVER_ANNOTATION] == a.identity
        claim.check()  # the body still shows b (the watch lags): the holder it replaced is fine
        await on_a._release(claim)
        assert DRIVER_ANNOTATION not in api.episodes["e"]["metadata"]["annotations"]

    asyncio.run(scenario())


def test_a_claim_fences_once_another_holds_it_and_hands_over_when_the_owner_changes() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = member(api, clock, "a"), member(api, clock, "b")
    uid = uid_owned_by("a", {"a", "b"})

    async def scenario() -> None:
        await a.join()
        await a.observe()
        body = api.add_episode("e", uid)
        claim = await replicas_on(api, a)._acquire(FAKE_EPISODES, body)
        assert isinstance(claim, Claim)
        body["metadata"]["annotations"][DRIVER_ANNOTATION] = a.identity  # the watch shows our write
        claim.check()
        body["metadata"]["annotations"][DRIVER_ANNOTATION] = "x.123"  # another replica's claim
        with pytest.raises(Fenced, match=r"claimed by x\.123"):
            claim.check()
        body["metadata"]["annotations"][DRIVER_ANNOTATION] = a.identity
        other = uid_owned_by("b", {"a", "b"})
        moving = api.add_episode("m", other)
        moving["metadata"]["annotations"][DRIVER_ANNOTATION] = a.identity
        moved = Claim(replicas_on(api, a), FAKE_EPISODES, moving, replaced=None)
        moved.check()  # b is not a member yet: still a's
        await b.join()
        await a.observe()
        with pytest.raises(HandOver):
            moved.check()
        clock.now += 7.5  # a missed its renewals
        with pytest.raises(Fenced, match="could not renew"):
            claim.check()

    asyncio.run(scenario())


def test_a_body_that_left_the_watch_is_driven_no_more_and_a_claim_starts_from_the_newest_status() -> None:
    """kopf's DELETED event for an object routed away carries it as it was before (its old route and
    claim) and kopf updates that body no more: its daemons must end, not wake later and drive from
    its old status over what the next driver wrote (a finished Episode ran again: the chaos test)."""
    api, clock = LeaseApi(), Clock()
    a = member(api, clock, "a")

    async def scenario() -> None:
        await a.join()
        await a.observe()
        replicas = Replicas(api, a, LOG, routing=True)  # type: ignore[arg-type]
        api.add_episode("e", "u")
        api.episodes["e"]["status"] = {"phase": "Succeeded"}  # what the next driver wrote since
        raw = {"metadata": {**copy.deepcopy(api.episodes["e"]["metadata"]), "labels": {ROUTE_LABEL: "a"}}}
        raw["metadata"]["annotations"][DRIVER_ANNOTATION] = a.identity
        raw["status"] = {"phase": "Running"}
        frozen = Body(raw)  # type: ignore[arg-type]  # kopf's body of the daemons
        held = Claim(replicas, FAKE_EPISODES, frozen, replaced=None)
        held.check()
        assert replicas.belongs_here(frozen)
        replicas.left_watch(FAKE_EPISODES, frozen)
        with pytest.raises(HandOver, match="left this replica's watch"):
            held.check()
        assert not replicas.belongs_here(frozen)
        with pytest.raises(RoutedAway, match="left the watch"):
            await replicas._acquire(FAKE_EPISODES, frozen)
        # The object back in the watch is a new body: driven again, from the status read for the claim.
        again = Body(copy.deepcopy(raw))  # type: ignore[arg-type]
        claim = await replicas._acquire(FAKE_EPISODES, again)
        assert isinstance(claim, Claim) and claim.current["status"] == {"phase": "Succeeded"}
        # A body whose own route is stale still claims nothing the API server routes elsewhere.
        await replicas._release(claim)
        api.episodes["e"]["metadata"]["labels"] = {ROUTE_LABEL: "b"}
        with pytest.raises(RoutedAway, match="routed to b"):
            await replicas._acquire(FAKE_EPISODES, Body(copy.deepcopy(raw)))  # type: ignore[arg-type]
        assert DRIVER_ANNOTATION not in api.episodes["e"]["metadata"]["annotations"]

    asyncio.run(scenario())


def test_departed_bodies_are_held_by_identity_and_weakly() -> None:
    departed = Departed()
    body = Body({"metadata": {"name": "e"}})  # kopf's bodies are mappings: unhashable, equal by value
    twin = Body({"metadata": {"name": "e"}})
    departed.add(body)
    assert body in departed and twin not in departed
    del body
    gc.collect()
    assert len(departed) == 0


def test_a_sole_replica_drives_everything_unfenced() -> None:
    replicas = Replicas(LeaseApi(), None, LOG)  # type: ignore[arg-type]
    body = {"metadata": {"name": "e", "namespace": "ns", "uid": "u"}}

    async def scenario() -> None:
        async with replicas.driving(EPISODES, body) as fence:
            fence.check()
            assert "u" in replicas.held
        assert replicas.held == {}

    asyncio.run(scenario())
    assert replicas.owns("anything")


# --- the fence in the runner ---------------------------------------------------------------------------
class CountingFence:
    """Says HandOver at its ``stop_at``-th check (None: never); counts every check."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.checks = 0
        self.stop_at = stop_at

    def check(self) -> None:
        self.checks += 1
        if self.checks == self.stop_at:
            raise HandOver("moving")

    async def confirm(self) -> None:
        self.check()


class FencedSink(FakeSink):
    """A status sink that asks the fence first, as kube/status.py does."""

    def __init__(self, fence: CountingFence) -> None:
        super().__init__()
        self.fence = fence

    async def publish(self, status: EpisodeStatus) -> None:
        self.fence.check()
        await super().publish(status)

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.fence.check()
        await super().event(reason, message, warning=warning)


def run_fenced(
    folder: dict[str, str],
    world: World,
    fence: CountingFence | None,
    status: EpisodeStatus | None,
    sink: FakeSink,
    store: MemoryStore,
) -> EpisodeStatus:
    files = TaskFiles.from_mapping(folder)
    config = EpisodeConfig(
        plan=resolve_plan(load_task(files)), files=files, agent=AgentSpec(kind="oracle"), digest=files.digest()
    )
    provider = FakeProvider(world) if fence is None else FencedProvider(FakeProvider(world), fence)
    runner = EpisodeRunner(
        config,
        provider,  # type: ignore[arg-type]
        sink,
        store,
        clock=world.clock.time,
        monotonic=world.clock.monotonic,
        sleep=world.clock.sleep,
    )
    return asyncio.run(runner.run(status))


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_a_handover_at_any_safe_point_runs_no_job_twice(separate: bool) -> None:
    """The driver stops at its k-th fence check, for every k of a whole run; the next replica resumes
    from the status the first one last wrote: same rewards, every job started once, every input placed once."""
    folder = ledger_steps({name: SEPARATE for name in "abc"} if separate else None)
    counting = CountingFence()
    run_fenced(folder, World(), counting, None, FencedSink(counting), MemoryStore())
    total = counting.checks
    assert total > 30, total  # every sandbox call and status write asks
    for stop_at in range(1, total + 1):
        # The store is shared, as every replica reads the same one (a separate verifier gets the
        # artifacts the first driver collected).
        world, fence, store = World(), CountingFence(stop_at), MemoryStore()
        first = FencedSink(fence)
        with pytest.raises(HandOver):
            run_fenced(folder, world, fence, None, first, store)
        resumed = first.statuses[-1] if first.statuses else None
        status = run_fenced(folder, world, None, resumed, FakeSink(), store)
        assert (status.phase, status.reward, status.attempt) == ("Succeeded", 1.0, 1), stop_at
        assert [turn.stage for turn in status.turns] == [Stage.DONE] * 3
        pods = [world.sandboxes[name] for name in sorted(world.sandboxes)]
        starts = [job for pod in pods for job in pod.starts]
        assert len(starts) == len(set(starts)), (stop_at, starts)
        assert world.sandboxes["pod-a1"].uploads.count("/solution") == 3, stop_at


def test_every_sandbox_call_asks_the_fence_first() -> None:
    """Each method of the fenced sandbox and provider: a fence that says no stops the call before it
    reaches the sandbox."""

    class No:
        def check(self) -> None:
            raise Fenced("no")

        async def confirm(self) -> None:
            raise Fenced("no")

    world = World()
    sandbox = FencedSandbox(FakeSandbox("pod", world.clock, world), No())
    provider = FencedProvider(FakeProvider(world), No())
    spec = JobSpec(id="j", command="true", timeout_sec=5)
    calls: list[Any] = [
        sandbox.start_job(spec),
        sandbox.wait_job(spec, max_wait_sec=1),
        sandbox.job_output("j", limit=10),
        sandbox.upload(b"", "/x"),
        sandbox.download(["/x"]),
        sandbox.read_files(["/x"]),
        sandbox.clear(["/x"]),
        sandbox.switch_user("root", None),
        provider.agent(1),
        provider.verifier(1, 0, None),  # type: ignore[arg-type]
        provider.apply_network(1, None),  # type: ignore[arg-type]
        provider.release_verifier(1, 0),
        provider.release_agent(1),
        provider.release_all(keep=False),
    ]
    for call in calls:
        with pytest.raises(Fenced):
            asyncio.run(call)
    assert sandbox.sandbox.calls == Counter() and world.sandboxes == {} and world.released == []  # type: ignore[attr-defined]


def test_a_failed_rejoin_keeps_the_identity_of_the_lease_it_had() -> None:
    """While the Lease's namespace is being deleted a rejoin fails: the replica is then no member (not
    fresh), and its identity still names the Lease it had, never one that does not exist."""
    api, clock = LeaseApi(), Clock()
    a = member(api, clock, "a")

    async def refuse(manifest: dict[str, Any]) -> dict[str, Any]:
        raise KubeError("forbidden: the namespace is being terminated", status=403)

    async def scenario() -> None:
        await a.join()
        first = a.identity
        api.leases.clear()
        api.create_lease = refuse  # type: ignore[method-assign]
        with pytest.raises(KubeError):
            await a.renew()
        assert a.identity == first and not a.fresh() and not a.owns("k")

    asyncio.run(scenario())
