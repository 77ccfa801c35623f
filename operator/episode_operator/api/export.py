"""Finished Episodes as NeMo Gym rollout rows (``kubectl episode export --format gym-jsonl``).

``rollouts.jsonl`` holds the Graded and the Masked episodes (``mask_sample: true``), as Gym keeps
both there; ``rollouts_failures.jsonl`` one row per failed attempt, with Gym's ``_ng_failure_*``
keys and no reward or response. A rollout row is Gym's verify response (``responses_create_params``,
``response``, ``reward``, ``mask_sample``, ``failure_kind``, ``failure_reason``) with the harbor
environment's keys (``verifier_rewards``, ``turns``, ``stopped_after_turn``, ``verifier_mode``), and,
when the agent's model calls were captured, the collector's observation keys:

=============  ================================================  ================
turn_sessions  episode ``ng_agent_observations``                 per-turn records
=============  ================================================  ================
fresh          the session's, when exactly one turn's agent ran  one per turn
continue       the cumulative session                            none
=============  ================================================  ================

``ng_model_call_capture`` holds every call of the final attempt and ``ng_trajectory`` is projected
from it and the episode's observations as Gym's collector does.

Every row carries Gym's identity keys, as its collector stamps them, so that Gym's ``--resume``,
aggregation and ATIF export read it: ``_ng_task_index`` / ``_ng_rollout_index`` (an EpisodeSet
child's, a Gym try's, else numbered within the export: :func:`split_rows`), ``_ng_attempt_index``
(from the second try on), ``_ng_environment_server``, and what Gym's ``/run`` gave the try
(``agent_ref``, ``_ng_task_id``, the echoed ``instance_id`` / ``task_name``; an Episode made
otherwise echoes its task's ``task_name``). A rollout row also has the harbor agent's
``agent_timeout_error`` and ``context_length_exceeded_error``. Everything here is pure: the
operator's store supplies the captured calls (:class:`EpisodeEvidence`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from episode_operator.api.episode_resource import AttemptStatus, EpisodeSpec, EpisodeStatus, TurnStatus
from episode_operator.api.vocabulary import GROUP, SET_ATTEMPT_LABEL, SET_TASK_INDEX_LABEL, Stage, is_terminal
from episode_operator.capture.atif import (
    Trajectory,
    trajectory_from_calls,
    trajectory_to_responses,
    without_copied_context,
)
from episode_operator.capture.observability import (
    AgentObservationBundle,
    InvocationStatus,
    agent_invocation,
    trajectory_record,
)
from episode_operator.capture.records import (
    CapturedCall,
    ObservationGap,
    model_call_capture,
    parse_journal,
    unattributed_gap,
)
from episode_operator.capture.wire import sampling_params

ROLLOUTS = "rollouts.jsonl"
FAILURES = "rollouts_failures.jsonl"
# Gym's collector keys (rollout_collection.py, global_config.py): a producer invents no other ``_ng_`` key.
TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
ATTEMPT_INDEX_KEY = "_ng_attempt_index"
TASK_ID_KEY = "_ng_task_id"
ENVIRONMENT_SERVER_KEY = "_ng_environment_server"
AGENT_REF_KEY = "agent_ref"
ECHOED_KEYS = ("instance_id", "task_name")  # a flat row's task, echoed in its answer (harbor_agent)
GYM_IDENTITY_ANNOTATION = f"{GROUP}/gym-identity"
# The name rows give the server that ran them when no Gym config names it (`export --environment-server`).
ENVIRONMENT_SERVER = "episode_operator"
FAILURE_CLASS = "environment_server_failed"
FailureStage = Literal["admission", "seed", "agent", "verification", "cleanup"]
# A turn's stage when its attempt failed → Gym's episode stage. Preparing a turn (its cleanup of the
# previous turn's grading files, workdir, setup.sh, healthcheck) sets the sandbox up for the agent.
# Where in Gym's episode a turn's stage lies: preparing the turn is seeding it (Gym's harbor
# server prepares a step before its agent), collecting belongs to verification.
STAGE_OF_TURN_STAGE: dict[Stage, FailureStage] = {
    Stage.CLEANUP: "seed",
    Stage.WORKDIR: "seed",
    Stage.SETUP: "seed",
    Stage.HEALTHCHECK: "seed",
    Stage.AGENT: "agent",
    Stage.COLLECT: "verification",
    Stage.VERIFY_PREPARE: "verification",
    Stage.VERIFY: "verification",
    Stage.DONE: "verification",
}
ROW_OUTCOMES = {"Graded": False, "Masked": True}  # outcome → mask_sample
TERMINAL_OUTCOMES = {"TerminalFailure": True, "Ungraded": False}  # outcome → _ng_failure_terminal
TurnSessions = Literal["fresh", "continue"]


# --- what the store adds to an Episode -------------------------------------------------------------------
@dataclass(frozen=True)
class TurnEvidence:
    """What one turn of the final attempt left: its instruction and its agent's captured model calls."""

    instruction: str | None = None
    calls: Sequence[CapturedCall] = ()
    capture_complete: bool = True
    trajectory: Trajectory | None = None  # as kept; built from ``calls`` when None


