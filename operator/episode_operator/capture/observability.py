"""Gym's observation records of a rollout: ``ng_agent_observations`` and ``ng_trajectory``, from captured calls.

The models mirror ``nemo_gym/rollout_observability.py`` (the subset a harness running in a sandbox can
report: one ``AgentInvocation`` per agent session, no tool timing). :func:`trajectory_record` follows
Gym's collector (``_build_trajectory_record`` in ``rollout_collection.py``) for a producer that sends
observations and model-call capture but no trajectory of its own: the capture's calls with their
payloads, the invocations, one trajectory turn per answered call an invocation owns, and the gaps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from episode_operator.capture.atif import Trajectory, trajectory_to_responses
from episode_operator.capture.records import (
    CallOutcome,
    CapturedCall,
    ModelServerRef,
    ObservationGap,
    model_call_record,
    model_calls,
)


class ObservationModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCallRef(ObservationModel):
    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _join_key(self) -> ModelCallRef:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError("model_call_id or both model_ref and response_id are required")
        return self


InvocationStatus = Literal["completed", "failed", "incomplete", "unknown"]


class AgentInvocation(ObservationModel):
    """One agent session (a harness process, or several under ``continue``) and its model calls."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: InvocationStatus = "unknown"
    duration_ms: float | None = Field(default=None, ge=0)
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[dict[str, Any]] = Field(
        default_factory=list, description="Responses input items (Gym's NeMoGymResponseInputItem)."
    )


class AgentObservationBundle(ObservationModel):
    source: str
    records: list[AgentInvocation] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)


class TrajectoryTokenStats(ObservationModel):
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)


class TrajectoryResponseMetadata(ObservationModel, CallOutcome):
    error_category: str | None = None
    latency_ttft_ms: float | None = Field(default=None, ge=0)


class TrajectoryModelCall(ObservationModel):
    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    request: Any | None = None
    response: Any | None = None
    response_metadata: TrajectoryResponseMetadata = Field(default_factory=TrajectoryResponseMetadata)
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryTurn(ObservationModel):
    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: Any | None = None
    answer: Any | None = None
    reasoning_content: Any | None = None
    resolved: bool | None = None
    step_count: int = Field(ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class TrajectoryRecord(ObservationModel):
    """Gym's ``ng_trajectory`` (schema 1.0)."""

    schema_version: Literal["1.0"] = "1.0"
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)


# --- builders ------------------------------------------------------------------------------------------
def conversation(trajectory: Trajectory) -> list[dict[str, Any]]:
    """A trajectory as Responses input items: system and user steps as messages, agent steps as Gym
    turns them into output items (their observations as function call outputs)."""
    items: list[dict[str, Any]] = []
    for step in trajectory.steps:
        if step.source == "agent":
            items.extend(trajectory_to_responses({"steps": [step.model_dump(mode="json", exclude_none=True)]}))
        else:
            text = (
                step.message if isinstance(step.message, str) else "\n".join(part.text or "" for part in step.message)
            )
            items.append({"role": step.source, "content": text, "type": "message"})
    return items


def agent_invocation(
    invocation_id: str,
    calls: Sequence[CapturedCall],
    trajectory: Trajectory | None,
    *,
    status: InvocationStatus = "unknown",
    duration_ms: float | None = None,
    error_type: str | None = None,
) -> AgentInvocation:
    """An agent session: every model call captured while it ran is its own (the proxy saw no other client)."""
    return AgentInvocation(
        invocation_id=invocation_id,
        status=status,
        duration_ms=duration_ms,
        error_type=error_type,
        model_calls=[ModelCallRef(model_call_id=call.model_call_id) for call in model_calls(calls)],
        conversation=conversation(trajectory) if trajectory is not None else [],
    )


