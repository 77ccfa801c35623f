"""Operator replicas: who is alive (member Leases), who drives what (a hash), and the claim that fences it.

docs/replicas.md gives the whole argument; in short:

- **Membership.** Every replica holds a ``coordination.k8s.io`` Lease of its own (one per process
  incarnation, labelled with its operator's group), renews it every ``retry_period`` and lists the
  group's Leases as often. Another replica is alive while its Lease keeps changing: it counts as
  dead ``lease_duration`` after *this* replica last saw it change (observed time, as client-go's
  leader election does, so clocks need not agree). A replica that could not renew for
  ``renew_deadline`` (< ``lease_duration``) stops acting on its own, before anyone takes over.
  Stopping gracefully deletes the Lease, so the others take over at their next listing.
- **Shards.** Each Episode and EpisodeSet belongs to one live replica by rendezvous hashing of
  its uid over the members' names: a replica joining or leaving moves only its share.
- **Claims.** The replica an object belongs to writes its identity into the object's
  ``episode-operator.dev/driver`` annotation (a merge patch with a resourceVersion precondition),
  only while the annotation is empty or names a replica that is no longer alive. The claim is the
  fence: every sandbox call checks it (locally), every status write carries it as a JSON patch
  ``test`` (the API server refuses the write once the claim is another's), and anything that
  removes pods reads it back first. When the hash gives an object to another live replica, its
  driver stops at the next safe point (between two sandbox calls) and clears the claim.

One process started without a Lease namespace is a sole replica: it drives everything and
claims nothing (the operator as it was; two such processes must not watch the same namespaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import re
import secrets
import socket
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from episode_operator.api.vocabulary import DRIVER_ANNOTATION, LEAVING_ANNOTATION, REPLICAS_LABEL, ROUTE_LABEL
from episode_operator.kube.client import Conflict, Guard, KubeClient, KubeError, NotFound
from episode_operator.kube.routing import route_in, route_of, route_patch
from episode_operator.runtime.fencing import Fenced, HandOver, NoFence
from episode_operator.runtime.wakeups import Wakeups, nap

# A parked driver re-checks by itself this often; wake-ups (its object changed, the members
# changed) normally come first.
RECHECK_SEC = 60.0


def default_replica_name() -> str:
    """The pod's name in a cluster (the chart sets POD_NAME), else this host and process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ReplicaSettings:
    """``episode-operator run``'s replica flags."""

    # Where the member Leases live (the operator's own namespace); None: a sole replica.
    namespace: str | None = None
    # Which operator the replicas belong to (the Helm release): replicas of another operator never count.
    group: str = "episode-operator"
    # Hashed to share the objects out; a restarted container keeps its pod's name, so its share.
    name: str = field(default_factory=default_replica_name)
    lease_duration_sec: float = 10.0
    renew_deadline_sec: float = 7.0
    retry_period_sec: float = 2.0

    def problems(self) -> list[str]:
        """What makes these settings unsafe (the renew deadline must end before others take over)."""
        found = []
        if not 0 < self.retry_period_sec < self.renew_deadline_sec < self.lease_duration_sec:
            found.append(
                f"need 0 < retry period ({self.retry_period_sec:g} s) < renew deadline "
                f"({self.renew_deadline_sec:g} s) < lease duration ({self.lease_duration_sec:g} s)"
            )
        return found


def owner_of(key: str, names: set[str]) -> str | None:
    """The member that ``key`` belongs to: rendezvous (highest random weight) hashing."""
    return max(names, key=lambda name: hashlib.sha256(f"{name}\0{key}".encode()).digest(), default=None)


def _lease_name(group: str, identity: str) -> str:
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", f"{group}-{identity}".lower()).strip("-.")
    return cleaned[:253].rstrip("-.")


def _micro_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1e6):06d}Z"


def name_of(identity: str) -> str:
    """A replica's name from its identity (``<name>.<incarnation>``)."""
    return identity.rsplit(".", 1)[0]


@dataclass
class _Seen:
    resource_version: str
    holder: str
    duration: float
    since: float  # monotonic time this replica first saw this resourceVersion
    leaving: bool = False  # its replica said it is shutting down


