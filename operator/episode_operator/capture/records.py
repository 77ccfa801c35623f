"""What the capture records for one model call, and NeMo Gym's ``ng_model_call_capture`` derived from it.

:class:`CapturedCall` is one stored exchange: the fields of the exchange Gym's capture middleware
writes (``model_call_id, dialect, started_at, completed_at, latency_ms, latency_ttft_ms, status_code,
error_category, request, response, client_session_id, request_raw, response_raw`` and the execution
outcome), plus ours: which attempt and turn it belongs to, and vLLM's token ids when asked for.
:class:`ModelCallRecord` and :func:`model_call_capture` mirror Gym's ``ModelCallRecord``,
``build_model_call_record`` and ``aggregate_model_call_records`` field for field (read in
``nemo_gym/base_responses_api_model.py``); the tests check them against Gym's own code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from episode_operator.capture.wire import Dialect

# Gym's ``error_category`` values: from the HTTP status, from an exception, from how a stream ended,
# or from a body the capture could not read. ``cancelled``: the client went away mid-call.
ErrorCategory = Literal[
    "timeout",
    "rate_limit",
    "auth",
    "not_found",
    "client_error",
    "upstream_error",
    "connection",
    "cancelled",
    "exception",
    "incomplete",
    "stream_truncated",
    "capture_parse_error",
]
STATUS_CATEGORIES: tuple[tuple[frozenset[int], ErrorCategory], ...] = (
    (frozenset({408, 504}), "timeout"),
    (frozenset({429}), "rate_limit"),
    (frozenset({401, 403}), "auth"),
    (frozenset({404}), "not_found"),
)
# Why the proxy answered a call itself instead of forwarding it (``local_response_reason``), where the
# operator reads it: a request that is no route of the model API (capture/wire.py ROUTES), and a call
# past the attempt's journal bound (the turn then fails: ``agent:capture_limit``).
ROUTE_REFUSED: Final = "route_not_allowed"
CAPTURE_LIMIT: Final = "capture_limit"

# How a stream that the proxy saw end (or not) is categorised when its status was a success.
STREAM_END_CATEGORIES: dict[str | None, ErrorCategory | None] = {
    "complete": None,
    "error": "upstream_error",
    "incomplete": "incomplete",
    None: "stream_truncated",
}


def classify_status(status: int) -> ErrorCategory | None:
    """Gym's ``_classify_status``: None below 400."""
    if status < 400:
        return None
    category = next((category for codes, category in STATUS_CATEGORIES if status in codes), None)
    return category or ("client_error" if status < 500 else "upstream_error")


class CapturedCall(BaseModel):
    """One model call as the proxy stored it (one JSON line)."""

    model_config = ConfigDict(extra="ignore")

    model_call_id: str
    dialect: Dialect | None = Field(
        default=None, description="None: a request that is no model call (``GET /v1/models``)."
    )
    method: str = "POST"
    path: str = ""
    started_at: float = Field(description="Unix time the request arrived.")
    completed_at: float
    latency_ms: float
    latency_ttft_ms: float | None = Field(default=None, description="First body byte from upstream, after arrival.")
    status_code: int | None = Field(default=None, description="The status the client got; None: no answer at all.")
    error_category: ErrorCategory | None = None
    streaming: bool = False
    request: dict[str, Any] | None = Field(default=None, description="The JSON body sent upstream.")
    response: dict[str, Any] | None = Field(default=None, description="The JSON answer (a stream reassembled).")
    request_raw: str | None = Field(default=None, description="A request body that is not a JSON object.")
    response_raw: str | None = Field(default=None, description="A streamed body, or one that is not a JSON object.")
    client_session_id: str | None = None
    # Gym's execution outcome (``ModelExecutionOutcome``): whether upstream answered, else why the proxy did.
    upstream_attempted: bool = True
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    # The proxy's per-call bound (ours): a body past it is forwarded whole but kept as its first bytes
    # in ``request_raw``/``response_raw`` (not parsed: a cut JSON document is none).
    truncated: dict[Literal["request", "response"], int] | None = Field(
        default=None, description="Bodies recorded only in part → their whole size in bytes."
    )
    # Attribution: set by the operator through a file only the capture container sees.
    attempt: int | None = None
    turn: str | None = Field(default=None, description="None: no turn was current when the call arrived.")
    # vLLM token transport (``capture.tokenIds``), as Gym's training records carry it.
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None
    # On-policy correction (capture/correction.py): the calls whose token ids the request sent upstream
    # carried on its history. Recorded by reference: those ids are in these calls' records, and a request
    # carrying all of them grows with the square of the conversation.
    carried_token_ids: list[str] | None = Field(
        default=None, description="model_call_ids of the earlier answers whose token ids went upstream with it."
    )

    @property
    def attributed(self) -> bool:
        return self.turn is not None


