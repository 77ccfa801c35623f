"""Reward files, the min_reward gate and the roll-up (docs/task-format.md §3.6–3.8, §5.1–5.7, §7)."""

from __future__ import annotations

import pytest

from episode_operator.taskfolder.rewards import (
    TurnScore,
    check_min_reward,
    parse_reward_files,
    roll_up,
)

# (id, reward.json bytes or None, reward.txt bytes or None, expected rewards or None for "no valid file")
REWARD_FILES: list[tuple[str, bytes | None, bytes | None, dict[str, float] | None]] = [
    ("json-wins-over-txt", b'{"reward": 0.75}', b"1", {"reward": 0.75}),  # §5.1
    ("invalid-json-no-fallback", b'{"reward": ', b"1", None),  # §5.2
    ("json-not-object", b"[1]", None, None),
    ("json-number-only", b"0.5", None, None),
    ("json-nested", b'{"reward": {"x": 1}}', None, None),
    ("json-boolean", b'{"reward": true}', None, None),
    ("json-string", b'{"reward": "1"}', None, None),
    ("json-null", b'{"reward": null}', None, None),
    ("json-nan", b'{"reward": NaN}', None, None),
    ("json-infinity", b'{"reward": -Infinity}', None, None),
    ("json-huge-number", b'{"reward": 1e999}', None, None),
    ("json-duplicate-key", b'{"reward": 1, "reward": 0}', None, None),
    ("json-empty-file", b"", b"1", None),
    ("json-not-utf8", b'{"reward": 1}\xff', None, None),
    ("json-components", b'{"reward": 1, "a": 0.5, "b": 2}', None, {"reward": 1.0, "a": 0.5, "b": 2.0}),
    ("json-components-only", b'{"core_pass_rate": 0.5}', None, {"core_pass_rate": 0.5}),
    ("json-empty-object", b"{}", None, {}),
    ("json-integer", b'{"reward": 1}', None, {"reward": 1.0}),
    ("txt-plain", None, b"1", {"reward": 1.0}),
    ("txt-whitespace", None, b" 1\n", {"reward": 1.0}),  # §5.3
    ("txt-fraction", None, b"0.25\n", {"reward": 0.25}),
    ("txt-exponent", None, b"1e-3", {"reward": 0.001}),
    ("txt-negative", None, b"-0.5", {"reward": -0.5}),
    ("txt-empty", None, b"", None),  # §5.3
    ("txt-blank", None, b" \n", None),
    ("txt-nan", None, b"nan", None),
    ("txt-inf", None, b"inf", None),
    ("txt-underscore", None, b"1_0", None),
    ("txt-two-numbers", None, b"1\n2\n", None),
    ("txt-word", None, b"pass", None),
    ("txt-hex", None, b"0x1", None),
    ("txt-arabic-indic-digit", None, "١".encode(), None),  # float() reads it as 1.0
    ("txt-fullwidth-digit", None, "１".encode(), None),
    ("txt-devanagari-fraction", None, "०.५".encode(), None),
    ("txt-no-break-space", None, "\u00a01".encode(), None),
    ("txt-ascii-whitespace", None, b"\t0.5\r\n\x0b\x0c", {"reward": 0.5}),
    ("json-fullwidth-digit", '{"reward": １}'.encode(), None, None),
    ("neither-file", None, None, None),
]


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "expected"),
    [row[1:] for row in REWARD_FILES],
    ids=[row[0] for row in REWARD_FILES],
)
def test_reward_file_parsing(
    reward_json: bytes | None, reward_txt: bytes | None, expected: dict[str, float] | None
) -> None:
    result = parse_reward_files(reward_json, reward_txt)
    assert result.rewards == expected
    assert result.valid == (expected is not None)
    assert (result.error is None) == (expected is not None)


def test_reward_file_errors_name_the_file() -> None:
    assert parse_reward_files(b"{oops", b"1").error.startswith("reward.json: invalid JSON")  # type: ignore[union-attr]
    assert parse_reward_files(None, b"").error == "reward.txt: empty file"
    assert parse_reward_files(None, None).error == "the verifier wrote neither reward.json nor reward.txt"
    assert parse_reward_files(None, b"1").source == "reward.txt"


