"""A model endpoint in the test's own event loop, for the capture proxy to forward to.

It answers the three dialects in JSON or SSE with canned answers shaped like the real APIs (and the
model listing and Anthropic's token count), with token ids when a request asks for them (as vLLM gives
them for chat completions and Responses; in Gym's names on a Messages answer), and misbehaves on
request (``x-behave`` header): an error status, garbage, no answer at all, a stream that stalls, a
stream whose last chunk waits for the test's say-so, a redirect (to ``x-redirect-to``), an answer
padded to ``x-pad`` bytes. It records what it received, and listens where a test says (an attacker's
listener is one more of these).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

KEY = "sk-real-0123456789abcdef"

TOOL_ARGUMENTS = {"command": "ls /app"}

JSON_ANSWERS: dict[str, dict[str, Any]] = {
    "chat": {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Listing.",
                    "reasoning_content": "I should look.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps(TOOL_ARGUMENTS)},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 7,
            "total_tokens": 18,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 3},
        },
    },
    "responses": {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "model": "m",
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should look."}]},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Listing.", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "bash",
                "arguments": json.dumps(TOOL_ARGUMENTS),
                "status": "completed",
            },
        ],
        "usage": {
            "input_tokens": 11,
            "output_tokens": 7,
            "total_tokens": 18,
            "input_tokens_details": {"cached_tokens": 4},
            "output_tokens_details": {"reasoning_tokens": 3},
        },
    },
    "messages": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "thinking", "thinking": "I should look.", "signature": "sig"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": TOOL_ARGUMENTS},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 7, "cache_read_input_tokens": 4, "output_tokens": 7},
    },
}


def sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n").encode()


def halves(text: str) -> tuple[str, str]:
    return text[: len(text) // 2], text[len(text) // 2 :]


def sse_answer(dialect: str) -> list[bytes]:
    """The streamed form of ``JSON_ANSWERS[dialect]``: one event per chunk, the end event last."""
    if dialect == "chat":
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "I should look."}}]},
            {"choices": [{"index": 0, "delta": {"content": "List"}}]},
            {"choices": [{"index": 0, "delta": {"content": "ing."}}]},
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "bash", "arguments": ""},
                                }
                            ]
                        },
                    }
                ]
            },
            # The arguments arrive in pieces, as models stream them.
            *(
                {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}}]}
                for piece in halves(json.dumps(TOOL_ARGUMENTS))
            ),
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            {"choices": [], "usage": JSON_ANSWERS["chat"]["usage"]},
        ]
        return [sse(None, {**base, **chunk}) for chunk in chunks] + [sse(None, "[DONE]")]
    if dialect == "responses":
        final = JSON_ANSWERS["responses"]
        return [
            sse(
                "response.created",
                {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}},
            ),
            sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Listing."}),
            sse("response.completed", {"type": "response.completed", "response": final}),
        ]
    answer = JSON_ANSWERS["messages"]
    return [
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **answer,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 7, "cache_read_input_tokens": 4, "output_tokens": 1},
                },
            },
        ),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        ),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "I should look."},
            },
        ),
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
        ),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        ),
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Listing."}},
        ),
        sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}},
            },
        ),
        *(
            sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 2,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                },
            )
            for piece in halves(json.dumps(TOOL_ARGUMENTS))
        ),
        sse(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
        ),
        sse("message_stop", {"type": "message_stop"}),
    ]


PROMPT_TOKEN_IDS = [1, 2, 3]
GENERATION = [(101, -0.5), (102, -0.25)]


def vllm_token_answer(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as vLLM answers ``logprobs``, ``return_tokens_as_token_ids`` and ``return_token_ids``."""
    if not request.get("return_tokens_as_token_ids"):
        return answer
    choice = dict(answer["choices"][0])
    choice["logprobs"] = {
        "content": [
            {"token": f"token_id:{token}", "logprob": logprob, "top_logprobs": []} for token, logprob in GENERATION
        ]
    }
    if request.get("return_token_ids"):
        choice["token_ids"] = [token for token, _ in GENERATION]
        return {**answer, "choices": [choice], "prompt_token_ids": PROMPT_TOKEN_IDS}
    return {**answer, "choices": [choice]}


