"""Gym-style export rows: graded to rollouts, the rest to failures, every row schema-valid."""

from __future__ import annotations

import jsonschema

from episode_operator.api.export import gym_row, split_rows
from tests.gym_row_schema import GYM_ROW

SPEC = {"task": {"inline": {"files": {}}}, "agent": {"kind": "oracle"}}


def episode(name: str, status: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": SPEC, "status": status}


GRADED = episode(
    "graded",
    {
        "phase": "Succeeded",
        "outcome": "Graded",
        "reward": 0.5,
        "verifierRewards": {"reward": 0.5},
        "verifierMode": "shared",
        "stoppedAfterTurn": "b",
        "attempts": [{"number": 1}],
        "task": {"digest": "sha256:" + "0" * 64, "name": "org/task"},
        "turns": [
            {"name": "a", "phase": "Succeeded", "reward": 1.0, "verifierRewards": {"reward": 1.0}, "rewardValid": True},
            {
                "name": "b",
                "phase": "Failed",
                "reward": 0.0,
                "rewardValid": False,
                "failureKind": "harbor:step_setup_failed",
            },
            {"name": "c", "phase": "Skipped"},
        ],
    },
)
TERMINAL = episode(
    "terminal",
    {"phase": "Failed", "outcome": "TerminalFailure", "failureKind": "harbor:invalid_task", "message": "task refused"},
)
RUNNING = episode("running", {"phase": "Running"})


def test_rows_split_and_validate() -> None:
    rollouts, failures = split_rows([GRADED, TERMINAL, RUNNING])
    assert [row["episode"] for row in rollouts] == ["ns/graded"]
    assert [row["episode"] for row in failures] == ["ns/terminal"]
    for row in rollouts + failures:
        jsonschema.validate(row, GYM_ROW)
    graded = rollouts[0]
    assert [turn["name"] for turn in graded["turns"]] == ["a", "b"]  # the skipped turn did not run
    assert (graded["reward"], graded["stopped_after_turn"], graded["task"]) == (0.5, "b", "org/task")


def test_schema_rejects_a_malformed_row() -> None:
    row = gym_row(GRADED)
    row["reward"] = "high"
    try:
        jsonschema.validate(row, GYM_ROW)
    except jsonschema.ValidationError:
        return
    raise AssertionError("the schema accepted a string reward")