# (id, min_reward, rewards, passes)
GATES: list[tuple[str, object, dict[str, float] | None, bool]] = [
    ("no-gate", None, {"reward": 0.0}, True),
    ("no-gate-no-file", None, None, True),
    ("number-above", 0.5, {"reward": 0.7}, True),
    ("number-equal-passes", 0.5, {"reward": 0.5}, True),
    ("number-below", 0.5, {"reward": 0.49}, False),
    ("number-components-only-misses", 0.5, {"core_pass_rate": 1.0}, False),  # §5.4
    ("table-equal-passes", {"core_pass_rate": 0.5}, {"core_pass_rate": 0.5}, True),  # §5.4
    ("table-missing-key", {"core_pass_rate": 0.5}, {"reward": 1.0}, False),
    ("table-one-below", {"a": 0.5, "b": 0.5}, {"a": 1.0, "b": 0.4}, False),
    ("table-ignores-unnamed", {"a": 0.5}, {"a": 0.5, "reward": 0.0}, True),
    ("no-valid-file-misses", 0.0, None, False),
]


@pytest.mark.parametrize(("min_reward", "rewards", "passes"), [row[1:] for row in GATES], ids=[row[0] for row in GATES])
def test_min_reward_gate(min_reward: object, rewards: dict[str, float] | None, passes: bool) -> None:
    miss = check_min_reward(min_reward, rewards)  # type: ignore[arg-type]
    assert (miss is None) == passes


def test_gate_miss_says_why() -> None:
    assert check_min_reward(0.5, {"reward": 0.25}) == "reward = 0.25 is below min_reward 0.5"
    assert check_min_reward({"core": 1}, {}) == "'core' is missing (min_reward core = 1)"


def test_mean_counts_a_failed_preparation_as_measured_zero() -> None:
    """§5.5: 3 steps, step 1 reward 1, step 2 setup fails → Gym 0.5 (Harbor would say 1.0)."""
    score = roll_up("mean", [TurnScore({"reward": 1.0}), TurnScore(valid=False)])
    assert score.reward == 0.5


def test_mean_with_missing_keys_counts_zero() -> None:
    """§5.6."""
    score = roll_up("mean", [TurnScore({"reward": 1.0, "a": 1.0}), TurnScore({"reward": 0.0})])
    assert score == type(score)(0.5, {"a": 0.5, "reward": 0.5})


def test_mean_with_invalid_reward_file() -> None:
    """§3.7: 0.25 then an invalid reward file → 0.125 (Harbor: 0.25)."""
    assert roll_up("mean", [TurnScore({"reward": 0.25}), TurnScore(valid=False)]).reward == 0.125


def test_mean_component_only_turns_count_zero_reward() -> None:
    score = roll_up("mean", [TurnScore({"core": 1.0}), TurnScore({"reward": 1.0, "core": 0.0})])
    assert score.reward == 0.5
    assert score.verifier_rewards == {"core": 0.5, "reward": 0.5}


def test_final_is_the_last_turn_that_ran() -> None:
    """§5.7: step 2 misses min_reward and stops → the episode reward is step 2's."""
    score = roll_up("final", [TurnScore({"reward": 1.0, "x": 1.0}), TurnScore({"reward": 0.2})])
    assert (score.reward, score.verifier_rewards) == (0.2, {"reward": 0.2})
    assert roll_up("final", [TurnScore({"reward": 1.0}), TurnScore(valid=False)]).reward == 0.0


def test_single_step_keeps_the_files_scalar() -> None:
    assert roll_up(None, [TurnScore({"core": 1.0})]).reward is None
    assert roll_up(None, [TurnScore({"reward": 0.3})]).reward == 0.3
    assert roll_up(None, [TurnScore(valid=False)]).reward == 0.0
    assert roll_up("mean", []).reward is None
