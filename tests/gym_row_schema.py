"""Our own JSON schema of export rows: the harbor keys Gym's models do not describe (unit and cluster tiers).

Gym's models are checked too, by :mod:`tests.reference` (``check_rollout_row``, ``check_failure_row``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jsonschema

from tests.reference import check_failure_row, check_rollout_row

NUMBER_OR_NULL: dict[str, Any] = {"type": ["number", "null"]}
STRING_OR_NULL: dict[str, Any] = {"type": ["string", "null"]}
REWARDS: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "number"}}
EPISODE: dict[str, Any] = {"type": "string", "pattern": "^[^/]+/[^/]+$"}
INDEX: dict[str, Any] = {"type": "integer", "minimum": 0}
# Gym's identity keys (export.py's docstring), on both kinds of row.
IDENTITY: dict[str, Any] = {
    "_ng_task_index": INDEX,
    "_ng_rollout_index": INDEX,
    "_ng_attempt_index": {"type": "integer", "minimum": 1},
    "_ng_environment_server": {"type": "string", "minLength": 1},
    "_ng_task_id": {"type": "object", "required": ["task_id"]},
    "agent_ref": {"type": "object", "required": ["name"]},
    "instance_id": {"type": "string", "pattern": "^[^:]+::.+$"},
    "task_name": {"type": "string", "minLength": 1},
}
FLAG: dict[str, Any] = {"enum": [0, 1]}

TURN: dict[str, Any] = {
    "type": "object",
    "required": [
        "name",
        "reward",
        "verifier_rewards",
        "reward_valid",
        "failure_kind",
        "responses_create_params",
        "response",
    ],
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
        "responses_create_params": {"type": "object"},
        "response": {"type": "object"},
        "ng_trajectory": {"type": "object"},
        "ng_agent_observations": {"type": "object"},
    },
    "additionalProperties": False,
}

ROLLOUT_ROW: dict[str, Any] = {
    "type": "object",
    "required": [
        "responses_create_params",
        "response",
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "verifier_rewards",
        "turns",
        "stopped_after_turn",
        "verifier_mode",
        "episode",
        "metadata",
        "agent_timeout_error",
        "context_length_exceeded_error",
        "_ng_environment_server",
    ],
    "properties": {
        "reward": {"type": "number"},
        "mask_sample": {"type": "boolean"},
        "failure_kind": STRING_OR_NULL,
        "failure_reason": STRING_OR_NULL,
        "verifier_rewards": REWARDS,
        "stopped_after_turn": STRING_OR_NULL,
        "verifier_mode": {"enum": ["shared", "separate", "mixed", None]},
        "turns": {"type": "array", "items": TURN},
        "episode": EPISODE,
        "metadata": {
            "type": "object",
            "required": ["uid", "task", "task_digest", "agent", "labels", "outcome", "attempts"],
            "properties": {
                "task_digest": {"type": ["string", "null"], "pattern": "^sha256:[0-9a-f]{64}$"},
                "agent": {"enum": ["oracle", "nop", "command"]},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "outcome": {"enum": ["Graded", "Masked"]},
                "attempts": {"type": "integer", "minimum": 1},
            },
        },
        "agent_timeout_error": FLAG,
        "context_length_exceeded_error": FLAG,
        **IDENTITY,
    },
}

FAILURE_ROW: dict[str, Any] = {
    "type": "object",
    "required": [
        "_ng_failure_class",
        "_ng_failure_terminal",
        "_ng_failure_message",
        "episode",
        "attempt",
        "failure_kind",
        "_ng_environment_server",
    ],
    "properties": {
        "_ng_failure_class": {"const": "environment_server_failed"},
        "_ng_failure_terminal": {"type": "boolean"},
        "_ng_failure_message": {"type": "string", "maxLength": 2000},
        "_ng_failure_stage": {"enum": ["admission", "seed", "agent", "verification", "cleanup"]},
        **IDENTITY,
        "episode": EPISODE,
        "attempt": {"type": ["integer", "null"]},
        "failure_kind": STRING_OR_NULL,
    },
    "additionalProperties": False,
}


def check_rows(rollouts: Iterable[dict[str, Any]], failures: Iterable[dict[str, Any]]) -> None:
    """Every row against our schema and Gym's models."""
    for row in rollouts:
        jsonschema.validate(row, ROLLOUT_ROW)
        check_rollout_row(row)
    for row in failures:
        jsonschema.validate(row, FAILURE_ROW)
        check_failure_row(row)
