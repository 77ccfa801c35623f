#!/usr/bin/env python3
"""A scripted model server: the one test double of the harness tests.

Real harnesses (mini-swe-agent, opencode, claude-code, codex, qwen-code) need a model endpoint,
and no real model is reachable from the test machines. This server speaks the three wire protocols those
harnesses use -- OpenAI chat completions (``/v1/chat/completions``), OpenAI Responses
(``/v1/responses``) and Anthropic Messages (``/v1/messages``), each as JSON or as an SSE stream --
and answers from a script, so a test can say "for the instruction of turn 1, run
``echo hi > /app/hello.txt``, then finish" and the harness really runs that command.

It uses only the Python standard library, so it runs in any image with a python3 (the sandbox
image, delivered as a ConfigMap) or on the host.

The script (JSON; YAML when PyYAML happens to be importable) is a list of rules::

    {"rules": [
      {"name": "turn-1",
       "when": {"prompt": "Create hello.txt", "tools": true},
       "steps": [{"run": "echo hi > /app/hello.txt"}, {"finish": "Done."}]},
      {"name": "outage", "when": {"prompt": "turn 2"}, "fail": {"status": 429}, "times": 2}
    ]}

A request is answered by the first rule whose ``when`` holds and whose ``times`` is not used up,
except that a rule with a ``prompt`` gives way to one whose prompt is in a later user message (in a
continued session the first instruction is still in the conversation; the newest one is answered):

- ``when.prompt``: a substring of a user message (the anchor); ``when.dialect``: ``chat``,
  ``responses`` or ``messages``; ``when.tools``: whether the request offers tools (a title or
  summary request offers none) -- or, from a harness whose model acts without tools, asks for an
  answer format this server writes (Terminus-2's keystrokes, aider's *file listing*);
  ``when.model``: the requested model name.
- ``steps`` are the replies, chosen by position without server state: the number of model replies
  already in the conversation after the anchoring user message (the last user message containing
  ``when.prompt``, else the first user message). Retries therefore get the same answer, and a
  continued session (``--continue``) starts its new instruction at step 0. Past the last step the
  server finishes. Step kinds:

  - ``{"run": "CMD"}``: call the harness's shell tool with CMD. The tool is picked from those the
    request offers (``bash``, ``Bash``, ``exec_command``, ``shell_command``, ``shell``,
    ``run_shell_command``, ``Shell``, ``run_commands``, ``terminal``) and its arguments from that
    tool's JSON schema (cline's takes a list of commands), so one script
    drives every harness. A harness that offers no tools but asks for its answers as JSON keystrokes
    (Terminus-2) offers its terminal: CMD is typed there
    (``{"commands": [{"keystrokes": "CMD\\n", ...}], "task_complete": false}``).
  - ``{"write": "PATH", "content": "TEXT"}``: make the file PATH hold TEXT: as a *file listing* to a
    harness that asks for that edit format (aider, which runs none of its model's commands), else as
    a ``run`` of ``printf '%s' TEXT > PATH``. A script of ``write`` and ``finish`` steps drives
    every harness.
  - ``{"tool": "NAME", "arguments": {...}}``: call any offered tool with literal arguments.
  - ``{"say": "TEXT"}`` / ``{"finish": "TEXT"}``: answer with text and no tool call. ``finish``
    ends the harness's loop: for a harness that ends only on a sentinel command it was told
    about (mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), it runs that command;
    Terminus-2 gets ``"task_complete": true`` (past the last step too, so its "are you sure?" is
    answered alike); a harness that ends only when its model calls a completion tool (cline's
    ``submit_and_exit``) gets that call.
- ``fail``: answer every matching request with an error instead: ``{"status": 401|429|500|...,
  "message": ..., "type": ..., "headers": {...}}``, ``{"kind": "context_window"}`` (the dialect's
  context-length error), ``{"kind": "garbage"}`` (200 with a body that is not the protocol),
  ``{"kind": "hang"}`` (never answer), ``{"kind": "drop"}`` (close the connection unanswered).
- ``times``: how many matching requests this rule answers before it stops matching.
- ``delay``: seconds before the first byte; ``stream_delay``: seconds between SSE events (a slow
  stream).

A request that asks for token ids gets them as its upstream would give them (the capture proxy asks so
with ``capture.tokenIds``), streamed or not:

- chat completions, as vLLM: ``return_token_ids`` puts ``prompt_token_ids`` beside the choices (on the
  first chunk of a stream) and the generation's ``token_ids`` on the choice (on the chunks that carry
  it); ``logprobs`` puts ``logprobs.content`` there (tokens spelled ``token_id:<n>`` under
  ``return_tokens_as_token_ids``).
- Responses, as vLLM: ``enable_response_messages`` adds ``input_messages`` and ``output_messages``, raw
  token messages (``{type: raw_message_tokens, message, tokens}``) of the prompt and the generation;
  ``include: [message.output_text.logprobs]`` puts each generated token's logprob on the output text
  (tokens spelled as text, as vLLM does without its ``--return-tokens-as-token-ids``). A stream's
  ``response.completed`` carries them, as vLLM's does.
- Messages: vLLM returns none there; asked in chat's names (``return_token_ids``), this server puts
  Gym's ``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs`` on the message (a
  stream: the prompt's on ``message_start``'s message, the generation's on ``message_delta``).

The ids are the bytes of the prompt's last message and of the reply, offset by 1000 (at most 64), so a
test can recompute them; every logprob is -0.5.

Requests that no rule matches are answered too (plain text, or a finish when tools are offered)
and recorded with ``"rule": null``, so a test can assert that nothing unscripted happened. Each
record names what the request let the model act with (``"offered"``: its tools' names, or the
answer format it asks for): the agent's own loop, as against a title or summary request.

Control endpoints (under ``/_scripted/``): ``GET health``, ``GET requests`` (every recorded
request, in order), ``DELETE requests``, ``PUT script`` (replace the script, counters reset).

Run: ``python3 server.py --script script.json [--host 0.0.0.0] [--port 8080] [--record FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CONTROL_PREFIX = "/_scripted/"

# Which protocol a path speaks, by its ending: harnesses put their own prefixes before it
# (``/v1``, Gym's ``/ng-rollout/<id>/v1``), and the server does not care.
DIALECT_BY_PATH_SUFFIX = {
    "/chat/completions": "chat",
    "/responses": "responses",
    "/messages": "messages",
}

# Sentinel commands a harness tells its model to run to end its loop; a `finish` step runs the one
# the conversation mentions instead of answering with text, which such a harness would reject.
FINISH_COMMANDS = ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",)

# Tools a harness ends its loop by, with the arguments a `finish` step calls them with: cline goes on
# (reminding its model to call it) after every answer that calls none, thousands of times.
FINISH_TOOLS: dict[str, dict[str, Any]] = {
    "submit_and_exit": {"verified": True},
}

# Shell tools, by the name each harness gives its own, in order of preference: cline's takes a list
# of commands; Hermes's is its terminal.
SHELL_TOOL_NAMES = (
    *("bash", "Bash", "exec_command", "shell_command", "shell", "run_shell_command", "Shell"),
    *("run_commands", "terminal"),
)

# Harnesses whose model acts without tools: their requests offer none, their prompt asks for every
# answer in a format of the harness's own, which this server writes. Such a format, known by the
# marks of the prompt that asks for it, is offered as a tool would be (``when.tools``, a record's
# ``offered``). Terminus-2 (Harbor's agent): a JSON object of keystrokes to type into its terminal,
# and `"task_complete": true` to end (twice: it asks to be sure). aider: the file edits of its one
# answer, in its whole-file *file listing* format.
KEYSTROKES = "keystrokes"
FILE_LISTING = "file listing"
ANSWER_FORMATS = {
    KEYSTROKES: ('"keystrokes"', '"task_complete"'),
    FILE_LISTING: ("You MUST use this *file listing* format",),
}
# How long Terminus-2 waits after typing a scripted command before it reads the screen.
KEYSTROKE_DURATION_SEC = 1.0

# What an error looks like for each status when the script gives no message or type.
DEFAULT_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "Incorrect API key provided"),
    403: ("permission_error", "Permission denied"),
    404: ("not_found_error", "Not found"),
    429: ("rate_limit_error", "Rate limit exceeded: too many requests, please retry later"),
    500: ("api_error", "Internal server error"),
    502: ("api_error", "Bad gateway"),
    503: ("overloaded_error", "The server is overloaded"),
}

# The context-window error each provider sends (the harnesses recognise these texts).
CONTEXT_WINDOW_ERRORS = {
    "chat": (
        "context_length_exceeded",
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. "
        "Please reduce the length of the messages.",
    ),
    "responses": (
        "context_length_exceeded",
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
    ),
    "messages": ("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
}

RULE_KEYS = {"name", "when", "steps", "fail", "times", "delay", "stream_delay"}
WHEN_KEYS = {"prompt", "dialect", "tools", "model"}
STEP_KINDS = {"run", "write", "tool", "say", "finish"}
# The key each step kind may carry besides its own.
STEP_EXTRAS = {"tool": "arguments", "write": "content"}
FAIL_KEYS = {"status", "message", "type", "code", "headers", "kind", "body"}
FAIL_KINDS = {"context_window", "garbage", "hang", "drop"}
DIALECTS = set(DIALECT_BY_PATH_SUFFIX.values())


class ScriptError(ValueError):
    """The script is malformed; the message names the rule and key."""


# --------------------------------------------------------------------------------------------
# the script


@dataclass
class Rule:
    """One rule of the script, validated."""

    name: str
    when: dict[str, Any]
    steps: list[dict[str, Any]]
    fail: dict[str, Any] | None
    times: int | None
    delay: float
    stream_delay: float
    used: int = 0


@dataclass
class Script:
    """The rules, in order, and the lock that guards their counters."""

    rules: list[Rule]
    lock: threading.Lock = field(default_factory=threading.Lock)


def parse_script(data: Any) -> Script:
    """Validate a script document (already decoded from JSON/YAML) into rules."""
    if not isinstance(data, dict) or set(data) - {"rules"}:
        raise ScriptError("a script is an object with one key, `rules` (a list)")
    rules_data = data.get("rules", [])
    if not isinstance(rules_data, list):
        raise ScriptError("`rules` must be a list")
    return Script([parse_rule(index, rule) for index, rule in enumerate(rules_data)])


def parse_rule(index: int, data: Any) -> Rule:
    """Validate one rule; errors name it by its name or position."""
    where = f"rules[{index}]"
    if not isinstance(data, dict):
        raise ScriptError(f"{where} must be an object")
    name = str(data.get("name") or where)
    where = f"rule {name!r}"
    if unknown := set(data) - RULE_KEYS:
        raise ScriptError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(RULE_KEYS)}")
    when = data.get("when") or {}
    if not isinstance(when, dict) or (unknown := set(when) - WHEN_KEYS):
        raise ScriptError(f"{where}: `when` takes {sorted(WHEN_KEYS)}")
    if "dialect" in when and when["dialect"] not in DIALECTS:
        raise ScriptError(f"{where}: when.dialect must be one of {sorted(DIALECTS)}")
    steps = data.get("steps") or []
    if not isinstance(steps, list):
        raise ScriptError(f"{where}: `steps` must be a list")
    for position, step in enumerate(steps):
        kinds = set(step) & STEP_KINDS if isinstance(step, dict) else set()
        if len(kinds) != 1 or set(step) - STEP_KINDS - set(STEP_EXTRAS.values()):
            raise ScriptError(f"{where}: steps[{position}] must have exactly one of {sorted(STEP_KINDS)}")
        for kind, extra in STEP_EXTRAS.items():
            if extra in step and kind not in step:
                raise ScriptError(f"{where}: steps[{position}]: `{extra}` goes with `{kind}`")
        if "write" in step and not isinstance(step.get("content"), str):
            raise ScriptError(f"{where}: steps[{position}]: `write` needs the file's `content` (a string)")
    fail = data.get("fail")
    if fail is not None:
        if not isinstance(fail, dict) or (unknown := set(fail) - FAIL_KEYS):
            raise ScriptError(f"{where}: `fail` takes {sorted(FAIL_KEYS)}")
        if "kind" in fail and fail["kind"] not in FAIL_KINDS:
            raise ScriptError(f"{where}: fail.kind must be one of {sorted(FAIL_KINDS)}")
        if "kind" not in fail and "status" not in fail:
            raise ScriptError(f"{where}: `fail` needs a `status` or a `kind`")
    if fail is not None and steps:
        raise ScriptError(f"{where}: a rule has `steps` or `fail`, not both")
    times = data.get("times")
    if times is not None and (not isinstance(times, int) or times < 1):
        raise ScriptError(f"{where}: `times` must be a positive integer")
    return Rule(
        name=name,
        when=when,
        steps=steps,
        fail=fail,
        times=times,
        delay=float(data.get("delay", 0)),
        stream_delay=float(data.get("stream_delay", 0)),
    )


def load_script_file(path: Path) -> Script:
    """Read a script file: JSON, or YAML if its name says so and PyYAML is importable."""
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml  # type: ignore[import-untyped,unused-ignore]  # only when the caller chose YAML

        return parse_script(yaml.safe_load(text))
    return parse_script(json.loads(text))


# --------------------------------------------------------------------------------------------
# reading a request: one conversation shape for the three dialects


@dataclass
class Item:
    """One entry of a conversation: who said it and its text."""

    role: str  # system | user | assistant | tool
    text: str


def text_of(content: Any) -> str:
    """The text of a message content in any dialect: a string or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(part) for part in content)
    if isinstance(content, dict):
        for key in ("text", "content", "output", "input_text"):
            if key in content:
                return text_of(content[key])
    return ""