@dataclass(frozen=True)
class EpisodeEvidence:
    """The captures of an Episode's final attempt (``turns`` by turn name), and how its agent ran."""

    turns: Mapping[str, TurnEvidence] = field(default_factory=dict)
    outside_turn_calls: Sequence[CapturedCall] = ()
    captured: bool = True
    harness: str = "command"
    harness_version: str = "unknown"
    model: str | None = None
    turn_sessions: TurnSessions = "fresh"
    # spec.agent.model.params as a Responses request names them: what every call was sent with.
    sampling: Mapping[str, Any] = field(default_factory=dict)


NO_EVIDENCE = EpisodeEvidence(captured=False)

# The names of a turn's records in the operator's store (runtime/episode_store.py keeps them).
INSTRUCTION_RECORD, CALLS_RECORD, TRAJECTORY_RECORD = "instruction.md", "model-calls.jsonl", "trajectory.json"


def evidence_of(spec: EpisodeSpec, records: Mapping[str, Any]) -> EpisodeEvidence:
    """An Episode's evidence from its turns' records as the operator's store serves them (``/turns``)."""
    agent = spec.agent
    if agent.model is None:
        return NO_EVIDENCE
    turns: dict[str, TurnEvidence] = {}
    for name, kept in (records.get("turns") or {}).items():
        journal = parse_journal(str(kept.get(CALLS_RECORD) or "").encode())
        trajectory = kept.get(TRAJECTORY_RECORD)
        turns[name] = TurnEvidence(
            instruction=kept.get(INSTRUCTION_RECORD),
            calls=journal.calls,
            capture_complete=not journal.unreadable and not journal.in_flight,
            trajectory=Trajectory.model_validate_json(trajectory) if trajectory else None,
        )
    return EpisodeEvidence(
        turns=turns,
        harness=agent.harness.name if agent.harness else agent.kind,
        harness_version=(agent.harness.version if agent.harness else None) or "default",
        model=agent.model.name,
        turn_sessions=agent.turn_sessions,
        sampling=responses_sampling(agent.model.params),
    )


# The sampling keys of Gym's responses_create_params and of a Responses object.
RESPONSES_SAMPLING_KEYS = ("temperature", "top_p", "max_output_tokens")


def responses_sampling(params: Mapping[str, Any]) -> dict[str, Any]:
    """The Episode's sampling parameters under the Responses API's names (the capture proxy sent them)."""
    named = sampling_params(params, "responses")
    return {key: named[key] for key in RESPONSES_SAMPLING_KEYS if key in named}


# --- identity --------------------------------------------------------------------------------------------
def set_indices(metadata: Mapping[str, Any]) -> dict[str, int]:
    """``_ng_task_index`` and ``_ng_rollout_index`` of an EpisodeSet child (Gym counts rollouts from 0)."""
    labels = metadata.get("labels") or {}
    try:
        return {
            TASK_INDEX_KEY: int(labels[SET_TASK_INDEX_LABEL]),
            ROLLOUT_INDEX_KEY: int(labels[SET_ATTEMPT_LABEL]) - 1,
        }
    except (KeyError, ValueError):
        return {}


def _an_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# What each key of a kept identity must be; anything else on the annotation (anyone who may create
# the Episode may write it) is left out of the rows.
IDENTITY_VALUES: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(ECHOED_KEYS, lambda value: isinstance(value, str) and bool(value)),
    AGENT_REF_KEY: lambda value: isinstance(value, dict) and isinstance(value.get("name"), str),
    TASK_ID_KEY: lambda value: isinstance(value, dict) and isinstance(value.get("task_id"), str),
    ATTEMPT_INDEX_KEY: _an_index,
}


