"""What kopf costs per event of an Episode: every replica's kopf sees every event of the Episodes it
watches, so its fixed costs are kept small (handlers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast

import kopf
import pytest

from episode_operator import handlers
from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.vocabulary import GROUP, VERSION
from episode_operator.kube.replicas import Replicas
from episode_operator.runtime.wakeups import Wakeups

EPISODE: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "Episode",
    "metadata": {
        "name": "e",
        "namespace": "ns",
        "uid": "u",
        "resourceVersion": "7",
        "labels": {"episode-operator.dev/episodeset": "s"},
        "annotations": {"team": "evals", f"{GROUP}/driver": "r0.1", f"{GROUP}/last-handled-configuration": "{}"},
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        "finalizers": [f"{GROUP}/finalizer"],
    },
    "spec": {"task": {"inline": {"files": {"task.toml": "x" * 1000}}}, "agent": {"kind": "oracle"}},
    "status": {"phase": "Running", "turns": [{"name": f"t{i}", "stage": "agent"} for i in range(20)]},
}


@pytest.mark.parametrize(
    "body",
    [
        EPISODE,
        {**EPISODE, "metadata": {"name": "bare"}},
        {key: value for key, value in EPISODE.items() if key != "status"},
    ],
)
def test_the_lean_diff_base_is_kopfs_essence(body: dict[str, Any]) -> None:
    lean = handlers.LeanDiffBase(prefix=GROUP).build(body=kopf.Body(cast(kopf.RawBody, body)))
    default = kopf.AnnotationsDiffBaseStorage(prefix=GROUP).build(body=kopf.Body(cast(kopf.RawBody, body)))
    assert lean == default


def test_episodes_have_no_change_handlers() -> None:
    """Without them kopf detects no change causes, keeps no last-handled state and matches no
    filters per event: the hold of a suspended Episode is a daemon."""
    registry = kopf.get_default_registry()
    resource = kopf.Resource(GROUP, VERSION, PLURAL)
    assert not registry._changing.has_handlers(resource=resource)
    assert [handler.id for handler in registry._watching.get_all_handlers() if handler.selector.check(resource)] == [
        "wake_for_episode"
    ]


def test_a_deleted_episodes_driver_that_cleans_up_for_a_while_is_waited_for_not_polled_a_minute_later() -> None:
    """kopf removes a deleted Episode's finalizer once its daemons exited; one still exiting after kopf's
    instant-exit wait is looked at again only after its cancellation backoff (60 s for the driver)."""
    from kopf._cogs.aiokits import aioenums
    from kopf._core.engines import daemons
    from kopf._core.intents import stoppers

    settings = kopf.OperatorSettings()
    handlers.apply_kopf_settings(settings, handlers.OperatorOptions())
    [drive] = [
        handler
        for handler in kopf.get_default_registry()._spawning.get_all_handlers()
        if getattr(handler, "fn", None) is handlers.drive
    ]

    async def scenario() -> tuple[bool, list[float]]:
        stopper = stoppers.DaemonStopper()
        stopped = aioenums.AsyncFlagWaiter(stopper)

        async def cleaning_up() -> None:  # the driver's cleanup: its work cancelled, then its pods deleted
            await stopped.wait()
            await asyncio.sleep(0.5)

        task = asyncio.create_task(cleaning_up())
        daemon = daemons.Daemon(task=task, logger=logging.getLogger("test"), handler=drive, stopper=stopper)
        delays = await daemons.stop_daemons(settings=settings, daemons={drive.id: daemon})
        return task.done(), list(delays)

    assert asyncio.run(scenario()) == (True, [])


@pytest.mark.parametrize(
    ("deletion_timestamp", "pods_released"),
    [("2026-12-02T01:35:45Z", True), (None, False)],
    ids=["deleted", "routed-to-another-replica"],
)
def test_a_driver_stopped_as_deleted_stops_its_pods_only_if_the_episode_is_being_deleted(
    monkeypatch: pytest.MonkeyPatch, deletion_timestamp: str | None, pods_released: bool
) -> None:
    """kopf stops a daemon as "deleted" also when its object leaves the replica's watch: a hand-over
    routes the Episode to its new owner, whose driver resumes with the pods (a chaos run saw the old
    owner delete them: the new one found its pod being deleted and started attempt 2)."""
    from kopf._cogs.aiokits import aioenums
    from kopf._core.intents import stoppers

    released: list[str] = []

    async def release(_client: Any, namespace: str, name: str) -> None:
        released.append(f"{namespace}/{name}")

    async def driving_for_ever(*_args: Any) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(handlers, "release_episode_pods", release)
    monkeypatch.setattr(handlers, "_drive_when_claimed", driving_for_ever)
    metadata: dict[str, Any] = {"namespace": "ns", "name": "e", "uid": "u1"}
    if deletion_timestamp:
        metadata["deletionTimestamp"] = deletion_timestamp
    memo = kopf.Memo(replicas=kopf.Memo(held={"u1": object()}), client=None)

    async def scenario() -> None:
        stopper = stoppers.DaemonStopper()
        stopped = aioenums.AsyncFlagWaiter(stopper)
        running = asyncio.create_task(
            handlers.drive(
                body=cast(Any, {"metadata": metadata}), memo=memo, logger=logging.getLogger("t"), stopped=stopped
            )  # type: ignore[call-arg]
        )
        await asyncio.sleep(0.05)
        stopper.set(reason=stoppers.DaemonStoppingReason.RESOURCE_DELETED)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(running, 5)

    asyncio.run(scenario())
    assert released == (["ns/e"] if pods_released else [])


@pytest.mark.parametrize(("event", "departs"), [("DELETED", True), ("MODIFIED", False), (None, False)])
def test_a_deleted_event_ends_the_daemons_of_the_body_it_froze(event: str | None, departs: bool) -> None:
    """A label-selector watch's DELETED event (the object was routed away) carries the old object,
    and kopf stops no daemon for it: the handler marks that body departed (kube/replicas.Departed)."""
    replicas = Replicas(cast(Any, None), None, logging.getLogger("t"))
    memo = kopf.Memo(replicas=replicas, set_wakeups=Wakeups())
    body = kopf.Body(cast(kopf.RawBody, EPISODE))
    asyncio.run(handlers.wake_for_episode(body=body, memo=memo, type=event))
    assert (body in replicas.departed) is departs
    assert kopf.Body(cast(kopf.RawBody, EPISODE)) not in replicas.departed  # another stay in the watch
    sets = kopf.Body(cast(kopf.RawBody, {**EPISODE, "kind": "EpisodeSet"}))
    asyncio.run(handlers.wake_set(body=sets, memo=memo, type=event))
    assert (sets in replicas.departed) is departs


def test_a_namespace_in_the_watchs_own_listing_is_watched() -> None:
    """kopf's namespace watch lists again before it watches, and kopf drops that listing: a namespace
    created between its first listing and the watch's was never watched (a CI run lost 15 minutes)."""
    from kopf._cogs.structs.references import Insights
    from kopf._core.reactor import observation

    listed = {"type": None, "object": {"metadata": {"name": "team-a"}}}

    def seen(handler: Any) -> set[Any]:
        insights = Insights()
        asyncio.run(handler(raw_event=listed, namespaces=["team-*"], insights=insights))
        return set(insights.namespaces)

    original = observation.process_discovered_namespace_event
    assert seen(original) == set()  # kopf's own handler: still needed
    handlers.see_listed_namespaces()
    try:
        assert observation.process_discovered_namespace_event is not original
        assert seen(observation.process_discovered_namespace_event) == {"team-a"}
        gone = {"type": "DELETED", "object": {"metadata": {"name": "team-a"}}}
        insights = Insights()
        insights.namespaces.add("team-a")
        asyncio.run(
            observation.process_discovered_namespace_event(raw_event=gone, namespaces=["team-*"], insights=insights)
        )
        assert insights.namespaces == set()  # the watch's events still go to kopf's handler
    finally:
        observation.process_discovered_namespace_event = original


