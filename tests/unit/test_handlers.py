"""What kopf costs per event of an Episode: every replica's kopf sees every event of the Episodes it
watches, so its fixed costs are kept small (handlers.py)."""

from __future__ import annotations

from typing import Any, cast

import kopf
import pytest

from episode_operator import handlers
from episode_operator.api.models import PLURAL
from episode_operator.api.vocabulary import GROUP, VERSION

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