def conversation(dialect: str, body: dict[str, Any]) -> list[Item]:
    """Flatten a request into (role, text) items; tool calls count as assistant, results as tool."""
    items: list[Item] = []
    if dialect == "chat":
        for message in body.get("messages") or []:
            role = message.get("role", "user")
            role = "system" if role == "developer" else role
            items.append(Item(role, text_of(message.get("content"))))
    elif dialect == "responses":
        if body.get("instructions"):
            items.append(Item("system", text_of(body["instructions"])))
        entries = body.get("input") or []
        if isinstance(entries, str):
            entries = [{"type": "message", "role": "user", "content": entries}]
        for entry in entries:
            kind = entry.get("type", "message")
            if kind == "message":
                role = entry.get("role", "user")
                role = "system" if role == "developer" else role
                items.append(Item(role, text_of(entry.get("content"))))
            elif kind.endswith("_call_output"):
                items.append(Item("tool", text_of(entry.get("output"))))
            elif kind.endswith("_call") or kind == "reasoning":
                items.append(Item("assistant", ""))
    else:
        system = body.get("system")
        if system:
            items.append(Item("system", text_of(system)))
        for message in body.get("messages") or []:
            role = message.get("role", "user")
            content = message.get("content")
            if role == "user" and isinstance(content, list) and content:
                results = [part for part in content if isinstance(part, dict) and part.get("type") == "tool_result"]
                others = [part for part in content if part not in results]
                items.extend(Item("tool", text_of(part.get("content"))) for part in results)
                if others:
                    items.append(Item("user", text_of(others)))
                continue
            items.append(Item(role, text_of(content)))
    return items