def gym_identity(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """What Gym's ``/run`` gave the try whose Episode this is (empty for an Episode made otherwise)."""
    text = (metadata.get("annotations") or {}).get(GYM_IDENTITY_ANNOTATION)
    try:
        identity = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    if not isinstance(identity, dict):
        return {}
    return {key: value for key, value in identity.items() if key in IDENTITY_VALUES and IDENTITY_VALUES[key](value)}


def identity_keys(
    metadata: Mapping[str, Any], status: EpisodeStatus, attempt: int | None, environment_server: str
) -> dict[str, Any]:
    """Gym's identity keys of a row of this attempt of the Episode (its final one: ``None``)."""
    gym = gym_identity(metadata)
    echoed = {key: gym[key] for key in ECHOED_KEYS if key in gym}
    if not gym and status.task and status.task.name:  # an Episode Gym did not send: its task
        echoed = {"task_name": status.task.name}
    keys: dict[str, Any] = {**set_indices(metadata), ENVIRONMENT_SERVER_KEY: environment_server, **echoed}
    # Gym counts tries from 0: the try Gym sent (its own attempt index), then the Episode's retries.
    tries = int(gym.get(ATTEMPT_INDEX_KEY) or 0) + max((attempt or status.attempt or 1) - 1, 0)
    if tries:
        keys[ATTEMPT_INDEX_KEY] = tries
    keys |= {key: gym[key] for key in (AGENT_REF_KEY, TASK_ID_KEY) if key in gym}
    return keys


def agent_error_flags(status: EpisodeStatus) -> dict[str, int]:
    """The harbor agent's error flags (1 or 0): a turn's agent ran out of its budget, or its context."""
    failures = {turn.agent_failure for turn in status.turns}
    return {
        "agent_timeout_error": int("timeout" in failures),
        "context_length_exceeded_error": int("context_window" in failures),
    }


def rollout_id(metadata: Mapping[str, Any], attempt: int | None) -> str:
    """Gym's capture key: ``<task>-<rollout>`` (else the Episode), ``-a<n>`` for the n-th retry."""
    indices = set_indices(metadata)
    base = (
        f"{indices[TASK_INDEX_KEY]}-{indices[ROLLOUT_INDEX_KEY]}"
        if indices
        else f"{metadata.get('namespace')}.{metadata.get('name')}"
    )
    return base if not attempt or attempt <= 1 else f"{base}-a{attempt - 1}"


# --- Responses objects ----------------------------------------------------------------------------------
def response_object(
    model: str,
    output: list[dict[str, Any]],
    trajectory: Trajectory | None,
    created_at: int,
    sampling: Mapping[str, Any],
) -> dict[str, Any]:
    """Gym's harbor agent response: its default Responses object with the model, output items and usage."""
    metrics = trajectory.final_metrics if trajectory and trajectory.final_metrics else None
    input_tokens = (metrics.total_prompt_tokens if metrics else None) or 0
    output_tokens = (metrics.total_completion_tokens if metrics else None) or 0
    cached_tokens = (metrics.total_cached_tokens if metrics else None) or 0
    return {
        "id": f"resp_{uuid.uuid4()}",
        "created_at": created_at,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": False,
        "temperature": sampling.get("temperature"),
        "tool_choice": "auto",
        "tools": [],
        "top_p": sampling.get("top_p"),
        "background": False,
        "max_output_tokens": sampling.get("max_output_tokens"),
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": {"effort": None, "generate_summary": None, "summary": None},
        "service_tier": "default",
        "status": "completed",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "top_logprobs": 0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
        "user": None,
        "prompt_cache_key": None,
        "safety_identifier": None,
        "store": True,
    }


def input_from_trajectory(trajectory: Trajectory | None) -> list[dict[str, Any]]:
    """Gym's ``extract_input_from_trajectory``: the leading user steps as input messages."""
    messages = []
    for step in trajectory.steps if trajectory else []:
        if step.source != "user":
            break
        messages.append(
            {"role": "user", "content": step.message if isinstance(step.message, str) else "", "type": "message"}
        )
    return messages


def create_params(
    instruction: str | None, trajectory: Trajectory | None, sampling: Mapping[str, Any]
) -> dict[str, Any]:
    """The request the agent started from: its instruction as one user message (Gym's harbor rows),
    with the sampling parameters every call was sent with."""
    if instruction is not None:
        return {"input": [{"role": "user", "content": instruction, "type": "message"}], **sampling}
    return {"input": input_from_trajectory(trajectory), **sampling}


# --- turns -------------------------------------------------------------------------------------------------
def session_status(turn: TurnStatus) -> tuple[InvocationStatus, str | None]:
    if turn.agent_exit_code is None:
        return "unknown", None
    if turn.agent_exit_code == 0:
        return "completed", None
    return "failed", f"exit_code_{turn.agent_exit_code}"


def epoch(timestamp: str | None) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()) if timestamp else 0