# --- token usage (Gym's extract_token_stats and _cache_signal) -------------------------------------
def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _detail(usage: Mapping[str, Any], groups: Sequence[str], fields: Sequence[str]) -> int | None:
    for group in groups:
        details = usage.get(group)
        if isinstance(details, Mapping):
            for field in fields:
                if (value := _count(details.get(field))) is not None:
                    return value
    return None


def token_stats(usage: Any) -> dict[str, int | None]:
    """Prompt, completion, reasoning and total tokens across the three dialects' usage shapes.

    Anthropic's ``input_tokens`` excludes cached tokens, so cache reads and writes are folded into
    ``tokens_in`` (the prompt's size); OpenAI's already include them.
    """
    if not isinstance(usage, Mapping):
        return dict.fromkeys(("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cache_creation_tokens"))
    tokens_in = _count(usage.get("input_tokens"))
    if tokens_in is None:
        tokens_in = _count(usage.get("prompt_tokens"))
    tokens_out = _count(usage.get("output_tokens"))
    if tokens_out is None:
        tokens_out = _count(usage.get("completion_tokens"))
    cache_read = _count(usage.get("cache_read_input_tokens"))
    cache_creation = _count(usage.get("cache_creation_input_tokens"))
    if cache_read is not None or cache_creation is not None:
        cached = (cache_read or 0) + (cache_creation or 0)
        if tokens_in is not None or cached > 0:
            tokens_in = (tokens_in or 0) + cached
    tokens_total = _count(usage.get("total_tokens"))
    if tokens_total is None and tokens_in is not None and tokens_out is not None:
        tokens_total = tokens_in + tokens_out
    tokens_reasoning = _detail(usage, ("output_tokens_details", "completion_tokens_details"), ("reasoning_tokens",))
    if tokens_reasoning is None:
        tokens_reasoning = _count(usage.get("reasoning_output_tokens"))
    return {
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_reasoning": tokens_reasoning,
        "tokens_total": tokens_total,
        "cache_creation_tokens": cache_creation,
    }


def cache_signal(usage: Any) -> tuple[bool | None, int | None]:
    """Whether the prompt hit a cache, and the cached tokens."""
    if not isinstance(usage, Mapping):
        return None, None
    cached = _detail(usage, ("prompt_tokens_details", "input_tokens_details"), ("cached_tokens", "cached_input_tokens"))
    if cached is None:
        cached = _count(usage.get("cache_read_input_tokens"))
    if cached is None:
        cached = _count(usage.get("cached_input_tokens"))
    if cached is None:
        return None, None
    return cached > 0, cached


def mapping(value: Any) -> dict[str, Any]:
    """A JSON object, or an empty one in place of anything else."""
    return value if isinstance(value, dict) else {}


def first_choice(response: Mapping[str, Any]) -> dict[str, Any]:
    choices = response.get("choices")
    return mapping(choices[0]) if isinstance(choices, list) and choices else {}


# --- tool calls and reasoning (Gym's _tool_calls_and_reasoning) ------------------------------------
def json_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments as an object: a JSON string parsed, anything unreadable kept under ``_raw``."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {"_raw": arguments}
        return parsed if isinstance(parsed, dict) else {"_raw": arguments}
    return {}


