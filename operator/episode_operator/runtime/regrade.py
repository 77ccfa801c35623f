"""A regrade: a finished Episode's kept artifacts verified again with new tests, its agent skipped.

A regrade is an Episode of its own (``spec.regrade`` names the original; its ``spec.task`` carries the
tests), not a section of the original's status: the original's record stays as its run wrote it (its
reward, what a set's pass@k and an export counted), a regrade can be repeated with other tests, and it
is crash-safe the way every Episode is — its status is its only state, its turns walk the runtime's
stage table from ``verify-prepare`` (the verifier pod recorded before anything runs in it, ``test.sh``
a keyed job a restart re-attaches to), so nothing here needs a second kind of bookkeeping.

What can be verified again is decided once, when the regrade starts, from the original's status
(:func:`plan_regrade`, pure) and recorded in ``status.regrade``:

- the original must be finished with a verdict to revisit (Graded, or Masked: its verifier never gave
  one) — an Ungraded or TerminalFailure run is re-run, not regraded;
- a turn the original verified in a **separate** sandbox is verified again: its artifacts were collected
  and kept by the operator's store (attempt N of the original, ``runtime/episode_store.py``), and a fresh
  verifier pod receives them exactly as the original's did;
- a turn the original verified in the agent's own sandbox (**shared**) cannot be: that sandbox, with
  whatever the agent left in it, is gone. The regrade is refused, naming the turn;
- a turn whose verifier never ran (a failed preparation, the agent's own failure) keeps the original's
  record; a turn the original never reached is skipped. Should a new verdict carry the episode past where
  the original stopped, the regrade ends Masked (``episode:regrade_incomplete``): no agent ran there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from episode_operator.api.episode_resource import EpisodeStatus, RegradeAction, RegradedTurn, RegradeStatus, TurnStatus
from episode_operator.api.vocabulary import FAILURE_REGRADE_INCOMPLETE, Outcome, SeedStage, Stage
from episode_operator.runtime.episode import EpisodeConfig, EpisodeRunner, StatusSink
from episode_operator.runtime.episode_store import EpisodeStore
from episode_operator.runtime.sandbox_protocol import ArchiveFile, Sandbox, SandboxProvider
from episode_operator.runtime.seed import build_images
from episode_operator.runtime.turn.context import TurnRun
from episode_operator.runtime.turn.turn_failures import EpisodeEnds, Outage
from episode_operator.runtime.turn.verify import stops_episode
from episode_operator.taskfolder import EpisodePlan

# The original's outcomes a regrade may revisit, and why (None: refused, with why not).
REGRADABLE: Final[Mapping[Outcome, str | None]] = {
    "Graded": None,
    "Masked": None,
    "Ungraded": "its outages used up its retries: no attempt ran to its verdict; re-run it instead",
    "TerminalFailure": "the task never started (a refused task, a failed build or first setup); re-run it instead",
}
# A turn whose record reached one of these stages without a failure of its own had its verifier ready to run:
# its artifacts were collected (collect comes before verify-prepare) and kept.
VERIFIED_STAGES: Final[frozenset[Stage]] = frozenset({Stage.VERIFY_PREPARE, Stage.VERIFY, Stage.DONE})


class RegradeRefused(Exception):
    """The original cannot be regraded (with these tests); the message names why, and the turns."""


def turn_action(record: TurnStatus) -> RegradeAction:
    """What a regrade does with a turn of the original, by how the original's turn ended."""
    if record.stage in VERIFIED_STAGES and record.failure_kind is None:
        return "verify"
    if record.stage == Stage.DONE:
        return "carried"
    return "skipped"


def plan_regrade(name: str, uid: str, original: EpisodeStatus, plan: EpisodePlan) -> RegradeStatus:
    """What regrading Episode ``name`` with the task of ``plan`` verifies; :class:`RegradeRefused` when nothing can."""
    if original.regrade is not None:
        raise RegradeRefused(f"episode {name} is itself a regrade of {original.regrade.episode}: regrade that one")
    if original.outcome is None or original.phase not in ("Succeeded", "Failed"):
        raise RegradeRefused(f"episode {name} is {original.phase or 'Pending'}: only a finished Episode is regraded")
    why_not = REGRADABLE[original.outcome]
    if why_not is not None:
        raise RegradeRefused(f"episode {name} ended {original.outcome}: {why_not}")
    names = [turn.name for turn in plan.turns]
    if [record.name for record in original.turns] != names:
        recorded = ", ".join(record.name for record in original.turns)
        raise RegradeRefused(
            f"the new task's turns ({', '.join(names)}) are not episode {name}'s ({recorded}): tests must be the "
            "same task's"
        )
    turns = [RegradedTurn(name=r.name, action=turn_action(r), original_reward=r.reward) for r in original.turns]
    shared = [
        f"{index + 1} ({record.name})"
        for index, (record, turn) in enumerate(zip(original.turns, turns, strict=True))
        if turn.action == "verify" and record.verifier_mode != "separate"
    ]
    if shared:
        raise RegradeRefused(
            f"turn {', '.join(shared)} of episode {name} was verified in the agent's own sandbox (a shared verifier), "
            "which is gone with what the agent left in it: it cannot be regraded (a task verifies separately to be "
            "regraded: [verifier] environment, or separate_verifier_for_artifacts)"
        )
    now_shared = [
        f"{index + 1} ({turn.name})"
        for index, (turn, planned) in enumerate(zip(turns, plan.turns, strict=True))
        if turn.action == "verify" and planned.verifier.mode != "separate"
    ]
    if now_shared:
        raise RegradeRefused(
            f"turn {', '.join(now_shared)} verifies in the agent's sandbox under the new task: a regrade verifies "
            "separately, as the original did"
        )
    if not any(turn.action == "verify" for turn in turns):
        raise RegradeRefused(f"no turn of episode {name} reached its verifier: nothing to verify again")
    assert original.attempt is not None
    return RegradeStatus(
        episode=name,
        uid=uid,
        attempt=original.attempt,
        original_outcome=original.outcome,
        original_reward=original.reward,
        turns=turns,
    )


