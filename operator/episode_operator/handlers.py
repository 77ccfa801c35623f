"""kopf wiring, the only module that imports kopf: one daemon per active Episode.

A daemon (not an ``on.create`` handler) drives each Episode because a turn may outlive
any handler's call: kopf re-spawns daemons for every existing object when the operator
starts, and the driver resumes from the Episode's status. Progress and diff-base live in
annotations, so kopf never writes into the status the driver owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kopf
from kopf._cogs.clients import watching  # kopf's watch-stream (see _watch_through_not_found)
from kopf._cogs.clients.errors import APINotFoundError
from kopf._cogs.structs.references import NamespaceName, match_namespace  # kopf's --namespace patterns
from kopf._core.reactor import observation  # kopf's namespace observer (see _namespace_event_listed_too)

from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.episodeset_resource import SET_PLURAL
from episode_operator.api.vocabulary import (
    EPISODE_LABEL,
    GROUP,
    ROUTE_LABEL,
    SET_LABEL,
    VERSION,
    is_terminal,
    parse_timestamp,
)
from episode_operator.kube.builds import BuildCoordinator, BuildSettings
from episode_operator.kube.client import KubeClient, KubeError, login_for
from episode_operator.kube.data_api_registration import nobody_else, start_data_api
from episode_operator.kube.driver import (
    DriverSettings,
    announce_waiting,
    drive_episode,
    release_episode_pods,
    suspend_episode,
)
from episode_operator.kube.episodeset_controller import SetSettings, run_episode_set
from episode_operator.kube.gym_catalogue import start_gym_server
from episode_operator.kube.objects.pods import AgentImages, SandboxRequests, label_value
from episode_operator.kube.prepull import PrePullSettings
from episode_operator.kube.replicas import (
    EPISODE_SETS,
    EPISODES,
    Claim,
    Membership,
    Replicas,
    ReplicaSettings,
    RoutedAway,
    join_replicas,
    name_of,
    owner_of,
)
from episode_operator.kube.routing import Router, Scope
from episode_operator.kube.status import EpisodeGone
from episode_operator.kube.tombstone_configmaps import expire_episode
from episode_operator.kube.warm_pool import PoolSettings
from episode_operator.runtime.agents.model import CaptureBounds
from episode_operator.runtime.episode_store import StoreSettings
from episode_operator.runtime.fencing import Fence, Fenced, HandOver
from episode_operator.runtime.gym_server import GymSettings
from episode_operator.runtime.limits import OutputLimits
from episode_operator.runtime.metrics import Metrics
from episode_operator.runtime.oci_tasks import TaskArtifacts, TaskArtifactSettings
from episode_operator.runtime.rerun_plan import rerun_requested
from episode_operator.runtime.server import serve
from episode_operator.runtime.slots import FifoSlots
from episode_operator.runtime.timing import DEFAULT_TIMING, Timing
from episode_operator.runtime.wakeups import Wakeups
from episode_operator.taskfolder.image_refs import ImageMirrors

# How long startup waits for the API server to serve the CRDs' resources (wait_until_served), and how often it asks.
SERVED_WAIT_SEC = 60.0
SERVED_POLL_SEC = 0.25
# How long kopf waits for a stopped daemon to exit before it polls again (apply_kopf_settings).
DAEMON_EXIT_WAIT_SEC = 10.0


@dataclass(frozen=True)
class OperatorOptions:
    """What ``episode-operator run`` was started with."""

    namespaces: tuple[str, ...] = ()
    data_dir: Path = Path("/var/lib/episode-operator/data")
    kubeconfig: str | None = None
    # How long pulls, unschedulable pods and job polls are waited for (--pull-grace, --poll-interval, …).
    timing: Timing = DEFAULT_TIMING
    liveness_endpoint: str | None = None
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8080
    data_api_port: int | None = None
    data_api_service: str = "episode-operator"
    data_api_owner: str = ""
    # Gym's rollout protocol (--gym-port, --gym-settings): None, off.
    gym: GymSettings | None = None
    gym_port: int = 0
    max_active_episodes: int = 0
    extra_pod_labels: dict[str, str] = field(default_factory=dict)
    # Where images are pulled from (--image-mirror); admission applies it to every image an Episode names.
    image_mirrors: ImageMirrors = field(default_factory=ImageMirrors)
    # Where logs and artifacts are kept: the data directory, or an S3-compatible bucket (--store-url).
    store: StoreSettings = field(default_factory=StoreSettings)
    # Membership among the operator's replicas (kube/replicas.py); no Lease namespace: a sole replica.
    replicas: ReplicaSettings = field(default_factory=ReplicaSettings)
    # In-cluster builds (--build-registry …); None: a Dockerfile replay cannot apply is refused.
    builds: BuildSettings | None = None
    # How much of [environment]'s limits sandbox pods request (--cpu-request-fraction).
    sandbox_requests: SandboxRequests = field(default_factory=SandboxRequests)
    capture_image: str | None = None
    # Every capture container's resources and journal bounds (--capture-requests, --capture-limits, --capture-max-*).
    capture_bounds: CaptureBounds = field(default_factory=CaptureBounds)
    toolchain_repository: str = "episode-operator.local"
    # What a sandbox's answers and a turn's artifacts may hold (--answer-limit …: runtime/limits.py).
    limits: OutputLimits = field(default_factory=OutputLimits)
    # Task folders as OCI artifacts (--task-registry, --task-artifact-limit, --task-cache-limit); the cache
    # directory defaults to <data_dir>/task-artifacts.
    task_artifacts: TaskArtifactSettings | None = None


class LeanDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base built from what it keeps: it deep-copies the whole body for every event and
    then drops the status and most metadata, which for an Episode is most of the object."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        if extra_fields:
            return super().build(body=body, extra_fields=extra_fields)
        metadata = body.get("metadata", {})
        kept = {key: value for key, value in body.items() if key not in ("metadata", "status")}
        kept["metadata"] = {key: metadata[key] for key in ("labels", "annotations") if key in metadata}
        return super().build(body=kopf.Body(cast(kopf.RawBody, kept)), extra_fields=None)


@kopf.on.login()
async def login(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """kopf logs in where our client does: ``--kubeconfig`` when given (its own logins read only $KUBECONFIG)."""
    found = await login_for(memo.options.kubeconfig)
    return kopf.ConnectionInfo(**dataclasses.asdict(found), trust_env=settings.networking.trust_env)


async def wait_until_served(client: KubeClient, logger: kopf.Logger) -> None:
    """Until the API server's discovery lists Episodes and EpisodeSets, for a while at most.

    kopf learns which resources exist from discovery once, as it starts, and again only when a CRD
    changes while it watches CRDs (never with named namespaces: scanning is off). A CRD created or
    updated a moment ago can be Established and still missing from discovery: an operator starting
    then would never see an Episode (CI met it: the cluster tests' operator, started right after
    they installed the CRDs). Startup activities run before kopf's observers, so waiting here
    closes that window; past the bound the operator goes on (its liveness must not fail on a
    cluster without the CRDs yet) and says why it may not see Episodes.
    """
    deadline = time.monotonic() + SERVED_WAIT_SEC
    wanted = {PLURAL, SET_PLURAL}
    while missing := wanted - await client.served_resources(GROUP, VERSION):
        if time.monotonic() >= deadline:
            logger.warning(
                f"the API server does not serve {', '.join(sorted(missing))} of {GROUP}/{VERSION} after "
                f"{SERVED_WAIT_SEC:.0f} s: install the CRDs (episode-operator install-crd); with named "
                "namespaces, restart the operator once they are served"
            )
            return
        await asyncio.sleep(SERVED_POLL_SEC)


def apply_kopf_settings(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """kopf's settings for this operator (no I/O)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = LeanDiffBase(prefix=GROUP)
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Explicit watch timeouts: a silently stalled watch is kopf's best-known failure mode.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.WARNING
    # A deleted Episode keeps kopf's finalizer until its driver's daemon has exited, and kopf looks
    # again only after the daemon's cancellation backoff (60 s) unless the daemon exits within
    # this wait: the driver's cleanup (its work cancelled, its pods deleted) takes API calls, so a
    # wait of kopf's default ten event-loop cycles left deleted Episodes for a minute (a CI run).
    settings.background.instant_exit_timeout = DAEMON_EXIT_WAIT_SEC
    if options.namespaces and not any(set(pattern) & set("*?!,") for pattern in options.namespaces):
        # Named namespaces only: kopf needs no cluster-wide view of namespaces and CRDs, and the
        # chart grants none (kube/rbac.py); scanning would retry forbidden listings at startup.
        settings.scanning.disabled = True


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    options: OperatorOptions = memo.options
    apply_kopf_settings(settings, options)
    memo.metrics = Metrics()
    memo.slots = FifoSlots(options.max_active_episodes)
    replica = memo.membership.identity if memo.membership is not None else None  # this incarnation
    memo.client = await KubeClient.connect(options.kubeconfig, metrics=memo.metrics, replica=replica)
    await wait_until_served(memo.client, logger)
    memo.replicas = Replicas(memo.client, memo.membership, logging.getLogger("episode_operator.replicas"), routing=True)
    route_watches(settings, memo.replicas.route)
    memo.router = memo.routing = None
    if memo.membership is not None:
        memo.router = Router(
            memo.client,
            memo.membership,
            owner_of,
            serving(options.namespaces),
            logging.getLogger("episode_operator.routing"),
        )
        memo.routing = asyncio.create_task(memo.router.run(), name="router")
    memo.store = options.store.open(options.data_dir)
    memo.server = None
    if options.metrics_port is not None:
        memo.server = await serve(memo.metrics, options.metrics_host, options.metrics_port)
    if options.data_api_port is not None:
        memo.data_api = await start_data_api(
            memo.client,
            memo.store,
            options.metrics_host,
            options.data_api_port,
            options.data_api_service,
            options.data_api_owner,
            logger,
            memo.membership.others_staying if memo.membership is not None else nobody_else,
        )
    memo.gym = None
    if options.gym is not None:
        memo.gym = await start_gym_server(
            memo.client, memo.store, options.gym, options.metrics_host, options.gym_port, logger
        )
    memo.pod_wakeups = Wakeups()
    memo.settings = DriverSettings(
        store=memo.store,
        timing=options.timing,
        extra_pod_labels={
            **options.extra_pod_labels,
            **({ROUTE_LABEL: memo.replicas.route} if memo.replicas.route is not None else {}),
        },
        agent_images=AgentImages(options.capture_image, options.toolchain_repository),
        sandbox_requests=options.sandbox_requests,
        capture_bounds=options.capture_bounds,
        pod_wakeups=memo.pod_wakeups,
        image_mirrors=options.image_mirrors,
        builds=(
            BuildCoordinator(memo.client, dataclasses.replace(options.builds, mirrors=options.image_mirrors))
            if options.builds is not None
            else None
        ),
        limits=options.limits,
        task_artifacts=TaskArtifacts(
            options.task_artifacts or TaskArtifactSettings(cache_dir=options.data_dir / "task-artifacts")
        ),
    )