def tool_calls_and_reasoning(response: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """The tool calls (``call_id, name, arguments``) and reasoning text of a response in any dialect."""
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    output, choices, content = response.get("output"), response.get("choices"), response.get("content")
    if isinstance(output, list):  # Responses
        for item in (item for item in output if isinstance(item, dict)):
            if item.get("type") == "function_call":
                call_id = item.get("call_id") or item.get("id")
                calls.append(
                    {"call_id": call_id, "name": item.get("name"), "arguments": json_arguments(item.get("arguments"))}
                )
            elif item.get("type") == "reasoning":
                texts = (part.get("text") for part in item.get("summary") or [] if isinstance(part, dict))
                reasoning.extend(text for text in texts if isinstance(text, str) and text)
    elif isinstance(choices, list):  # Chat Completions
        for choice in (choice for choice in choices if isinstance(choice, dict)):
            message = choice.get("message")
            if not isinstance(message, Mapping):
                continue
            for call in (call for call in message.get("tool_calls") or [] if isinstance(call, dict)):
                function = mapping(call.get("function"))
                calls.append(
                    {
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": json_arguments(function.get("arguments")),
                    }
                )
            text = message.get("reasoning_content") or message.get("reasoning")
            if isinstance(text, str) and text:
                reasoning.append(text)
    elif isinstance(content, list):  # Anthropic Messages
        for block in (block for block in content if isinstance(block, dict)):
            if block.get("type") == "tool_use":
                calls.append(
                    {"call_id": block.get("id"), "name": block.get("name"), "arguments": block.get("input") or {}}
                )
            elif block.get("type") in ("thinking", "redacted_thinking") and isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
    return calls, "\n".join(reasoning) or None


# --- vLLM token ids --------------------------------------------------------------------------------
#: Gym's token fields (``REQUIRED_TOKEN_METADATA_FIELDS``), named alike on an answer and on a later request.
TOKEN_FIELDS: Final = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
RAW_TOKENS = "raw_message_tokens"  # vLLM's Responses ``input_messages``/``output_messages`` entry type


class TokenIds(NamedTuple):
    """One call's token ids and log-probabilities, in Gym's names; a piece the answer lacks is None."""

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None

    @property
    def complete(self) -> bool:
        """All three, one log-probability per generated token: what Gym takes as a token bundle
        (``_validate_atomic_token_metadata``, ``_validate_token_bundle``)."""
        return (
            self.prompt_token_ids is not None
            and self.generation_token_ids is not None
            and self.generation_log_probs is not None
            and len(self.generation_token_ids) == len(self.generation_log_probs)
        )


def gym_bundle(holder: Mapping[str, Any]) -> TokenIds | None:
    """Gym's bundle where a Gym-style server puts it (an assistant message, a Responses output item);
    None when ``holder`` carries no generation."""
    if holder.get("generation_token_ids") is None:
        return None
    return TokenIds(
        _ints(holder.get("prompt_token_ids")),
        _ints(holder["generation_token_ids"]),
        _floats(holder.get("generation_log_probs")),
    )


def logprob_entries(entries: Any) -> tuple[list[float] | None, list[int] | None]:
    """vLLM's per-token logprob entries (``{token, logprob}``): their log-probabilities, and the token ids
    when every token is spelled ``token_id:<n>`` (``return_tokens_as_token_ids``)."""
    if not isinstance(entries, list):
        return None, None
    entries = [entry for entry in entries if isinstance(entry, dict)]
    log_probs = [float(entry["logprob"]) for entry in entries if _is_number(entry.get("logprob"))]
    tokens = [str(entry.get("token")) for entry in entries]
    spelled = None
    if tokens and all(token.startswith("token_id:") and token[9:].isdigit() for token in tokens):
        spelled = [int(token.removeprefix("token_id:")) for token in tokens]
    return log_probs or None, spelled


def chat_token_ids(response: Mapping[str, Any]) -> TokenIds:
    """A chat completion's token ids, from the sources Gym's vllm_model reads, in its order: a bundle on
    the message; the prompt's ids at the top (``return_token_ids``) with the generation's on the choice;
    the generation's from the choice's logprobs, whose tokens read ``token_id:<n>``."""
    choice = first_choice(response)
    if (bundle := gym_bundle(mapping(choice.get("message")))) is not None:
        return bundle
    prompt = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
    log_probs, spelled = logprob_entries(mapping(choice.get("logprobs")).get("content"))
    generation = choice.get("token_ids") if choice.get("token_ids") is not None else spelled
    return TokenIds(_ints(prompt), _ints(generation), log_probs)


def responses_token_ids(response: Mapping[str, Any]) -> TokenIds:
    """A Responses answer's token ids: Gym's bundle on its output items (Gym's vllm_model puts it on the
    last one); else vLLM's Responses transport, which has no ``return_token_ids``: the raw token messages
    of ``enable_response_messages`` (``input_messages``: the prompt; ``output_messages``: the generation)
    and the chosen tokens' logprobs on the output text (``include: message.output_text.logprobs``)."""
    items = [item for item in response.get("output") or [] if isinstance(item, dict)]
    bundles = [bundle for item in items if (bundle := gym_bundle(item)) is not None]
    if bundles:
        return bundles[-1]
    texts = [part for item in items for part in item.get("content") or [] if isinstance(part, dict)]
    entries = [entry for part in texts if part.get("type") == "output_text" for entry in part.get("logprobs") or []]
    log_probs, spelled = logprob_entries(entries)
    prompts, generated = _raw_tokens(response.get("input_messages")), _raw_tokens(response.get("output_messages"))
    generation = [token for tokens in generated for token in tokens] if generated else spelled
    return TokenIds(prompts[0] if prompts else None, _ints(generation), log_probs)


def messages_token_ids(response: Mapping[str, Any]) -> TokenIds:
    """An Anthropic message's token ids: Gym's fields on the message itself (it is the assistant message).
    Neither vLLM's Messages endpoint nor Gym's serves them; an upstream that does is read here."""
    return gym_bundle(response) or TokenIds()


#: Where each API's answer carries its token ids (records.CapturedCall keeps them in Gym's names).
TOKEN_ID_READERS: dict[Dialect, Callable[[Mapping[str, Any]], TokenIds]] = {
    "chat": chat_token_ids,
    "responses": responses_token_ids,
    "messages": messages_token_ids,
}


def _raw_tokens(messages: Any) -> list[list[int]]:
    """The token lists of vLLM's raw token messages (``{type: raw_message_tokens, message, tokens}``)."""
    raw = [entry for entry in messages if isinstance(entry, dict)] if isinstance(messages, list) else []
    return [tokens for entry in raw if entry.get("type") == RAW_TOKENS and (tokens := _ints(entry.get("tokens")))]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(item) is int for item in value):
        return value
    return None


