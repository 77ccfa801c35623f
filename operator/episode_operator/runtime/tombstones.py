"""Tombstones: a finished Episode that ``ttlSecondsAfterFinished`` deleted is not run again by a re-sync.

GitOps tools re-create what Git declares and the cluster lacks: an Episode its TTL deleted comes back
and, without this, runs again. An Episode annotated ``episode-operator.dev/run-once: "true"`` leaves a
*tombstone* when its TTL deletes it: its name, the digest of its work (the spec but for the fields that
do not change what runs) and its final status. An Episode of the same name, annotation and work created
later is answered from the tombstone — its status is the recorded one, with a ``FromTombstone``
condition saying so — and runs nothing; a changed spec runs. An answered Episode is not deleted by its
TTL again: deleting it would only have the next sync create it again.

Pure decisions only; :mod:`episode_operator.kube.tombstone_configmaps` keeps the tombstones (one ConfigMap per
namespace, an entry per Episode name) and hooks them into the driver and the TTL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.naming import document_digest
from episode_operator.api.vocabulary import GROUP, ApiModel, Condition, Timestamp

RUN_ONCE_ANNOTATION = f"{GROUP}/run-once"
CONDITION = "FromTombstone"
# Spec fields that do not change what an Episode runs: changing them does not make it new work.
NOT_THE_WORK = frozenset({"suspend", "ttlSecondsAfterFinished", "debug"})
# Where they are kept holds 1 MiB (a ConfigMap); the oldest tombstones go first past these.
MAX_TOMBSTONES = 500
MAX_BYTES = 768 * 1024
TERMINAL = ("Succeeded", "Failed")


class Tombstone(ApiModel):
    """What is kept of a run-once Episode its TTL deleted."""

    uid: str = Field(description="The deleted Episode's uid.")
    work: str = Field(description="sha256 of its spec, less the fields that do not change what runs.")
    deleted_at: Timestamp
    status: EpisodeStatus = Field(description="Its final status, conditions left out.")


def runs_once(metadata: Mapping[str, Any]) -> bool:
    return str((metadata.get("annotations") or {}).get(RUN_ONCE_ANNOTATION, "")).lower() == "true"


def work_digest(spec: Mapping[str, Any]) -> str:
    """The digest of what an Episode runs: its spec as stored, less :data:`NOT_THE_WORK`."""
    return document_digest({key: value for key, value in spec.items() if key not in NOT_THE_WORK})


def answered(status: EpisodeStatus) -> bool:
    """Was this status answered from a tombstone (so the TTL leaves the Episode)?"""
    return any(condition.type == CONDITION and condition.status == "True" for condition in status.conditions)


def tombstone_of(body: Mapping[str, Any], now: str) -> Tombstone | None:
    """What to keep when the TTL deletes ``body``: None unless it runs once and finished by running."""
    metadata = body.get("metadata") or {}
    try:
        status = EpisodeStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None
    if not runs_once(metadata) or status.phase not in TERMINAL or answered(status):
        return None
    return Tombstone(
        uid=str(metadata.get("uid", "")),
        work=work_digest(body.get("spec") or {}),
        deleted_at=now,
        status=status.model_copy(update={"conditions": []}),
    )


def answer(body: Mapping[str, Any], tombstone: Tombstone | None, now: str, kept_in: str) -> EpisodeStatus | None:
    """The status of a new Episode answered from ``tombstone`` (kept in ``kept_in``), or None: it runs.

    Only an Episode that runs once, has not started, is another object than the one the tombstone
    was kept for, and has the same work.
    """
    metadata = body.get("metadata") or {}
    try:
        current = EpisodeStatus.model_validate(body.get("status") or {})
    except ValidationError:
        current = EpisodeStatus()
    if (
        tombstone is None
        or not runs_once(metadata)
        or current.phase not in (None, "Pending")
        or tombstone.uid == metadata.get("uid")
        or tombstone.work != work_digest(body.get("spec") or {})
    ):
        return None
    recorded = tombstone.status
    success = recorded.phase == "Succeeded"
    message = (
        f"not run again: an Episode of this name and spec finished {recorded.phase} at {recorded.finished_at} "
        f"(uid {tombstone.uid}) and was deleted after ttlSecondsAfterFinished at {tombstone.deleted_at}; "
        f"its status is kept in {kept_in} ({RUN_ONCE_ANNOTATION})"
    )
    reason = recorded.outcome or recorded.phase or "Finished"
    return recorded.model_copy(
        update={
            "conditions": [
                Condition(
                    type=CONDITION, status="True", reason="SameNameAndSpec", message=message, last_transition_time=now
                ),
                Condition(
                    type="Complete" if success else "Failed",
                    status="True",
                    reason=reason,
                    message=message,
                    last_transition_time=now,
                ),
            ]
        },
        deep=True,
    )


def with_tombstone(entries: Mapping[str, str], name: str, tombstone: Tombstone) -> dict[str, str]:
    """The ConfigMap's entries (name -> tombstone JSON) with ``name``'s replaced, the oldest dropped past
    :data:`MAX_TOMBSTONES` entries or :data:`MAX_BYTES`."""
    kept = {key: value for key, value in entries.items() if key != name}
    kept[name] = tombstone.model_dump_json(by_alias=True, exclude_none=True)

    def deleted_at(item: tuple[str, str]) -> str:
        try:
            return Tombstone.model_validate_json(item[1]).deleted_at
        except ValidationError:
            return ""  # unreadable: the first to go

    # Oldest first; the new one is never dropped.
    ordered = [*sorted((item for item in kept.items() if item[0] != name), key=deleted_at), (name, kept[name])]
    while len(ordered) > 1 and (
        len(ordered) > MAX_TOMBSTONES or sum(len(key) + len(value) for key, value in ordered) > MAX_BYTES
    ):
        ordered.pop(0)
    return dict(ordered)


def read_tombstone(entries: Mapping[str, str], name: str) -> Tombstone | None:
    """``name``'s tombstone, if one is kept and readable."""
    try:
        return Tombstone.model_validate_json(entries[name]) if name in entries else None
    except ValidationError:
        return None