@dataclass(frozen=True)
class TurnView:
    """One turn that ran, with what it is built into."""

    status: TurnStatus
    evidence: TurnEvidence
    trajectory: Trajectory | None
    sampling: Mapping[str, Any]

    @property
    def agent_ran(self) -> bool:
        return self.status.agent_exit_code is not None or bool(self.evidence.calls)

    @property
    def activation(self) -> Trajectory | None:
        """This turn's own steps (a ``continue`` trajectory repeats earlier turns as copied context)."""
        return without_copied_context(self.trajectory) if self.trajectory else None

    def response(self, model: str) -> dict[str, Any]:
        activation = self.activation
        output = trajectory_to_responses(activation.to_json_dict()) if activation else []
        return response_object(model, output, activation, epoch(self.status.finished_at), self.sampling)

    def params(self) -> dict[str, Any]:
        return create_params(self.evidence.instruction, self.activation, self.sampling)


def turn_views(status: EpisodeStatus, evidence: EpisodeEvidence, session_id: str) -> list[TurnView]:
    views: list[TurnView] = []
    earlier: list[CapturedCall] = []
    for turn in status.turns:
        if turn.phase == "Skipped":
            continue
        turn_evidence = evidence.turns.get(turn.name, TurnEvidence())
        trajectory = turn_evidence.trajectory
        if trajectory is None and turn_evidence.calls:
            trajectory = trajectory_from_calls(
                turn_evidence.calls,
                agent_name=evidence.harness,
                agent_version=evidence.harness_version,
                session_id=session_id if evidence.turn_sessions == "continue" else f"{session_id}/{turn.name}",
                earlier_calls=earlier if evidence.turn_sessions == "continue" else (),
            )
        views.append(TurnView(turn, turn_evidence, trajectory, evidence.sampling))
        earlier.extend(turn_evidence.calls)
    return views


def turn_entry(view: TurnView, model: str) -> dict[str, Any]:
    turn = view.status
    return {
        "name": turn.name,
        "reward": turn.reward,
        "verifier_rewards": turn.verifier_rewards,
        "reward_valid": turn.reward_valid,
        "verifier_mode": turn.verifier_mode,
        "failure_kind": turn.failure_kind,
        "agent_exit_code": turn.agent_exit_code,
        "started_at": turn.started_at,
        "finished_at": turn.finished_at,
        "responses_create_params": view.params(),
        "response": view.response(model),
    }


# --- observation keys ------------------------------------------------------------------------------------
def observations(source: str, views: Sequence[TurnView], invocation_id: str) -> AgentObservationBundle:
    """One agent session over ``views`` (a fresh turn, or every turn of a continued session)."""
    calls = [call for view in views for call in view.evidence.calls]
    last = views[-1]
    status, error = session_status(last.status)
    invocation = agent_invocation(invocation_id, calls, last.trajectory, status=status, error_type=error)
    return AgentObservationBundle(source=source, records=[invocation])


def capture_gaps(views: Sequence[TurnView], outside: Sequence[CapturedCall]) -> list[ObservationGap]:
    gaps = [
        ObservationGap(code="model_call_capture_incomplete", detail=view.status.name)
        for view in views
        if not view.evidence.capture_complete
    ]
    stray = unattributed_gap(outside)
    return [*gaps, stray] if stray else gaps


