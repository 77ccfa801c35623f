"""What the proxy knows of the three model dialects on the wire: paths, key headers, request rewrites, SSE ends.

Declared as tables so that each rule is read in one place; :mod:`.proxy` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

# Gym's dialect names (``ModelCallRecord.dialect``).
Dialect = Literal["chat", "responses", "messages"]

# A model call is recognised by how its path ends, so any upstream prefix (``/v1``, ``/openai/v1``…) works.
DIALECT_PATH_SUFFIXES: tuple[tuple[str, Dialect], ...] = (
    ("/chat/completions", "chat"),
    ("/responses", "responses"),
    ("/messages", "messages"),
)


def dialect_of(method: str, path: str) -> Dialect | None:
    """The dialect of a request, or None for anything else (``GET /v1/models``…), which is forwarded too."""
    if method.upper() != "POST":
        return None
    stripped = path.rstrip("/")
    return next((dialect for suffix, dialect in DIALECT_PATH_SUFFIXES if stripped.endswith(suffix)), None)


def agent_base_url(host: str, port: int, upstream: str) -> str:
    """The base URL to give the agent: the proxy, with the upstream's path (``/v1``…) kept."""
    return f"http://{host}:{port}{urlsplit(upstream).path.rstrip('/')}"


# --- keys ---------------------------------------------------------------------------------------------
# The capture container's variable holding the real key (set from the Secret; nowhere else).
KEY_ENV = "EPISODE_CAPTURE_API_KEY"
# Every header a client may carry a key in, and how the real key is written back in it. The agent only
# ever holds a placeholder; whichever of these it sent is rewritten with the real key, the others dropped.
KEY_HEADERS: dict[str, str] = {
    "authorization": "Bearer {key}",  # OpenAI-compatible, and Anthropic's ANTHROPIC_AUTH_TOKEN
    "x-api-key": "{key}",  # Anthropic
    "api-key": "{key}",  # Azure OpenAI
}
# When the client sent no key header at all: the dialect's own.
DEFAULT_KEY_HEADER: dict[Dialect | None, str] = {
    "chat": "authorization",
    "responses": "authorization",
    "messages": "x-api-key",
    None: "authorization",
}
# Hop-by-hop headers (RFC 9110 §7.6.1) and those aiohttp recomputes: never copied between the two sides.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
    }
)
# Gym's correlation header: kept as ``client_session_id`` (evidence, not authentication).
CLIENT_SESSION_HEADER = "x-session-id"


def upstream_headers(incoming: Mapping[str, str], dialect: Dialect | None, key: str | None) -> dict[str, str]:
    """The headers sent upstream: the client's, minus hop-by-hop ones, with the real key in place of any other."""
    headers = {name: value for name, value in incoming.items() if name.lower() not in HOP_HEADERS}
    sent = [name for name in headers if name.lower() in KEY_HEADERS]
    for name in sent:
        del headers[name]
    if key:
        for name in {name.lower() for name in sent} or {DEFAULT_KEY_HEADER[dialect]}:
            headers[name] = KEY_HEADERS[name].format(key=key)
    # The record reassembles what it reads: ask for an uncompressed body.
    headers["accept-encoding"] = "identity"
    return headers


def downstream_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in upstream.items() if name.lower() not in HOP_HEADERS}


# --- request rewrites ------------------------------------------------------------------------------
# vLLM's token-id transport, exactly as Gym's vllm_model asks for it (return_token_id_information with
# request_prompt_and_generation_token_ids): the chosen token's logprob and id (``top_logprobs`` pinned
# to 0, since vLLM reads a null as "no logprobs"), tokens spelled ``token_id:<n>``, and the prompt's
# and generation's token ids in the response. Gym drives vLLM through chat completions only.
TOKEN_ID_PARAMS: dict[Dialect, dict[str, Any]] = {
    "chat": {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True},
}


def rewrite_request(body: dict[str, Any], dialect: Dialect | None, *, token_ids: bool) -> dict[str, Any]:
    """The body sent upstream (and recorded: the record says what the model was really asked).

    With ``token_ids``, a chat completion asks for vLLM's token ids and logprobs. A streamed chat
    completion asks for its usage (``stream_options.include_usage``, which the OpenAI protocol defines:
    one last chunk with empty ``choices``) when the client did not say, so token counts are recorded;
    Responses and Messages streams carry usage already.
    """
    rewritten = dict(body)
    if token_ids and dialect in TOKEN_ID_PARAMS:
        rewritten.update(TOKEN_ID_PARAMS[dialect])
    if dialect == "chat" and rewritten.get("stream") is True and "stream_options" not in rewritten:
        rewritten["stream_options"] = {"include_usage": True}
    return rewritten


# --- SSE ends --------------------------------------------------------------------------------------
# The event that ends a stream, per dialect, and what it means (Gym's ``_TERMINAL_SSE_LINES``): the proxy
# holds that event back until the record is durable, so a client that saw the end sees a stored call.
SseEnd = Literal["complete", "incomplete", "error"]
TERMINAL_EVENTS: dict[Dialect, dict[str, SseEnd]] = {
    "responses": {
        "event:response.completed": "complete",
        "event:response.incomplete": "incomplete",
        "event:response.failed": "error",
        "event:error": "error",
    },
    "chat": {"data:[DONE]": "complete", "event:error": "error"},
    "messages": {"event:message_stop": "complete", "event:error": "error"},
}
