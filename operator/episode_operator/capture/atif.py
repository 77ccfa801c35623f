"""ATIF trajectories (Harbor's Agent Trajectory Interchange Format, v1.7 as Gym writes it), built from captured calls.

The models mirror ``harbor/models/trajectories/`` (Harbor 0.25.0) with their validators. A turn's
trajectory is built from what the capture proxy recorded, never from files the agent can edit, and
without knowing the harness: the calls are read into one conversation shape (:mod:`.conversation`),
the main thread is the longest conversation any call answered, and each of its agent steps carries
the metrics of the call that produced it (tokens, and vLLM's token ids and logprobs when captured).
:func:`trajectory_to_responses` is Gym's ``HarborAgentUtils.trajectory_to_responses``
(``responses_api_agents/harbor_agent/utils.py``), which makes a row's ``response.output``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from episode_operator.capture.conversation import Entry, is_prefix, request_entries, response_entries
from episode_operator.capture.records import CapturedCall, cache_signal, mapping, token_stats

SchemaVersion = Literal[
    "ATIF-v1.0",
    "ATIF-v1.1",
    "ATIF-v1.2",
    "ATIF-v1.3",
    "ATIF-v1.4",
    "ATIF-v1.5",
    "ATIF-v1.6",
    "ATIF-v1.7",
]
SCHEMA_VERSION: SchemaVersion = "ATIF-v1.7"


class AtifModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageSource(AtifModel):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: str


class ContentPart(AtifModel):
    type: Literal["text", "image"]
    text: str | None = None
    source: ImageSource | None = None

    @model_validator(mode="after")
    def _fields_match_type(self) -> ContentPart:
        if (self.type == "text") != (self.text is not None) or (self.type == "image") != (self.source is not None):
            raise ValueError(f"a {self.type} content part needs {'text' if self.type == 'text' else 'source'} alone")
        return self


Content = str | list[ContentPart]


class Agent(AtifModel):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class ToolCall(AtifModel):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class SubagentTrajectoryRef(AtifModel):
    trajectory_id: str | None = None
    session_id: str | None = None
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resolvable(self) -> SubagentTrajectoryRef:
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent trajectory reference needs trajectory_id or trajectory_path")
        return self


class ObservationResult(AtifModel):
    source_call_id: str | None = None
    content: Content | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None
    extra: dict[str, Any] | None = None


class Observation(AtifModel):
    results: list[ObservationResult]


class Metrics(AtifModel):
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(AtifModel):
    total_prompt_tokens: int | None = Field(default=None, ge=0)
    total_completion_tokens: int | None = Field(default=None, ge=0)
    total_cached_tokens: int | None = Field(default=None, ge=0)
    total_cost_usd: float | None = None
    total_steps: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None


AGENT_ONLY_FIELDS = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


class Step(AtifModel):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: Content
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    is_copied_context: bool | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None

    @field_validator("timestamp")
    @classmethod
    def _iso_8601(cls, value: str | None) -> str | None:
        if value is not None:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        return value

    @model_validator(mode="after")
    def _agent_only_fields(self) -> Step:
        if self.source != "agent":
            present = [name for name in AGENT_ONLY_FIELDS if getattr(self, name) is not None]
            if present:
                raise ValueError(f"{', '.join(present)} apply to agent steps only, not {self.source}")
        if self.llm_call_count == 0 and (self.metrics is not None or self.reasoning_content is not None):
            raise ValueError("a step with llm_call_count 0 has no metrics or reasoning_content")
        return self


class Trajectory(AtifModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None
    subagent_trajectories: list[Trajectory] | None = None

    @model_validator(mode="after")
    def _steps_and_references(self) -> Trajectory:
        for index, step in enumerate(self.steps):
            if step.step_id != index + 1:
                raise ValueError(
                    f"steps[{index}].step_id: expected {index + 1} (sequential from 1), got {step.step_id}"
                )
            call_ids = {call.tool_call_id for call in step.tool_calls or []}
            for result in step.observation.results if step.observation else []:
                if result.source_call_id is not None and result.source_call_id not in call_ids:
                    raise ValueError(
                        f"step {step.step_id} observes tool call {result.source_call_id!r}, which it did not make"
                    )
        return self

    def to_json_dict(self) -> dict[str, Any]:
        """As Harbor writes ``trajectory.json``: unset fields left out."""
        return self.model_dump(mode="json", exclude_none=True)


# --- calls → trajectory ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answered:
    """A call that got an answer, read into conversation entries."""

    call: CapturedCall
    request: list[Entry]
    answer: Entry

    @property
    def conversation(self) -> list[Entry]:
        return [*self.request, self.answer]


def answered(calls: Sequence[CapturedCall]) -> list[Answered]:
    result = []
    for call in sorted(calls, key=lambda call: call.started_at):
        if call.dialect is None or call.request is None or call.response is None or call.error_category is not None:
            continue
        answer = response_entries(call.dialect, call.response)
        if answer:
            result.append(Answered(call, request_entries(call.dialect, call.request), answer[0]))
    return result


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def step_metrics(call: CapturedCall) -> Metrics:
    usage = (call.response or {}).get("usage")
    tokens = token_stats(usage)
    _, cached = cache_signal(usage)
    extra: dict[str, Any] = {"model_call_id": call.model_call_id}
    if tokens["tokens_reasoning"] is not None:
        extra["reasoning_tokens"] = tokens["tokens_reasoning"]
    return Metrics(
        prompt_tokens=tokens["tokens_in"],
        completion_tokens=tokens["tokens_out"],
        cached_tokens=cached,
        prompt_token_ids=call.prompt_token_ids,
        completion_token_ids=call.generation_token_ids,
        logprobs=call.generation_log_probs,
        extra=extra,
    )


def trajectory_from_calls(
    calls: Sequence[CapturedCall],
    *,
    agent_name: str,
    agent_version: str,
    session_id: str | None = None,
    earlier_calls: Sequence[CapturedCall] = (),
) -> Trajectory | None:
    """The ATIF trajectory of one agent session's calls, or None when no call was answered.

    ``earlier_calls`` are the same session's calls from earlier turns (a ``continue`` session): the
    steps they account for are kept, marked ``is_copied_context``, so the trajectory reads whole
    while its new steps stand apart. Calls off the main thread (a harness's title request, a retried
    sample the conversation did not keep) leave no step; ``extra.model_call_ids`` lists those that did.
    """
    everything = answered([*earlier_calls, *calls])
    earlier = {call.model_call_id for call in earlier_calls}
    if not any(item.call.model_call_id not in earlier for item in everything):
        return None
    final = max(everything, key=lambda item: (len(item.conversation), item.call.completed_at))
    conversation = final.conversation
    producers: dict[int, Answered] = {}
    for item in everything:
        if is_prefix(item.conversation, conversation):
            producers[len(item.request)] = item  # later calls win: a retried sample that was kept
    copied_until = max(
        (len(item.conversation) for item in producers.values() if item.call.model_call_id in earlier), default=0
    )
    first_seen: dict[int, float] = {}
    for item in sorted(producers.values(), key=lambda item: item.call.started_at):
        for position in range(len(item.request)):
            first_seen.setdefault(position, item.call.started_at)

    steps: list[Step] = []
    for position, entry in enumerate(conversation):
        copied = True if position < copied_until else None
        producer = producers.get(position)
        if entry.kind == "tool":
            owner = next((step for step in reversed(steps) if step.source == "agent"), None)
            if owner is None:
                owner = Step(step_id=len(steps) + 1, source="system", message="", is_copied_context=copied)
                steps.append(owner)
            call_ids = {call.tool_call_id for call in owner.tool_calls or []}
            result = ObservationResult(
                source_call_id=entry.call_id if entry.call_id in call_ids else None, content=entry.text
            )
            owner.observation = Observation(results=[*(owner.observation.results if owner.observation else []), result])
            continue
        timestamp = first_seen.get(position, final.call.started_at)
        if entry.kind != "assistant":
            steps.append(
                Step(
                    step_id=len(steps) + 1,
                    timestamp=iso(timestamp),
                    source=entry.kind,
                    message=entry.text,
                    is_copied_context=copied,
                )
            )
            continue
        answer = producer.answer if producer is not None else entry
        call = producer.call if producer is not None else None
        steps.append(
            Step(
                step_id=len(steps) + 1,
                timestamp=iso(call.completed_at if call else timestamp),
                source="agent",
                model_name=_model(call) if call else None,
                message=answer.text,
                reasoning_content=answer.reasoning,
                tool_calls=[
                    ToolCall(tool_call_id=c.call_id, function_name=c.name, arguments=c.arguments)
                    for c in answer.tool_calls
                ]
                or None,
                metrics=step_metrics(call) if call else None,
                is_copied_context=copied,
            )
        )
    on_thread = [item.call.model_call_id for _, item in sorted(producers.items())]
    off_thread = [item.call.model_call_id for item in everything if item.call.model_call_id not in set(on_thread)]
    return Trajectory(
        session_id=session_id,
        agent=Agent(name=agent_name, version=agent_version, model_name=_model(final.call)),
        steps=steps,
        final_metrics=final_metrics(steps),
        notes=(
            f"{len(off_thread)} answered model call(s) off the main thread: {', '.join(off_thread)}"
            if off_thread
            else None
        ),
        extra={"source": "episode-operator capture", "model_call_ids": on_thread},
    )


def _model(call: CapturedCall) -> str | None:
    model = (call.response or {}).get("model") or (call.request or {}).get("model")
    return model if isinstance(model, str) else None


def final_metrics(steps: Sequence[Step]) -> FinalMetrics:
    def total(field: str) -> int | None:
        values = [
            getattr(step.metrics, field) for step in steps if step.metrics and getattr(step.metrics, field) is not None
        ]
        return sum(values) if values else None

    return FinalMetrics(
        total_prompt_tokens=total("prompt_tokens"),
        total_completion_tokens=total("completion_tokens"),
        total_cached_tokens=total("cached_tokens"),
        total_steps=len(steps),
    )


def without_copied_context(trajectory: Trajectory) -> Trajectory:
    """The steps of this activation alone (what a ``continue`` turn's row reports as its ``response``)."""
    steps = [step for step in trajectory.steps if not step.is_copied_context]
    if len(steps) == len(trajectory.steps) or not steps:
        return trajectory
    renumbered = [step.model_copy(update={"step_id": index + 1}) for index, step in enumerate(steps)]
    return trajectory.model_copy(update={"steps": renumbered, "final_metrics": final_metrics(renumbered)})


# --- trajectory → Responses output items (Gym's HarborAgentUtils) ------------------------------------
def _think(reasoning: str | None, message: str) -> str:
    # The model's native order: <think>reasoning</think> then the message (matters for token alignment).
    return f"<think>{reasoning}</think>{message}" if reasoning else message


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a text (Gym's ``_extract_json_object``)."""
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            return parsed
    except (ValueError, TypeError):
        pass
    if not text or "{" not in text:
        return None
    depth, start, in_string, escaped = 0, -1, False, False
    for index, character in enumerate(text):
        if escaped:
            escaped = False
            continue
        if character == "\\" and in_string:
            escaped = True
            continue
        if character == '"':
            in_string = not in_string
            continue
        if in_string:
            continue
        if character == "{":
            start = index if depth == 0 else start
            depth += 1
        elif character == "}":
            depth -= 1
            if depth == 0 and start >= 0:
                try:
                    parsed = json.loads(text[start : index + 1])
                    if isinstance(parsed, dict):
                        return parsed
                except ValueError:
                    pass
                start = -1
    return None


def _raw_content_tool_calls(message: str, agent_step_index: int) -> list[dict[str, Any]]:
    """Terminus-2's ``raw_content`` mode: the ``commands`` of a JSON answer as ``bash_command`` calls."""
    parsed = _json_object(message)
    if parsed is None:
        return []
    calls = []
    commands = parsed.get("commands", [])
    for index, command in enumerate(commands if isinstance(commands, list) else []):
        if not isinstance(command, dict) or not isinstance(command.get("keystrokes"), str) or not command["keystrokes"]:
            continue
        try:
            duration = float(command.get("duration", 1.0))
        except (TypeError, ValueError):
            duration = 1.0
        calls.append(
            {
                "tool_call_id": f"call_{agent_step_index}_{index + 1}",
                "function_name": "bash_command",
                "arguments": {"keystrokes": command["keystrokes"], "duration": duration},
            }
        )
    return calls


def _hex(length: int) -> str:
    return uuid.uuid4().hex[:length]


def trajectory_to_responses(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """Gym's ``trajectory_to_responses``: per agent step an assistant message (the training variant when it
    has token ids or logprobs), its function calls and its observations as function call outputs."""
    items: list[dict[str, Any]] = []
    agent_step_index = 0
    for step in trajectory.get("steps", []):
        if step.get("source") != "agent":
            continue
        text = _think(step.get("reasoning_content"), step.get("message", "") or "")
        message: dict[str, Any] = {
            "id": f"cht_{_hex(12)}",
            "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "phase": None,
        }
        metrics = step.get("metrics") or {}
        extra = mapping(metrics.get("extra"))
        routed_experts = metrics.get("routed_experts")
        if routed_experts is None:
            routed_experts = extra.get("routed_experts")
        if metrics.get("prompt_token_ids") or metrics.get("completion_token_ids") or metrics.get("logprobs"):
            message |= {
                "prompt_token_ids": metrics.get("prompt_token_ids") or [],
                "generation_token_ids": metrics.get("completion_token_ids") or [],
                "generation_log_probs": metrics.get("logprobs") or [],
                "routed_experts": routed_experts,
            }
        items.append(message)
        tool_calls = step.get("tool_calls") or _raw_content_tool_calls(step.get("message", "") or "", agent_step_index)
        for call in tool_calls:
            arguments = call.get("arguments", {})
            items.append(
                {
                    "arguments": json.dumps(arguments) if isinstance(arguments, dict) else str(arguments),
                    "call_id": call.get("tool_call_id", f"call_{_hex(8)}"),
                    "name": call.get("function_name", "unknown"),
                    "type": "function_call",
                    "id": f"fc_{_hex(8)}",
                    "status": "completed",
                    "namespace": None,
                }
            )
        for index, result in enumerate((step.get("observation") or {}).get("results", [])):
            call_id = (
                tool_calls[index].get("tool_call_id", f"call_{_hex(8)}")
                if index < len(tool_calls)
                else f"call_{_hex(8)}"
            )
            items.append(
                {
                    "call_id": call_id,
                    "output": result.get("content", ""),
                    "type": "function_call_output",
                    "id": f"fco_{_hex(8)}",
                    "status": "completed",
                }
            )
        agent_step_index += 1
    return items