def _floats(value: Any) -> list[float] | None:
    if isinstance(value, list) and all(_is_number(item) for item in value):
        return [float(item) for item in value]
    return None


# --- Gym's ModelCallRecord and the ng_model_call_capture block --------------------------------------
class ModelServerRef(BaseModel):
    type: Literal["responses_api_models"] = "responses_api_models"
    name: str


class CallOutcome(BaseModel):
    """How a call went, as Gym's ``ModelCallRecord`` and ``TrajectoryResponseMetadata`` both say it."""

    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None


class ModelCallRecord(CallOutcome):
    """Gym's ``ModelCallRecord``: one call as ``ng_model_call_capture.calls[]`` lists it."""

    model_call_id: str | None = None
    client_session_id: str | None = None
    call_index: int
    started_at: float | None = None
    completed_at: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    request_raw: str | None = None
    response_raw: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    reasoning_content: str | None = None
    cache_hit: bool | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    error_category: str | None = None
    latency_total_ms: float | None = None
    latency_ttft_ms: float | None = None
    # Ours (Gym's model ignores unknown keys): which turn the call belongs to.
    turn: str | None = None


PAYLOAD_FIELDS = frozenset({"request", "response", "request_raw", "response_raw"})


def model_call_record(call: CapturedCall, *, call_index: int) -> ModelCallRecord:
    """Gym's ``build_model_call_record`` applied to one captured call."""
    response = call.response or {}
    request = call.request or {}
    usage = response.get("usage")
    tool_calls, reasoning = tool_calls_and_reasoning(response)
    cache_hit, cached_tokens = cache_signal(usage)
    reasons = (
        response.get("stop_reason"),
        first_choice(response).get("finish_reason"),
        mapping(response.get("incomplete_details")).get("reason"),
    )
    finish_reason = next((reason for reason in reasons if isinstance(reason, str)), None)
    model = response.get("model") or request.get("model")
    return ModelCallRecord(
        model_call_id=call.model_call_id,
        response_id=response.get("id") if isinstance(response.get("id"), str) else None,
        client_session_id=call.client_session_id,
        call_index=call_index,
        model=model if isinstance(model, str) else None,
        dialect=call.dialect,
        status_code=call.status_code,
        response_status=response.get("status") if isinstance(response.get("status"), str) else None,
        finish_reason=finish_reason,
        upstream_attempted=call.upstream_attempted,
        response_source=call.response_source,
        upstream_status_code=call.upstream_status_code,
        local_response_reason=call.local_response_reason,
        started_at=call.started_at,
        completed_at=call.completed_at,
        request=call.request,
        response=call.response,
        request_raw=call.request_raw,
        response_raw=call.response_raw,
        tool_calls=tool_calls,
        reasoning_content=reasoning,
        cache_hit=cache_hit,
        cached_tokens=cached_tokens,
        error_category=call.error_category,
        latency_total_ms=call.latency_ms,
        latency_ttft_ms=call.latency_ttft_ms,
        turn=call.turn,
        **token_stats(usage),
    )


