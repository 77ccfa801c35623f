"""The CRDs follow Kubernetes' API conventions where kubectl, GitOps tools and clients rely on them.

Conditions are metav1.Condition-shaped and a map keyed by ``type`` (one per type; server-side apply
merges them by type), each with the generation it was computed from; times are ``date-time``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.vocabulary import CONDITION_REASON_PATTERN, Condition
from episode_operator.kube.objects.crds import episode_crd, episodeset_crd
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.status import KubeStatusSink
from tests.unit.test_api import walk

CRDS = {"Episode": episode_crd, "EpisodeSet": episodeset_crd}
NOW = "2026-01-01T00:00:00Z"


def status_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["status"]


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_conditions_are_a_map_keyed_by_type(kind: str) -> None:
    conditions = status_schema(kind)["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    # A list-map key must be required; metav1.Condition requires these four.
    assert set(item["required"]) == {"type", "status", "reason", "lastTransitionTime"}
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert item["properties"]["observedGeneration"]["type"] == "integer"
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"
    assert item["properties"]["reason"]["pattern"] == CONDITION_REASON_PATTERN


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_every_time_in_the_status_is_a_date_time(kind: str) -> None:
    times = {}
    for path, node in walk(status_schema(kind)):
        name = path.rsplit(".", 1)[-1]
        if path.split(".")[-2:-1] == ["properties"] and re.search(r"(At|Time)$", name):
            times[path] = node.get("format")
    assert times and set(times.values()) == {"date-time"}, times


@pytest.mark.parametrize(
    ("reason", "valid"),
    [("Graded", True), ("TerminalFailure", True), ("outage:image", True), ("outage:image-pull", False), ("", False)],
)
def test_condition_reasons_follow_the_convention(reason: str, valid: bool) -> None:
    make = lambda: Condition(type="Complete", status="True", reason=reason, last_transition_time=NOW)  # noqa: E731
    if valid:
        make()
    else:
        with pytest.raises(ValidationError):
            make()


class StatusApi:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.written.append(status)


def test_the_episode_status_sink_stamps_every_condition_with_its_generation() -> None:
    api = StatusApi()
    sink = KubeStatusSink(api, OwnerRef("e", "ns", "uid"), 7, logging.getLogger("test"))  # type: ignore[arg-type]
    status = EpisodeStatus(
        phase="Running",
        conditions=[
            Condition(type="Running", status="True", reason="Started", last_transition_time=NOW, observed_generation=6)
        ],
    )
    asyncio.run(sink.publish(status))
    (written,) = api.written
    assert written["observedGeneration"] == 7
    assert [condition["observedGeneration"] for condition in written["conditions"]] == [7]


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_no_defaults_inside_list_items(kind: str) -> None:
    """A default inside a list item makes every ``kubectl apply`` (and GitOps sync) of an unchanged
    manifest a change: the stored list differs from the applied one, and a list is replaced whole."""
    schema = CRDS[kind]()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    inside_items = [path for path, node in walk(schema) if ".items" in path and "default" in node]
    assert inside_items == []
