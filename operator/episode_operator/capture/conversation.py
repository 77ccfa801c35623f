"""A model call's conversation in one shape, whatever the dialect: system, user, assistant and tool entries.

Each dialect spells the same conversation its own way (chat ``messages`` with ``tool`` roles; Responses
``instructions`` and ``input`` items, where one answer is several items; Messages ``system`` and content
blocks, where tool results ride in a user message). Reading them into :class:`Entry` lists lets the
trajectory builder compare calls (does this request continue that one?) and turn them into steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from episode_operator.capture.records import json_arguments
from episode_operator.capture.wire import Dialect

EntryKind = Literal["system", "user", "assistant", "tool"]
ROLE_KINDS: dict[str, EntryKind] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
IMAGE = "[image]"


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class Entry:
    kind: EntryKind
    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_id: str | None = None  # a tool result's call
    # Where a request spelled it: the index of its (last) message or item in the request's list, so that
    # what belongs on it can be put back there (capture/correction.py). Not part of what it says.
    at: int | None = field(default=None, compare=False)

    def key(self) -> tuple[Any, ...]:
        """What must match for two spellings to be the same entry (reasoning is often dropped on resend)."""
        calls = tuple(
            call.call_id or f"{call.name}:{json.dumps(call.arguments, sort_keys=True)}" for call in self.tool_calls
        )
        return (self.kind, " ".join(self.text.split()), calls, self.call_id)


def text_of(content: Any) -> str:
    """The text of a content value: a string, or parts (text kept, images marked, other parts dropped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    texts = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping):
            kind = part.get("type")
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image", "image_url", "input_image"):
                texts.append(IMAGE)
            elif kind == "tool_result":
                texts.append(text_of(part.get("content")))
    return "\n".join(text for text in texts if text)


def _merge_assistant(entries: list[Entry]) -> Entry:
    """The latest entry if it is the assistant's, else a new assistant entry appended."""
    if not entries or entries[-1].kind != "assistant":
        entries.append(Entry("assistant"))
    return entries[-1]


def _add_reasoning(entry: Entry, text: str | None) -> None:
    if text:
        entry.reasoning = f"{entry.reasoning}\n{text}" if entry.reasoning else text