def _turn_content(request: Any, response: Any) -> tuple[Any, Any, Any, int]:
    """Gym's ``_turn_content``: a call's question, answer, reasoning and tool-call count (Responses, chat)."""
    question = request.get("input", request.get("messages")) if isinstance(request, dict) else request
    if isinstance(request, dict) and isinstance(request.get("input"), list):
        question = [
            {"type": "message", **item} if isinstance(item, dict) and "role" in item and "type" not in item else item
            for item in request["input"]
        ]
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        output = [item for item in response["output"] if isinstance(item, dict)]
        reasoning = [item for item in output if item.get("type") == "reasoning"] or None
        answer = [item for item in output if item.get("type") != "reasoning"]
        return question, answer, reasoning, sum(1 for item in answer if item.get("type") == "function_call")
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        message_answer = {key: value for key, value in message.items() if key not in ("reasoning_content", "reasoning")}
        return question, message_answer, reasoning, len(message.get("tool_calls") or [])
    return question, None, None, 0


def trajectory_model_call(call: CapturedCall, index: int) -> TrajectoryModelCall:
    record = model_call_record(call, call_index=index)
    fields = TrajectoryResponseMetadata.model_fields
    metadata = {key: value for key in fields if (value := getattr(record, key)) is not None}
    return TrajectoryModelCall(
        model_call_id=record.model_call_id,
        started_at=record.started_at,
        completed_at=record.completed_at,
        duration_ms=record.latency_total_ms,
        request=record.request if record.request is not None else record.request_raw,
        response=record.response if record.response is not None else record.response_raw,
        response_metadata=TrajectoryResponseMetadata.model_validate(metadata),
        token_stats=TrajectoryTokenStats(
            prompt_tokens=record.tokens_in,
            completion_tokens=record.tokens_out,
            reasoning_tokens=record.tokens_reasoning,
            total_tokens=record.tokens_total,
            cached_tokens=record.cached_tokens,
        ),
    )


def trajectory_record(
    task_id: str,
    rollout_id: str,
    calls: Sequence[CapturedCall],
    observations: AgentObservationBundle | None,
    *,
    resolved: bool | None = None,
    capture_gaps: Sequence[ObservationGap] = (),
) -> TrajectoryRecord:
    """``ng_trajectory`` as Gym's collector projects it from the capture and the observations."""
    recorded = [trajectory_model_call(call, index) for index, call in enumerate(model_calls(calls))]
    invocations = list(observations.records) if observations else []
    gaps = [*(observations.gaps if observations else []), *capture_gaps]
    owner = {
        ref.model_call_id: invocation.invocation_id for invocation in invocations for ref in invocation.model_calls
    }
    turns: list[TrajectoryTurn] = []
    turn_numbers: Counter[str] = Counter()
    tool_counts: Counter[str] = Counter()
    for call in recorded:
        invocation_id = owner.get(call.model_call_id)
        if call.response is None or invocation_id is None:
            continue  # a call that returned nothing is no model decision; an unowned one is no agent's
        question, answer, reasoning, tools = _turn_content(call.request, call.response)
        turn_numbers[invocation_id] += 1
        turns.append(
            TrajectoryTurn(
                invocation_id=invocation_id,
                task_id=task_id,
                rollout_id=rollout_id,
                turn_no=turn_numbers[invocation_id],
                timestamp=call.started_at or call.completed_at or 0.0,
                question=question,
                answer=answer,
                reasoning_content=reasoning,
                step_count=tool_counts[invocation_id],
                model_calls=[
                    ModelCallRef(model_call_id=call.model_call_id, response_id=call.response_metadata.response_id)
                ],
            )
        )
        tool_counts[invocation_id] += tools
    if turns and resolved is not None:
        turns[-1] = turns[-1].model_copy(update={"resolved": resolved})
    if not recorded:
        gaps.append(ObservationGap(code="model_calls_unavailable"))
    if not turns:
        gaps.append(ObservationGap(code="turns_unavailable"))
    if not any(invocation.conversation for invocation in invocations):
        gaps.append(ObservationGap(code="conversation_unavailable"))
    unique = list({(gap.code, gap.invocation_id, gap.detail): gap for gap in gaps}.values())
    return TrajectoryRecord(
        task_id=task_id, rollout_id=rollout_id, invocations=invocations, turns=turns, model_calls=recorded, gaps=unique
    )