class Membership:
    """This replica's member Lease, renewed, and the other replicas', observed."""

    def __init__(
        self,
        client: KubeClient,
        settings: ReplicaSettings,
        logger: logging.Logger,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        assert settings.namespace is not None
        self.client = client
        self.settings = settings
        self.namespace: str = settings.namespace
        self.name = settings.name
        self.logger = logger
        self.monotonic = monotonic
        self.clock = clock
        self.identity = ""
        self.members: dict[str, str] = {}  # identity -> name, the live ones
        self.listeners: list[Callable[[], None]] = []
        self._lease: dict[str, Any] | None = None
        self._renewed_at: float | None = None
        self._seen: dict[str, _Seen] = {}
        self._listed_at = -math.inf
        self._listing = asyncio.Lock()
        self._renewing = asyncio.Lock()  # a renewal and the leaving mark write the same Lease
        self._leaving = False
        self._selector = f"{REPLICAS_LABEL}={settings.group}"

    # This replica ---------------------------------------------------------------------------
    async def join(self) -> None:
        """Create a Lease under a new identity (a fresh incarnation) and see who else is there.

        The identity changes only once its Lease exists: a failed join leaves the old one, void."""
        identity = f"{self.name}.{secrets.token_hex(3)}"
        now = self.clock()
        manifest = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": _lease_name(self.settings.group, identity),
                "namespace": self.namespace,
                "labels": {REPLICAS_LABEL: self.settings.group},
                **({"annotations": {LEAVING_ANNOTATION: "true"}} if self._leaving else {}),
            },
            "spec": {
                "holderIdentity": identity,
                "leaseDurationSeconds": math.ceil(self.settings.lease_duration_sec),
                "acquireTime": _micro_time(now),
                "renewTime": _micro_time(now),
            },
        }
        sent = self.monotonic()
        self._lease = await self.client.create_lease(manifest)
        self.identity, self._renewed_at = identity, sent
        await self.observe()
        self.logger.info("replica %s joined: members %s", self.identity, sorted(self.members))

    async def run(self) -> None:
        """Renew and observe every retry period, for ever (cancelled at shutdown)."""
        while True:
            await asyncio.sleep(self.settings.retry_period_sec)
            was_fresh = self.fresh()
            try:
                await self.renew()
                with contextlib.suppress(KubeError):  # logged by observe; the next round tries again
                    await self.observe()
            except Exception:  # nothing may end the renewals but the shutdown
                self.logger.exception("replica %s: renewing or observing failed", self.identity)
            if self.fresh() and not was_fresh:
                self._changed()  # parked drivers fenced by a missed renewal may act again

    async def renew(self) -> None:
        async with self._renewing:
            await self._renew()

    async def _renew(self) -> None:
        assert self._lease is not None
        lease = {**self._lease, "spec": {**self._lease["spec"], "renewTime": _micro_time(self.clock())}}
        if self._leaving:
            annotations = {**(self._lease["metadata"].get("annotations") or {}), LEAVING_ANNOTATION: "true"}
            lease["metadata"] = {**self._lease["metadata"], "annotations": annotations}
        sent = self.monotonic()
        try:
            self._lease = await self.client.replace_lease(lease)
            self._renewed_at = sent
        except (NotFound, Conflict) as error:
            # Others found it stale and removed it, so they may drive what this incarnation
            # claimed: its claims are void; start over as a new incarnation (the next round
            # tries again should this fail: renewing a Lease that is gone fails the same way).
            self.logger.warning("replica %s lost its Lease (%s); joining again", self.identity, error)
            self._renewed_at = None
            await self.join()
            self._changed()
        except KubeError as error:
            self.logger.warning("replica %s could not renew its Lease: %s", self.identity, error)

    async def announce_leaving(self) -> None:
        """Mark the Lease (at once, and in every renewal from now on): this replica is shutting
        down. It still drives what it drives until :meth:`leave`; the mark only tells the others."""
        self._leaving = True
        if self._lease is not None:
            await self.renew()

    async def others_staying(self) -> list[str]:
        """The other live replicas that have not announced they are leaving, from a fresh listing.

        Every replica marks its Lease before it asks, so of replicas stopping together the last to
        ask sees all the others' marks and finds nobody staying (others may too: each removal then
        finds the registration gone or already removed, which is harmless)."""
        with contextlib.suppress(KubeError):
            await self.observe()
        leaving = {lease.holder for lease in self._seen.values() if lease.leaving}
        return sorted(identity for identity in self.members if identity != self.identity and identity not in leaving)

    async def leave(self) -> None:
        """Delete the Lease (after the drivers stopped): the others take over at their next listing."""
        if self._lease is None:
            return
        self._renewed_at = None
        try:
            await self.client.delete_lease(
                self.namespace, self._lease["metadata"]["name"], self._lease["metadata"]["resourceVersion"]
            )
        except KubeError as error:
            self.logger.warning("replica %s could not delete its Lease: %s", self.identity, error)
        self._lease = None

    def fresh(self) -> bool:
        """Whether this replica renewed its Lease recently enough to act (no one can have taken over)."""
        return self._renewed_at is not None and self.monotonic() - self._renewed_at < self.settings.renew_deadline_sec

    # The others -------------------------------------------------------------------------------
    async def observe(self) -> None:
        """List the group's Leases; who is alive is what changed within its lease duration."""
        async with self._listing:
            sent = self.monotonic()
            try:
                leases = await self.client.list_leases(self.namespace, self._selector)
            except KubeError as error:
                self.logger.warning("replica %s could not list the replicas' Leases: %s", self.identity, error)
                raise
            now = self.monotonic()
            seen: dict[str, _Seen] = {}
            for lease in leases:
                metadata, spec = lease["metadata"], lease.get("spec") or {}
                version = str(metadata.get("resourceVersion"))
                before = self._seen.get(metadata["name"])
                seen[metadata["name"]] = _Seen(
                    version,
                    spec.get("holderIdentity") or "",
                    float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_sec),
                    before.since if before is not None and before.resource_version == version else now,
                    LEAVING_ANNOTATION in (metadata.get("annotations") or {}),
                )
            self._seen = seen
            self._listed_at = sent
            members = {
                lease.holder: name_of(lease.holder)
                for lease in seen.values()
                if lease.holder and (lease.holder == self.identity or now - lease.since < lease.duration)
            }
            if not self.fresh():
                members.pop(self.identity, None)
            changed = members != self.members
            self.members = members
        if changed:
            self._changed()
        await self._collect(now)

    async def observed_after(self, moment: float) -> None:
        """Make sure a listing started after ``moment`` (monotonic) was seen."""
        if self._listed_at < moment:
            with contextlib.suppress(KubeError):
                await self.observe()

    async def _collect(self, now: float) -> None:
        """Delete Leases nobody renewed for twice their duration (a replica that died)."""
        for name, lease in list(self._seen.items()):
            if lease.holder != self.identity and now - lease.since > 2 * lease.duration:
                with contextlib.suppress(KubeError):
                    await self.client.delete_lease(self.namespace, name, lease.resource_version)

    def _changed(self) -> None:
        self.logger.info("replica %s: members now %s", self.identity, sorted(self.members))
        for listener in self.listeners:
            listener()

    def is_live(self, identity: str) -> bool:
        if identity == self.identity:
            return self.fresh()
        return identity in self.members

    def live_names(self) -> set[str]:
        """The live replicas' names, this one included while it may act."""
        return set(self.members.values()) | ({self.name} if self.fresh() else set())

    def owns(self, key: str) -> bool:
        """Whether ``key`` (a uid) belongs to this replica by the hash over the live members."""
        return self.fresh() and owner_of(key, self.live_names()) == self.name


