"""Tombstones: a run-once Episode its TTL deleted is answered, not re-run, when a re-sync creates it again.

The decisions (runtime/tombstones.py) on Episode bodies; the keeping (kube/tombstone_configmaps.py) against a fake
API that honours what the real one does with a ConfigMap: 409 on a create of one that exists and on a
replace whose resourceVersion is not the stored one.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from episode_operator.kube.client import Conflict, NotFound
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.tombstone_configmaps import CONFIG_MAP, answer_from_tombstone, expire_episode
from episode_operator.runtime import tombstones
from episode_operator.runtime.tombstones import (
    RUN_ONCE_ANNOTATION,
    Tombstone,
    answer,
    answered,
    read_tombstone,
    tombstone_of,
    with_tombstone,
    work_digest,
)

NOW = "2026-01-02T00:00:00Z"
SPEC = {"task": {"configMap": {"name": "task-hello-1", "key": "task.tar.gz"}}, "agent": {"kind": "oracle"}}


def episode(
    uid: str = "uid-1",
    *,
    run_once: bool = True,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "hello", "namespace": "evals", "uid": uid, "generation": 1}
    if run_once:
        metadata["annotations"] = {RUN_ONCE_ANNOTATION: "true"}
    return {"metadata": metadata, "spec": {**SPEC, "ttlSecondsAfterFinished": 60, **(spec or {})}, "status": status}


FINISHED = {
    "phase": "Succeeded",
    "outcome": "Graded",
    "reward": 1.0,
    "progress": "1/1",
    "startedAt": "2026-01-01T00:00:00Z",
    "finishedAt": "2026-01-01T00:01:00Z",
    "turns": [{"name": "task", "phase": "Succeeded", "reward": 1.0}],
    "conditions": [
        {"type": "Complete", "status": "True", "reason": "Graded", "lastTransitionTime": "2026-01-01T00:01:00Z"}
    ],
}


def kept() -> Tombstone:
    tombstone = tombstone_of(episode(status=FINISHED), "2026-01-01T00:02:00Z")
    assert tombstone is not None
    return tombstone


# --- decisions -----------------------------------------------------------------------------------------------
def test_a_finished_run_once_episode_leaves_its_status_and_work() -> None:
    tombstone = kept()
    assert (tombstone.uid, tombstone.status.phase, tombstone.status.reward) == ("uid-1", "Succeeded", 1.0)
    assert tombstone.status.conditions == []
    assert tombstone.work == work_digest(episode()["spec"])


@pytest.mark.parametrize(
    "body",
    [
        episode(run_once=False, status=FINISHED),
        episode(status={"phase": "Running"}),
        episode(status={**FINISHED, "conditions": [{**FINISHED["conditions"][0], "type": "FromTombstone"}]}),
    ],
    ids=["not-run-once", "not-finished", "itself-answered"],
)
def test_no_tombstone_for(body: dict[str, Any]) -> None:
    assert tombstone_of(body, NOW) is None


def test_the_same_name_and_work_is_answered_visibly() -> None:
    status = answer(episode("uid-2"), kept(), NOW, "configmap evals/x")
    assert status is not None
    assert (status.phase, status.outcome, status.reward, status.progress) == ("Succeeded", "Graded", 1.0, "1/1")
    assert status.finished_at == "2026-01-01T00:01:00Z"  # when the work finished, not now
    conditions = {condition.type: condition for condition in status.conditions}
    assert set(conditions) == {"FromTombstone", "Complete"} and answered(status)
    assert (
        "uid uid-1" in conditions["FromTombstone"].message
        and "configmap evals/x" in conditions["FromTombstone"].message
    )


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (episode("uid-2", spec={"agent": {"kind": "nop"}}), "another agent is other work"),
        (episode("uid-2", spec={"timeoutMultiplier": 2.0}), "other budgets are other work"),
        (episode("uid-2", run_once=False), "not run-once"),
        (episode("uid-2", status={"phase": "Running"}), "already started"),
        (episode("uid-1"), "the very Episode the tombstone was kept for"),
    ],
)
def test_it_runs(body: dict[str, Any], why: str) -> None:
    assert answer(body, kept(), NOW, "here") is None, why


def test_fields_that_do_not_change_the_work_do_not_make_it_new() -> None:
    body = episode("uid-2", spec={"ttlSecondsAfterFinished": 5, "suspend": False, "debug": {"keepPods": True}})
    assert answer(body, kept(), NOW, "here") is not None


def test_the_oldest_tombstones_go_first_the_new_one_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tombstones, "MAX_TOMBSTONES", 3)
    entries: dict[str, str] = {}
    for day in range(1, 6):
        tombstone = kept().model_copy(update={"deleted_at": f"2026-01-0{day}T00:00:00Z"})
        entries = with_tombstone(entries, f"e{day}", tombstone)
    assert sorted(entries) == ["e3", "e4", "e5"]
    old = kept().model_copy(update={"deleted_at": "2020-01-01T00:00:00Z"})
    entries = with_tombstone({**entries, "broken": "{"}, "late", old)
    assert "late" in entries and "broken" not in entries
    assert read_tombstone(entries, "late") == old and read_tombstone({"x": "{"}, "x") is None


# --- keeping, against a fake API ---------------------------------------------------------------------------
class ConfigMapApi:
    """ConfigMaps with resourceVersions as the API server keeps them; Episodes deleted; statuses written."""

    def __init__(self, *, interleave: int = 0) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.deleted: list[str] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.event_recorder = EventRecorder(self.create_event)
        self.interleave = interleave  # another writer changes the ConfigMap after this many reads

    async def get_config_map(self, namespace: str, name: str) -> Any:
        if name not in self.stored:
            raise NotFound(name, status=404)
        stored = copy.deepcopy(self.stored[name])
        if self.interleave:
            self.interleave -= 1
            self._store(name, {**stored, "data": {**stored["data"], "other": kept().model_dump_json()}})
        return SimpleNamespace(
            data=stored["data"], metadata=SimpleNamespace(resource_version=stored["metadata"]["resourceVersion"])
        )

    def _store(self, name: str, manifest: dict[str, Any]) -> None:
        self.version += 1
        self.stored[name] = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": str(self.version)}}

    async def create_config_map(self, manifest: dict[str, Any]) -> None:
        if manifest["metadata"]["name"] in self.stored:
            raise Conflict("exists", status=409)
        self._store(manifest["metadata"]["name"], manifest)

    async def replace_config_map(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        if self.stored[name]["metadata"]["resourceVersion"] != manifest["metadata"]["resourceVersion"]:
            raise Conflict("changed", status=409)
        self._store(name, manifest)

    async def delete_episode(self, namespace: str, name: str) -> None:
        self.deleted.append(name)

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.statuses.append(status)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.events.append(event["reason"])


def test_ttl_keeps_the_tombstone_then_deletes_and_a_recreation_is_answered() -> None:
    api = ConfigMapApi()
    logger = logging.getLogger("test")
    earlier = {"metadata": {"name": CONFIG_MAP, "namespace": "evals"}, "data": {"earlier": kept().model_dump_json()}}
    asyncio.run(api.create_config_map(earlier))
    api.interleave = 1  # another Episode's tombstone lands between our read and our write
    asyncio.run(expire_episode(api, episode(status=FINISHED)))  # type: ignore[arg-type]
    assert api.deleted == ["hello"]
    data = api.stored[CONFIG_MAP]["data"]
    assert set(data) == {"earlier", "other", "hello"}  # the concurrent write was not lost
    assert api.stored[CONFIG_MAP]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "episode-operator"

    recreated = episode("uid-2")
    status = asyncio.run(answer_from_tombstone(api, recreated, logger))  # type: ignore[arg-type]
    assert status is not None and status.phase == "Succeeded"
    (written,) = api.statuses
    assert written["phase"] == "Succeeded" and written["observedGeneration"] == 1
    assert {c["type"] for c in written["conditions"]} == {"FromTombstone", "Complete"}
    assert api.events == ["FromTombstone"]

    # Its own TTL leaves it: deleting it would only have the next sync create it again.
    answered_body = {**recreated, "status": written}
    asyncio.run(expire_episode(api, answered_body))  # type: ignore[arg-type]
    assert api.deleted == ["hello"]
    # A changed spec runs.
    changed = episode("uid-3", spec={"agent": {"kind": "nop"}})
    assert asyncio.run(answer_from_tombstone(api, changed, logger)) is None  # type: ignore[arg-type]


def test_without_the_annotation_nothing_is_kept_or_read() -> None:
    api = ConfigMapApi()
    asyncio.run(expire_episode(api, episode(run_once=False, status=FINISHED)))  # type: ignore[arg-type]
    assert api.deleted == ["hello"] and api.stored == {}
    assert asyncio.run(answer_from_tombstone(api, episode(run_once=False), logging.getLogger("t"))) is None  # type: ignore[arg-type]
