"""The scripted model server speaks each dialect as its clients expect, JSON and SSE, and fails on cue.

The harness tests trust this double to stand in for a model provider: if it answered a shape no
real provider sends, a harness could pass against it and fail against the real thing. These tests
check each dialect's documents and streams field by field, the script's step counting (which is
what makes a harness run the scripted commands in order), and every failure a rule can order.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from episode_operator.capture.records import TOKEN_ID_READERS, TokenIds
from episode_operator.capture.sse import reassemble
from episode_operator.capture.wire import rewrite_request
from tests.scripted_model.server import (
    ScriptedServer,
    ScriptError,
    main,
    parse_script,
    serve,
)

INSTRUCTION = "Create hello.txt in /app"
COMMAND = "echo hi > /app/hello.txt"
BASH_TOOL_CHAT = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
}
EXEC_TOOL_RESPONSES = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}}},
}
BASH_TOOL_MESSAGES = {
    "name": "Bash",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
    },
}
TWO_STEPS = {
    "rules": [
        {
            "name": "turn-1",
            "when": {"prompt": INSTRUCTION, "tools": True},
            "steps": [{"run": COMMAND}, {"finish": "All done."}],
        }
    ]
}


@pytest.fixture
def start() -> Iterator[Callable[[dict[str, Any]], ScriptedServer]]:
    """Start servers on free loopback ports, each with its script; all are stopped after the test."""
    started: list[ScriptedServer] = []

    def start_server(script: dict[str, Any]) -> ScriptedServer:
        started.append(serve(parse_script(script), "127.0.0.1", 0, None))
        return started[-1]

    yield start_server
    for running in started:
        running.shutdown()
        running.server_close()


@pytest.fixture
def server(start: Callable[[dict[str, Any]], ScriptedServer]) -> ScriptedServer:
    """A server with the two-step script: run COMMAND, then finish."""
    return start(TWO_STEPS)


def post(server: ScriptedServer, path: str, body: dict[str, Any], timeout: float = 10) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=timeout)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-unit"}
    connection.request("POST", path, json.dumps(body), headers)
    return connection.getresponse()


def sse_events(response: http.client.HTTPResponse) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) of every SSE event; `[DONE]` stays a string."""
    events: list[tuple[str | None, Any]] = []
    for block in response.read().decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                raw = line.removeprefix("data: ")
                data = raw if raw == "[DONE]" else json.loads(raw)
        events.append((name, data))
    return events


# -- each dialect, as its clients read it: (tool calls, text) of one answer


def chat_answer(response: http.client.HTTPResponse, stream: bool) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    if not stream:
        message = json.loads(response.read())["choices"][0]["message"]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []
        ]
        return calls, message["content"] or ""
    events = sse_events(response)
    assert events[-1] == (None, "[DONE]")
    text, names, arguments, finish = "", {}, {}, None
    for _, chunk in events[:-1]:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        text += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                names[call["index"]] = call["function"]["name"]
            arguments[call["index"]] = arguments.get(call["index"], "") + call["function"].get("arguments", "")
        finish = choice["finish_reason"] or finish
    assert finish == ("tool_calls" if names else "stop")
    return [(names[i], json.loads(arguments[i])) for i in sorted(names)], text


