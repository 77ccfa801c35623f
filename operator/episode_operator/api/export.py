"""Finished Episodes as NeMo Gym-style result rows (``kubectl episode export --format gym-jsonl``).

Graded episodes go to ``rollouts.jsonl``; every other finished episode (terminal failure,
masked, ungraded after outages) to ``rollouts_failures.jsonl``, as Gym keeps failures out
of the rollouts it trains or scores on. Field names are Gym's (snake_case).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from episode_operator.api.models import EpisodeSpec, EpisodeStatus
from episode_operator.api.vocabulary import is_terminal

ROLLOUTS = "rollouts.jsonl"
FAILURES = "rollouts_failures.jsonl"


def gym_row(episode: Mapping[str, Any]) -> dict[str, Any]:
    """One Episode object (as read from the API) as a Gym result row."""
    metadata = episode["metadata"]
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    spec = EpisodeSpec.model_validate(episode["spec"])
    turns = [turn for turn in status.turns if turn.phase != "Skipped"]
    return {
        "episode": f"{metadata['namespace']}/{metadata['name']}",
        "uid": metadata.get("uid"),
        "task": status.task.name if status.task else None,
        "task_digest": status.task.digest if status.task else None,
        "agent": spec.agent.kind,
        "labels": dict(metadata.get("labels") or {}),
        "outcome": status.outcome,
        "reward": status.reward,
        "verifier_rewards": status.verifier_rewards,
        "stopped_after_turn": status.stopped_after_turn,
        "verifier_mode": status.verifier_mode,
        "failure_kind": status.failure_kind,
        "message": status.message,
        "attempts": len(status.attempts),
        "started_at": status.started_at,
        "finished_at": status.finished_at,
        "turns": [
            {
                "name": turn.name,
                "reward": turn.reward,
                "verifier_rewards": turn.verifier_rewards,
                "reward_valid": turn.reward_valid,
                "verifier_mode": turn.verifier_mode,
                "failure_kind": turn.failure_kind,
                "agent_exit_code": turn.agent_exit_code,
                "started_at": turn.started_at,
                "finished_at": turn.finished_at,
            }
            for turn in turns
        ],
    }


def split_rows(episodes: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rollouts, failures)`` of the finished episodes; running ones are left out."""
    rollouts: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for episode in episodes:
        phase = (episode.get("status") or {}).get("phase")
        if not is_terminal(phase):
            continue
        row = gym_row(episode)
        (rollouts if row["outcome"] == "Graded" else failures).append(row)
    return rollouts, failures