class RegradeStore:
    """The regrade's own store, except that a turn's artifacts are the original's (its attempt's, as kept)."""

    def __init__(self, own: EpisodeStore, original: EpisodeStore, attempt: int) -> None:
        self.own, self.original, self.attempt = own, original, attempt

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await self.own.save_log(attempt, turn, name, data)

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: ArchiveFile) -> None:
        raise AssertionError("a regrade collects no artifacts")

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, object]]) -> None:
        raise AssertionError("a regrade collects no artifacts")

    async def artifact_archives(self, attempt: int, turn: str) -> list[ArchiveFile]:
        return await self.original.artifact_archives(self.attempt, turn)

    async def save_file(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await self.own.save_file(attempt, turn, name, data)

    async def read_file(self, attempt: int, turn: str, name: str) -> bytes | None:
        return await self.own.read_file(attempt, turn, name)


class RegradeRunner(EpisodeRunner):
    """The episode runner with the agent skipped: no agent pod, no seed but the images, and each turn to verify
    walked from ``verify-prepare`` in a fresh verifier pod; the other turns keep the original's record."""

    def __init__(
        self,
        config: EpisodeConfig,
        provider: SandboxProvider,
        sink: StatusSink,
        store: EpisodeStore,
        *,
        regrade: RegradeStatus,
        original_turns: Sequence[TurnStatus] = (),
        **options: Any,
    ) -> None:
        super().__init__(config, provider, sink, store, **options)
        self.regrade = regrade
        self._original_turns = {turn.name: turn for turn in original_turns}
        self._actions = {turn.name: turn.action for turn in regrade.turns}

    def _begin(self) -> None:
        self.status.regrade = self.regrade
        super()._begin()

    def _reset_turns(self, attempt: int) -> None:
        """A new attempt re-verifies its turns; the carried and skipped records stay as the original left them."""
        kept = {record.name: record for record in self.status.turns} or self._original_turns
        super()._reset_turns(attempt)
        self.status.turns = [
            record if self._actions[record.name] == "verify" else self._carried(kept[record.name])
            for record in self.status.turns
        ]
        self._progress()

    @staticmethod
    def _carried(record: TurnStatus) -> TurnStatus:
        return record if record.stage == Stage.DONE else TurnStatus(name=record.name)

    async def _seed(self) -> None:
        """The seed's images only (a separate verifier's image may be built): no agent sandbox, no agent setup."""
        if self.images.builds():
            self._attempt.seed_stage = SeedStage.IMAGES
            await self.publish()
        await build_images(self)

    async def _run_turn(self, turn: TurnRun) -> bool:
        action = self._actions[turn.name]
        if action == "carried":
            return stops_episode(turn.record)
        if action == "skipped":
            stopped_at = next(
                (record.name for record in reversed(self.status.turns[: turn.index]) if record.stage == Stage.DONE),
                None,
            )
            raise EpisodeEnds(
                "Masked",
                FAILURE_REGRADE_INCOMPLETE,
                f"turn {turn.label()}: the new verdicts carry the episode past turn {stopped_at}, where "
                f"episode {self.regrade.episode} stopped: no agent ran turn {turn.name}, so there is no verdict",
            )
        return await super()._run_turn(turn)

    def _first_stage(self, turn: TurnRun) -> Stage:
        return Stage.VERIFY_PREPARE

    def _agent_broke_the_sandbox(self, outage: Outage) -> bool:
        return False  # no agent acts in a regrade: every outage is retried

    async def agent_sandbox(self) -> Sandbox:
        raise AssertionError("a regrade runs no agent sandbox")

    async def release_agent(self) -> None:
        return None  # there is none