def offered_tools(dialect: str, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The request's tools by name, each as its JSON schema of parameters (empty if none)."""
    tools: dict[str, dict[str, Any]] = {}
    for tool in body.get("tools") or []:
        if dialect == "chat":
            function = tool.get("function") or {}
            name, schema = function.get("name"), function.get("parameters")
        elif dialect == "responses":
            name, schema = tool.get("name") or tool.get("type"), tool.get("parameters")
        else:
            name, schema = tool.get("name"), tool.get("input_schema")
        if name:
            tools[str(name)] = schema if isinstance(schema, dict) else {}
    return tools


def request_tools(dialect: str, body: dict[str, Any], items: list[Item]) -> dict[str, dict[str, Any]]:
    """What the request lets the model act with: its tools, or else the answer formats its prompt asks
    for (ANSWER_FORMATS: Terminus-2's terminal, aider's file listing), each as a tool of no schema."""
    tools = offered_tools(dialect, body)
    if tools:
        return tools
    said = "\n".join(item.text for item in items if item.role in ("system", "user"))
    return {name: {} for name, marks in ANSWER_FORMATS.items() if all(mark in said for mark in marks)}


def requested_stream(dialect: str, body: dict[str, Any]) -> bool:
    """Whether the client asked for SSE."""
    return bool(body.get("stream"))


# --------------------------------------------------------------------------------------------
# deciding the answer


@dataclass
class Decision:
    """What to answer one request with."""

    rule: Rule | None
    step_index: int | None
    action: dict[str, Any]  # a step ({"run": ...}) or {"fail": {...}}


def anchor_index(items: list[Item], prompt: str | None) -> int | None:
    """Position of the user message a rule's steps count from, or None if it is absent."""
    users = [index for index, item in enumerate(items) if item.role == "user"]
    if prompt is None:
        return users[0] if users else None
    matching = [index for index in users if prompt in items[index].text]
    return matching[-1] if matching else None


def replies_since(items: list[Item], anchor: int) -> int:
    """How many model replies follow the anchor: runs of assistant items count once."""
    replies, previous = 0, None
    for item in items[anchor + 1 :]:
        if item.role == "assistant" and previous != "assistant":
            replies += 1
        previous = item.role
    return replies


def rule_matches(rule: Rule, dialect: str, body: dict[str, Any], items: list[Item], tools: dict[str, Any]) -> bool:
    """Whether every condition of the rule's `when` holds for this request."""
    when = rule.when
    if "dialect" in when and when["dialect"] != dialect:
        return False
    if "tools" in when and bool(when["tools"]) != bool(tools):
        return False
    if "model" in when and when["model"] != body.get("model"):
        return False
    if rule.times is not None and rule.used >= rule.times:
        return False
    return anchor_index(items, when.get("prompt")) is not None


def decide(script: Script, dialect: str, body: dict[str, Any]) -> Decision:
    """Pick the rule and step for a request (and count the rule's use).

    Rules are tried in order, but a rule with a `prompt` gives way to one whose prompt anchors
    at a later user message: in a continued session turn 1's instruction is still in the
    conversation, and the model answers the latest instruction, not the first.
    """
    items = conversation(dialect, body)
    tools = request_tools(dialect, body, items)
    with script.lock:
        matching = [rule for rule in script.rules if rule_matches(rule, dialect, body, items, tools)]
        anchors = {id(rule): anchor_index(items, rule.when.get("prompt")) for rule in matching}
        latest = max((anchors[id(rule)] or 0 for rule in matching if "prompt" in rule.when), default=0)
        for rule in matching:
            anchor = anchors[id(rule)]
            assert anchor is not None  # rule_matches checked it
            if "prompt" in rule.when and anchor < latest:
                continue
            rule.used += 1
            if rule.fail is not None:
                return Decision(rule, None, {"fail": rule.fail})
            index = replies_since(items, anchor)
            step = rule.steps[index] if index < len(rule.steps) else {"finish": "Done."}
            return Decision(rule, index, step)
    fallback = {"finish": "No scripted rule matched this request."} if tools else {"say": "Scripted reply"}
    return Decision(None, None, fallback)


@dataclass
class Reply:
    """A model reply, dialect-neutral: text and tool calls ({id, name, arguments})."""

    text: str
    tool_calls: list[dict[str, Any]]


def shell_arguments(name: str, schema: dict[str, Any], command: str) -> dict[str, Any]:
    """Arguments for a shell tool, shaped by its JSON schema."""
    properties = schema.get("properties") or {}
    if (properties.get("commands") or {}).get("type") == "array":
        arguments: dict[str, Any] = {"commands": [command]}
    elif "cmd" in properties:
        arguments = {"cmd": command}
    elif (properties.get("command") or {}).get("type") == "array":
        arguments = {"command": ["bash", "-lc", command]}
    else:
        arguments = {"command": command}
    if "description" in properties:
        arguments["description"] = "Run a scripted command"
    return arguments


def render_step(step: dict[str, Any], items: list[Item], tools: dict[str, dict[str, Any]]) -> Reply:
    """Turn a script step into a reply for this request's tools and conversation."""
    call_id = f"call_{uuid.uuid4().hex[:24]}"
    if "write" in step:
        path, content = str(step["write"]), str(step["content"])
        if FILE_LISTING in tools:
            # aider's whole-file format: the path alone on a line, then the whole content fenced.
            ending = "" if content.endswith("\n") else "\n"
            return Reply(f"Writing {path}.\n\n{path}\n```\n{content}{ending}```\n", [])
        step = {"run": f"printf '%s' {shlex.quote(content)} > {shlex.quote(path)}"}
    if KEYSTROKES in tools and ("run" in step or "finish" in step):
        return Reply(keystroke_answer(step), [])
    if "finish" in step:
        finishing = next((name for name in FINISH_TOOLS if name in tools), None)
        if finishing is not None:
            # cline's summary must be 10 characters or more.
            arguments = {"summary": f"Finished: {step['finish']}", **FINISH_TOOLS[finishing]}
            return Reply("", [{"id": call_id, "name": finishing, "arguments": arguments}])
        said = " ".join(item.text for item in items if item.role in ("system", "user"))
        sentinel = next((command for command in FINISH_COMMANDS if command in said), None)
        if sentinel is None or not tools:
            return Reply(str(step["finish"]), [])
        step = {"run": sentinel}
    if "say" in step:
        return Reply(str(step["say"]), [])
    if "tool" in step:
        name = str(step["tool"])
        return Reply("", [{"id": call_id, "name": name, "arguments": step.get("arguments") or {}}])
    command = str(step["run"])
    name = next((candidate for candidate in SHELL_TOOL_NAMES if candidate in tools), None)
    if name is None:
        # No shell tool offered: answer as a text-based harness expects, a fenced bash block.
        return Reply(f"Running a scripted command.\n\n```bash\n{command}\n```", [])
    return Reply(
        "Running a scripted command.",
        [{"id": call_id, "name": name, "arguments": shell_arguments(name, tools[name], command)}],
    )


def keystroke_answer(step: dict[str, Any]) -> str:
    """A `run` or `finish` step as Terminus-2's JSON answer: the command typed and run, or the task complete."""
    if "run" in step:
        command = str(step["run"])
        answer = {
            "analysis": "Running a scripted command.",
            "plan": f"Run {command}",
            "commands": [{"keystrokes": command + "\n", "duration": KEYSTROKE_DURATION_SEC}],
            "task_complete": False,
        }
    else:
        answer = {"analysis": str(step["finish"]), "plan": "", "commands": [], "task_complete": True}
    return json.dumps(answer, indent=2)


# --------------------------------------------------------------------------------------------
# writing the answer, per dialect


def usage_numbers(body: dict[str, Any], reply: Reply) -> tuple[int, int]:
    """Rough token counts (4 characters a token), so harnesses that track usage see numbers."""
    prompt = max(1, len(json.dumps(body)) // 4)
    completion = max(1, (len(reply.text) + len(json.dumps([c["arguments"] for c in reply.tool_calls]))) // 4)
    return prompt, completion


def chat_json(model: str, reply: Reply, usage: tuple[int, int], body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in reply.tool_calls
        ]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
    }
    answer: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }
    if body.get("return_token_ids"):
        answer["prompt_token_ids"] = prompt_token_ids("chat", body)
    choice |= chat_token_fields(generation_token_ids(reply), body)
    return answer


LOG_PROB = -0.5  # every token's


def token_ids(text: str) -> list[int]:
    """The scripted "tokenizer": a token per byte of ``text`` (at most 64), offset by 1000."""
    return [1000 + byte for byte in text.encode()[:64]]


def token_text(token: int) -> str:
    """A token as text (the inverse of :func:`token_ids`, one byte)."""
    return bytes([token - 1000]).decode("utf-8", "replace")


def prompt_token_ids(dialect: str, body: dict[str, Any]) -> list[int]:
    """The prompt's token ids: its last message's (or item's) content."""
    history = body.get("input" if dialect == "responses" else "messages")
    if not isinstance(history, list):
        return token_ids(json.dumps(history))
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    return token_ids(json.dumps(last.get("content", last.get("output"))))


def generation_token_ids(reply: Reply) -> list[int]:
    return token_ids(reply.text + json.dumps([c["arguments"] for c in reply.tool_calls]))


def chat_token_fields(tokens: list[int], body: dict[str, Any]) -> dict[str, Any]:
    """What a chat choice (or a chunk's) carries of the generated ``tokens``, as the request asked."""
    fields: dict[str, Any] = {}
    if body.get("return_token_ids"):
        fields["token_ids"] = tokens
    if body.get("logprobs"):
        spell = (lambda n: f"token_id:{n}") if body.get("return_tokens_as_token_ids") else token_text
        entries = [{"token": spell(n), "logprob": LOG_PROB, "bytes": None, "top_logprobs": []} for n in tokens]
        fields["logprobs"] = {"content": entries}
    return fields


def chat_events(model: str, reply: Reply, usage: tuple[int, int], body: dict[str, Any]) -> Iterator[str]:
    """chat.completion.chunk events, then [DONE]."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model

    # The generation's token ids go on the chunks that carry text or arguments, a token a byte, what is
    # left on the last; the prompt's on the first chunk (vLLM's stream with ``return_token_ids``).
    generated = generation_token_ids(reply)

    def chunk(delta: dict[str, Any], finish: str | None = None, first: bool = False) -> str:
        nonlocal generated
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        text = delta.get("content") or "".join(c["function"].get("arguments", "") for c in delta.get("tool_calls", []))
        tokens, generated = (
            (generated, []) if finish else (generated[: len(text.encode())], generated[len(text.encode()) :])
        )
        if tokens:
            choice |= chat_token_fields(tokens, body)
        prompt = {"prompt_token_ids": prompt_token_ids("chat", body)} if first and body.get("return_token_ids") else {}
        return sse(None, base | prompt | {"choices": [choice]})

    yield chunk({"role": "assistant", "content": ""}, first=True)
    if reply.text:
        for piece in pieces(reply.text):
            yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": ""},
        }
        yield chunk({"tool_calls": [head]})
        for piece in pieces(json.dumps(call["arguments"])):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
    if (body.get("stream_options") or {}).get("include_usage"):
        numbers = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
        yield sse(None, base | {"choices": [], "usage": numbers})
    yield "data: [DONE]\n\n"


def responses_output(reply: Reply) -> list[dict[str, Any]]:
    """The output items of a Responses answer."""
    output: list[dict[str, Any]] = []
    if reply.text:
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for call in reply.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": call["name"],
                "arguments": json.dumps(call["arguments"]),
                "status": "completed",
            }
        )
    return output


def responses_json(
    model: str, reply: Reply, usage: tuple[int, int], body: dict[str, Any], status: str = "completed"
) -> dict[str, Any]:
    """A Responses `response` object, with vLLM's token ids and logprobs when ``body`` asks for them."""
    answer = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": responses_output(reply) if status == "completed" else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": sum(usage),
        },
    }
    generated = generation_token_ids(reply)
    if body.get("enable_response_messages"):
        raw = "raw_message_tokens"
        prompt = prompt_token_ids("responses", body)
        answer["input_messages"] = [{"type": raw, "message": "".join(map(token_text, prompt)), "tokens": prompt}]
        answer["output_messages"] = [{"type": raw, "message": "".join(map(token_text, generated)), "tokens": generated}]
    if "message.output_text.logprobs" in (body.get("include") or []):
        # vLLM puts every generated token's logprob on the output text (none without text to put them on).
        logprobs = [
            {"token": text, "logprob": LOG_PROB, "bytes": list(text.encode()), "top_logprobs": []}
            for text in map(token_text, generated)
        ]
        for item in answer["output"]:
            if item["type"] == "message":
                item["content"] = [part | {"logprobs": logprobs} for part in item["content"]]
    return answer


