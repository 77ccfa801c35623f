"""Routes (kube/routing.py): which replica's watch sees an object, set so that each object has one.

The API stand-in extends test_replicas.py's: Episodes with labels, merge patches of labels and
annotations with resourceVersion preconditions, and lists filtered by the label selectors the
router sends (``!key``, ``key notin (…)``), as the API server evaluates them.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import kopf
import pytest

from episode_operator import handlers
from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.vocabulary import DRIVER_ANNOTATION, GROUP, ROUTE_LABEL, VERSION
from episode_operator.kube.client import Conflict
from episode_operator.kube.replicas import Claimable, Replicas, RoutedAway, owner_of
from episode_operator.kube.routing import Router, Scope, route_of
from episode_operator.runtime.fencing import HandOver
from tests.unit.test_replicas import LOG, Clock, LeaseApi, member


class RoutedApi(LeaseApi):
    """Episodes with labels, listed by label selector."""

    def add(self, name: str, uid: str, route: str | None = None, namespace: str = "ns") -> None:
        labels = {ROUTE_LABEL: route} if route else {}
        self.episodes[name] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": {}, "labels": labels}
        }
        self._stamp(self.episodes[name])

    def route(self, name: str) -> str | None:
        return self.episodes[name]["metadata"]["labels"].get(ROUTE_LABEL)

    async def patch_episode(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        current = self.episodes[name]["metadata"]
        wanted = patch["metadata"]
        if "resourceVersion" in wanted and wanted["resourceVersion"] != current["resourceVersion"]:
            raise Conflict("changed", status=409)
        for field in ("annotations", "labels"):
            for key, value in wanted.get(field, {}).items():
                if value is None:
                    current[field].pop(key, None)
                else:
                    current[field][key] = value
        self._stamp(self.episodes[name])

    async def list_objects_at(
        self, plural: str, namespace: str | None, selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        if plural != PLURAL:
            return [], str(self.version)
        items = [
            copy.deepcopy(episode)
            for episode in self.episodes.values()
            if (namespace is None or episode["metadata"]["namespace"] == namespace)
            and matches(selector or "", episode["metadata"]["labels"])
        ]
        return items, str(self.version)


class WatchedApi(RoutedApi):
    """Adds a watch: every write is an event to the watches whose selector the object matches."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: list[tuple[str, asyncio.Queue[tuple[str, dict[str, Any]]]]] = []

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        stamped = super()._stamp(obj)
        if "uid" in obj["metadata"] and "holderIdentity" not in obj.get("spec", {}):
            for selector, queue in getattr(self, "watches", []):
                if matches(selector, obj["metadata"]["labels"]):
                    queue.put_nowait(("MODIFIED", copy.deepcopy(stamped)))
        return stamped

    async def watch_objects(
        self, plural: str, namespace: str | None, selector: str | None, resource_version: str
    ) -> Any:
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        if plural == PLURAL:
            self.watches.append((selector or "", queue))
        while True:
            yield await queue.get()


def matches(selector: str, labels: dict[str, str]) -> bool:
    """The two forms the router sends, as the API server reads them."""
    if not selector:
        return True
    if selector.startswith("!"):
        return selector[1:] not in labels
    if re.fullmatch(r"[^\s=!]+=[^\s=]+", selector):
        key, value = selector.split("=")
        return labels.get(key) == value
    found = re.fullmatch(r"(\S+) notin \((.*)\)", selector)
    assert found, f"unexpected selector {selector!r}"
    return labels.get(found[1]) not in found[2].split(",")


FAKE_EPISODES = Claimable("episode", RoutedApi.get_episode, RoutedApi.patch_episode)  # type: ignore[arg-type]


async def joined(api: RoutedApi, clock: Clock, *names: str) -> list[Any]:
    members = [member(api, clock, name) for name in names]
    for each in members:
        await each.join()
    for each in members:
        await each.observe()
    return members


async def watched_by_a_owned_by_b(api: RoutedApi, clock: Clock) -> tuple[Any, Replicas, dict[str, Any]]:
    """Replica "a" alone, watching Episode "e" that will belong to "b" once it joins; "e"'s body is
    updated in place by the API, as kopf's live body is by its watch."""
    (a,) = await joined(api, clock, "a")
    uid = next(f"u{i}" for i in range(100) if owner_of(f"u{i}", {"a", "b"}) == "b")
    api.add("e", uid, route="a")
    return a, Replicas(api, a, LOG, routing=True), api.episodes["e"]  # type: ignore[arg-type]