def route_watches(settings: kopf.OperatorSettings, route: str | None) -> None:
    """Watch only what is routed to this replica (kube/routing.py), and only sandbox pods.

    kopf passes these to the API server as label selectors, so events for other replicas' objects
    (and for pods that are not the operator's) never reach this process."""
    settings.watching.label_selectors["v1", "pods"] = EPISODE_LABEL + (f",{ROUTE_LABEL}={route}" if route else "")
    if route is not None:
        for plural in (PLURAL, SET_PLURAL):
            settings.watching.label_selectors[GROUP, plural] = f"{ROUTE_LABEL}={route}"


def serving(patterns: tuple[str, ...]) -> Scope:
    """The namespaces ``--namespace`` names (kopf's patterns), for the router's lists and watches."""
    if patterns and not any(set(pattern) & set("*?!,") for pattern in patterns):
        return Scope(names=patterns)
    if not patterns:
        return Scope()
    return Scope(
        includes=lambda namespace: any(match_namespace(NamespaceName(namespace), pattern) for pattern in patterns)
    )


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    routing: asyncio.Task[None] | None = getattr(memo, "routing", None)
    if routing is not None:
        routing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await routing
    membership: Membership | None = getattr(memo, "membership", None)
    if membership is not None:  # before the data API asks who stays (kube/data_api_registration.py)
        with contextlib.suppress(KubeError):
            await membership.announce_leaving()
        router: Router | None = getattr(memo, "router", None)
        if router is not None:  # kopf stopped the drivers before its cleanup: hand their objects on
            # Neither raises: others_staying lists from its last view on errors, hand_over logs and skips.
            await router.hand_over({name_of(identity) for identity in await membership.others_staying()})
    servers = (getattr(memo, "gym", None), getattr(memo, "data_api", None), getattr(memo, "server", None))
    for server in servers:  # the data API unregisters
        if server is not None:
            await server.cleanup()
    client: KubeClient | None = getattr(memo, "client", None)
    if client is not None:
        await client.close()


