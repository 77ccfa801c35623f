"""The capture proxy against a real endpoint in the same process: forwarding, records, keys, attribution, bounds."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from episode_operator.capture.capture_store import CaptureStore, CurrentTurn, read_journal
from episode_operator.capture.proxy import KeyScrubber, ProxyConfig, start
from episode_operator.capture.records import TOKEN_FIELDS, TOKEN_ID_READERS, CapturedCall, model_call_record
from episode_operator.capture.wire import agent_base_url
from tests.reference import gym
from tests.unit.model_upstream import (
    DIALECT_PATHS,
    GENERATION,
    JSON_ANSWERS,
    KEY,
    PROMPT_TOKEN_IDS,
    Upstream,
    running_upstream,
    sse_answer,
)

DIALECTS = ("chat", "responses", "messages")
PLACEHOLDER = "placeholder-key"
BODIES: dict[str, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
    "messages": {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
}


@dataclass
class Rig:
    upstream: Upstream
    url: str
    store: CaptureStore
    session: aiohttp.ClientSession

    def post(self, dialect: str, *, stream: bool = False, headers: dict[str, str] | None = None, **extra: Any) -> Any:
        body = {**BODIES[dialect], "stream": stream, **extra}
        return self.session.post(
            self.endpoint(dialect),
            json=body,
            headers={"authorization": f"Bearer {PLACEHOLDER}", **(headers or {})},
        )

    def endpoint(self, dialect: str) -> str:
        """The agent's base URL (``…/v1``) and the dialect's path under it."""
        return self.url + DIALECT_PATHS[dialect].removeprefix("/v1")

    def calls(self, turn: str | None = "one", attempt: int = 1) -> list[CapturedCall]:
        harvest = self.store.harvest(attempt, turn, settle_seconds=5)
        assert harvest.complete, harvest
        return harvest.calls


@asynccontextmanager
async def rig(
    tmp_path: Path, *, turn: str | None = "one", upstream_url: str | None = None, **config: Any
) -> AsyncIterator[Rig]:
    async with running_upstream() as upstream:
        store = CaptureStore(tmp_path / "store")
        if turn is not None:
            store.set_current_turn(CurrentTurn(attempt=1, turn=turn))
        settings = ProxyConfig(upstream=upstream_url or upstream.url, store=store.root, api_key=KEY, **config)
        runner, port = await start(settings, "127.0.0.1", 0)
        try:
            # A proxy that hangs fails the test instead of hanging it.
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                yield Rig(upstream, agent_base_url("127.0.0.1", port, upstream.url), store, session)
        finally:
            await runner.cleanup()


def run(tmp_path: Path, scenario: Callable[[Rig], Awaitable[None]], **config: Any) -> None:
    async def main() -> None:
        async with rig(tmp_path, **config) as proxy:
            await scenario(proxy)

    asyncio.run(main())


# --- forwarding and records ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_json_call_is_forwarded_and_recorded(tmp_path: Path, dialect: str) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post(dialect) as response:
            assert response.status == 200
            assert await response.json() == JSON_ANSWERS[dialect]
        (call,) = proxy.calls()
        assert (call.dialect, call.status_code, call.error_category, call.streaming) == (dialect, 200, None, False)
        assert call.response == JSON_ANSWERS[dialect]
        assert call.request == {**BODIES[dialect], "stream": False}
        assert (call.attempt, call.turn, call.response_source, call.upstream_status_code) == (1, "one", "upstream", 200)
        assert call.started_at <= call.completed_at and 0 < call.latency_ttft_ms <= call.latency_ms  # type: ignore[operator]
        record = model_call_record(call, call_index=0)
        assert (record.tokens_in, record.tokens_out, record.cached_tokens) == (11, 7, 4)
        assert record.tool_calls == [
            {"call_id": record.tool_calls[0]["call_id"], "name": "bash", "arguments": {"command": "ls /app"}}
        ]
        assert record.reasoning_content == "I should look."

    run(tmp_path, scenario)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_stream_is_passed_through_unchanged_and_recorded_whole(tmp_path: Path, dialect: str) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post(dialect, stream=True) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert await response.read() == b"".join(sse_answer(dialect))
        (call,) = proxy.calls()
        assert (call.dialect, call.status_code, call.error_category, call.streaming) == (dialect, 200, None, True)
        assert call.response_raw == b"".join(sse_answer(dialect)).decode()
        assert call.response is not None
        record = model_call_record(call, call_index=0)
        assert (record.tokens_in, record.tokens_out, record.cached_tokens) == (11, 7, 4)
        assert record.tool_calls[0]["name"] == "bash" and record.tool_calls[0]["arguments"] == {"command": "ls /app"}
        assert record.reasoning_content == "I should look."
        assert record.finish_reason in ("tool_calls", "tool_use", None)

    run(tmp_path, scenario)


def test_records_can_be_fsynced(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        for stream in (False, True):
            async with proxy.post("messages", stream=stream) as response:
                assert response.status == 200
                await response.read()
        assert [(call.streaming, call.error_category) for call in proxy.calls()] == [(False, None), (True, None)]

    run(tmp_path, scenario, fsync=True)


def test_a_streamed_chat_completion_asks_for_its_usage(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("chat", stream=True) as response:
            await response.read()
        async with proxy.post("chat", stream=True, stream_options={"include_usage": False}) as response:
            await response.read()
        sent = [json.loads(received["body"]) for received in proxy.upstream.received]
        assert [body.get("stream_options") for body in sent] == [{"include_usage": True}, {"include_usage": False}]
        assert [call.request["stream_options"] for call in proxy.calls() if call.request] == [
            {"include_usage": True},
            {"include_usage": False},
        ]

    run(tmp_path, scenario)


def test_a_stream_reaches_the_client_before_upstream_finishes(tmp_path: Path) -> None:
    """The upstream holds its last chunk until the client has read the first: no buffering in between."""

    async def scenario(proxy: Rig) -> None:
        chunks = sse_answer("chat")
        async with proxy.post("chat", stream=True, headers={"x-behave": "hold-last"}) as response:
            seen = b""
            while chunks[0] not in seen:
                seen += await asyncio.wait_for(response.content.readany(), timeout=10)
            assert not proxy.upstream.release_last.is_set()
            journal = read_journal(proxy.store.calls_path(1, "one"))
            assert (journal.calls, len(journal.in_flight)) == ([], 1)  # begun, not recorded
            proxy.upstream.release_last.set()
            seen += await response.read()
            # The record is on disk before the client saw the end: read without waiting.
            journal = read_journal(proxy.store.calls_path(1, "one"))
            assert ([call.error_category for call in journal.calls], journal.in_flight) == ([None], set())
        assert seen == b"".join(chunks)

    run(tmp_path, scenario)


# --- failures -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "category"), [(401, "auth"), (429, "rate_limit"), (500, "upstream_error"), (404, "not_found")]
)
def test_an_error_status_is_passed_on_and_categorised(tmp_path: Path, status: int, category: str) -> None:
    async def scenario(proxy: Rig) -> None:
        for stream in (False, True):
            async with proxy.post("chat", stream=stream, headers={"x-behave": f"status-{status}"}) as response:
                assert response.status == status
                body = await response.json()
                assert KEY not in json.dumps(body) and "[redacted]" in body["error"]["message"]
        calls = proxy.calls()
        assert [(call.status_code, call.error_category) for call in calls] == [(status, category)] * 2

    run(tmp_path, scenario)


def test_garbage_is_passed_on_and_flagged(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("responses", headers={"x-behave": "garbage"}) as response:
            assert (response.status, await response.text()) == (200, "<html>not json</html>")
        (call,) = proxy.calls()
        assert (call.error_category, call.response, call.response_raw) == (
            "capture_parse_error",
            None,
            "<html>not json</html>",
        )

    run(tmp_path, scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_a_silent_upstream_gets_a_504_within_the_read_timeout(tmp_path: Path, stream: bool) -> None:
    async def scenario(proxy: Rig) -> None:
        started = time.monotonic()
        async with proxy.post("messages", stream=stream, headers={"x-behave": "silent"}) as response:
            assert response.status == 504
            assert (await response.json())["error"]["type"] == "upstream_timeout"
        assert time.monotonic() - started < 5
        (call,) = proxy.calls()
        assert (call.status_code, call.error_category, call.response_source, call.local_response_reason) == (
            504,
            "timeout",
            "local",
            "upstream_timeout",
        )

    run(tmp_path, scenario, read_timeout=0.3)


def test_no_call_outlives_its_bound(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        started = time.monotonic()
        async with proxy.post("chat", headers={"x-behave": "silent"}) as response:
            assert response.status == 504
        assert time.monotonic() - started < 5
        assert [call.error_category for call in proxy.calls()] == ["timeout"]

    run(tmp_path, scenario, read_timeout=60, max_call_seconds=0.3)


def test_an_unreachable_upstream_gets_a_502(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("chat") as response:
            assert response.status == 502
            assert (await response.json())["error"]["type"] == "upstream_unreachable"
        (call,) = proxy.calls()
        assert (call.status_code, call.error_category, call.local_response_reason) == (
            502,
            "connection",
            "upstream_unreachable",
        )

    run(tmp_path, scenario, upstream_url="http://127.0.0.1:9/v1")  # the discard port: nothing listens


def test_a_stream_that_stalls_ends_with_an_error_event(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("responses", stream=True, headers={"x-behave": "stall"}) as response:
            assert response.status == 200
            body = await asyncio.wait_for(response.read(), timeout=10)
        chunks = sse_answer("responses")
        assert body.startswith(b"".join(chunks[:-1]))
        assert body.endswith(b'"upstream_timeout", "message": "capture proxy: upstream_timeout"}}\n\n')
        (call,) = proxy.calls()
        assert (call.status_code, call.error_category, call.streaming) == (200, "timeout", True)
        assert call.response_raw == b"".join(chunks[:-1]).decode()

    run(tmp_path, scenario, read_timeout=0.3)


def test_a_request_too_large_is_refused_and_recorded(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("chat", padding="x" * 2048) as response:
            assert response.status == 413
        (call,) = proxy.calls()
        assert (call.status_code, call.error_category, call.upstream_attempted) == (413, "client_error", False)
        assert proxy.upstream.received == []

    run(tmp_path, scenario, max_request_bytes=1024)


def test_a_client_that_goes_away_leaves_a_cancelled_record(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        task = asyncio.create_task(proxy.post("chat", headers={"x-behave": "silent"}).__aenter__())
        while not proxy.upstream.received:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await proxy.session.close()  # the agent is gone: its connection closes
        (call,) = await asyncio.to_thread(proxy.calls)
        assert (call.error_category, call.status_code) == ("cancelled", None)

    run(tmp_path, scenario)


# --- keys ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dialect", "client_header", "upstream_header", "upstream_value"),
    [
        ("chat", {"authorization": f"Bearer {PLACEHOLDER}"}, "Authorization", f"Bearer {KEY}"),
        ("chat", {"Authorization": f"Bearer {PLACEHOLDER}"}, "authorization", f"Bearer {KEY}"),
        ("messages", {"x-api-key": PLACEHOLDER}, "X-Api-Key", KEY),
        ("chat", {"api-key": PLACEHOLDER}, "Api-Key", KEY),
        ("messages", {}, "x-api-key", KEY),
        ("responses", {}, "authorization", f"Bearer {KEY}"),
    ],
)
def test_the_real_key_replaces_the_placeholder(
    tmp_path: Path, dialect: str, client_header: dict[str, str], upstream_header: str, upstream_value: str
) -> None:
    async def scenario(proxy: Rig) -> None:
        body = {**BODIES[dialect], "stream": False}
        async with proxy.session.post(proxy.endpoint(dialect), json=body, headers=client_header) as response:
            assert response.status == 200
        items = [(name.lower(), value) for name, value in proxy.upstream.received[0]["header_items"]]
        keys = [(name, value) for name, value in items if name in ("authorization", "x-api-key", "api-key")]
        assert keys == [(upstream_header.lower(), upstream_value)]  # the real key alone, once
        assert PLACEHOLDER not in json.dumps(items)

    run(tmp_path, scenario)


def test_the_key_is_never_stored_nor_shown(tmp_path: Path) -> None:
    """Every outcome, the key echoed by the endpoint in errors: no byte of the store holds it."""

    async def scenario(proxy: Rig) -> None:
        for dialect in DIALECTS:
            for stream in (False, True):
                for behave in ("", "status-401", "status-500", "garbage"):
                    async with proxy.post(dialect, stream=stream, headers={"x-behave": behave}) as response:
                        assert KEY.encode() not in await response.read()
        assert len(proxy.calls()) == 24
        stored = b"".join(path.read_bytes() for path in proxy.store.root.rglob("*") if path.is_file())
        assert KEY.encode() not in stored and b"[redacted]" in stored

    run(tmp_path, scenario)


def test_the_key_is_scrubbed_even_across_chunks() -> None:
    scrubber = KeyScrubber(KEY)
    text = f"data: before {KEY} after {KEY[:5]}".encode()
    split = [text[i : i + 3] for i in range(0, len(text), 3)] + [KEY[5:].encode() + b" end\n\n"]
    out = b"".join(scrubber.feed(chunk) for chunk in split) + scrubber.flush()
    assert out == b"data: before [redacted] after [redacted] end\n\n"
    assert KeyScrubber(None).feed(text) == text


# --- attribution --------------------------------------------------------------------------------------
def test_calls_belong_to_the_turn_the_operator_named(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("chat") as response:
            await response.read()
        proxy.store.set_current_turn(CurrentTurn(attempt=1, turn=None))
        async with proxy.post("chat") as response:
            await response.read()
        proxy.store.set_current_turn(CurrentTurn(attempt=1, turn="two"))
        async with proxy.post("chat") as response:
            await response.read()
        assert [len(proxy.calls(turn)) for turn in ("one", None, "two")] == [1, 1, 1]
        (between,) = proxy.calls(None)
        assert (between.turn, between.attributed) == (None, False)

    run(tmp_path, scenario)


def test_a_call_before_any_turn_is_kept_and_flagged(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("responses") as response:
            assert response.status == 200
        (call,) = proxy.store.harvest(0, None, settle_seconds=1).calls  # no attempt named yet
        assert (call.attempt, call.turn) == (None, None)

    run(tmp_path, scenario, turn=None)


def test_the_agent_cannot_attribute_its_calls_to_another_turn(tmp_path: Path) -> None:
    """Whatever the agent sends (headers, Gym's rollout path prefix, a would-be control request), the
    current turn is the operator's: there is no control route, and such a request is refused (it is no
    model route) and recorded under the current turn."""

    async def scenario(proxy: Rig) -> None:
        forged = {"x-session-id": "two", "x-episode-turn": "two", "x-episode-attempt": "2"}
        async with proxy.post("chat", headers=forged) as response:
            await response.read()
        control = {"attempt": 2, "turn": "two"}
        for path in ("/current-turn", "/capture/turn", "/ng-rollout/two/v1/chat/completions"):
            async with proxy.session.post(proxy.url.removesuffix("/v1") + path, json=control) as response:
                await response.read()
        assert CaptureStore(proxy.store.root).harvest(2, "two", settle_seconds=0).calls == []
        assert json.loads(proxy.store.current_turn_path.read_text()) == {"attempt": 1, "turn": "one"}
        calls = proxy.calls()
        assert len(calls) == 4 and {call.turn for call in calls} == {"one"}
        assert calls[0].client_session_id == "two"  # kept as evidence, as Gym does, never as attribution

    run(tmp_path, scenario)


def test_turn_names_cannot_escape_the_store(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    for name in ("../x", "a/b", "", "_outside-turn", ".hidden"):
        with pytest.raises(ValueError, match="turn name"):
            store.set_current_turn(CurrentTurn(attempt=1, turn=name))


# --- token ids ----------------------------------------------------------------------------------------
# What the proxy asks each API for (capture/wire.py), as the request upstream shows it.
ASKED: dict[str, dict[str, Any]] = {
    "chat": {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True},
    "responses": {"top_logprobs": 0, "enable_response_messages": True, "include": ["message.output_text.logprobs"]},
    "messages": {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True},
}
KEPT = (PROMPT_TOKEN_IDS, [token for token, _ in GENERATION], [logprob for _, logprob in GENERATION])


def kept(call: CapturedCall) -> tuple[Any, Any, Any]:
    return call.prompt_token_ids, call.generation_token_ids, call.generation_log_probs


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_token_ids_are_asked_for_and_kept(tmp_path: Path, dialect: str, stream: bool) -> None:
    """Every API, streamed or not: asked as its upstream understands, kept in Gym's names."""

    async def scenario(proxy: Rig) -> None:
        async with proxy.post(dialect, stream=stream) as response:
            assert response.status == 200
            await response.read()
        (received,) = proxy.upstream.received
        sent = json.loads(received["body"])
        assert {key: sent.get(key) for key in ASKED[dialect]} == ASKED[dialect]
        (call,) = proxy.calls()
        assert kept(call) == KEPT
        assert call.error_category is None and call.request == sent and call.carried_token_ids is None

    run(tmp_path, scenario, token_ids=True)