def observation_keys(
    row_id: str, task_id: str, views: Sequence[TurnView], evidence: EpisodeEvidence, resolved: bool | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The row's ``ng_*`` keys, and each turn entry's (empty under ``continue``)."""
    ran = [view for view in views if view.agent_ran]
    calls = [call for view in views for call in view.evidence.calls] + list(evidence.outside_turn_calls)
    gaps = capture_gaps(views, evidence.outside_turn_calls)
    capture = model_call_capture(row_id, calls)
    if gaps:
        capture.gaps = [*(capture.gaps or []), *gaps]
    keys: dict[str, Any] = {"ng_model_call_capture": capture.row()}
    per_turn: list[dict[str, Any]] = [{} for _ in views]
    episode_observations: AgentObservationBundle | None = None
    if evidence.turn_sessions == "continue" and ran:
        episode_observations = observations(evidence.harness, ran, f"{row_id}/session")
    else:
        for index, view in enumerate(views):
            if view.agent_ran:
                bundle = observations(evidence.harness, [view], f"{row_id}/{view.status.name}")
                record = trajectory_record(task_id, row_id, view.evidence.calls, bundle, resolved=None)
                per_turn[index] = {
                    "ng_agent_observations": bundle.model_dump(mode="json"),
                    # The payloads are the episode's ng_trajectory's: not repeated per turn.
                    "ng_trajectory": record.model_dump(
                        mode="json", exclude={"model_calls": {"__all__": {"request", "response"}}}
                    ),
                }
        if len(ran) == 1:
            episode_observations = observations(evidence.harness, ran, f"{row_id}/{ran[0].status.name}")
    if episode_observations is not None:
        keys["ng_agent_observations"] = episode_observations.model_dump(mode="json")
    keys["ng_trajectory"] = trajectory_record(
        task_id, row_id, calls, episode_observations, resolved=resolved, capture_gaps=capture.gaps or ()
    ).model_dump(mode="json")
    return keys, per_turn


# --- rows --------------------------------------------------------------------------------------------------
def episode_name(metadata: Mapping[str, Any]) -> str:
    return f"{metadata['namespace']}/{metadata['name']}"


def metadata_of(metadata: Mapping[str, Any], spec: EpisodeSpec, status: EpisodeStatus) -> dict[str, Any]:
    """Where the row came from (Gym's harbor rows keep the trial's details under ``metadata`` too)."""
    return {
        "uid": metadata.get("uid"),
        "task": status.task.name if status.task else None,
        "task_digest": status.task.digest if status.task else None,
        "agent": spec.agent.kind,
        "labels": dict(metadata.get("labels") or {}),
        "outcome": status.outcome,
        "attempts": len(status.attempts),
        "started_at": status.started_at,
        "finished_at": status.finished_at,
    }


def rollout_row(
    episode: Mapping[str, Any],
    evidence: EpisodeEvidence = NO_EVIDENCE,
    environment_server: str = ENVIRONMENT_SERVER,
) -> dict[str, Any]:
    """The ``rollouts.jsonl`` row of a Graded or Masked Episode."""
    metadata = episode["metadata"]
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    spec = EpisodeSpec.model_validate(episode["spec"])
    masked = ROW_OUTCOMES[str(status.outcome)]
    model = evidence.model or spec.agent.kind
    row_id = rollout_id(metadata, status.attempt)
    views = turn_views(status, evidence, row_id)
    last_ran = next((view for view in reversed(views) if view.agent_ran), None)
    failed = bool(status.failure_kind) or masked
    row: dict[str, Any] = {
        "responses_create_params": last_ran.params() if last_ran else create_params(None, None, evidence.sampling),
        "response": last_ran.response(model)
        if last_ran
        else response_object(model, [], None, epoch(status.finished_at), evidence.sampling),
        "reward": status.reward if status.reward is not None else 0.0,
        "mask_sample": masked,
        "failure_kind": status.failure_kind,
        "failure_reason": status.message if failed else None,
        "verifier_rewards": status.verifier_rewards,
        "turns": [turn_entry(view, model) for view in views],
        "stopped_after_turn": status.stopped_after_turn,
        "verifier_mode": status.verifier_mode,
        "episode": episode_name(metadata),
        "metadata": metadata_of(metadata, spec, status),
        **agent_error_flags(status),
        **identity_keys(metadata, status, None, environment_server),
    }
    if evidence.captured:
        task_id = (status.task.name if status.task else None) or episode_name(metadata)
        resolved = None if masked else bool(status.reward and status.reward > 0)
        keys, per_turn = observation_keys(row_id, task_id, views, evidence, resolved)
        row |= keys
        for entry, extra in zip(row["turns"], per_turn, strict=True):
            entry |= extra
    return row


def failure_row(
    episode: Mapping[str, Any],
    attempt: AttemptStatus | None,
    *,
    terminal: bool,
    message: str,
    stage: FailureStage | None,
    environment_server: str = ENVIRONMENT_SERVER,
) -> dict[str, Any]:
    """One ``rollouts_failures.jsonl`` row: Gym's handled environment failure, no reward, no response."""
    metadata = episode["metadata"]
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    row: dict[str, Any] = {
        "_ng_failure_class": FAILURE_CLASS,
        "_ng_failure_terminal": terminal,
        "_ng_failure_message": message[:2000],
        **identity_keys(metadata, status, attempt.number if attempt else None, environment_server),
        "episode": episode_name(metadata),
        "attempt": attempt.number if attempt else status.attempt,
        "failure_kind": status.failure_kind if attempt is None else None,
    }
    if stage is not None:
        row["_ng_failure_stage"] = stage
    return row


def failure_stage(status: EpisodeStatus) -> FailureStage:
    """Where the final attempt failed: the stage of the turn it stopped in, else setting up (seed)."""
    stopped = next((turn for turn in reversed(status.turns) if turn.stage and turn.phase != "Skipped"), None)
    return STAGE_OF_TURN_STAGE.get(stopped.stage, "seed") if stopped and stopped.stage else "seed"


def rows(
    episode: Mapping[str, Any],
    evidence: EpisodeEvidence = NO_EVIDENCE,
    environment_server: str = ENVIRONMENT_SERVER,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rollouts, failures)`` of one finished Episode: its row, and a failure row per failed attempt.

    Earlier attempts ended in outages (Gym retries those): each is a failure row that is not terminal.
    """
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    if not is_terminal(status.phase):
        return [], []
    retried = [attempt for attempt in status.attempts if attempt.number != status.attempt]
    failures = [
        failure_row(
            episode,
            attempt,
            terminal=False,
            message=attempt.reason or "outage",
            stage=None,
            environment_server=environment_server,
        )
        for attempt in retried
    ]
    outcome = str(status.outcome)
    if outcome in ROW_OUTCOMES:
        return [rollout_row(episode, evidence, environment_server)], failures
    message = status.message or status.failure_kind or outcome
    terminal = TERMINAL_OUTCOMES.get(outcome, False)
    final = failure_row(
        episode,
        None,
        terminal=terminal,
        message=message,
        stage=failure_stage(status),
        environment_server=environment_server,
    )
    return [], [*failures, final]


def export_indices(episodes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Gym's indices of the Episodes that have none (neither an EpisodeSet's child nor a Gym try), by
    Episode: one task index per task, after every index an Episode has, and its rollouts in the order
    they were made. The same Episodes always number the same way."""
    labelled = [set_indices(episode["metadata"]) for episode in episodes]
    first = 1 + max((indices[TASK_INDEX_KEY] for indices in labelled if indices), default=-1)
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for episode, indices in zip(episodes, labelled, strict=True):
        if not indices:
            task = EpisodeStatus.model_validate(episode.get("status") or {}).task
            key = (task.digest or task.name) if task else None
            by_task.setdefault(key or episode_name(episode["metadata"]), []).append(episode)
    numbered: dict[str, dict[str, int]] = {}
    for offset, key in enumerate(sorted(by_task)):
        made = sorted(
            by_task[key], key=lambda e: (e["metadata"].get("creationTimestamp") or "", episode_name(e["metadata"]))
        )
        for rollout, episode in enumerate(made):
            numbered[episode_name(episode["metadata"])] = {TASK_INDEX_KEY: first + offset, ROLLOUT_INDEX_KEY: rollout}
    return numbered


def split_rows(
    episodes: Iterable[Mapping[str, Any]],
    evidence_of: Callable[[Mapping[str, Any]], EpisodeEvidence] = lambda _episode: NO_EVIDENCE,
    environment_server: str = ENVIRONMENT_SERVER,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rollouts, failures)`` of the finished episodes; running ones are left out."""
    finished = [e for e in episodes if is_terminal((e.get("status") or {}).get("phase"))]
    numbered = export_indices(finished)
    rollouts: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for episode in finished:
        done, failed = rows(episode, evidence_of(episode), environment_server)
        for row in (*done, *failed):
            row |= numbered.get(episode_name(episode["metadata"]), {})
        rollouts.extend(done)
        failures.extend(failed)
    return rollouts, failures
