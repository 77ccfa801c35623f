"""One agent session as each dialect's calls would carry it, for the trajectory and row tests.

The session: a system prompt and an instruction; the model runs two commands (thinking before the
first), then answers. Each call's request carries the whole conversation so far, as harnesses send
it (reasoning dropped on resend, as most clients do), and a harness-style title request comes first.
"""

from __future__ import annotations

import json
from typing import Any

from episode_operator.capture.records import CapturedCall

SYSTEM = "You are an agent in a Linux sandbox."
INSTRUCTION = "Create hello.txt containing hi."
# (reasoning, text, tool call or None, tool output) per model answer.
ANSWERS: list[tuple[str | None, str, tuple[str, str, dict[str, Any]] | None, str | None]] = [
    ("I need a file.", "I'll write it.", ("call_1", "bash", {"command": "echo hi > hello.txt"}), ""),
    (None, "", ("call_2", "bash", {"command": "cat hello.txt"}), "hi\n"),
    (None, "Done.", None, None),
]
USAGES = [(100, 20), (130, 10), (150, 5)]  # (prompt, completion) per answer
TOKENS = [([1, 2], [10, 11], [-0.1, -0.2]), ([1, 2, 10, 11, 3], [12], [-0.3]), ([1, 2, 10, 11, 3, 12, 4], [13], [-0.4])]


def _chat_answer(index: int) -> dict[str, Any]:
    reasoning, text, call, _ = ANSWERS[index]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if call:
        message["tool_calls"] = [
            {"id": call[0], "type": "function", "function": {"name": call[1], "arguments": json.dumps(call[2])}}
        ]
    return message


def chat_call(index: int, *, token_ids: bool = False) -> CapturedCall:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": INSTRUCTION}]
    for earlier in range(index):
        message = {key: value for key, value in _chat_answer(earlier).items() if key != "reasoning_content"}
        messages.append(message)
        call, output = ANSWERS[earlier][2], ANSWERS[earlier][3]
        assert call is not None
        messages.append({"role": "tool", "tool_call_id": call[0], "content": output})
    prompt, completion = USAGES[index]
    response = {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion",
        "model": "policy",
        "choices": [{"index": 0, "message": _chat_answer(index), "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }
    ids = TOKENS[index] if token_ids else (None, None, None)
    return captured(
        f"chat-{index}", "chat", {"model": "policy", "messages": messages, "tools": []}, response, index, ids
    )


def _responses_answer(index: int, *, with_reasoning: bool) -> list[dict[str, Any]]:
    reasoning, text, call, _ = ANSWERS[index]
    items: list[dict[str, Any]] = []
    if reasoning and with_reasoning:
        items.append(
            {"type": "reasoning", "id": f"rs_{index}", "summary": [{"type": "summary_text", "text": reasoning}]}
        )
    if text:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        items.append(
            {"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed", "content": content}
        )
    if call:
        arguments = json.dumps(call[2])
        items.append(
            {"type": "function_call", "id": f"fc_{index}", "call_id": call[0], "name": call[1], "arguments": arguments}
        )
    return items


def responses_call(index: int) -> CapturedCall:
    items: list[dict[str, Any]] = [{"role": "user", "content": INSTRUCTION}]
    for earlier in range(index):
        items.extend(_responses_answer(earlier, with_reasoning=False))
        call, output = ANSWERS[earlier][2], ANSWERS[earlier][3]
        assert call is not None
        items.append({"type": "function_call_output", "call_id": call[0], "output": output})
    prompt, completion = USAGES[index]
    response = {
        "id": f"resp_{index}",
        "object": "response",
        "model": "policy",
        "status": "completed",
        "output": _responses_answer(index, with_reasoning=True),
        "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion},
    }
    request = {"model": "policy", "instructions": SYSTEM, "input": items, "stream": True}
    return captured(f"responses-{index}", "responses", request, response, index)


def _messages_answer(index: int, *, with_reasoning: bool) -> list[dict[str, Any]]:
    reasoning, text, call, _ = ANSWERS[index]
    blocks: list[dict[str, Any]] = []
    if reasoning and with_reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": "s"})
    if text:
        blocks.append({"type": "text", "text": text})
    if call:
        blocks.append({"type": "tool_use", "id": call[0], "name": call[1], "input": call[2]})
    return blocks


def messages_call(index: int) -> CapturedCall:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]}]
    for earlier in range(index):
        messages.append({"role": "assistant", "content": _messages_answer(earlier, with_reasoning=True)})
        call, output = ANSWERS[earlier][2], ANSWERS[earlier][3]
        assert call is not None
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call[0], "content": output}]}
        )
    prompt, completion = USAGES[index]
    response = {
        "id": f"msg_{index}",
        "type": "message",
        "role": "assistant",
        "model": "policy",
        "content": _messages_answer(index, with_reasoning=True),
        "stop_reason": "end_turn",
        "usage": {"input_tokens": prompt - 40, "cache_read_input_tokens": 40, "output_tokens": completion},
    }
    request = {
        "model": "policy",
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": messages,
        "max_tokens": 1024,
    }
    return captured(f"messages-{index}", "messages", request, response, index)


def title_call(dialect: str) -> CapturedCall:
    """A harness's side request (opencode asks for a session title first): another conversation."""
    requests = {
        "chat": {"model": "policy", "messages": [{"role": "user", "content": f"Title this: {INSTRUCTION}"}]},
        "responses": {"model": "policy", "input": f"Title this: {INSTRUCTION}"},
        "messages": {"model": "policy", "messages": [{"role": "user", "content": f"Title this: {INSTRUCTION}"}]},
    }
    responses = {
        "chat": {
            "model": "policy",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello file"}}],
        },
        "responses": {
            "model": "policy",
            "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello file"}]}
            ],
        },
        "messages": {"model": "policy", "content": [{"type": "text", "text": "Hello file"}]},
    }
    return captured(f"{dialect}-title", dialect, requests[dialect], responses[dialect], -1)


def captured(
    call_id: str,
    dialect: str,
    request: dict[str, Any],
    response: dict[str, Any],
    index: int,
    ids: tuple[list[int] | None, list[int] | None, list[float] | None] = (None, None, None),
    *,
    turn: str = "01-make",
) -> CapturedCall:
    started = 1_800_000_000.0 + 10 * (index + 1)
    return CapturedCall(
        model_call_id=call_id,
        dialect=dialect,  # type: ignore[arg-type]
        started_at=started,
        completed_at=started + 2,
        latency_ms=2000.0,
        latency_ttft_ms=300.0,
        status_code=200,
        request=request,
        response=response,
        response_source="upstream",
        upstream_status_code=200,
        attempt=1,
        turn=turn,
        prompt_token_ids=ids[0],
        generation_token_ids=ids[1],
        generation_log_probs=ids[2],
    )


SESSIONS = {
    "chat": lambda: [title_call("chat"), *(chat_call(index) for index in range(3))],
    "responses": lambda: [title_call("responses"), *(responses_call(index) for index in range(3))],
    "messages": lambda: [title_call("messages"), *(messages_call(index) for index in range(3))],
}