def responses_answer(response: http.client.HTTPResponse, stream: bool) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    if stream:
        events = sse_events(response)
        kinds = [name for name, _ in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert all(data["type"] == name for name, data in events)
        assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
        done = [data["item"] for name, data in events if name == "response.output_item.done"]
        document = events[-1][1]["response"]
        assert document["output"] == done
    else:
        document = json.loads(response.read())
    assert document["object"] == "response" and document["status"] == "completed"
    assert set(document["usage"]) >= {"input_tokens", "output_tokens", "total_tokens"}
    calls = [
        (item["name"], json.loads(item["arguments"])) for item in document["output"] if item["type"] == "function_call"
    ]
    text = "".join(part["text"] for item in document["output"] if item["type"] == "message" for part in item["content"])
    return calls, text


def messages_answer(response: http.client.HTTPResponse, stream: bool) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    if not stream:
        document = json.loads(response.read())
        assert document["type"] == "message" and document["role"] == "assistant"
        calls = [(b["name"], b["input"]) for b in document["content"] if b["type"] == "tool_use"]
        assert document["stop_reason"] == ("tool_use" if calls else "end_turn")
        return calls, "".join(b["text"] for b in document["content"] if b["type"] == "text")
    events = sse_events(response)
    kinds = [name for name, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = data["content_block"] | {"partial": ""}
        elif name == "content_block_delta":
            delta = data["delta"]
            key = "text" if delta["type"] == "text_delta" else "partial"
            blocks[data["index"]][key] += delta["text" if key == "text" else "partial_json"]
    calls = [(b["name"], json.loads(b["partial"])) for b in blocks.values() if b["type"] == "tool_use"]
    assert events[-2][1]["delta"]["stop_reason"] == ("tool_use" if calls else "end_turn")
    return calls, "".join(b["text"] for b in blocks.values() if b["type"] == "text")


def chat_request(stream: bool, history: list[dict[str, Any]]) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": INSTRUCTION}]
    return {"model": "m", "messages": messages + history, "tools": [BASH_TOOL_CHAT], "stream": stream}


def chat_history() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": COMMAND})}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": ""},
    ]


def responses_request(stream: bool, history: list[dict[str, Any]]) -> dict[str, Any]:
    first = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": INSTRUCTION}]}
    return {
        "model": "m",
        "instructions": "agent",
        "input": [first, *history],
        "tools": [EXEC_TOOL_RESPONSES],
        "stream": stream,
    }


def responses_history() -> list[dict[str, Any]]:
    return [
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": json.dumps({"cmd": COMMAND})},
        {"type": "function_call_output", "call_id": "c1", "output": ""},
    ]


def messages_request(stream: bool, history: list[dict[str, Any]]) -> dict[str, Any]:
    first = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>x</system-reminder>"},
            {"type": "text", "text": INSTRUCTION},
        ],
    }
    return {
        "model": "m",
        "system": [{"type": "text", "text": "agent"}],
        "messages": [first, *history],
        "tools": [BASH_TOOL_MESSAGES],
        "stream": stream,
        "max_tokens": 100,
    }


def messages_history() -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": COMMAND}}
    return [
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": ""}]},
    ]


