"""Which replica's watch sees an object: its route label, and the router that sets it.

With several replicas, kopf in each one watches only the Episodes, EpisodeSets and sandbox pods
*routed* to it: a server-side label selector ``episode-operator.dev/replica=<route>``, the same
for the replica's whole life. So an object's events reach one replica instead of all of them —
the work every replica's kopf did for every other replica's Episodes, which made three replicas
cost as much CPU per turn as two drove (bench/RESULTS.md). The route is data on the object:

- **New objects** carry no route. The router of every replica watches the unrouted ones, and
  the replica an object belongs to by the hash (``owner_of``) routes it to itself: a merge patch
  with a resourceVersion precondition, so of replicas that disagree about who is alive one wins
  and the other's patch conflicts. The object then arrives in that replica's watch (the API
  server sends ADDED when a label change brings an object under a selector), where kopf starts
  its daemons.
- **A replica gone**: its objects are routed to a route nobody watches. At every change of the
  members, and every ``SWEEP_SEC`` in case a change was missed, each router lists the objects
  routed to no live replica and routes its own share by the hash, as for new ones.
- **A replica joining** takes its share from the others: a replica routes an object it watches
  to its hash owner when that is another live replica and this one holds no claim on it — at
  once for one it only watches, after the hand-over for one it drives (``replicas.py``). The
  replica it left sees a DELETED event and its daemons for it end by themselves.

Routes only say where events go; they are not what keeps two drivers apart. The claims are: a
replica that wrongly sees an object (a route set from a stale view of the members) still cannot
drive it while another's claim stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.episodeset_resource import SET_PLURAL
from episode_operator.api.vocabulary import ROUTE_LABEL
from episode_operator.kube.client import Conflict, Gone, KubeClient, KubeError, NotFound

# How often a router lists the objects routed to no live replica, besides at every change of the members.
SWEEP_SEC = 30.0
# After a failed list or watch, how long before the next try.
RETRY_SEC = 2.0
# The plurals of the kinds that are routed; sandbox pods are routed by the driver that creates them.
ROUTED = (PLURAL, SET_PLURAL)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def route_of(name: str) -> str:
    """The route label of the replica named ``name``: the name itself where it is a valid label value."""
    if len(name) <= 63 and _LABEL_VALUE.fullmatch(name):
        return name
    return "r-" + hashlib.sha256(name.encode()).hexdigest()[:20]


def route_patch(body: Mapping[str, Any], route: str) -> dict[str, Any]:
    """The merge patch that routes ``body`` to ``route``, if it is still the version seen."""
    return {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"], "labels": {ROUTE_LABEL: route}}}


def route_in(body: Mapping[str, Any]) -> str | None:
    """Where ``body`` is routed (None: nowhere yet)."""
    route = (body["metadata"].get("labels") or {}).get(ROUTE_LABEL)
    return str(route) if route else None


@dataclass(frozen=True)
class Scope:
    """The namespaces the operator serves: by name (a list and a watch in each), or all of them
    (one of each, the namespaces checked with ``includes``: kopf's patterns)."""

    names: tuple[str, ...] = ()
    includes: Callable[[str], bool] = lambda _namespace: True

    def namespaces(self) -> Sequence[str | None]:
        return self.names or (None,)


class Members(Protocol):
    """What the router needs of the replicas' membership (kube/replicas.py's Membership)."""

    name: str
    listeners: list[Callable[[], None]]

    def live_names(self) -> set[str]:
        """The names of the live replicas, this one included while it may act."""
        ...


class Router:
    """This replica's share of routing: new objects and those of replicas gone, to their hash owner."""

    def __init__(
        self,
        client: KubeClient,
        members: Members,
        owner_of: Callable[[str, set[str]], str | None],
        scope: Scope,
        logger: logging.Logger,
        *,
        sweep_sec: float = SWEEP_SEC,
    ) -> None:
        self.client = client
        self.members = members
        self.owner_of = owner_of
        self.scope = scope
        self.logger = logger
        self.sweep_sec = sweep_sec
        self.route = route_of(members.name)
        self.routed = 0  # objects this router routed, for tests and logs
        self._sweep = asyncio.Event()
        members.listeners.append(self._sweep.set)

    async def run(self) -> None:
        """Watch the unrouted objects and sweep the orphans, for ever (cancelled at shutdown)."""
        async with asyncio.TaskGroup() as tasks:
            for plural in ROUTED:
                for namespace in self.scope.namespaces():
                    tasks.create_task(self._watch_unrouted(plural, namespace))
            tasks.create_task(self._sweep_orphans())

    async def _watch_unrouted(self, plural: str, namespace: str | None) -> None:
        selector = f"!{ROUTE_LABEL}"
        while True:
            try:
                items, version = await self.client.list_objects_at(plural, namespace, selector)
                for item in items:
                    await self.consider(plural, item)
                while True:  # the API server ends each watch after a while; continue from the last version
                    async for kind, item in self.client.watch_objects(plural, namespace, selector, version):
                        version = item["metadata"].get("resourceVersion") or version
                        if kind != "DELETED":
                            await self.consider(plural, item)
            except Gone:
                continue  # too old to continue from: list again
            except KubeError as error:
                self.logger.warning("router %s: watching unrouted %s: %s", self.route, plural, error)
                await asyncio.sleep(RETRY_SEC)

    async def _sweep_orphans(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sweep.wait(), self.sweep_sec)
            self._sweep.clear()
            await self.sweep()

    async def sweep(self) -> None:
        """Route this replica's share of the objects routed to no live replica."""
        routes = sorted({route_of(name) for name in self.members.live_names()})
        if not routes:
            return  # this replica is not live itself: nothing is its to route
        selector = f"{ROUTE_LABEL} notin ({','.join(routes)})"  # no route, or a route nobody watches
        async for plural, item in self._listed(selector, "orphaned"):
            await self.consider(plural, item)

    async def _listed(self, selector: str, what: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Each routed object the selector picks, in every namespace served; a failed listing is logged
        (as ``what`` the objects are) and skipped."""
        for plural in ROUTED:
            for namespace in self.scope.namespaces():
                try:
                    items, _ = await self.client.list_objects_at(plural, namespace, selector)
                except KubeError as error:
                    self.logger.warning("router %s: listing %s %s: %s", self.route, what, plural, error)
                    continue
                for item in items:
                    yield plural, item

    async def hand_over(self, staying: set[str]) -> int:
        """As this replica leaves (its drivers stopped): route what is routed to it to each object's
        owner among ``staying`` (the names of the replicas that stay); how many it routed.

        The others would find these objects by themselves only at a change of the members they saw,
        or at their next sweep: a replica that joined and left between two of their listings is a
        change nobody saw, and its objects would wait for the sweep. A conflict (the object changed)
        leaves it to the sweep."""
        routed = 0
        if not staying:
            return routed
        async for plural, item in self._listed(f"{ROUTE_LABEL}={self.route}", "to hand over"):
            metadata = item["metadata"]
            owner = self.owner_of(metadata["uid"], staying)
            if owner is None or not self.scope.includes(metadata["namespace"]):
                continue
            try:
                await self._patch(plural, metadata["namespace"], metadata["name"], route_patch(item, route_of(owner)))
            except KubeError as error:  # Conflict, NotFound, or worse: the others' sweep decides
                self.logger.debug("router %s: handing over %s %s: %s", self.route, plural, metadata["name"], error)
                continue
            routed += 1
        if routed:
            self.logger.info("router %s: handed over %d objects to %s", self.route, routed, sorted(staying))
        return routed

    async def consider(self, plural: str, body: Mapping[str, Any]) -> bool:
        """Route ``body`` here if it is routed to no live replica and belongs here; whether it did."""
        metadata = body["metadata"]
        if not self.scope.includes(metadata["namespace"]):
            return False
        live = self.members.live_names()
        if route_in(body) in {route_of(name) for name in live}:
            return False
        if self.owner_of(metadata["uid"], live) != self.members.name:
            return False  # its owner routes it
        try:
            await self._patch(plural, metadata["namespace"], metadata["name"], route_patch(body, self.route))
        except (Conflict, NotFound):
            return False  # changed or gone meanwhile: its next event or sweep decides again
        except KubeError as error:
            self.logger.warning("router %s: routing %s %s: %s", self.route, plural, metadata["name"], error)
            return False
        self.routed += 1
        return True

    async def _patch(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        if plural == PLURAL:
            await self.client.patch_episode(namespace, name, patch)
        else:
            await self.client.patch_episodeset(namespace, name, patch)