# --- chat completions --------------------------------------------------------------------------------
def _chat_message(entries: list[Entry], message: Mapping[str, Any]) -> Entry | None:
    """Read a message into ``entries``; the entry it made (None: a role that says nothing here)."""
    kind = ROLE_KINDS.get(str(message.get("role")))
    if kind is None:
        return None
    if kind == "tool":
        entries.append(Entry("tool", text_of(message.get("content")), call_id=message.get("tool_call_id")))
        return entries[-1]
    if kind != "assistant":
        entries.append(Entry(kind, text_of(message.get("content"))))
        return entries[-1]
    entry = Entry("assistant", text_of(message.get("content")))
    _add_reasoning(entry, message.get("reasoning_content") or message.get("reasoning"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        entry.tool_calls.append(
            ToolCall(
                str(call.get("id") or ""), str(function.get("name") or ""), json_arguments(function.get("arguments"))
            )
        )
    entries.append(entry)
    return entry


def chat_request(request: Mapping[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    for index, message in enumerate(request.get("messages") or []):
        if isinstance(message, Mapping) and (entry := _chat_message(entries, message)) is not None:
            entry.at = index
    return entries


def chat_response(response: Mapping[str, Any]) -> list[Entry]:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return []
    message = choices[0].get("message")
    entries: list[Entry] = []
    if isinstance(message, Mapping):
        _chat_message(entries, {**message, "role": "assistant"})
    return entries


# --- Responses ---------------------------------------------------------------------------------------
def _responses_item(entries: list[Entry], item: Mapping[str, Any]) -> Entry | None:
    """Read an item into ``entries`` (one answer's items merge into one entry); the entry it went into."""
    kind = item.get("type", "message")
    if kind == "message":
        role = ROLE_KINDS.get(str(item.get("role")))
        if role == "assistant":
            entry = _merge_assistant(entries)
            entry.text = "\n".join(text for text in (entry.text, text_of(item.get("content"))) if text)
            return entry
        if role is not None:
            entries.append(Entry(role, text_of(item.get("content"))))
            return entries[-1]
    elif kind in ("function_call", "custom_tool_call"):
        arguments = json_arguments(item.get("arguments")) if kind == "function_call" else {"input": item.get("input")}
        call_id = str(item.get("call_id") or item.get("id") or "")
        entry = _merge_assistant(entries)
        entry.tool_calls.append(ToolCall(call_id, str(item.get("name") or ""), arguments))
        return entry
    elif kind in ("function_call_output", "custom_tool_call_output"):
        entries.append(Entry("tool", text_of(item.get("output")), call_id=item.get("call_id")))
        return entries[-1]
    elif kind == "reasoning":
        summary = [part.get("text") for part in item.get("summary") or [] if isinstance(part, Mapping)]
        entry = _merge_assistant(entries)
        _add_reasoning(entry, "\n".join(text for text in summary if isinstance(text, str)) or None)
        return entry
    return None


def responses_request(request: Mapping[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    if isinstance(request.get("instructions"), str) and request["instructions"]:
        entries.append(Entry("system", request["instructions"]))
    items = request.get("input")
    if isinstance(items, str):
        entries.append(Entry("user", items))
    for index, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, Mapping) and (entry := _responses_item(entries, item)) is not None:
            entry.at = index
    return entries


def responses_response(response: Mapping[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    for item in response.get("output") or []:
        if isinstance(item, Mapping):
            _responses_item(entries, item)
    # Everything a response says is one answer.
    return [entry for entry in entries if entry.kind == "assistant"][:1]


# --- Anthropic Messages --------------------------------------------------------------------------------
def _messages_blocks(entries: list[Entry], role: str, content: Any) -> None:
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if role == "assistant":
            entry = _merge_assistant(entries)
            if kind == "text":
                entry.text = "\n".join(text for text in (entry.text, block.get("text") or "") if text)
            elif kind == "thinking":
                _add_reasoning(entry, block.get("thinking"))
            elif kind in ("tool_use", "server_tool_use"):
                entry.tool_calls.append(
                    ToolCall(str(block.get("id") or ""), str(block.get("name") or ""), dict(block.get("input") or {}))
                )
        elif kind == "tool_result":
            entries.append(Entry("tool", text_of(block.get("content")), call_id=block.get("tool_use_id")))
        elif entries and entries[-1].kind == "user":
            entries[-1].text = "\n".join(text for text in (entries[-1].text, text_of([block])) if text)
        else:
            entries.append(Entry("user", text_of([block])))


def messages_request(request: Mapping[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    system = text_of(request.get("system"))
    if system:
        entries.append(Entry("system", system))
    for message in request.get("messages") or []:
        if isinstance(message, Mapping) and message.get("role") in ("user", "assistant"):
            if message["role"] == "assistant":
                entries.append(Entry("assistant"))
            _messages_blocks(entries, message["role"], message.get("content"))
    return entries


def messages_response(response: Mapping[str, Any]) -> list[Entry]:
    entries: list[Entry] = [Entry("assistant")]
    _messages_blocks(entries, "assistant", response.get("content"))
    return entries


READERS: dict[
    Dialect, tuple[Callable[[Mapping[str, Any]], list[Entry]], Callable[[Mapping[str, Any]], list[Entry]]]
] = {
    "chat": (chat_request, chat_response),
    "responses": (responses_request, responses_response),
    "messages": (messages_request, messages_response),
}


def request_entries(dialect: Dialect, request: Mapping[str, Any]) -> list[Entry]:
    return READERS[dialect][0](request)


def response_entries(dialect: Dialect, response: Mapping[str, Any]) -> list[Entry]:
    return READERS[dialect][1](response)


def is_prefix(prefix: Iterable[Entry], entries: list[Entry]) -> bool:
    keys = [entry.key() for entry in prefix]
    return len(keys) <= len(entries) and all(key == entry.key() for key, entry in zip(keys, entries, strict=False))