def test_a_route_is_the_replicas_name_where_that_is_a_label_value() -> None:
    assert route_of("episode-operator-6d4f9-x2x") == "episode-operator-6d4f9-x2x"
    long = route_of("a" * 70)
    assert long.startswith("r-") and len(long) <= 63 and long == route_of("a" * 70)
    assert route_of("host_name-1234.") != "host_name-1234."  # ends with a dot: not a label value


def test_a_leaving_replica_routes_its_objects_to_their_owners_among_those_staying() -> None:
    """A replica that joined and left between two of the others' listings is a change of the members
    nobody saw: what was routed to it must not wait for their next sweep."""

    async def scenario() -> None:
        api, clock = RoutedApi(), Clock()
        _a, b, _c = await joined(api, clock, "a", "b", "c")
        for index in range(30):
            api.add(f"mine-{index}", f"uid-mine-{index}", route="b")
            api.add(f"theirs-{index}", f"uid-theirs-{index}", route="a")
        router = Router(api, b, owner_of, Scope(), LOG)  # type: ignore[arg-type]
        assert await router.hand_over(set()) == 0  # nobody stays: the routes stay for b's next incarnation
        assert all(api.route(f"mine-{index}") == "b" for index in range(30))
        assert await router.hand_over({"a", "c"}) == 30
        for name, episode in api.episodes.items():
            if name.startswith("mine"):
                assert api.route(name) == owner_of(episode["metadata"]["uid"], {"a", "c"}), name
            else:
                assert api.route(name) == "a", name
        assert {api.route(f"mine-{index}") for index in range(30)} == {"a", "c"}

    asyncio.run(scenario())


def test_new_and_orphaned_objects_are_routed_to_their_owner_by_its_own_router() -> None:
    """Each router routes only its share; together they route all, once; live routes stay."""

    async def scenario() -> None:
        api, clock = RoutedApi(), Clock()
        a, b = await joined(api, clock, "a", "b")
        for index in range(40):
            api.add(f"new-{index}", f"uid-new-{index}")
            api.add(f"orphan-{index}", f"uid-orphan-{index}", route="gone")
            api.add(f"kept-{index}", f"uid-kept-{index}", route="b")
        routers = [Router(api, m, owner_of, Scope(), LOG) for m in (a, b)]  # type: ignore[arg-type]
        for router in routers:
            await router.sweep()
        for name, episode in api.episodes.items():
            uid = episode["metadata"]["uid"]
            if name.startswith("kept"):
                assert api.route(name) == "b"
            else:
                assert api.route(name) == owner_of(uid, {"a", "b"}), name
        assert sum(router.routed for router in routers) == 80
        assert 20 < routers[0].routed < 60
        before = api.version
        for router in routers:
            await router.sweep()
        assert api.version == before  # nothing left to route: no writes

    asyncio.run(scenario())


def test_a_route_written_meanwhile_wins_and_namespaces_out_of_scope_are_left() -> None:
    async def scenario() -> None:
        api, clock = RoutedApi(), Clock()
        (a,) = await joined(api, clock, "a")
        api.add("e", "uid-e")
        api.add("elsewhere", "uid-x", namespace="other")
        router = Router(api, a, owner_of, Scope(includes=lambda namespace: namespace == "ns"), LOG)  # type: ignore[arg-type]
        stale = copy.deepcopy(api.episodes["e"])
        await api.patch_episode("ns", "e", {"metadata": {"labels": {"team": "x"}}})  # a newer version
        assert not await router.consider(PLURAL, stale) and api.route("e") is None
        assert await router.consider(PLURAL, api.episodes["e"]) and api.route("e") == "a"
        await router.sweep()
        assert api.route("elsewhere") is None

    asyncio.run(scenario())


