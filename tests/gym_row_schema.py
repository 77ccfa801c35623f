"""The JSON schema export rows must satisfy (used by the unit and cluster tiers)."""

from __future__ import annotations

from typing import Any

NUMBER_OR_NULL: dict[str, Any] = {"type": ["number", "null"]}
STRING_OR_NULL: dict[str, Any] = {"type": ["string", "null"]}
REWARDS: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "number"}}

TURN: dict[str, Any] = {
    "type": "object",
    "required": ["name", "reward", "verifier_rewards", "reward_valid", "failure_kind"],
    "properties": {
        "name": {"type": "string"},
        "reward": NUMBER_OR_NULL,
        "verifier_rewards": REWARDS,
        "reward_valid": {"type": ["boolean", "null"]},
        "verifier_mode": {"enum": ["shared", "separate", None]},
        "failure_kind": STRING_OR_NULL,
        "agent_exit_code": {"type": ["integer", "null"]},
        "started_at": STRING_OR_NULL,
        "finished_at": STRING_OR_NULL,
    },
    "additionalProperties": False,
}

GYM_ROW: dict[str, Any] = {
    "type": "object",
    "required": [
        "episode",
        "turns",
        "reward",
        "verifier_rewards",
        "stopped_after_turn",
        "verifier_mode",
        "failure_kind",
        "outcome",
    ],
    "properties": {
        "episode": {"type": "string", "pattern": "^[^/]+/[^/]+$"},
        "uid": STRING_OR_NULL,
        "task": STRING_OR_NULL,
        "task_digest": {"type": ["string", "null"], "pattern": "^sha256:[0-9a-f]{64}$"},
        "agent": {"enum": ["oracle", "nop", "command"]},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "outcome": {"enum": ["Graded", "Masked", "TerminalFailure", "Ungraded"]},
        "reward": NUMBER_OR_NULL,
        "verifier_rewards": REWARDS,
        "stopped_after_turn": STRING_OR_NULL,
        "verifier_mode": {"enum": ["shared", "separate", "mixed", None]},
        "failure_kind": STRING_OR_NULL,
        "message": STRING_OR_NULL,
        "attempts": {"type": "integer", "minimum": 0},
        "started_at": STRING_OR_NULL,
        "finished_at": STRING_OR_NULL,
        "turns": {"type": "array", "items": TURN},
    },
    "additionalProperties": False,
}