def responses_events(model: str, reply: Reply, usage: tuple[int, int], body: dict[str, Any]) -> Iterator[str]:
    """The Responses stream: created, per-item added/delta/done, completed."""
    final = responses_json(model, reply, usage, body)
    sequence = iter(range(1_000_000))

    def event(kind: str, **fields: Any) -> str:
        return sse(kind, {"type": kind, "sequence_number": next(sequence), **fields})

    pending = final | {"status": "in_progress", "output": []}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event(
                "response.output_item.added", output_index=index, item=item | {"status": "in_progress", "content": []}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event(
                "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
            )
            for piece in pieces(text):
                yield event(
                    "response.output_text.delta", item_id=item["id"], output_index=index, content_index=0, delta=piece
                )
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text)
            yield event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=item["content"][0],
            )
        else:
            yield event(
                "response.output_item.added", output_index=index, item=item | {"status": "in_progress", "arguments": ""}
            )
            for piece in pieces(item["arguments"]):
                yield event(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece
                )
            yield event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=final)


def messages_content(reply: Reply) -> list[dict[str, Any]]:
    """The content blocks of a Messages answer."""
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [
        {"type": "tool_use", "id": c["id"].replace("call_", "toolu_"), "name": c["name"], "input": c["arguments"]}
        for c in reply.tool_calls
    ]
    return content