@pytest.mark.parametrize("installed", [False, True], ids=["kopfs-own", "through-not-found"])
def test_a_watch_the_api_server_does_not_serve_yet_is_retried_not_fatal(
    installed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted API server answers 404 for the CRD's endpoint until it has read the CRD again:
    kopf's own watch lets the error out (and a failed watcher stops the operator); ours lists and
    watches again, and the stream goes on with what the API server sends once it serves it."""
    from kopf._cogs.clients import watching
    from kopf._cogs.clients.errors import APINotFoundError
    from kopf._cogs.structs.references import NamespaceName, Resource

    tries: list[int] = []

    async def served_on_the_second_try(**_: Any) -> Any:
        tries.append(len(tries))
        if len(tries) == 1:
            raise APINotFoundError("404 page not found", status=404, headers={})
        yield {"type": "ADDED", "object": {"metadata": {"name": "e1"}}}

    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0
    monkeypatch.setattr(handlers, "NOT_SERVED_RETRY_SEC", 0.0)
    monkeypatch.setattr(handlers, "KOPFS_CONTINUOUS_WATCH", served_on_the_second_try)
    monkeypatch.setattr(watching, "continuous_watch", served_on_the_second_try)
    if installed:
        handlers.watch_through_not_found()

    async def events() -> list[Any]:
        stream = watching.infinite_watch(
            settings=settings,
            resource=Resource(GROUP, VERSION, PLURAL),
            namespace=NamespaceName("ns"),
            _iterations=2,
        )
        return [event async for event in stream]

    if not installed:
        with pytest.raises(APINotFoundError):
            asyncio.run(events())
        return
    assert asyncio.run(events()) == [{"type": "ADDED", "object": {"metadata": {"name": "e1"}}}]
    assert tries == [0, 1]