DIALECTS = {
    "chat": ("/v1/chat/completions", chat_request, chat_history, chat_answer, ("bash", {"command": COMMAND})),
    "responses": (
        "/v1/responses",
        responses_request,
        responses_history,
        responses_answer,
        ("exec_command", {"cmd": COMMAND}),
    ),
    "messages": (
        "/v1/messages",
        messages_request,
        messages_history,
        messages_answer,
        ("Bash", {"command": COMMAND, "description": "Run a scripted command"}),
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_each_dialect_runs_the_scripted_command_then_finishes(
    server: ScriptedServer, dialect: str, stream: bool
) -> None:
    path, request, history, answer, expected_call = DIALECTS[dialect]
    first = post(server, path, request(stream, []))
    assert first.status == 200
    assert first.getheader("Content-Type") == ("text/event-stream" if stream else "application/json")
    calls, _ = answer(first, stream)
    assert calls == [expected_call]

    second = post(server, path, request(stream, history()))
    calls, text = answer(second, stream)
    assert (calls, text) == ([], "All done.")

    records = server.recorder.snapshot()
    assert [(r["dialect"], r["rule"], r["step"], r["stream"], r["status"]) for r in records] == [
        (dialect, "turn-1", 0, stream, 200),
        (dialect, "turn-1", 1, stream, 200),
    ]
    assert records[0]["api_key"] == "sk-unit" and "authorization" not in records[0]["headers"]


def test_the_prefix_before_the_dialect_path_does_not_matter(server: ScriptedServer) -> None:
    calls, _ = chat_answer(post(server, "/ng-rollout/abc/v1/chat/completions", chat_request(False, [])), False)
    assert calls == [("bash", {"command": COMMAND})]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        (
            {"name": "shell", "parameters": {"properties": {"command": {"type": "array"}}}},
            {"command": ["bash", "-lc", COMMAND]},
        ),
        (
            {"name": "shell_command", "parameters": {"properties": {"command": {"type": "string"}}}},
            {"command": COMMAND},
        ),
        (
            {
                "name": "run_shell_command",
                "parameters": {
                    "properties": {"command": {"type": "string"}, "is_background": {"type": "boolean"}},
                    "required": ["command"],
                },
            },
            {"command": COMMAND},
        ),
        (
            {
                "name": "run_commands",
                "parameters": {
                    "properties": {"commands": {"type": "array", "items": {"type": "string"}}},
                    "required": ["commands"],
                },
            },
            {"commands": [COMMAND]},
        ),
        (
            {
                "name": "terminal",
                "parameters": {
                    "properties": {"command": {"type": "string"}, "background": {"type": "boolean"}},
                    "required": ["command"],
                },
            },
            {"command": COMMAND},
        ),
    ],
    ids=[
        "codex-shell-array",
        "codex-shell-command",
        "qwen-code-run-shell-command",
        "cline-run-commands-list",
        "hermes-terminal",
    ],
)
def test_shell_arguments_follow_the_offered_tool_schema(
    server: ScriptedServer, tool: dict[str, Any], arguments: dict[str, Any]
) -> None:
    body = responses_request(False, []) | {"tools": [{"type": "function", **tool}]}
    calls, _ = responses_answer(post(server, "/v1/responses", body), False)
    assert calls == [(tool["name"], arguments)]