def messages_json(model: str, reply: Reply, usage: tuple[int, int], body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic `message` object, with Gym's token fields when ``body`` asks in chat's names."""
    answer = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": messages_content(reply),
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    if body.get("return_token_ids"):
        generated = generation_token_ids(reply)
        answer["prompt_token_ids"] = prompt_token_ids("messages", body)
        answer["generation_token_ids"] = generated
        answer["generation_log_probs"] = [LOG_PROB] * len(generated)
    return answer


GENERATION_FIELDS = ("generation_token_ids", "generation_log_probs")


def messages_events(model: str, reply: Reply, usage: tuple[int, int], body: dict[str, Any]) -> Iterator[str]:
    """The Messages stream: message_start, blocks (start/delta/stop), message_delta, message_stop; token
    fields as its usage goes: the prompt's on the start, the generation's on the last delta."""
    final = messages_json(model, reply, usage, body)
    generation = {field: final.pop(field) for field in GENERATION_FIELDS if field in final}
    start = final | {"content": [], "stop_reason": None, "usage": final["usage"] | {"output_tokens": 0}}
    yield sse("message_start", {"type": "message_start", "message": start})
    yield sse("ping", {"type": "ping"})
    for index, block in enumerate(final["content"]):
        if block["type"] == "text":
            yield sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            )
            for piece in pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        else:
            opening = block | {"input": {}}
            yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening})
            for piece in pieces(json.dumps(block["input"])):
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    delta = {"stop_reason": final["stop_reason"], "stop_sequence": None}
    ending = {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage[1]}}
    yield sse("message_delta", ending | generation)
    yield sse("message_stop", {"type": "message_stop"})


def error_body(dialect: str, status: int, error_type: str, message: str, code: str | None) -> dict[str, Any]:
    """An error document as the dialect's provider sends it."""
    if dialect == "messages":
        return {"type": "error", "error": {"type": error_type, "message": message}}
    return {"error": {"message": message, "type": error_type, "param": None, "code": code or error_type}}


def sse(event: str | None, data: dict[str, Any]) -> str:
    """One SSE event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def pieces(text: str, size: int = 24) -> Iterator[str]:
    """A text cut into stream deltas."""
    for start in range(0, len(text), size):
        yield text[start : start + size]


# --------------------------------------------------------------------------------------------
# the HTTP server


def received() -> dict[str, float]:
    """When a request was read: wall clock, and CLOCK_MONOTONIC, which a process on the same kernel (the
    node's: containers get no time namespace) can compare with its own (bench/toolchain_start.py)."""
    return {"received_at": time.time(), "received_monotonic": time.monotonic()}


class Recorder:
    """Every request received, in order; optionally appended to a JSON-lines file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any]) -> None:
        """Record a request as soon as it is read (a request that is never answered is still seen)."""
        with self.lock:
            record["seq"] = len(self.records) + 1
            self.records.append(record)

    def update(self, record: dict[str, Any], **fields: Any) -> None:
        with self.lock:
            record.update(fields)

    def close(self, record: dict[str, Any]) -> None:
        """The request is answered (or given up): append its final form to the file."""
        if self.path is None:
            return
        with self.lock, self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return json.loads(json.dumps(self.records))

    def clear(self) -> None:
        with self.lock:
            self.records.clear()


class ScriptedServer(ThreadingHTTPServer):
    """The HTTP server, holding the script and the record."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], script: Script, recorder: Recorder) -> None:
        super().__init__(address, Handler)
        self.script = script
        self.recorder = recorder
        self.stopping = threading.Event()

    def shutdown(self) -> None:
        self.stopping.set()
        super().shutdown()


class Handler(BaseHTTPRequestHandler):
    """Answers one connection's requests: control endpoints, models list, the three dialects."""

    protocol_version = "HTTP/1.1"
    server: ScriptedServer

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"scripted-model: {self.address_string()} {format % args}\n")

    # -- plumbing

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def send_stream(self, events: Iterator[str], delay: float) -> None:
        """Write SSE events as a chunked body, `delay` seconds apart."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            if delay and self.server.stopping.wait(delay):
                return
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def hang(self) -> None:
        """Never answer: wait until the client goes away or the server stops."""
        self.close_connection = True
        while not self.server.stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.5)
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return

    # -- verbs

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == CONTROL_PREFIX + "health":
            self.send_json(200, {"ok": True})
        elif path == CONTROL_PREFIX + "requests":
            self.send_json(200, self.server.recorder.snapshot())
        elif path.endswith("/models"):
            self.server.recorder.add({**received(), "method": "GET", "path": self.path, "dialect": None})
            self.send_json(
                200, {"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "scripted"}]}
            )
        else:
            self.send_json(404, {"error": {"message": f"no such path: {path}", "type": "not_found_error"}})

    def do_DELETE(self) -> None:
        if self.path.split("?", 1)[0] == CONTROL_PREFIX + "requests":
            self.read_body()
            self.server.recorder.clear()
            self.send_json(200, {"ok": True})
        else:
            self.send_json(404, {"error": {"message": f"no such path: {self.path}", "type": "not_found_error"}})

    def do_PUT(self) -> None:
        if self.path.split("?", 1)[0] != CONTROL_PREFIX + "script":
            self.send_json(404, {"error": {"message": f"no such path: {self.path}", "type": "not_found_error"}})
            return
        try:
            script = parse_script(json.loads(self.read_body() or b"{}"))
        except (ValueError, ScriptError) as error:
            self.send_json(400, {"error": {"message": str(error), "type": "invalid_script"}})
            return
        self.server.script = script
        self.send_json(200, {"ok": True, "rules": [rule.name for rule in script.rules]})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        dialect = next((d for suffix, d in DIALECT_BY_PATH_SUFFIX.items() if path.endswith(suffix)), None)
        raw = self.read_body()
        record: dict[str, Any] = {**received(), "method": "POST", "path": self.path, "dialect": dialect}
        record["headers"] = {
            k.lower(): v for k, v in self.headers.items() if k.lower() not in ("authorization", "x-api-key")
        }
        record["api_key"] = self.api_key()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        record["body"] = body if body is not None else raw.decode(errors="replace")
        self.server.recorder.add(record)
        try:
            self.answer(record, dialect, body)
        finally:
            self.server.recorder.close(record)

    def answer(self, record: dict[str, Any], dialect: str | None, body: Any) -> None:
        """Answer a model request by the script."""
        if dialect is None or not isinstance(body, dict):
            status = 404 if dialect is None else 400
            self.server.recorder.update(record, status=status)
            self.send_json(
                status,
                error_body(dialect or "chat", status, "invalid_request_error", "not a request this server knows", None),
            )
            return
        decision = decide(self.server.script, dialect, body)
        items = conversation(dialect, body)
        tools = request_tools(dialect, body, items)
        self.server.recorder.update(
            record,
            rule=decision.rule.name if decision.rule else None,
            step=decision.step_index,
            action=decision.action,
            stream=requested_stream(dialect, body),
            offered=list(tools),
        )
        rule = decision.rule
        if rule is not None and rule.delay and self.server.stopping.wait(rule.delay):
            return
        if "fail" in decision.action:
            self.answer_failure(record, dialect, body, decision.action["fail"])
            return
        reply = render_step(decision.action, items, tools)
        self.server.recorder.update(record, status=200, reply={"text": reply.text, "tool_calls": reply.tool_calls})
        model = str(body.get("model") or "scripted")
        usage = usage_numbers(body, reply)
        stream_delay = rule.stream_delay if rule is not None else 0.0
        if not requested_stream(dialect, body):
            document = {"chat": chat_json, "responses": responses_json, "messages": messages_json}[dialect](
                model, reply, usage, body
            )
            self.send_json(200, document)
        else:
            events = {"chat": chat_events, "responses": responses_events, "messages": messages_events}[dialect]
            self.send_stream(events(model, reply, usage, body), stream_delay)

    def api_key(self) -> str | None:
        """The credential the client sent (Bearer token or x-api-key), for tests to check."""
        if key := self.headers.get("x-api-key"):
            return key
        authorization = self.headers.get("Authorization") or ""
        return authorization.removeprefix("Bearer ").strip() or None

    def answer_failure(self, record: dict[str, Any], dialect: str, body: dict[str, Any], fail: dict[str, Any]) -> None:
        kind = fail.get("kind")
        if kind == "hang":
            self.server.recorder.update(record, status=None)
            self.hang()
            return
        if kind == "drop":
            self.server.recorder.update(record, status=None)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind == "garbage":
            self.server.recorder.update(record, status=200)
            payload = b"<html>this is not what a model server says {{{"
            if requested_stream(dialect, body):
                self.send_stream(iter(["data: {not json\n\n", "data: [garbage]\n\n"]), 0.0)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if kind == "context_window":
            status = int(fail.get("status", 400))
            code, message = CONTEXT_WINDOW_ERRORS[dialect]
            error_type = "invalid_request_error"
        else:
            status = int(fail["status"])
            error_type, message = DEFAULT_ERRORS.get(status, ("api_error", f"HTTP {status}"))
            code = None
        error_type = str(fail.get("type", error_type))
        message = str(fail.get("message", message))
        document = fail.get("body") or error_body(dialect, status, error_type, message, fail.get("code", code))
        self.server.recorder.update(record, status=status)
        self.send_json(status, document, {str(k): str(v) for k, v in (fail.get("headers") or {}).items()})


def serve(script: Script, host: str, port: int, record: Path | None) -> ScriptedServer:
    """Start the server on a thread and return it (``shutdown()`` stops it)."""
    server = ScriptedServer((host, port), script, Recorder(record))
    # A short poll interval: shutdown() waits for it, and tests start and stop many servers.
    threading.Thread(target=server.serve_forever, args=(0.05,), name="scripted-model", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--script", type=Path, help="JSON (or YAML) script; no rules if absent")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--record", type=Path, help="append every request as a JSON line to this file")
    args = parser.parse_args(argv)
    try:
        script = load_script_file(args.script) if args.script else Script([])
    except (OSError, ValueError, ScriptError) as error:
        print(f"scripted-model: bad script {args.script}: {error}", file=sys.stderr)
        return 2
    server = ScriptedServer((args.host, args.port), script, Recorder(args.record))
    # As a pod's PID 1 the default SIGTERM action is ignored: stop promptly when the pod is deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"scripted-model: listening on {args.host}:{server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
