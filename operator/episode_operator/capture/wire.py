"""What the proxy knows of the three model dialects on the wire: paths, key headers, request rewrites, SSE ends.

Declared as tables so that each rule is read in one place; :mod:`.proxy` applies them.
"""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

# Gym's dialect names (``ModelCallRecord.dialect``).
Dialect = Literal["chat", "responses", "messages"]


# --- routes ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """A request the proxy forwards (with the real key): ``method`` and ``path`` below the upstream's base
    path (``/v1``); ``{id}`` stands for one plain path segment. ``dialect``: the model call it is, None for
    a forwarded request that is no model call (a listing, a token count)."""

    method: str
    path: str
    dialect: Dialect | None


#: The model APIs' own routes, the only requests that reach the upstream: what the four harness presets
#: call (docs/harnesses.md), each dialect's neighbours that a ``command`` agent's SDK may call, and the
#: model listing. Anything else -- another method or path, a path outside the base path -- is answered
#: by the proxy with a 403 and recorded, never forwarded: the key opens the model API's routes only.
ROUTES: tuple[Route, ...] = (
    # Chat Completions: mini-swe-agent (litellm), opencode (@ai-sdk/openai-compatible).
    Route("POST", "/chat/completions", "chat"),
    Route("POST", "/completions", None),  # legacy completions (vLLM serves them); no Gym dialect
    # Responses: codex.
    Route("POST", "/responses", "responses"),
    # Messages: claude-code (``/v1/messages?beta=true``, and its token counting).
    Route("POST", "/messages", "messages"),
    Route("POST", "/messages/count_tokens", None),
    # Every dialect's model listing (OpenAI's and Anthropic's ``/v1/models[/{id}]``).
    Route("GET", "/models", None),
    Route("GET", "/models/{id}", None),
)
ROUTE_PARAMETER = "{id}"

# The characters of a request target the proxy reads: RFC 3986's unreserved ones and ``/`` in the path
# (``:`` and ``@`` too, for model ids such as ``ft:gpt-4o:org:id``); no ``%``: a percent-encoded ``/``
# or ``.`` would read as another path to a server that decodes it, so no encoding is taken at all.
PATH_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~/:@")
QUERY_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/?%")


@dataclass(frozen=True)
class Refused:
    """Why a request is not forwarded (the proxy's 403 says it, the record keeps it)."""

    detail: str


def is_ip_address(host: str) -> bool:
    """An IPv4 or IPv6 literal (connected to as it is, never resolved)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def base_path(upstream: str) -> str:
    """The upstream's base path (``/v1``), without a trailing slash; ``""`` for the root."""
    return urlsplit(upstream).path.rstrip("/")


def check_base_path(path: str) -> str | None:
    """What is wrong with a base URL's path for the proxy to serve routes below it (None: nothing)."""
    if path and (refused := _plain_path(path)) is not None:
        return refused.detail
    return None


def _plain_path(path: str) -> Refused | None:
    if not path.startswith("/"):
        return Refused("the request target is not a path")
    if "%" in path:
        return Refused("the path is percent-encoded")
    if not set(path) <= PATH_CHARACTERS:
        return Refused("the path has characters outside [A-Za-z0-9-._~/:@]")
    segments = path[1:].split("/")
    if "" in segments:
        return Refused("the path has an empty segment (a doubled or trailing slash)")
    if "." in segments or ".." in segments:
        return Refused("the path has a dot segment")
    return None


def route_of(method: str, target: str, base: str) -> Route | Refused:
    """The route a request target (as the client sent it: ``request.raw_path``) is, or why it is refused.

    The target is read as sent, never decoded or normalised: only a plain path below ``base`` that is
    one of :data:`ROUTES` passes, so what the upstream reads is what was checked.
    """
    path, _, query = target.partition("?")
    if (refused := _plain_path(path)) is not None:
        return refused
    if not set(query) <= QUERY_CHARACTERS:
        return Refused("the query has characters outside RFC 3986's")
    if base and not path.startswith(base + "/"):
        return Refused(f"the path is not below the model API's base path {base}")
    relative = path[len(base) :]
    for route in ROUTES:
        if route.method == method.upper() and _matches(route.path, relative):
            return route
    return Refused(f"{method.upper()} {relative} is not a route of the model API")


def _matches(pattern: str, path: str) -> bool:
    wanted, given = pattern.split("/"), path.split("/")
    return len(wanted) == len(given) and all(w in (g, ROUTE_PARAMETER) for w, g in zip(wanted, given, strict=True))


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
# vLLM's token-id transport, per API, as the proxy asks for it (``capture.tokenIds``): the fields it sets,
# and (TOKEN_ID_LIST_PARAMS) the values it adds to a list the client may have started. What each answer
# carries back is read by records.TOKEN_ID_READERS.
# - chat: exactly as Gym's vllm_model asks vLLM (return_token_id_information with
#   request_prompt_and_generation_token_ids): the chosen token's logprob and id (``top_logprobs`` pinned
#   to 0, since vLLM reads a null as "no logprobs"), tokens spelled ``token_id:<n>``, and the prompt's and
#   generation's token ids in the response.
# - responses: vLLM's Responses endpoint has no ``return_token_ids`` (nor does Gym ask it anything: its
#   vllm_model converts Responses to chat completions). The prompt's and generation's ids come as raw
#   token messages (``enable_response_messages``), the chosen tokens' logprobs on the output text
#   (``include: message.output_text.logprobs`` with ``top_logprobs`` 0).
# - messages: vLLM serves Anthropic's Messages through its chat-completions code and returns no token
#   ids there (Gym's Messages endpoint keeps them out of its answer too); the proxy asks in chat's names,
#   which that code reads, so an upstream that answers them is asked the way it understands.
TOKEN_ID_PARAMS: dict[Dialect, dict[str, Any]] = {
    "chat": {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True},
    "responses": {"top_logprobs": 0, "enable_response_messages": True},
    "messages": {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True},
}
TOKEN_ID_LIST_PARAMS: dict[Dialect, dict[str, tuple[str, ...]]] = {
    # codex sends ``include: ["reasoning.encrypted_content"]``: kept, the logprobs added.
    "responses": {"include": ("message.output_text.logprobs",)},
}


# spec.agent.model.params names a cap on the answer's length as ``max_tokens`` (chat completions'
# and Messages' name); the Responses API calls it ``max_output_tokens``. Chat completions has a
# second name for it, which the cap replaces (an endpoint refuses a request with both).
LENGTH_CAP: dict[Dialect, str] = {"chat": "max_tokens", "messages": "max_tokens", "responses": "max_output_tokens"}
# Every name of the length cap (spec.agent.model.params may use any of them: api/episode_resource.py).
LENGTH_CAP_NAMES = ("max_tokens", "max_output_tokens", "max_completion_tokens")


def sampling_params(params: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
    """``spec.agent.model.params`` as ``dialect`` names them (the length cap under its name there)."""
    named = {key: value for key, value in params.items() if key not in LENGTH_CAP_NAMES}
    cap = next((params[name] for name in LENGTH_CAP_NAMES if name in params), None)
    if cap is not None:
        named[LENGTH_CAP[dialect]] = cap
    return named


def rewrite_request(
    body: dict[str, Any], dialect: Dialect | None, *, token_ids: bool, params: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The body sent upstream (and recorded: the record says what the model was really asked).

    ``params`` (``spec.agent.model.params``) are set on every model call, over what the harness
    sent: an eval or a policy's rollouts sample as the Episode says, whatever the harness's defaults
    (or the agent) ask for. With ``token_ids``, every model call asks for vLLM's token ids and
    logprobs as its API spells them (:data:`TOKEN_ID_PARAMS`). A streamed chat completion asks for
    its usage (``stream_options.include_usage``, which the OpenAI protocol defines: one last chunk
    with empty ``choices``) when the client did not say, so token counts are recorded; Responses and
    Messages streams carry usage already.
    """
    rewritten = dict(body)
    if params and dialect is not None:
        if any(name in params for name in LENGTH_CAP_NAMES):
            for name in LENGTH_CAP_NAMES:
                rewritten.pop(name, None)
        rewritten.update(sampling_params(params, dialect))
    if token_ids and dialect is not None:
        rewritten.update(TOKEN_ID_PARAMS[dialect])
        for name, values in TOKEN_ID_LIST_PARAMS.get(dialect, {}).items():
            asked = rewritten.get(name)
            present: list[Any] = asked if isinstance(asked, list) else []
            rewritten[name] = [*present, *(value for value in values if value not in present)]
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