def test_finish_runs_the_sentinel_a_harness_asked_for(server: ScriptedServer) -> None:
    """mini-swe-agent ends only on its submit command, which its own prompt tells the model."""
    body = chat_request(False, chat_history())
    body["messages"][1]["content"] += "\nFinish with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."
    calls, _ = chat_answer(post(server, "/v1/chat/completions", body), False)
    assert calls == [("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]


def test_finish_calls_the_completion_tool_of_a_harness_that_ends_only_on_it(server: ScriptedServer) -> None:
    """cline's loop goes on after any answer that calls no tool: a finish calls its submit_and_exit."""
    submit = {
        "type": "function",
        "function": {
            "name": "submit_and_exit",
            "parameters": {"properties": {"summary": {"type": "string"}, "verified": {"type": "boolean"}}},
        },
    }
    body = chat_request(False, chat_history()) | {"tools": [BASH_TOOL_CHAT, submit]}
    calls, _ = chat_answer(post(server, "/v1/chat/completions", body), False)
    [(name, arguments)] = calls
    assert name == "submit_and_exit" and arguments["verified"] is True
    assert len(arguments["summary"]) >= 10  # cline refuses a shorter one


def test_a_continued_session_starts_the_new_instruction_at_its_first_step(
    start: Callable[[dict[str, Any]], ScriptedServer],
) -> None:
    server = start(
        {
            "rules": [
                {"name": "t1", "when": {"prompt": "turn one"}, "steps": [{"run": "echo 1"}]},
                {"name": "t2", "when": {"prompt": "turn two"}, "steps": [{"run": "echo 2"}, {"finish": "two done"}]},
            ]
        }
    )
    """Under `--continue`, turn 2's request carries turn 1's conversation; steps count from turn 2's prompt."""
    turn_one = [{"role": "user", "content": "turn one"}, *chat_history(), {"role": "assistant", "content": "done"}]
    body = {"model": "m", "messages": [*turn_one, {"role": "user", "content": "turn two"}], "tools": [BASH_TOOL_CHAT]}
    calls, _ = chat_answer(post(server, "/v1/chat/completions", body), False)
    assert calls == [("bash", {"command": "echo 2"})]
    assert server.recorder.snapshot()[-1]["rule"] == "t2"


def test_terminus_2_gets_its_keystrokes_then_task_complete_until_it_stops_asking(server: ScriptedServer) -> None:
    """Terminus-2 offers no tools; its prompt asks for JSON keystrokes, and for task_complete twice."""
    prompt = (
        'Format your response as JSON: {"analysis": "...", "plan": "...", "commands": [{"keystrokes": "ls\\n", '
        f'"duration": 0.1}}], "task_complete": true}}\n\nTask Description:\n{INSTRUCTION}\n'
    )
    history: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    answers = []
    for _ in range(3):
        _, text = chat_answer(post(server, "/v1/chat/completions", {"model": "m", "messages": history}), False)
        answers.append(json.loads(text))
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": "New Terminal Output:\n$"}]
    typed, complete, confirmed = answers
    assert typed["commands"] == [{"keystrokes": COMMAND + "\n", "duration": 1.0}] and not typed["task_complete"]
    assert (complete["commands"], complete["task_complete"], complete["analysis"]) == ([], True, "All done.")
    assert confirmed["task_complete"] is True  # past the last step: the "are you sure?" is answered alike
    assert [r["rule"] for r in server.recorder.snapshot()] == ["turn-1"] * 3  # `tools: true` held


def test_requests_without_tools_get_text_and_unmatched_ones_are_recorded(server: ScriptedServer) -> None:
    title = {"model": "m", "messages": [{"role": "user", "content": f"Generate a title for: {INSTRUCTION}"}]}
    _, text = chat_answer(post(server, "/v1/chat/completions", title), False)
    other = chat_request(False, []) | {"messages": [{"role": "user", "content": "something unscripted"}]}
    calls, _ = chat_answer(post(server, "/v1/chat/completions", other), False)
    assert text and calls == []
    assert [r["rule"] for r in server.recorder.snapshot()] == [None, None]


# --- write steps: one script for harnesses that act by tools and for aider, which acts by file edits ---
WRITE = {
    "rules": [
        {
            "name": "write",
            "when": {"prompt": INSTRUCTION, "tools": True},
            "steps": [{"write": "/app/hello.txt", "content": "it's\n$HOME"}, {"finish": "Written."}],
        }
    ]
}
# aider's whole-file format, as its system prompt asks for it (aider/coders/wholefile_prompts.py).
AIDER_SYSTEM = (
    "Act as an expert software developer.\nTo suggest changes to a file you MUST return the entire content of "
    "the updated file.\nYou MUST use this *file listing* format:\n\npath/to/filename.js\n```\n// entire file\n```\n"
)


def test_a_write_step_is_a_shell_command_for_a_harness_with_a_shell_tool(
    start: Callable[[dict[str, Any]], ScriptedServer], tmp_path: Any
) -> None:
    import subprocess

    server = start(WRITE)
    calls, _ = chat_answer(post(server, "/v1/chat/completions", chat_request(False, [])), False)
    [(name, arguments)] = calls
    target = tmp_path / "hello.txt"
    subprocess.run(["sh", "-c", arguments["command"].replace("/app/hello.txt", str(target))], check=True)
    assert name == "bash" and target.read_text() == "it's\n$HOME"
    assert server.recorder.snapshot()[0]["offered"] == ["bash"]


def test_a_write_step_is_a_file_listing_for_aider_whose_requests_count_as_its_loop(
    start: Callable[[dict[str, Any]], ScriptedServer],
) -> None:
    server = start(WRITE)
    messages = [{"role": "system", "content": AIDER_SYSTEM}, {"role": "user", "content": INSTRUCTION}]
    for stream in (False, True):
        calls, text = chat_answer(
            post(server, "/v1/chat/completions", {"model": "m", "messages": messages, "stream": stream}), stream
        )
        # The path alone on its line, then the whole content fenced (a newline added before the fence).
        assert calls == [] and text.endswith("\n\n/app/hello.txt\n```\nit's\n$HOME\n```\n")
    # Without aider's prompt the same request is a title or summary request: no rule's loop.
    plain = {"model": "m", "messages": [{"role": "user", "content": INSTRUCTION}]}
    chat_answer(post(server, "/v1/chat/completions", plain), False)
    records = server.recorder.snapshot()
    assert [(r["rule"], r["step"], r["offered"]) for r in records] == [
        ("write", 0, ["file listing"]),
        ("write", 0, ["file listing"]),
        (None, None, []),
    ]


FAILURES = {
    "auth": ({"status": 401}, 401, "authentication_error"),
    "rate-limit": ({"status": 429, "headers": {"retry-after": "7"}}, 429, "rate_limit_error"),
    "server-error": ({"status": 500}, 500, "api_error"),
    "context-window": ({"kind": "context_window"}, 400, "invalid_request_error"),
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_error_answers_have_the_dialects_error_shape(
    start: Callable[[dict[str, Any]], ScriptedServer], dialect: str, failure: str
) -> None:
    fail, status, error_type = FAILURES[failure]
    path, request, _, _, _ = DIALECTS[dialect]
    response = post(start({"rules": [{"name": "f", "fail": fail}]}), path, request(True, []))
    document = json.loads(response.read())
    assert response.status == status
    error = document["error"]
    assert error["type"] == error_type and error["message"]
    if dialect == "messages":
        assert document["type"] == "error"
    if failure == "rate-limit":
        assert response.getheader("retry-after") == "7"
    if failure == "context-window":
        assert ("prompt is too long" if dialect == "messages" else "context") in error["message"]


def test_times_limits_a_rule_then_the_next_rule_answers(start: Callable[[dict[str, Any]], ScriptedServer]) -> None:
    server = start({"rules": [{"name": "flaky", "fail": {"status": 429}, "times": 2}, *TWO_STEPS["rules"]]})
    statuses = [post(server, "/v1/chat/completions", chat_request(False, [])).status for _ in range(3)]
    assert statuses == [429, 429, 200]
    assert [r["rule"] for r in server.recorder.snapshot()] == ["flaky", "flaky", "turn-1"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_garbage_is_a_200_that_no_client_can_parse(
    start: Callable[[dict[str, Any]], ScriptedServer], stream: bool
) -> None:
    server = start({"rules": [{"name": "garbage", "fail": {"kind": "garbage"}}]})
    response = post(server, "/v1/chat/completions", chat_request(stream, []))
    body = response.read().decode()
    assert response.status == 200
    with pytest.raises(ValueError):
        if stream:
            [json.loads(line.removeprefix("data: ")) for line in body.splitlines() if line.startswith("data: ")]
        else:
            json.loads(body)


def test_hang_never_answers_but_is_recorded(start: Callable[[dict[str, Any]], ScriptedServer]) -> None:
    server = start({"rules": [{"name": "hang", "fail": {"kind": "hang"}}]})
    with pytest.raises(TimeoutError):
        post(server, "/v1/messages", messages_request(False, []), timeout=1)
    [record] = server.recorder.snapshot()
    assert (record["rule"], record["status"]) == ("hang", None)


def test_drop_closes_the_connection_unanswered(start: Callable[[dict[str, Any]], ScriptedServer]) -> None:
    server = start({"rules": [{"name": "drop", "fail": {"kind": "drop"}}]})
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        post(server, "/v1/responses", responses_request(False, []))


def test_a_slow_stream_sends_its_first_event_and_then_stalls(start: Callable[[dict[str, Any]], ScriptedServer]) -> None:
    server = start({"rules": [{**TWO_STEPS["rules"][0], "stream_delay": 60}]})
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    connection.request(
        "POST", "/v1/chat/completions", json.dumps(chat_request(True, [])), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200  # headers come at once; the events do not
    connection.sock.settimeout(1)
    with pytest.raises((TimeoutError, socket.timeout)):
        response.read(1)


def test_control_endpoints_list_clear_and_replace(server: ScriptedServer) -> None:
    post(server, "/v1/chat/completions", chat_request(False, []))
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    connection.request("GET", "/_scripted/requests")
    assert len(json.loads(connection.getresponse().read())) == 1
    connection.request("DELETE", "/_scripted/requests")
    connection.getresponse().read()
    connection.request("PUT", "/_scripted/script", json.dumps({"rules": [{"name": "new", "fail": {"status": 500}}]}))
    assert json.loads(connection.getresponse().read())["rules"] == ["new"]
    connection.request("PUT", "/_scripted/script", json.dumps({"rules": [{"name": "bad", "steps": [{"jump": 1}]}]}))
    refused = connection.getresponse()
    assert refused.status == 400 and "bad" in json.loads(refused.read())["error"]["message"]
    assert post(server, "/v1/chat/completions", chat_request(False, [])).status == 500
    assert [r["rule"] for r in server.recorder.snapshot()] == ["new"]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"rules": [{"name": "r", "stepz": []}]}, "rule 'r': unknown key(s) ['stepz']"),
        (
            {"rules": [{"name": "r", "steps": [{"run": "x"}], "fail": {"status": 500}}]},
            "rule 'r': a rule has `steps` or `fail`",
        ),
        ({"rules": [{"when": {"dialect": "grpc"}}]}, "rule 'rules[0]': when.dialect"),
        ({"rules": [{"name": "r", "fail": {"kind": "explode"}}]}, "rule 'r': fail.kind"),
        ({"rules": [{"name": "r", "times": 0, "fail": {"status": 500}}]}, "rule 'r': `times`"),
        ({"rule": []}, "one key, `rules`"),
        ({"rules": [{"name": "r", "steps": [{"write": "/x"}]}]}, "`write` needs the file's `content`"),
        ({"rules": [{"name": "r", "steps": [{"run": "x", "content": "y"}]}]}, "`content` goes with `write`"),
    ],
)
def test_bad_scripts_are_refused_naming_the_rule_and_key(script: dict[str, Any], message: str) -> None:
    with pytest.raises(ScriptError, match=None) as error:
        parse_script(script)
    assert message in str(error.value)


def test_the_command_line_refuses_a_bad_script_file(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "script.json"
    path.write_text('{"rules": [{"name": "r", "steps": "run"}]}')
    assert main(["--script", str(path), "--port", "0"]) == 2
    assert f"bad script {path}: rule 'r': `steps` must be a list" in capsys.readouterr().err


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_call_asking_for_token_ids_gets_them_and_the_capture_reads_them(
    server: ScriptedServer, dialect: str, stream: bool
) -> None:
    """Asked as the capture proxy asks (capture/wire.py), each API answers as its upstream would, streamed or
    not; the capture's own readers (and its stream reassembly) take the ids the server made."""
    path, request, *_ = DIALECTS[dialect]
    body = request(stream, [])
    asked = rewrite_request(body, dialect, token_ids=True)  # type: ignore[arg-type]
    response = post(server, path, asked)
    answer = reassemble(response.read(), dialect) if stream else json.loads(response.read())  # type: ignore[arg-type]
    assert answer is not None
    reply = server.recorder.snapshot()[-1]["reply"]
    generated = reply["text"] + json.dumps([call["arguments"] for call in reply["tool_calls"]])
    history = body["input" if dialect == "responses" else "messages"]
    tokens = TOKEN_ID_READERS[dialect](answer)  # type: ignore[index]
    assert tokens.prompt_token_ids == [1000 + byte for byte in json.dumps(history[-1]["content"]).encode()[:64]]
    assert tokens.generation_token_ids == [1000 + byte for byte in generated.encode()[:64]]
    assert tokens.generation_log_probs == [-0.5] * len(tokens.generation_token_ids)
    response = post(server, path, body)
    plain = reassemble(response.read(), dialect) if stream else json.loads(response.read())  # type: ignore[arg-type]
    assert plain is not None and TOKEN_ID_READERS[dialect](plain) == TokenIds()  # type: ignore[index]