def vllm_token_stream(chunks: list[bytes], request: dict[str, Any]) -> list[bytes]:
    """A streamed chat completion as vLLM sends it with token ids: the prompt's on the first chunk, each
    generated token's id and logprob on the chunk that carries it (here: the two content chunks)."""
    if not request.get("return_tokens_as_token_ids"):
        return chunks
    out = []
    tokens = iter(GENERATION)
    for chunk in chunks:
        payload = chunk.removeprefix(b"data: ").strip()
        if payload == b"[DONE]":
            out.append(chunk)
            continue
        event = json.loads(payload)
        if not out and request.get("return_token_ids"):
            event["prompt_token_ids"] = PROMPT_TOKEN_IDS
        for choice in event["choices"]:
            if choice["delta"].get("content"):
                token, logprob = next(tokens)
                choice["logprobs"] = {
                    "content": [{"token": f"token_id:{token}", "logprob": logprob, "top_logprobs": []}]
                }
                choice["token_ids"] = [token]
        out.append(sse(None, event))
    return out


RAW_PROMPT = "<|user|>hi<|assistant|>"  # what the scripted chat template made of the request


def vllm_responses_token_answer(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A Responses answer as vLLM gives ``enable_response_messages`` (raw token messages: the prompt's in
    ``input_messages``, the generation's in ``output_messages``) and ``include: message.output_text.logprobs``
    (every generated token's logprob on the output text, tokens spelled as text: ``token_id:<n>`` would
    need the server's ``--return-tokens-as-token-ids``)."""
    out = dict(answer)
    if request.get("enable_response_messages"):
        generated = [token for token, _ in GENERATION]
        out["input_messages"] = [{"type": "raw_message_tokens", "message": RAW_PROMPT, "tokens": PROMPT_TOKEN_IDS}]
        out["output_messages"] = [{"type": "raw_message_tokens", "message": "Listing.", "tokens": generated}]
    if "message.output_text.logprobs" in (request.get("include") or []):
        logprobs = [{"token": "L", "logprob": logprob, "bytes": [76], "top_logprobs": []} for _, logprob in GENERATION]
        out["output"] = [
            {**item, "content": [part | {"logprobs": logprobs} for part in item["content"]]}
            if item["type"] == "message"
            else item
            for item in answer["output"]
        ]
    return out


def gym_messages_token_answer(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A Messages answer asked in chat's names (``return_token_ids``), with Gym's fields on the message."""
    if not request.get("return_token_ids"):
        return answer
    return {**answer, **GYM_TOKEN_FIELDS}


GYM_TOKEN_FIELDS = {
    "prompt_token_ids": PROMPT_TOKEN_IDS,
    "generation_token_ids": [token for token, _ in GENERATION],
    "generation_log_probs": [logprob for _, logprob in GENERATION],
}


def rewrite_events(chunks: list[bytes], change: Callable[[str | None, dict[str, Any]], dict[str, Any]]) -> list[bytes]:
    """The chunks of a named-event stream with each event's data as ``change(event, data)`` makes it (a chunk
    that holds no event, such as a comment, kept as it is)."""
    out = []
    for chunk in chunks:
        lines = chunk.decode().splitlines()
        data = next((line.removeprefix("data: ") for line in lines if line.startswith("data: ")), None)
        if data is None:
            out.append(chunk)
            continue
        event = next((line.removeprefix("event: ") for line in lines if line.startswith("event: ")), None)
        out.append(sse(event, change(event, json.loads(data))))
    return out


def vllm_responses_token_stream(chunks: list[bytes], request: dict[str, Any]) -> list[bytes]:
    """A Responses stream whose terminal event carries the answer as :func:`vllm_responses_token_answer`."""

    def change(event: str | None, data: dict[str, Any]) -> dict[str, Any]:
        if event != "response.completed":
            return data
        return {**data, "response": vllm_responses_token_answer(data["response"], request)}

    return rewrite_events(chunks, change)


def gym_messages_token_stream(chunks: list[bytes], request: dict[str, Any]) -> list[bytes]:
    """A Messages stream with Gym's fields where its usage goes: the prompt's ids on the message's start, the
    generation's on its last delta."""

    def change(event: str | None, data: dict[str, Any]) -> dict[str, Any]:
        if event == "message_start":
            return {**data, "message": {**data["message"], "prompt_token_ids": PROMPT_TOKEN_IDS}}
        if event == "message_delta":
            return {**data, **{key: value for key, value in GYM_TOKEN_FIELDS.items() if key != "prompt_token_ids"}}
        return data

    return rewrite_events(chunks, change) if request.get("return_token_ids") else chunks


# How each API's answer carries token ids when the request asks for them (and untouched when it does not).
TOKEN_ANSWERS = {
    "chat": vllm_token_answer,
    "responses": vllm_responses_token_answer,
    "messages": gym_messages_token_answer,
}
TOKEN_STREAMS = {
    "chat": vllm_token_stream,
    "responses": vllm_responses_token_stream,
    "messages": gym_messages_token_stream,
}

DIALECT_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# The routes that are no model call, as the real APIs answer them.
OTHER_ANSWERS: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/v1/models"): {"object": "list", "data": [{"id": "m", "object": "model"}]},
    ("GET", "/v1/models/m"): {"id": "m", "object": "model"},
    ("POST", "/v1/messages/count_tokens"): {"input_tokens": 3},
    ("POST", "/v1/completions"): {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "hi"}]},
}


