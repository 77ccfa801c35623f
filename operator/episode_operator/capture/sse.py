"""Server-sent events: finding a stream's end as it passes, and rebuilding the complete answer afterwards.

The rebuilding follows NeMo Gym's capture (``_reconstruct_*_sse`` in ``base_responses_api_model.py``)
so that a streamed call is recorded as the same response object a non-streamed one would be; it adds
what Gym gets elsewhere: token ids and logprobs carried by a chat completion's chunks (vLLM's), and Gym's
token fields on a message's start and end events. A Responses stream needs nothing more: its terminal
event carries the whole response, token ids included.
"""

from __future__ import annotations

import json
import re
from typing import Any

from episode_operator.capture.records import TOKEN_FIELDS
from episode_operator.capture.wire import TERMINAL_EVENTS, Dialect, SseEnd

EVENT_SEPARATOR = re.compile(rb"\r?\n\r?\n")


class SseScanner:
    """Watches a stream chunk by chunk for the event that ends it (without holding any chunk back)."""

    def __init__(self, dialect: Dialect) -> None:
        self._terminal = TERMINAL_EVENTS[dialect]
        self._chat = dialect == "chat"
        self._pending = b""
        self.end: SseEnd | None = None

    def feed(self, chunk: bytes) -> SseEnd | None:
        """The end this chunk completes, if any (once found, later chunks are not scanned)."""
        if self.end is not None:
            return None
        blocks = EVENT_SEPARATOR.split(self._pending + chunk)
        self._pending = blocks.pop()
        for block in blocks:
            end = self._block_end(block)
            if end is not None:
                self.end = end
                return end
        return None

    def _block_end(self, block: bytes) -> SseEnd | None:
        for line in block.splitlines():
            field, colon, value = line.decode("utf-8", "replace").partition(":")
            normalized = f"{field}:{value.strip()}" if colon else field
            if normalized in self._terminal:
                return self._terminal[normalized]
            # A chat stream reports a mid-stream failure as a data chunk carrying ``error``.
            if self._chat and field == "data" and '"error"' in value:
                try:
                    payload = json.loads(value)
                except ValueError:
                    continue
                if isinstance(payload, dict) and payload.get("error") is not None:
                    return "error"
        return None


def parse_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON ``data:`` payloads of an SSE body, in order (``[DONE]`` and non-JSON payloads skipped)."""
    events: list[dict[str, Any]] = []
    for block in EVENT_SEPARATOR.split(raw):
        lines = block.decode("utf-8", "replace").splitlines()
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        try:
            parsed = json.loads(data)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            events.append(parsed)
    return events


def reassemble(raw: bytes, dialect: Dialect) -> dict[str, Any] | None:
    """The complete response a streamed body amounts to, or None when it holds no usable event."""
    events = parse_events(raw)
    if not events:
        return None
    return REASSEMBLERS[dialect](events)


def _messages(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    tool_json: dict[int, str] = {}
    # Gym's token fields, where an upstream that serves them on Messages sends them: like the usage, the
    # prompt's on the message's start, the generation's on its last delta.
    tokens: dict[str, Any] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            start = event.get("message") or {}
            message = {key: start[key] for key in ("id", "type", "role", "model", "stop_reason") if start.get(key)}
            usage.update(start.get("usage") or {})
            tokens.update((field, start[field]) for field in TOKEN_FIELDS if field in start)
        elif kind == "content_block_start":
            blocks[event.get("index", len(blocks))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = event.get("index", 0)
            block = blocks.setdefault(index, {})
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["type"] = block.get("type") or "text"
                block["text"] = (block.get("text") or "") + (delta.get("text") or "")
            elif delta.get("type") == "thinking_delta":
                block["type"] = block.get("type") or "thinking"
                block["thinking"] = (block.get("thinking") or "") + (delta.get("thinking") or "")
            elif delta.get("type") == "signature_delta":
                block["signature"] = (block.get("signature") or "") + (delta.get("signature") or "")
            elif delta.get("type") == "input_json_delta":
                tool_json[index] = tool_json.get(index, "") + (delta.get("partial_json") or "")
        elif kind == "message_delta":
            usage.update(event.get("usage") or {})
            tokens.update((field, event[field]) for field in TOKEN_FIELDS if field in event)
            stop = (event.get("delta") or {}).get("stop_reason")
            if message is not None and stop:
                message["stop_reason"] = stop
    if message is None and not blocks:
        return None
    content = []
    for index in sorted(blocks):
        block = blocks[index]
        if block.get("type") == "tool_use" and index in tool_json and not block.get("input"):
            try:
                block["input"] = json.loads(tool_json[index]) if tool_json[index] else {}
            except ValueError:
                block["input"] = {"_raw": tool_json[index]}
        content.append(block)
    result: dict[str, Any] = {**(message or {}), "type": "message", "content": content, **tokens}
    if usage:
        result["usage"] = usage
    return result


def _chat(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    content: list[str] = []
    reasoning: list[str] = []
    refusal: list[str] = []
    tool_calls: dict[int, dict[str, Any]] = {}
    logprobs: list[Any] = []
    token_ids: list[int] = []
    result: dict[str, Any] = {"object": "chat.completion", "model": None}
    role = "assistant"
    finish_reason = None
    saw_choice = False
    for chunk in events:
        result["model"] = chunk.get("model") or result["model"]
        for key in ("id", "created", "system_fingerprint"):
            if chunk.get(key) is not None:
                result[key] = chunk[key]
        if chunk.get("usage"):
            result["usage"] = chunk["usage"]
        if chunk.get("prompt_token_ids") is not None:  # vLLM's return_token_ids, first chunk
            result["prompt_token_ids"] = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            saw_choice = True
            delta = choice.get("delta") or {}
            role = delta.get("role") or role
            if delta.get("content"):
                content.append(delta["content"])
            if delta.get("refusal"):
                refusal.append(delta["refusal"])
            if delta.get("reasoning_content") or delta.get("reasoning"):
                reasoning.append(delta.get("reasoning_content") or delta["reasoning"])
            for call in delta.get("tool_calls") or []:
                slot = tool_calls.setdefault(
                    call.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] = function.get("name") or slot["function"]["name"]
                slot["function"]["arguments"] += function.get("arguments") or ""
            logprobs.extend((choice.get("logprobs") or {}).get("content") or [])
            token_ids.extend(choice.get("token_ids") or [])
            finish_reason = choice.get("finish_reason") or finish_reason
    if not saw_choice:
        return None
    message: dict[str, Any] = {"role": role, "content": "".join(content) or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if refusal:
        message["refusal"] = "".join(refusal)
    if tool_calls:
        message["tool_calls"] = [tool_calls[index] for index in sorted(tool_calls)]
    choice_out: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason}
    if logprobs:
        choice_out["logprobs"] = {"content": logprobs}
    if token_ids:
        choice_out["token_ids"] = token_ids
    result["choices"] = [choice_out]
    return result


RESPONSES_ENDS = ("response.completed", "response.incomplete", "response.failed")


def _responses(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    # The terminal event carries the whole response object; else the latest one seen.
    for event in reversed(events):
        if event.get("type") in RESPONSES_ENDS and isinstance(event.get("response"), dict):
            return dict(event["response"])
    return next(
        (dict(event["response"]) for event in reversed(events) if isinstance(event.get("response"), dict)), None
    )


REASSEMBLERS = {"messages": _messages, "chat": _chat, "responses": _responses}