# --- claims ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claimable:
    """A kind of object a replica claims (Episodes, EpisodeSets)."""

    kind: str
    get: Callable[[KubeClient, str, str], Awaitable[dict[str, Any]]]
    patch: Callable[[KubeClient, str, str, dict[str, Any]], Awaitable[None]]


EPISODES = Claimable("episode", KubeClient.get_episode, KubeClient.patch_episode)
EPISODE_SETS = Claimable("episodeset", KubeClient.get_episodeset, KubeClient.patch_episodeset)


def _holder(body: Mapping[str, Any]) -> str | None:
    holder = (body["metadata"].get("annotations") or {}).get(DRIVER_ANNOTATION)
    return str(holder) if holder else None


class Claim:
    """This replica's claim on one object: the runtime's :class:`~episode_operator.runtime.fencing.Fence`.

    ``body`` is kopf's live body of the object (updated in place by its watch), so the check
    reads the newest annotation this process has seen without a request. Until the watch shows
    this replica's own write, the holder it replaced is still what the body says.
    """

    def __init__(
        self,
        replicas: Replicas,
        claimable: Claimable,
        body: Mapping[str, Any],
        replaced: str | None,
        current: Mapping[str, Any] | None = None,
    ) -> None:
        assert replicas.membership is not None
        self.replicas = replicas
        self.membership: Membership = replicas.membership
        self.claimable = claimable
        self.body = body
        self.identity = self.membership.identity
        self.replaced = replaced
        # The object as read just before the claim was written: what the driver starts from. kopf's
        # body may lag it (the watch), and the status a driver resumes must be the newest there is.
        self.current = current if current is not None else body
        self._seen_own = False
        metadata = body["metadata"]
        self.namespace, self.name, self.uid = metadata["namespace"], metadata["name"], metadata["uid"]

    @property
    def guard(self) -> Guard:
        """The precondition of this driver's status writes."""
        return Guard(DRIVER_ANNOTATION, self.identity)

    def check(self) -> None:
        membership = self.membership
        if membership.identity != self.identity or not membership.fresh():
            raise Fenced(f"{self._what}: replica {self.identity} could not renew its membership in time")
        holder = _holder(self.body)
        if holder == self.identity:
            self._seen_own = True
        elif self._seen_own or holder != self.replaced:
            raise Fenced(f"{self._what} is claimed by {holder or 'nobody'}, not {self.identity}")
        if not membership.owns(self.uid):
            raise HandOver(f"{self._what} belongs to another replica now")
        if self.body in self.replicas.departed:
            raise HandOver(f"{self._what} left this replica's watch")
        route = self.replicas.route
        if route is not None and route_in(self.body) not in (None, route):
            # Routed away from under this driver (a router that took this replica for dead): let the
            # claim go, so that the replica whose watch sees it now can drive it.
            raise HandOver(f"{self._what} is routed to {route_in(self.body)} now")

    @property
    def _what(self) -> str:
        return f"{self.claimable.kind} {self.namespace}/{self.name}"

    async def confirm(self) -> None:
        self.check()
        what = self._what
        try:
            current = await self.claimable.get(self.replicas.client, self.namespace, self.name)
        except KubeError as error:
            raise Fenced(f"{what}: cannot confirm the claim: {error}") from error
        if _holder(current) != self.identity:
            raise Fenced(f"{what} is claimed by {_holder(current)}, not {self.identity}")