@dataclass
class Upstream:
    """What the endpoint received, and the switch a held-back last chunk waits for."""

    received: list[dict[str, Any]] = field(default_factory=list)
    release_last: asyncio.Event = field(default_factory=asyncio.Event)
    first_chunk_sent: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(
            {
                "path": request.path,
                "headers": dict(request.headers),
                "header_items": list(request.headers.items()),
                "body": body,
            }
        )
        behave = request.headers.get("x-behave", "")
        if behave == "redirect":
            raise web.HTTPTemporaryRedirect(request.headers["x-redirect-to"])
        if (request.method, request.path) in OTHER_ANSWERS:
            return web.json_response(OTHER_ANSWERS[request.method, request.path])
        dialect = next((name for name, path in DIALECT_PATHS.items() if request.path == path), None)
        if dialect is None:
            return web.json_response({"error": {"message": "no such route", "type": "not_found"}}, status=404)
        if behave.startswith("status-"):
            status = int(behave.removeprefix("status-"))
            error = {"error": {"message": f"failure {status}; key {KEY}", "type": "test"}}
            return web.json_response(error, status=status)
        if behave == "garbage":
            return web.Response(body=b"<html>not json</html>", content_type="application/json")
        if behave == "silent":
            await asyncio.Event().wait()
        parsed = json.loads(body)
        pad = int(request.headers.get("x-pad", "0"))
        if not parsed.get("stream"):
            answer = JSON_ANSWERS[dialect] | ({"padding": "x" * pad} if pad else {})
            return web.json_response(TOKEN_ANSWERS[dialect](answer, parsed))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunks = sse_answer(dialect)
        if pad:  # one long SSE comment before the answer: a stream larger than any record
            chunks = [b": " + b"x" * pad + b"\n\n", *chunks]
        chunks = TOKEN_STREAMS[dialect](chunks, parsed)
        for index, chunk in enumerate(chunks):
            if index == len(chunks) - 1:
                if behave == "stall":
                    await asyncio.Event().wait()
                if behave == "hold-last":
                    await self.release_last.wait()
            await response.write(chunk)
            self.first_chunk_sent.set()
        await response.write_eof()
        return response


@asynccontextmanager
async def running_upstream(
    host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[Upstream]:
    upstream = Upstream()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    upstream.url = f"{'https' if ssl_context else 'http'}://{host}:{port}/v1"
    try:
        yield upstream
    finally:
        await runner.cleanup()
