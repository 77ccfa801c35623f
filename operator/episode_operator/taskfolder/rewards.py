"""Reward files, the ``min_reward`` gate and the roll-up of turns into an episode reward.

The rules are NeMo Gym's (docs/task-format.md §3.6–3.8) with the strict validity this project
decided (§7): ``reward.json`` wins over ``reward.txt`` with no fallback; a file must hold
finite numbers only; anything else is "no valid reward file", which Gym scores as a
measured 0 that ends the episode.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

REWARD_KEY = "reward"
REWARD_JSON_NAME = "reward.json"
REWARD_TXT_NAME = "reward.txt"
# One decimal number in ASCII: what float() takes minus nan, inf, underscores, hex and the
# digits of other scripts ("١", "１"), which float() reads but no verifier means to write.
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Around the number; str.strip() would also drop Unicode spaces (e.g. U+00A0).
ASCII_SPACE = " \t\n\r\v\f"


@dataclass(frozen=True)
class RewardFile:
    """The outcome of reading a turn's reward files.

    ``rewards`` is None when there is no valid reward file; ``error`` then says why.
    """

    rewards: dict[str, float] | None
    source: str | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.rewards is not None


class _Invalid(ValueError):
    pass


def parse_reward_files(reward_json: bytes | None, reward_txt: bytes | None) -> RewardFile:
    """Read ``/logs/verifier/reward.json`` or, only when it does not exist, ``reward.txt``.

    Pass None for a file that does not exist. test.sh's exit status plays no part.
    """
    if reward_json is not None:
        try:
            return RewardFile(_parse_json(reward_json), REWARD_JSON_NAME)
        except _Invalid as error:
            return RewardFile(None, REWARD_JSON_NAME, f"{REWARD_JSON_NAME}: {error}")
    if reward_txt is not None:
        try:
            return RewardFile({REWARD_KEY: _parse_txt(reward_txt)}, REWARD_TXT_NAME)
        except _Invalid as error:
            return RewardFile(None, REWARD_TXT_NAME, f"{REWARD_TXT_NAME}: {error}")
    return RewardFile(None, None, f"the verifier wrote neither {REWARD_JSON_NAME} nor {REWARD_TXT_NAME}")


def _text(data: bytes) -> str:
    if not data:
        raise _Invalid("empty file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid("not UTF-8 text") from None


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise _Invalid(f"{value!r} is not a finite number")
    return value


def _parse_txt(data: bytes) -> float:
    text = _text(data).strip(ASCII_SPACE)
    if not NUMBER.fullmatch(text):
        raise _Invalid(f"must hold one number, not {text[:80]!r}")
    return _finite(float(text))


def _parse_json(data: bytes) -> dict[str, float]:
    text = _text(data)

    def refuse_constant(name: str) -> Any:
        raise _Invalid(f"{name} is not a finite number")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        duplicated = sorted({key for key in keys if keys.count(key) > 1})
        if duplicated:
            raise _Invalid(f"duplicate keys: {', '.join(duplicated)}")
        return dict(pairs)

    try:
        document = json.loads(text, parse_constant=refuse_constant, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        raise _Invalid(f"invalid JSON: {error}") from None
    except OverflowError:
        raise _Invalid("a number is too large") from None
    if not isinstance(document, dict):
        raise _Invalid(f"must be a JSON object of numbers, not {type(document).__name__}")
    rewards: dict[str, float] = {}
    for key, value in document.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(f"{key!r} must be a number, not {json.dumps(value)[:80]}")
        try:
            rewards[key] = _finite(float(value))
        except OverflowError:
            raise _Invalid(f"{key!r} is too large") from None
    return rewards


MinReward = float | Mapping[str, float] | None


def check_min_reward(min_reward: MinReward, rewards: Mapping[str, float] | None) -> str | None:
    """None if the turn passes its gate, else why it misses (equality passes).

    A number gates the ``reward`` key, so a file with component keys only always misses;
    a table gates each key it names, a missing key missing. No valid file misses any gate.
    """
    if min_reward is None:
        return None
    if rewards is None:
        return "no valid reward file"
    thresholds = {REWARD_KEY: min_reward} if isinstance(min_reward, int | float) else min_reward
    for key, threshold in thresholds.items():
        if key not in rewards:
            return f"{key!r} is missing (min_reward {key} = {threshold})"
        if rewards[key] < threshold:
            return f"{key} = {rewards[key]} is below min_reward {threshold}"
    return None


@dataclass(frozen=True)
class TurnScore:
    """A turn's contribution to the roll-up.

    ``valid`` False is Gym's measured 0: no valid reward file, or a failed preparation at
    step 2 or later. ``rewards`` is then empty.
    """

    rewards: Mapping[str, float] = field(default_factory=dict)
    valid: bool = True

    @property
    def reward(self) -> float | None:
        """The turn's scalar: its ``reward`` key, 0 for a measured 0, None if the file has none."""
        if not self.valid:
            return 0.0
        return self.rewards.get(REWARD_KEY)


@dataclass(frozen=True)
class EpisodeScore:
    reward: float | None
    verifier_rewards: dict[str, float]


def roll_up(strategy: Literal["mean", "final"] | None, turns: Sequence[TurnScore]) -> EpisodeScore:
    """Roll the turns that ran into the episode's reward (docs/task-format.md §3.7, Gym).

    ``mean`` (the default for multi-step): the mean over turns that ran, a measured-0 turn
    and a missing key counting 0, for ``reward`` and for every other key alike. ``final``,
    and None for a single-step task: the last turn as it is.
    """
    if not turns:
        return EpisodeScore(None, {})
    if strategy != "mean":
        last = turns[-1]
        return EpisodeScore(last.reward, dict(last.rewards))
    keys = sorted({key for turn in turns for key in turn.rewards})
    means = {key: sum(turn.rewards.get(key, 0.0) for turn in turns) / len(turns) for key in keys}
    reward = sum(turn.rewards.get(REWARD_KEY, 0.0) for turn in turns) / len(turns)
    return EpisodeScore(reward, means)
