"""What ``kubectl episode logs -f`` follows: the agent job of the turn running now, in its pod (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.runtime.sandbox_protocol import keyed_job_id
from episode_operator.runtime.turn.context import running_agent_job


def status(**change: Any) -> EpisodeStatus:
    document: dict[str, Any] = {
        "phase": "Running",
        "attempt": 2,
        "currentTurn": 1,
        "attempts": [
            {"number": 1, "jobKey": "k1", "pods": [{"role": "agent", "name": "e-a1", "uid": "u1"}]},
            {"number": 2, "jobKey": "k2", "pods": [{"role": "agent", "name": "e-a2", "uid": "u2"}]},
        ],
        "turns": [{"name": "one", "phase": "Succeeded", "stage": "verify"}, {"name": "two", "stage": "agent"}],
    }
    return EpisodeStatus.model_validate(document | change)


def test_the_running_turns_agent_job_in_the_current_attempts_pod() -> None:
    # The operator's own id of that job (TurnContext.job_id, under the attempt's key).
    assert running_agent_job(status()) == ("e-a2", keyed_job_id("k2", "a2.t2.agent"))


@pytest.mark.parametrize(
    "change",
    [
        {"phase": "Succeeded"},
        {"phase": "Pending", "currentTurn": None},
        {"turns": [{"name": "one", "stage": "verify"}, {"name": "two", "stage": "setup"}]},
        {"attempts": [{"number": 2, "jobKey": "k2", "pods": []}]},
        {"attempts": [{"number": 2, "pods": [{"role": "agent", "name": "e-a2", "uid": "u2"}]}]},
        {"currentTurn": 5},
    ],
    ids=["finished", "not started", "between stages", "pod not recorded", "no job key", "no such turn"],
)
def test_nothing_to_follow(change: dict[str, Any]) -> None:
    assert running_agent_job(status(**change)) is None