def test_a_responses_call_keeps_what_it_includes_and_adds_the_logprobs(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        async with proxy.post("responses", include=["reasoning.encrypted_content"]) as response:
            await response.read()
        sent = json.loads(proxy.upstream.received[0]["body"])
        assert sent["include"] == ["reasoning.encrypted_content", "message.output_text.logprobs"]
        (call,) = proxy.calls()
        assert kept(call) == KEPT

    run(tmp_path, scenario, token_ids=True)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_without_token_ids_nothing_is_asked_nor_kept_nor_carried(tmp_path: Path, dialect: str) -> None:
    """The control: the proxy adds nothing to a request, and keeps no token ids even when the agent asked
    for them itself and the upstream answered them; nor does the next call carry any."""

    async def scenario(proxy: Rig) -> None:
        async with proxy.post(dialect) as response:
            await response.read()
        async with proxy.post(dialect, **ASKED[dialect]) as response:
            answer = await response.json()
        assert TOKEN_ID_READERS[dialect](answer) == KEPT  # the upstream did answer them
        async with proxy.session.post(proxy.endpoint(dialect), json=continued(dialect, answer)) as response:
            await response.read()
        plain, _, following = (json.loads(received["body"]) for received in proxy.upstream.received)
        assert plain == {**BODIES[dialect], "stream": False}
        assert following == continued(dialect, answer)
        assert all(kept(call) == (None, None, None) and call.carried_token_ids is None for call in proxy.calls())

    run(tmp_path, scenario)


# The answer's message or item that carries its token ids on the next request: chat, the assistant
# message after the user's; Responses, the answer's last item (user, reasoning, message, function_call).
CARRIED_AT = {"chat": ("messages", 1), "responses": ("input", 3)}


def continued(dialect: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The request a harness sends after ``answer``: its history, the answer as it replays it (without
    token ids), then the tool's result."""
    if dialect == "chat":
        message = {key: answer["choices"][0]["message"][key] for key in ("role", "content", "tool_calls")}
        result = {"role": "tool", "tool_call_id": "call_1", "content": "app.py"}
        return {**BODIES["chat"], "messages": [*BODIES["chat"]["messages"], message, result]}
    if dialect == "responses":
        result = {"type": "function_call_output", "call_id": "call_1", "output": "app.py"}
        return {**BODIES["responses"], "input": [{"role": "user", "content": "hi"}, *answer["output"], result]}
    replayed = {"role": "assistant", "content": answer["content"]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "app.py"}]}
    return {**BODIES["messages"], "messages": [*BODIES["messages"]["messages"], replayed, result]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_next_call_carries_the_answers_token_ids_where_gym_does(tmp_path: Path, dialect: str, stream: bool) -> None:
    """On-policy correction: the request that continues an answer carries that answer's token ids on it,
    as Gym's vllm_model sends them (chat: on the assistant message) and its Responses endpoint takes them
    (on the answer's last item); never on Messages, where neither Gym nor vLLM reads them. Gym's own
    request models and converter read them where the proxy put them."""

    async def scenario(proxy: Rig) -> None:
        async with proxy.post(dialect, stream=stream) as response:
            await response.read()
        (first,) = proxy.calls()
        assert first.response is not None and kept(first) == KEPT
        following = continued(dialect, first.response)
        async with proxy.session.post(proxy.endpoint(dialect), json=following) as response:
            assert response.status == 200
        sent = json.loads(proxy.upstream.received[1]["body"])
        second = next(call for call in proxy.calls() if call.model_call_id != first.model_call_id)
        assert second.request is not None
        recorded_history = second.request.get("messages") or second.request["input"]
        assert not any(set(TOKEN_FIELDS) & set(entry) for entry in recorded_history)  # recorded by reference
        if dialect not in CARRIED_AT:
            assert sent == {**following, **ASKED[dialect]} and second.carried_token_ids is None
            return
        name, at = CARRIED_AT[dialect]
        assert {key: sent[name][at][key] for key in TOKEN_FIELDS} == dict(zip(TOKEN_FIELDS, KEPT, strict=True))
        assert [index for index, entry in enumerate(sent[name]) if set(TOKEN_FIELDS) & set(entry)] == [at]
        assert second.carried_token_ids == [first.model_call_id]
        assert {**sent, name: following[name]} == {**following, **ASKED[dialect]} == second.request
        assert gym_chat_messages(dialect, sent)[1] == {
            **gym_chat_messages(dialect, following)[1],
            **dict(zip(TOKEN_FIELDS, KEPT, strict=True)),
        }

    run(tmp_path, scenario, token_ids=True)


def gym_chat_messages(dialect: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages Gym's vllm_model sends vLLM for ``request`` (its conversation only)."""
    utils = gym()["nemo_gym.openai_utils"]
    if dialect == "chat":
        params = utils.NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(
            {"model": "m", "messages": request["messages"]}
        )
    else:
        converter = gym()["nemo_gym.responses_converter"].ResponsesConverter(return_token_id_information=True)
        params = converter.responses_to_chat_completion_create_params(
            utils.NeMoGymResponseCreateParamsNonStreaming.model_validate({"model": "m", "input": request["input"]})
        )
    messages: list[dict[str, Any]] = params.model_dump(exclude_unset=True)["messages"]
    return messages


def test_a_request_that_does_not_continue_an_answer_carries_nothing(tmp_path: Path) -> None:
    """The same answer after another question is not that answer: nothing is carried."""

    async def scenario(proxy: Rig) -> None:
        async with proxy.post("chat") as response:
            answer = await response.json()
        elsewhere = continued("chat", answer)
        elsewhere["messages"][0] = {"role": "user", "content": "something else"}
        async with proxy.session.post(proxy.endpoint("chat"), json=elsewhere) as response:
            await response.read()
        sent = json.loads(proxy.upstream.received[1]["body"])
        assert sent == {**elsewhere, **ASKED["chat"]}
        assert all(call.carried_token_ids is None for call in proxy.calls())

    run(tmp_path, scenario, token_ids=True)


# --- spec.agent.model.params ---------------------------------------------------------------------------
CAP_NAMES = {"chat": "max_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("params", [False, True], ids=["harness-defaults", "episode-params"])
def test_the_episodes_sampling_params_override_what_the_agent_asks_for(
    tmp_path: Path, dialect: str, params: bool
) -> None:
    """An agent (or a harness's defaults) asking for temperature 1.7 and a long answer: with
    spec.agent.model.params the model is asked at the Episode's temperature, top_p and length cap
    (under the dialect's own name, every other name of the cap gone), and the record says so;
    without, the body goes as the agent sent it."""
    asked = {"temperature": 1.7, "max_completion_tokens": 4096, "max_output_tokens": 4096, "max_tokens": 4096}
    episode = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 64, "seed": 7}

    async def scenario(proxy: Rig) -> None:
        async with proxy.post(dialect, **asked) as response:
            assert response.status == 200
        sent = json.loads(proxy.upstream.received[0]["body"])
        (call,) = proxy.calls()
        assert call.request == sent  # what the model was really asked
        if not params:
            assert sent == {**BODIES[dialect], "stream": False, **asked}
            return
        caps = {name: sent.get(name) for name in ("max_tokens", "max_output_tokens", "max_completion_tokens")}
        assert caps == {name: 64 if name == CAP_NAMES[dialect] else None for name in caps}
        assert (sent["temperature"], sent["top_p"], sent["seed"]) == (0.2, 0.9, 7)

    run(tmp_path, scenario, **({"params": episode} if params else {}))


def test_the_proxy_command_refuses_params_that_are_not_a_json_object(tmp_path: Path) -> None:
    for bad in ("[0.2]", "temperature=0.2"):
        options = ("--upstream", "http://127.0.0.1:9", "--store", str(tmp_path), "--params", bad)
        refused = episode_operator("capture-proxy", *options)
        assert refused.returncode == 2 and "--params" in refused.stderr and "Traceback" not in refused.stderr


# --- the commands, as the operator runs them ----------------------------------------------------------
def episode_operator(*args: str) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).parent / "episode-operator"
    return subprocess.run([str(command), *args], capture_output=True, text=True, timeout=120)


def test_the_capture_commands_end_to_end(tmp_path: Path) -> None:
    """``capture-proxy`` as its own process, ``capture-turn`` and ``capture-harvest`` as the operator execs them."""
    store = tmp_path / "store"

    async def main() -> None:
        async with running_upstream() as upstream:
            turn = episode_operator("capture-turn", "--store", str(store), "--attempt", "1", "--turn", "01-first")
            assert turn.returncode == 0, turn.stderr
            environment = {**os.environ, "EPISODE_CAPTURE_API_KEY": KEY}
            command = [str(Path(sys.executable).parent / "episode-operator"), "capture-proxy"]
            arguments = [
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                upstream.url,
                "--store",
                str(store),
                "--read-timeout",
                "5",
                "--params",
                '{"temperature": 0.3}',
            ]
            proxy = subprocess.Popen([*command, *arguments], env=environment, stderr=subprocess.PIPE)
            try:
                ready = store / "ready.json"
                deadline = time.monotonic() + 120  # a loaded machine starts Python slowly
                while not ready.exists():
                    assert proxy.poll() is None and time.monotonic() < deadline, (
                        proxy.stderr.read() if proxy.stderr else ""
                    )
                    await asyncio.sleep(0.05)
                address = json.loads(ready.read_text())["listen"]
                async with aiohttp.ClientSession() as session:
                    url = f"http://{address}/v1/chat/completions"
                    async with session.post(url, json={**BODIES["chat"], "stream": True}) as response:
                        assert response.status == 200
                        await response.read()
                headers = {name.lower(): value for name, value in upstream.received[0]["headers"].items()}
                assert headers["authorization"] == f"Bearer {KEY}"
                assert json.loads(upstream.received[0]["body"])["temperature"] == 0.3
            finally:
                proxy.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(proxy.wait, 60)
                assert code == 0, proxy.stderr.read() if proxy.stderr else code
            assert not ready.exists()

    asyncio.run(main())
    harvest = episode_operator("capture-harvest", "--store", str(store), "--attempt", "1", "--turn", "01-first")
    assert harvest.returncode == 0, harvest.stderr
    document = json.loads(harvest.stdout)
    assert (len(document["calls"]), document["unreadable_lines"], document["still_in_flight"]) == (1, 0, 0)
    assert document["calls"][0]["turn"] == "01-first" and document["calls"][0]["streaming"] is True
    bad = episode_operator("capture-turn", "--store", str(store), "--attempt", "1", "--turn", "../escape")
    assert bad.returncode == 2 and "turn name '../escape'" in bad.stderr


def test_a_harvest_reads_past_a_torn_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    good = CapturedCall(
        model_call_id="a", dialect="chat", started_at=1, completed_at=2, latency_ms=1, attempt=1, turn="t"
    )
    path = store.calls_path(1, "t")
    path.parent.mkdir(parents=True)
    path.write_text(good.model_dump_json() + "\n" + '{"model_call_id": "b", "dial')
    harvest = store.harvest(1, "t", settle_seconds=0)
    assert ([call.model_call_id for call in harvest.calls], harvest.unreadable_lines, harvest.complete) == (
        ["a"],
        1,
        False,
    )


def test_a_harvest_waits_for_calls_in_flight(tmp_path: Path) -> None:
    async def scenario(proxy: Rig) -> None:
        request = asyncio.create_task(proxy.post("chat", stream=True, headers={"x-behave": "hold-last"}).__aenter__())
        await proxy.upstream.first_chunk_sent.wait()
        unsettled = await asyncio.to_thread(proxy.store.harvest, 1, "one", settle_seconds=0.1)
        assert (unsettled.calls, unsettled.still_in_flight) == ([], 1)
        harvest = asyncio.create_task(asyncio.to_thread(proxy.store.harvest, 1, "one", settle_seconds=10))
        proxy.upstream.release_last.set()
        response = await request
        await response.read()
        settled = await harvest
        assert (len(settled.calls), settled.still_in_flight, settled.complete) == (1, 0, True)

    run(tmp_path, scenario)


def test_config_refuses_a_bad_upstream() -> None:
    with pytest.raises(ValueError, match="http"):
        replace(ProxyConfig(upstream="ftp://x", store=Path("/tmp"))).origin  # noqa: B018


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (["--upstream", "http://model.test:8000/v1"], "--upstream-address: the upstream's host model.test is not"),
        (["--upstream", "http://model.test/v1", "--upstream-address", "model.test"], "must be an IP address"),
        (["--upstream", "http://model.test/v1/../admin", "--upstream-address", "198.18.0.1"], "dot segment"),
        (["--upstream", "ftp://model.test/v1"], "must be an http(s) URL"),
    ],
)
def test_the_proxy_command_refuses_an_upstream_it_would_have_to_resolve_itself(
    tmp_path: Path, arguments: list[str], problem: str
) -> None:
    """No hostname without the operator's addresses: the proxy never falls back to the pod's resolver."""
    refused = episode_operator("capture-proxy", "--store", str(tmp_path), *arguments)
    assert refused.returncode == 2 and problem in refused.stderr, refused.stderr
    assert not (tmp_path / "ready.json").exists()