class CaptureMetrics(BaseModel):
    """Gym's ``aggregate_model_call_records``: sums over the calls that report each value (None: none do)."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    cached_tokens: int | None = None
    latency_total_ms: float | None = None
    num_calls: int = 0


def aggregate(records: Sequence[ModelCallRecord]) -> CaptureMetrics:
    sums: dict[str, Any] = {}
    for field in ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "latency_total_ms"):
        values = [getattr(record, field) for record in records if getattr(record, field) is not None]
        sums[field] = sum(values) if values else None
    return CaptureMetrics(num_calls=len(records), **sums)


class ObservationGap(BaseModel):
    """Gym's ``ObservationGap``: a fact the capture could not observe or join."""

    model_config = ConfigDict(extra="forbid")

    code: str
    invocation_id: str | None = None
    detail: str | None = None


class ModelCallCapture(BaseModel):
    """Gym's ``ng_model_call_capture``: ``{rollout_id, metrics, calls[, gaps]}``."""

    rollout_id: str
    metrics: CaptureMetrics
    calls: list[ModelCallRecord]
    gaps: list[ObservationGap] | None = None

    def row(self, *, payloads: bool = False) -> dict[str, Any]:
        """The block as a row carries it: like Gym's collector, without the request and response payloads
        unless asked (the row's ``ng_trajectory`` owns them)."""
        block = self.model_dump(mode="json", exclude={"calls", "gaps"})
        exclude = None if payloads else set(PAYLOAD_FIELDS)
        block["calls"] = [call.model_dump(mode="json", exclude=exclude) for call in self.calls]
        if self.gaps is not None:
            block["gaps"] = [gap.model_dump(mode="json", exclude_none=True) for gap in self.gaps]
        return block


def model_calls(calls: Iterable[CapturedCall]) -> list[CapturedCall]:
    """The model calls among captured requests (a ``GET /v1/models`` is kept in the store, not here)."""
    return [call for call in calls if call.dialect is not None]


def model_call_capture(rollout_id: str, calls: Iterable[CapturedCall]) -> ModelCallCapture:
    """The ``ng_model_call_capture`` block of a rollout's calls, in the order they were stored."""
    records = [model_call_record(call, call_index=index) for index, call in enumerate(model_calls(calls))]
    gaps = [ObservationGap(code="model_call_capture_no_records")] if not records else None
    return ModelCallCapture(rollout_id=rollout_id, metrics=aggregate(records), calls=records, gaps=gaps)


def unattributed_gap(calls: Iterable[CapturedCall]) -> ObservationGap | None:
    """A gap naming the model calls that arrived while no turn was current (kept, never assigned to one)."""
    stray = [call.model_call_id for call in model_calls(calls) if not call.attributed]
    if not stray:
        return None
    return ObservationGap(code="model_call_outside_turn", detail=f"count={len(stray)}:{','.join(stray)}")


# --- a turn's journal (the store's file, as the operator reads a copy of it) ----------------------------
class Begun(BaseModel):
    """A journal line: this call arrived (its record follows when it ends)."""

    begun: str


@dataclass(frozen=True)
class Journal:
    calls: list[CapturedCall]
    in_flight: set[str]
    unreadable: int


def parse_journal(data: bytes) -> Journal:
    """A turn's journal file, as :func:`read_journal` reads it (the operator reads a copy it downloaded)."""
    calls: list[CapturedCall] = []
    begun: set[str] = set()
    unreadable = 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            if line.startswith(b'{"begun"'):
                begun.add(Begun.model_validate_json(line).begun)
            else:
                calls.append(CapturedCall.model_validate_json(line))
        except ValidationError:
            unreadable += 1
    return Journal(calls, begun - {call.model_call_id for call in calls}, unreadable)