class RoutedAway(Exception):
    """The object is routed to another replica now (kube/routing.py): this one's daemons for it end."""


class Departed:
    """kopf's bodies of objects that left this replica's watch: kopf stops updating them, and keeps
    their daemons running.

    A label-selector watch tells of an object routed away with a DELETED event that carries the
    object as it was *before* the change (its old route, its old claim), and kopf forgets the
    object but stops no daemon: a daemon's body is then frozen at that old version for good. Left
    alone, a parked driver would wake with it at the next change of the members and drive from
    its old status, over whatever the Episode's new driver wrote since (a finished Episode ran
    again). kopf gives each stay in the watch a new body, so a departed body is one stay ended:
    its daemons end, and an object routed back gets new daemons with a new body. Held weakly: a
    body goes with its daemons."""

    def __init__(self) -> None:
        self._bodies: dict[int, weakref.ref[Any]] = {}

    def add(self, body: Mapping[str, Any]) -> None:
        key = id(body)  # kopf's bodies are mappings, which hash by value: by identity here
        self._bodies[key] = weakref.ref(body, lambda _gone: self._bodies.pop(key, None))

    def __contains__(self, body: Mapping[str, Any]) -> bool:
        held = self._bodies.get(id(body))
        return held is not None and held() is body

    def __len__(self) -> int:
        return len(self._bodies)