def is_active(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    """Episodes that have not finished and are not suspended get a driver."""
    phase: Any = status.get("phase") if status else None
    return not is_terminal(phase) and not spec.get("suspend")


def is_suspended(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    phase: Any = status.get("phase") if status else None
    return not is_terminal(phase) and bool(spec.get("suspend"))


@kopf.daemon(GROUP, VERSION, PLURAL, when=is_suspended, cancellation_timeout=5.0, backoff=5.0)
async def hold(body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """A suspended Episode waits Pending (e.g. for Kueue to admit it); it starts when unsuspended.

    A daemon rather than change handlers: with none of those kopf computes no change causes, keeps
    no last-handled state and prematches no filters for every event of every Episode."""
    try:
        await memo.replicas.until_owner(body)
    except RoutedAway:
        return
    await suspend_episode(memo.client, body)
    await stopped.wait()


@kopf.daemon(
    GROUP,
    VERSION,
    PLURAL,
    when=is_active,
    # The daemon watches `stopped` itself (below); kopf's cancellation is only the last resort.
    cancellation_backoff=60.0,
    cancellation_timeout=20.0,
    backoff=15.0,
    errors=kopf.ErrorsMode.TEMPORARY,
)
async def drive(body: kopf.Body, memo: Any, logger: Any, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Drive one Episode; react to why kopf stops the daemon, if it does, before it ends by itself.

    - the Episode reached a terminal phase (the driver wrote it): let the driver finish;
    - deleted mid-run: stop its pods now rather than when garbage collection gets to them;
    - suspended mid-run (e.g. preempted by Kueue): stop its pods; it starts over when resumed;
    - the operator is exiting: leave everything, the next operator resumes from the status.
    """
    metadata = body["metadata"]
    work = asyncio.create_task(_drive_when_claimed(body, memo, logger))
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            driving = metadata["uid"] in memo.replicas.held  # another replica's driver stops its pods
            reason = stopped.reason or kopf.DaemonStoppingReason(0)
            # kopf says "deleted" also of an object that left this replica's watch (routed to another
            # replica: the watch's DELETED event); only a deletionTimestamp is a deletion, whose pods go.
            deleted = bool(reason & kopf.DaemonStoppingReason.RESOURCE_DELETED) and bool(
                metadata.get("deletionTimestamp")
            )
            suspended = bool(reason & kopf.DaemonStoppingReason.FILTERS_MISMATCH) and bool(
                body.get("spec", {}).get("suspend")
            )
            if not (deleted or suspended or reason & kopf.DaemonStoppingReason.FILTERS_MISMATCH):
                work.cancel()  # the operator is exiting or pausing
            elif deleted or suspended:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                if not driving:
                    return
                try:
                    if deleted:
                        await release_episode_pods(memo.client, metadata["namespace"], metadata["name"])
                    else:
                        await suspend_episode(memo.client, body)
                except KubeError as error:
                    logger.warning("could not stop the pods of episode %s: %s", metadata["name"], error)
                return
        await work
    except EpisodeGone:
        return
    finally:
        stop.cancel()
        if not work.done():
            work.cancel()


async def _drive_when_claimed(body: kopf.Body, memo: Any, logger: Any) -> None:
    """Drive the Episode once this replica holds its claim; park again when fenced or handing over."""
    replicas: Replicas = memo.replicas
    while True:
        try:
            async with replicas.driving(EPISODES, body) as fence:
                await _drive_in_a_slot(body, memo, logger, fence)
                return
        except Fenced as error:
            logger.warning("%s; stopped driving it", error)
        except RoutedAway:
            return  # the replica it is routed to drives it


async def _drive_in_a_slot(body: kopf.Body, memo: Any, logger: Any, fence: Fence) -> None:
    """The driver, once one of the operator's maxActiveEpisodes slots is free (oldest first)."""
    metadata = body["metadata"]
    claim = fence if isinstance(fence, Claim) else None
    # With a claim, the Episode as read when it was claimed: kopf's body may be older.
    current = claim.current if claim is not None else body
    slots: FifoSlots = memo.slots
    if slots.would_wait() or slots.waiting:
        await announce_waiting(memo.client, current, slots.active, guard=claim.guard if claim is not None else None)
    metrics: Metrics = memo.metrics
    waiting = True
    metrics.pending.inc()
    try:
        async with slots.slot((metadata.get("creationTimestamp", ""), metadata["namespace"], metadata["name"])):
            waiting = False
            metrics.pending.dec()
            metrics.active.inc()
            try:
                await drive_episode(memo.client, current, memo.settings, logger, observer=metrics, claim=claim)
            finally:
                metrics.active.dec()
    finally:
        if waiting:
            metrics.pending.dec()


def has_ttl(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    phase: Any = status.get("phase") if status else None
    return is_terminal(phase) and spec.get("ttlSecondsAfterFinished") is not None and bool(status.get("finishedAt"))


@kopf.daemon(GROUP, VERSION, PLURAL, when=has_ttl, cancellation_timeout=5.0, backoff=30.0)
async def expire(body: kopf.Body, memo: Any, **_: Any) -> None:
    """Delete a finished Episode ``spec.ttlSecondsAfterFinished`` after it finished (as Jobs do)."""
    spec, status = body["spec"], body["status"]
    remaining = parse_timestamp(status["finishedAt"]) + float(spec["ttlSecondsAfterFinished"]) - time.time()
    if remaining > 0:
        await asyncio.sleep(remaining)
    try:
        await memo.replicas.until_owner(body)
    except RoutedAway:
        return
    await expire_episode(memo.client, body)  # a run-once Episode leaves its tombstone (kube/tombstone_configmaps.py)


KOPFS_NAMESPACE_EVENT = observation.process_discovered_namespace_event


async def _namespace_event_listed_too(*, raw_event: Any, namespaces: Any, insights: Any, **rest: Any) -> None:
    """kopf's handler of its namespace watch, which also takes in the namespaces the watch lists.

    kopf lists the namespaces at startup, then starts a watch, which lists them *again* and watches
    from that second listing; kopf drops the second listing's items (events of type None) as
    already known. A namespace created between the two listings (an operator started just before a
    test or a pipeline creates its namespace, or a watch relisted after "410 Gone") is then in
    neither: its Episodes were not watched until the namespace itself changed — 15 minutes of a CI
    run, until the test deleted it. Taking in a listed namespace again is idempotent."""
    if raw_event["type"] is None:
        async with insights.revised:
            observation.revise_namespaces(raw_bodies=[raw_event["object"]], insights=insights, namespaces=namespaces)
            insights.revised.notify_all()
        return
    await KOPFS_NAMESPACE_EVENT(raw_event=raw_event, namespaces=namespaces, insights=insights, **rest)


def see_listed_namespaces() -> None:
    """Install :func:`_namespace_event_listed_too` (kopf's observer looks the handler up when it starts)."""
    observation.process_discovered_namespace_event = _namespace_event_listed_too


KOPFS_CONTINUOUS_WATCH = watching.continuous_watch
# Between two tries of a watch the API server answered 404: it is coming back (a restarted API
# server serves a CRD's endpoint only once it has read the CRD again, seconds after it answers).
NOT_SERVED_RETRY_SEC = 2.0


async def _watch_through_not_found(**kwargs: Any) -> AsyncIterator[Any]:
    """kopf's continuous watch (list, then watch), for which a 404 ends this stream, not the operator.

    kopf retries a watch that breaks (a reset connection, "410 Gone") but lets a 404 through, and
    a failed watcher stops the operator: a restarted API server answers "404 page not found" for
    the Episode CRD's endpoint until it has read the CRD again, so the operator exited with a turn
    in flight (CI, test_api_server_restart_mid_run). kopf's infinite watch starts the stream again
    (a fresh listing) after this one ends, as client-go's reflectors retry a watch they cannot open."""
    try:
        async for event in KOPFS_CONTINUOUS_WATCH(**kwargs):
            yield event
    except APINotFoundError as error:
        logging.getLogger("episode_operator.watch").warning(
            "the API server does not serve %s yet (%s); watching again in %.0f s",
            kwargs.get("resource"),
            error,
            NOT_SERVED_RETRY_SEC,
        )
        await asyncio.sleep(NOT_SERVED_RETRY_SEC)


def watch_through_not_found() -> None:
    """Install :func:`_watch_through_not_found` (kopf's infinite watch looks it up each time round)."""
    watching.continuous_watch = _watch_through_not_found


def run_operator(options: OperatorOptions) -> None:
    """Run the operator until interrupted (``episode-operator run``)."""
    kopf.configure(verbose=os.environ.get("EPISODE_OPERATOR_VERBOSE") == "1")
    see_listed_namespaces()
    watch_through_not_found()
    try:
        asyncio.run(_operate(options))
    except KubeError as error:  # e.g. no such Lease namespace, or no right to its Leases
        raise SystemExit(f"episode-operator: {error}") from error


async def _operate(options: OperatorOptions) -> None:
    """kopf inside this replica's membership: joined before kopf starts a driver, left after
    kopf stopped them all (so the others take over only what nothing here drives any more)."""
    async with join_replicas(options.kubeconfig, options.replicas, logging.getLogger("episode_operator.replicas")) as (
        membership
    ):
        await kopf.operator(
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            standalone=True,
            memo=kopf.Memo(options=options, membership=membership),
            liveness_endpoint=options.liveness_endpoint,
        )


# --- EpisodeSet -----------------------------------------------------------------------------------
# One loop per open set; kube/episodeset_controller.py decides everything. A change of the set or of one of
# its children wakes the loop, so a freed slot is filled at once, and a resync catches the rest.
class _QuietWakeups(logging.Filter):
    """The wake-up handlers run on every change of a set, a child or a sandbox pod: their success is no news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and str(record.msg).startswith("Handler 'wake_"))


@kopf.on.startup()
async def configure_episode_sets(memo: kopf.Memo, **_: Any) -> None:
    memo.set_wakeups = Wakeups()
    if memo.membership is not None:  # a set loop notices at once that its set moved to another replica
        memo.membership.listeners.append(memo.set_wakeups.wake_all)
    logging.getLogger("kopf.objects").addFilter(_QuietWakeups())


def set_is_open(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    """A set gets a loop until it is complete (no child active and none to start), and again when its spec asks
    for a rerun generation it has not seen (runtime/rerun_plan.py)."""
    return not (status.get("completionTime") if status else None) or rerun_requested(spec, status)


@kopf.daemon(
    GROUP,
    VERSION,
    SET_PLURAL,
    when=set_is_open,
    cancellation_backoff=1.0,  # a completing set's loop returns by itself; a deleted set's waits to be woken
    cancellation_timeout=5.0,
    backoff=10.0,
    errors=kopf.ErrorsMode.TEMPORARY,
)
async def run_set(body: kopf.Body, memo: Any, logger: Any, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Create and follow a set's children; every step is idempotent, so cancelling it anywhere is safe.

    Only the replica holding the set's claim runs its loop; the loop ends at the next pass once the
    set belongs to another replica, and the claim is handed over."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    wakeups: Wakeups = memo.set_wakeups
    replicas: Replicas = memo.replicas
    while not stopped:
        try:
            async with replicas.driving(EPISODE_SETS, body) as fence:
                claim = fence if isinstance(fence, Claim) else None
                with wakeups.registered(namespace, label_value(name)) as wakeup:
                    await run_episode_set(
                        memo.client,
                        namespace,
                        name,
                        wakeup,
                        lambda: bool(stopped) or not replicas.belongs_here(body),
                        logger,
                        SetSettings(
                            pool=PoolSettings(
                                memo.settings.sandbox_requests,
                                memo.settings.agent_images,
                                memo.settings.capture_bounds,
                            ),
                            prepull=PrePullSettings(
                                memo.settings.agent_images, memo.settings.image_policy, memo.settings.task_artifacts
                            ),
                        ),
                        claim=claim,
                    )
                if not stopped and not replicas.belongs_here(body):
                    raise HandOver(f"episodeset {namespace}/{name} belongs to another replica now")
                break
        except Fenced as error:
            logger.warning("%s; stopped running it", error)
        except RoutedAway:
            return
    # The set is complete (or gone). kopf never spawns a daemon again for an object whose daemon returned by
    # itself, but it does one that it stopped because its filter stopped matching: so this one waits until kopf
    # sees the completion and stops it, and a rerun asked for later (spec.rerun) gets a loop again.
    await stopped.wait()


@kopf.on.event(GROUP, VERSION, SET_PLURAL)
async def wake_set(body: kopf.Body, memo: Any, type: str | None, **_: Any) -> None:
    if type == "DELETED":  # deleted, or routed to another replica: kopf updates this body no more
        memo.replicas.left_watch(EPISODE_SETS, body)
    memo.set_wakeups.wake(body["metadata"]["namespace"], label_value(body["metadata"]["name"]))
    memo.replicas.wake(EPISODE_SETS, body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.event(GROUP, VERSION, PLURAL)
async def wake_for_episode(body: kopf.Body, memo: Any, type: str | None, **_: Any) -> None:
    """An Episode changed: if this replica waits to drive it (e.g. its claim was released), it looks
    now, and so does the loop of the set it belongs to. One handler: kopf's cost is per handler.
    A DELETED event (deleted, or routed to another replica) ends this replica's daemons for it."""
    metadata = body["metadata"]
    if type == "DELETED":
        memo.replicas.left_watch(EPISODES, body)
    memo.replicas.wake(EPISODES, metadata["namespace"], metadata["name"])
    set_name = (metadata.get("labels") or {}).get(SET_LABEL)
    if set_name:
        memo.set_wakeups.wake(metadata["namespace"], set_name)


@kopf.on.event("v1", "pods", labels={EPISODE_LABEL: kopf.PRESENT})
async def wake_pod_waiter(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A sandbox pod changed: the driver waiting for it to start reads it now, not at its next poll."""
    memo.pod_wakeups.wake(body["metadata"]["namespace"], body["metadata"]["name"])