def test_a_replica_routes_on_what_it_watches_but_does_not_own_and_its_daemon_ends() -> None:
    """A replica joined: the one that watches an object it no longer owns routes it to the new
    owner (it holds no claim on it), and its parked daemon ends once the route says so."""

    async def scenario() -> None:
        api, clock = RoutedApi(), Clock()
        a, replicas, body = await watched_by_a_owned_by_b(api, clock)
        await member(api, clock, "b").join()
        await a.observe()
        driving = asyncio.create_task(replicas.driving(FAKE_EPISODES, body).__aenter__())
        async with asyncio.timeout(5):
            while api.route("e") != "b":
                await asyncio.sleep(0.01)
            replicas.wake(FAKE_EPISODES, "ns", "e")
            with pytest.raises(RoutedAway):
                await driving
        assert DRIVER_ANNOTATION not in api.episodes["e"]["metadata"]["annotations"]

    asyncio.run(scenario())


def test_a_handover_releases_the_claim_and_routes_in_one_write() -> None:
    async def scenario() -> None:
        api, clock = RoutedApi(), Clock()
        a, replicas, body = await watched_by_a_owned_by_b(api, clock)
        async with replicas.driving(FAKE_EPISODES, body) as claim:
            assert body["metadata"]["annotations"][DRIVER_ANNOTATION] == a.identity
            b = member(api, clock, "b")
            await b.join()
            await a.observe()
            writes = api.version
            with pytest.raises(HandOver):
                claim.check()
            raise HandOver("b joined")
        assert api.route("e") == "b" and DRIVER_ANNOTATION not in body["metadata"]["annotations"]
        assert api.version == writes + 1

    asyncio.run(scenario())


def test_the_scope_follows_the_namespace_patterns_and_kopf_watches_only_its_routes() -> None:
    assert handlers.serving(("a", "b")).names == ("a", "b")
    patterned = handlers.serving(("team-*,!team-x", "solo"))  # kopf's: globs, negations, any pattern
    assert patterned.names == () and patterned.includes("team-y") and patterned.includes("solo")
    assert not patterned.includes("team-x") and not patterned.includes("other")
    assert handlers.serving(()).includes("anything")
    settings = kopf.OperatorSettings()
    handlers.route_watches(settings, "r0")
    episodes = kopf.Resource(GROUP, VERSION, PLURAL)
    pods = kopf.Resource("", "v1", "pods")
    assert list(settings.watching.label_selectors.collect(episodes)) == [f"{ROUTE_LABEL}=r0"]
    assert list(settings.watching.label_selectors.collect(pods)) == [f"episode-operator.dev/episode,{ROUTE_LABEL}=r0"]
    sole = kopf.OperatorSettings()
    handlers.route_watches(sole, None)
    assert list(sole.watching.label_selectors.collect(episodes)) == []
    assert list(sole.watching.label_selectors.collect(pods)) == ["episode-operator.dev/episode"]


def test_the_router_routes_an_episode_created_while_it_watches() -> None:
    async def scenario() -> None:
        api, clock = WatchedApi(), Clock()
        (a,) = await joined(api, clock, "a")
        router = Router(api, a, owner_of, Scope(names=("ns",)), LOG)  # type: ignore[arg-type]
        running = asyncio.create_task(router.run())
        try:
            async with asyncio.timeout(5):
                while not api.watches:
                    await asyncio.sleep(0.01)
                api.add("fresh", "uid-fresh")
                while api.route("fresh") != "a":
                    await asyncio.sleep(0.01)
        finally:
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running

    asyncio.run(scenario())


def test_a_daemon_whose_object_left_the_watch_ends_even_when_the_object_is_its_own_again() -> None:
    """Routed away (kopf stopped updating the body the daemon holds), then owned again when the other
    replica died: the old daemon must not claim with its stale body; the new one, started by the
    object's ADDED event in this replica's watch, drives it."""

    async def scenario() -> None:
        api, clock = RoutedApi(), Clock()
        (a,) = await joined(api, clock, "a")
        api.add("e", "u1", route="a")
        stale = copy.deepcopy(api.episodes["e"])
        stale["metadata"]["labels"][ROUTE_LABEL] = "b"  # the DELETED event's body: routed to b
        replicas = Replicas(api, a, LOG, routing=True)  # type: ignore[arg-type]
        assert replicas.owns("u1")
        writes = api.version
        with pytest.raises(RoutedAway):
            async with replicas.driving(FAKE_EPISODES, stale):
                pass
        assert api.version == writes  # claimed nothing

    asyncio.run(scenario())