class Replicas:
    """This process among the operator's replicas: whether and when it drives an object.

    With ``routing``, this replica's watches see only the objects routed to it (kube/routing.py):
    one it does not own by the hash and holds no claim on is routed on to its owner, and a daemon
    of an object routed elsewhere ends (:class:`RoutedAway`).
    """

    def __init__(
        self, client: KubeClient, membership: Membership | None, logger: logging.Logger, *, routing: bool = False
    ) -> None:
        self.client = client
        self.membership = membership
        self.logger = logger
        self.route = route_of(membership.name) if membership is not None and routing else None
        # Parked drivers, woken when their object changes (handlers.py) or the members change.
        self.wakeups = Wakeups()
        self.held: dict[str, Claim | NoFence] = {}
        self.departed = Departed()
        if membership is not None:
            membership.listeners.append(self.wakeups.wake_all)

    def owns(self, uid: str) -> bool:
        """Whether an object belongs to this replica (for work that needs no claim: TTLs, holds)."""
        return self.membership is None or self.membership.owns(uid)

    def _check_route(self, claimable: Claimable, body: Mapping[str, Any]) -> None:
        """:class:`RoutedAway` when the object is routed to another replica, or left this one's watch."""
        metadata = body["metadata"]
        what = f"{claimable.kind} {metadata['namespace']}/{metadata['name']}"
        if body in self.departed:
            raise RoutedAway(f"{what} left the watch of replica {self.route}")
        if self.route is not None and route_in(body) not in (None, self.route):
            raise RoutedAway(f"{what} is routed to {route_in(body)}")

    def belongs_here(self, body: Mapping[str, Any]) -> bool:
        """Whether this replica owns the object and its watch still shows it (a loop's test to go on)."""
        return self.owns(body["metadata"]["uid"]) and body not in self.departed

    def left_watch(self, claimable: Claimable, body: Mapping[str, Any]) -> None:
        """kopf's watch had a DELETED event for ``body``: its daemons end (see :class:`Departed`)."""
        self.departed.add(body)
        metadata = body["metadata"]
        self.wake(claimable, metadata["namespace"], metadata["name"])

    async def _route_to_owner(self, claimable: Claimable, body: Mapping[str, Any]) -> None:
        """Route an object this replica watches but does not own to its owner (a replica joined).

        Only an object this replica holds no claim on: a driven one goes after its hand-over."""
        membership = self.membership
        if self.route is None or membership is None or _holder(body) == membership.identity:
            return
        owner = owner_of(body["metadata"]["uid"], membership.live_names())
        if owner is None or owner == membership.name:
            return
        metadata = body["metadata"]
        try:
            await claimable.patch(
                self.client, metadata["namespace"], metadata["name"], route_patch(body, route_of(owner))
            )
        except KubeError as error:  # Conflict: it changed; its watch event wakes the daemon to try again
            self.logger.debug("routing %s %s to %s: %s", claimable.kind, metadata["name"], owner, error)

    async def until_owner(self, body: Mapping[str, Any], claimable: Claimable | None = None) -> None:
        """Wait until the object belongs to this replica (:class:`RoutedAway` if it goes elsewhere)."""
        claimable = claimable or EPISODES
        metadata = body["metadata"]
        with self.wakeups.registered(metadata["namespace"], f"owner/{metadata['name']}") as wakeup:
            while True:
                self._check_route(claimable, body)
                if self.owns(metadata["uid"]):
                    return
                await self._route_to_owner(claimable, body)
                await nap(wakeup, RECHECK_SEC)
                wakeup.clear()

    @contextlib.asynccontextmanager
    async def driving(self, claimable: Claimable, body: Mapping[str, Any]) -> Any:
        """Wait until this replica holds the object's claim; yield the fence; let it go after.

        A :class:`HandOver` ends the block with the claim released (the next replica takes it at
        once); a :class:`Fenced` leaves the claim as it is (it is not ours to clear).
        """
        metadata = body["metadata"]
        with self.wakeups.registered(metadata["namespace"], f"{claimable.kind}/{metadata['name']}") as wakeup:
            while (fence := await self._acquire(claimable, body)) is None:
                self._check_route(claimable, body)
                await nap(wakeup, RECHECK_SEC)
                wakeup.clear()
        self.held[metadata["uid"]] = fence
        try:
            yield fence
        except HandOver as handover:
            self.logger.info("%s; handing it over", handover)
            if isinstance(fence, Claim):
                await self._release(fence)
        finally:
            self.held.pop(metadata["uid"], None)

    def wake(self, claimable: Claimable, namespace: str, name: str) -> None:
        """The object changed (kopf's watch): a parked driver looks at its claim again."""
        self.wakeups.wake(namespace, f"{claimable.kind}/{name}")
        self.wakeups.wake(namespace, f"owner/{name}")

    async def _acquire(self, claimable: Claimable, body: Mapping[str, Any]) -> Claim | NoFence | None:
        membership = self.membership
        if membership is None:
            return NoFence()
        metadata = body["metadata"]
        # Before ownership: a body routed elsewhere is one kopf stopped updating (the object left
        # this replica's watch); a daemon holding it must not act on it, whoever owns the object.
        self._check_route(claimable, body)
        if not membership.owns(metadata["uid"]):
            await self._route_to_owner(claimable, body)
            return None
        holder = _holder(body)
        if holder is not None and holder != membership.identity and membership.is_live(holder):
            return None  # the common case for a replica it does not belong to: no request
        started = membership.monotonic()
        try:
            current = await claimable.get(self.client, metadata["namespace"], metadata["name"])
        except KubeError as error:
            self.logger.warning("cannot read %s %s: %s", claimable.kind, metadata["name"], error)
            return None
        self._check_route(claimable, current)  # this replica's watch may not have shown the route yet
        holder = _holder(current)
        if holder is not None and holder != membership.identity:
            # A holder this replica does not know may have joined after its last listing.
            await membership.observed_after(started)
            if membership.is_live(holder):
                return None
        if holder != membership.identity:
            patch = {
                "metadata": {
                    "resourceVersion": current["metadata"]["resourceVersion"],
                    "annotations": {DRIVER_ANNOTATION: membership.identity},
                }
            }
            try:
                await claimable.patch(self.client, metadata["namespace"], metadata["name"], patch)
            except KubeError as error:  # Conflict: it changed meanwhile; its watch event wakes us
                self.logger.debug("claim of %s %s: %s", claimable.kind, metadata["name"], error)
                return None
            if holder is not None:
                self.logger.info(
                    "%s %s/%s taken over from %s", claimable.kind, metadata["namespace"], metadata["name"], holder
                )
        return Claim(self, claimable, body, replaced=holder, current=current)

    async def _release(self, claim: Claim) -> None:
        """Clear the claim if it is still ours (a resourceVersion precondition; retried on conflicts),
        routing the object to its owner in the same write when routes are on."""
        for _ in range(5):
            try:
                current = await claim.claimable.get(self.client, claim.namespace, claim.name)
                if _holder(current) != claim.identity:
                    return
                patch: dict[str, Any] = {
                    "metadata": {
                        "resourceVersion": current["metadata"]["resourceVersion"],
                        "annotations": {DRIVER_ANNOTATION: None},
                    }
                }
                owner = owner_of(claim.uid, claim.membership.live_names())
                if self.route is not None and owner is not None and owner != claim.membership.name:
                    patch["metadata"]["labels"] = {ROUTE_LABEL: route_of(owner)}
                await claim.claimable.patch(self.client, claim.namespace, claim.name, patch)
                return
            except NotFound:
                return
            except Conflict:
                continue
            except KubeError as error:
                self.logger.warning("could not release %s %s: %s", claim.claimable.kind, claim.name, error)
                return


@contextlib.asynccontextmanager
async def join_replicas(
    kubeconfig: str | None, settings: ReplicaSettings, logger: logging.Logger
) -> AsyncIterator[Membership | None]:
    """Be a member for the block (renewing in the background), then leave; None: a sole replica.

    The membership has its own API connection, so its renewals never queue behind the drivers', and
    each of its requests ends by the renew deadline: one left waiting would stop the renewals and the
    listings for good, unlogged (no replica would learn who joined or left)."""
    if settings.namespace is None:
        yield None
        return
    client = await KubeClient.connect(
        kubeconfig, request_timeout_sec=settings.renew_deadline_sec, replica=settings.name
    )
    try:
        membership = Membership(client, settings, logger)
        try:
            await membership.join()
        except KubeError as error:
            raise KubeError(
                f"cannot join the operator's replicas (--lease-namespace {settings.namespace}): {error}",
                status=error.status,
            ) from error
        renewing = asyncio.create_task(membership.run(), name="replica membership")
        try:
            yield membership
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await membership.leave()
    finally:
        await client.close()
