"""The recording proxy: forwards the agent's model calls to the real endpoint and stores each exchange.

It runs as its own container in the agent's pod (``episode-operator capture-proxy``), listening on
loopback, which the agent shares. It alone holds the real key (from its environment, set from the
Secret), rewrites the placeholder key the agent sends, and scrubs the key from anything it passes on
or stores. A streamed answer goes to the client chunk by chunk as it arrives; only the chunk that ends
the stream waits until the call is recorded. A silent or unreachable endpoint gets a clean 502/504,
and no call outlives ``max_call_seconds``.

The agent runs as root beside it, in the same network namespace and with the same ``/etc/hosts`` and
``/etc/resolv.conf``, so the key goes only where the agent has no say:

- **To the pinned address.** The upstream's hostname is never resolved here: the operator resolved it
  when it made the pod (``--upstream-address``), and :class:`PinnedResolver` answers with those
  addresses and nothing else, while the URL keeps the hostname for the Host header, SNI and the
  certificate check. No environment proxy is used, no redirect followed.
- **On the model API's routes only** (:data:`~episode_operator.capture.wire.ROUTES`), read from the
  request target as sent: anything else is answered here with a 403 and recorded, never forwarded.

What is stored is bounded too: each body in a record (``max_record_bytes``: past it a body is
forwarded whole and recorded as its first bytes), and an attempt's journal (``max_journal_bytes``:
past it calls are answered here, the first of each turn recorded as ``capture_limit``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from episode_operator.capture.capture_store import (
    MAX_JOURNAL_BYTES,
    MAX_RECORD_BYTES,
    CallWriter,
    CaptureStore,
    TurnTracker,
)
from episode_operator.capture.correction import AnswerTokens
from episode_operator.capture.records import (
    CAPTURE_LIMIT,
    ROUTE_REFUSED,
    STREAM_END_CATEGORIES,
    TOKEN_ID_READERS,
    CapturedCall,
    ErrorCategory,
    classify_status,
)
from episode_operator.capture.sse import SseScanner, reassemble
from episode_operator.capture.wire import (
    CLIENT_SESSION_HEADER,
    Dialect,
    Refused,
    base_path,
    check_base_path,
    downstream_headers,
    is_ip_address,
    rewrite_request,
    route_of,
    upstream_headers,
)

log = logging.getLogger(__name__)

REDACTED = b"[redacted]"


@dataclass(frozen=True)
class ProxyConfig:
    """``upstream``: the model's base URL as a client would use it (``http://vllm:8000/v1``); the agent is
    given the proxy's address with the same path (:func:`~episode_operator.capture.wire.agent_base_url`).
    ``upstream_addresses``: the IP addresses its hostname was resolved to by the operator, the only ones
    the proxy connects to (none: a hostname is never reached; an IP-literal upstream needs none)."""

    upstream: str
    store: Path
    upstream_addresses: tuple[str, ...] = ()
    api_key: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    max_call_seconds: float = 1800.0
    token_ids: bool = False
    # spec.agent.model.params: set on every model call over what the agent sent (wire.rewrite_request).
    params: Mapping[str, Any] = field(default_factory=dict)
    fsync: bool = False
    # A request body past this is refused (413). 32 MiB: a 200k-token conversation is about 1 MiB of JSON.
    max_request_bytes: int = 32 * 1024 * 1024
    max_record_bytes: int = MAX_RECORD_BYTES
    max_journal_bytes: int = MAX_JOURNAL_BYTES

    @property
    def origin(self) -> str:
        """``scheme://host[:port]`` of the upstream; a ValueError naming the option for a URL it cannot serve."""
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--upstream must be an http(s) URL, not {self.upstream!r}")
        if (problem := check_base_path(base_path(self.upstream))) is not None:
            raise ValueError(f"--upstream {self.upstream!r}: {problem}")
        for address in self.upstream_addresses:
            if not is_ip_address(address):
                raise ValueError(f"--upstream-address must be an IP address, not {address!r}")
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def hostname(self) -> str:
        hostname = urlsplit(self.upstream).hostname
        assert hostname is not None
        return hostname


class PinnedResolver(AbstractResolver):
    """Resolves the upstream's hostname to the pinned addresses, and any other name to nothing.

    Never the system's resolver: it reads the pod's ``/etc/hosts`` and ``/etc/resolv.conf``, which the
    agent, root in its own container, can rewrite to send the key to itself."""

    def __init__(self, hostname: str, addresses: Sequence[str]) -> None:
        self.hostname = hostname.rstrip(".").lower()
        self.addresses = tuple(addresses)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host.rstrip(".").lower() != self.hostname or not self.addresses:
            raise OSError(f"capture proxy: {host} is not the pinned upstream")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.addresses
        ]

    async def close(self) -> None:
        return None


class KeyScrubber:
    """Replaces the real key in a byte stream, even split across chunks (holding back a possible key prefix)."""

    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else b""
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._key:
            return chunk
        data = (self._held + chunk).replace(self._key, REDACTED)
        # Hold back the longest tail that could be the start of the key (never an SSE event's end).
        hold = next(
            (size for size in range(min(len(self._key) - 1, len(data)), 0, -1) if self._key.startswith(data[-size:])), 0
        )
        self._held = data[len(data) - hold :] if hold else b""
        return data[: len(data) - hold] if hold else data

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def whole(self, data: bytes) -> bytes:
        return data.replace(self._key, REDACTED) if self._key else data


@dataclass(frozen=True)
class Failure:
    """A call the proxy answers itself: why, with which status and category."""

    status: int
    category: ErrorCategory
    reason: str

    def body(self, detail: str | None = None) -> bytes:
        message = f"capture proxy: {self.reason}" + (f": {detail}" if detail else "")
        return json.dumps({"error": {"type": self.reason, "message": message}}).encode()

    def response(self, detail: str | None = None) -> web.Response:
        return web.Response(status=self.status, body=self.body(detail), content_type="application/json")

    def sse_event(self) -> bytes:
        # One shape every SDK reads as a failure: Anthropic's ``error`` event, and OpenAI's ``data.error``.
        payload = {"type": "error", "error": {"type": self.reason, "message": f"capture proxy: {self.reason}"}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


UNREACHABLE = Failure(502, "connection", "upstream_unreachable")
TIMED_OUT = Failure(504, "timeout", "upstream_timeout")
BROKEN = Failure(502, "exception", "upstream_broken")
TOO_LARGE = Failure(413, "client_error", "request_too_large")
PROXY_FAILED = Failure(502, "exception", "capture_proxy_error")
# Answered here, never forwarded. ``client_error``: the agent's doing, which says nothing of the model
# endpoint (runtime/agents/agent_failures.py). Past the journal's bound a 400, which no harness retries.
NOT_A_ROUTE = Failure(403, "client_error", ROUTE_REFUSED)
JOURNAL_FULL = Failure(400, "client_error", CAPTURE_LIMIT)


def failure_of(error: BaseException) -> Failure:
    if isinstance(error, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return TIMED_OUT
    if isinstance(error, aiohttp.ClientConnectionError | OSError):
        return UNREACHABLE
    return BROKEN


class Exchange:
    """One call in flight: what is known so far, recorded once at the end whatever happens."""

    def __init__(self, proxy: Proxy, request: web.Request, dialect: Dialect | None) -> None:
        current = proxy.tracker.current()
        self.max_record_bytes = proxy.config.max_record_bytes
        self.token_ids = proxy.config.token_ids
        self.started_at = time.time()
        self.start = time.perf_counter()
        self.call = CapturedCall(
            model_call_id=uuid.uuid4().hex,
            dialect=dialect,
            method=request.method,
            # As sent: the record shows what the proxy checked (a forwarded path is plain, so the same decoded).
            path=request.raw_path.partition("?")[0],
            started_at=self.started_at,
            completed_at=self.started_at,
            latency_ms=0.0,
            attempt=current.attempt if current else None,
            turn=current.turn if current else None,
            client_session_id=request.headers.get(CLIENT_SESSION_HEADER),
        )
        proxy.writer.begin(self.call.attempt, self.call.turn, self.call.model_call_id)
        self.body = bytearray()  # the response as recorded: its first max_record_bytes
        self.response_bytes = 0
        self.recorded = False

    def keep(self, chunk: bytes) -> None:
        """Record a piece of the response, up to the per-call bound (the client gets it all)."""
        self.response_bytes += len(chunk)
        room = self.max_record_bytes - len(self.body)
        if room > 0:
            self.body.extend(chunk[:room])

    def keep_request(self, raw: bytes, sent: dict[str, Any] | None) -> None:
        """Record the request: the JSON object sent upstream, or the raw body; past the bound its first bytes."""
        if len(raw) > self.max_record_bytes:
            self.call.request_raw = raw[: self.max_record_bytes].decode("utf-8", "replace")
            self._truncated("request", len(raw))
        elif sent is not None:
            self.call.request = sent
        else:
            self.call.request_raw = raw.decode("utf-8", "replace")

    def _truncated(self, part: str, size: int) -> None:
        self.call.truncated = {**(self.call.truncated or {}), part: size}  # type: ignore[dict-item]

    def first_byte(self) -> None:
        if self.call.latency_ttft_ms is None:
            self.call.latency_ttft_ms = round((time.perf_counter() - self.start) * 1000.0, 2)

    def finish(
        self, category: ErrorCategory | None, *, status: int | None, local: Failure | None = None
    ) -> CapturedCall:
        call = self.call
        call.completed_at = time.time()
        call.latency_ms = round((time.perf_counter() - self.start) * 1000.0, 2)
        call.status_code = status
        if local is not None:
            call.response_source, call.local_response_reason = "local", local.reason
        else:
            call.response_source, call.upstream_status_code = "upstream", status
        body = bytes(self.body)
        if self.response_bytes > len(body):
            # Cut: kept raw, not parsed (a cut document is none, and the call itself went through).
            call.response_raw = body.decode("utf-8", "replace")
            self._truncated("response", self.response_bytes)
        elif body and call.dialect is not None:
            parsed = self._parse(body)
            call.response = parsed
            if parsed is None or call.streaming:
                call.response_raw = body.decode("utf-8", "replace")
            if parsed is None and category is None and not call.streaming:
                category = "capture_parse_error"
            if parsed is not None and self.token_ids:  # kept when asked for, as the proxy asked
                call.prompt_token_ids, call.generation_token_ids, call.generation_log_probs = TOKEN_ID_READERS[
                    call.dialect
                ](parsed)
        elif body:
            call.response_raw = body.decode("utf-8", "replace")
        unread = call.response is None and call.dialect is not None and not (call.truncated or {}).get("response")
        if call.streaming and category is None and unread:
            category = "capture_parse_error"
        call.error_category = category
        return call

    def _parse(self, body: bytes) -> dict[str, Any] | None:
        if self.call.streaming:
            assert self.call.dialect is not None
            return reassemble(body, self.call.dialect)
        try:
            parsed = json.loads(body)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.origin = config.origin
        self.base_path = base_path(config.upstream)
        store = CaptureStore(config.store)
        self.tracker = TurnTracker(store)
        self.writer = CallWriter(store, fsync=config.fsync, max_journal_bytes=config.max_journal_bytes)
        # The (attempt, turn) journals that already hold their capture_limit record: one each, no more.
        self.limit_recorded: set[tuple[int | None, str | None]] = set()
        # Answers' token ids, carried on the requests that continue them (``token_ids`` only).
        self.answers = AnswerTokens()
        self.session: aiohttp.ClientSession | None = None

    async def start(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0,
                resolver=PinnedResolver(self.config.hostname, self.config.upstream_addresses),
                use_dns_cache=False,
            ),
            # Every bound is per call (below); the session's own default total of 5 minutes would cut long answers.
            timeout=aiohttp.ClientTimeout(total=None),
            # No HTTP(S)_PROXY from the environment: the key goes to the pinned address, through nobody.
            trust_env=False,
        )

    async def stop(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()
        self.writer.close()

    async def record(self, call: CapturedCall, exchange: Exchange) -> None:
        """Store the call before the client sees its end. A write lands in the page cache, which the
        capture container's readers see at once; only an fsync waits for the disk (off a thread then)."""
        exchange.recorded = True
        self.answers.remember(call)  # a call with token ids (asked for: ``token_ids``) that may be continued
        try:
            if self.writer.fsync:
                await asyncio.to_thread(self.writer.append, call)
            else:
                self.writer.append(call)
        except OSError:
            log.exception("could not store model call %s", call.model_call_id)

    def record_now(self, exchange: Exchange, category: ErrorCategory) -> None:
        """Record a call cut short (no awaiting: the handler is being cancelled)."""
        if exchange.recorded:
            return
        exchange.recorded = True
        try:
            self.writer.append(exchange.finish(category, status=exchange.call.upstream_status_code))
        except OSError:
            log.exception("could not store model call %s", exchange.call.model_call_id)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        route = route_of(request.method, request.raw_path, self.base_path)
        dialect = None if isinstance(route, Refused) else route.dialect
        current = self.tracker.current()
        attempt, turn = (current.attempt, current.turn) if current else (None, None)
        if self.writer.full(attempt):
            if (attempt, turn) in self.limit_recorded:
                return JOURNAL_FULL.response()  # the journal says so once per turn; it grows no more
            self.limit_recorded.add((attempt, turn))
            return await self._answer_locally(Exchange(self, request, dialect), JOURNAL_FULL, attempted=False)
        exchange = Exchange(self, request, dialect)
        if isinstance(route, Refused):
            # Not read, not forwarded: the key never leaves for anything but the model API's routes.
            return await self._answer_locally(exchange, NOT_A_ROUTE, attempted=False, detail=route.detail)
        scrubber = KeyScrubber(self.config.api_key)
        try:
            data = await self._request_body(request, exchange, dialect)
            timeout = aiohttp.ClientTimeout(
                total=self.config.max_call_seconds,
                connect=self.config.connect_timeout,
                sock_read=self.config.read_timeout,
            )
            assert self.session is not None
            try:
                upstream = await self.session.request(
                    request.method,
                    # The target as checked, not re-encoded or normalised on the way.
                    URL(self.origin + request.raw_path, encoded=True),
                    headers=upstream_headers(request.headers, dialect, self.config.api_key),
                    data=data,
                    timeout=timeout,
                    allow_redirects=False,
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                return await self._answer_locally(exchange, failure_of(error))
            exchange.call.upstream_status_code = upstream.status
            async with upstream:
                streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
                exchange.call.streaming = streaming and dialect is not None
                if exchange.call.streaming:
                    assert dialect is not None
                    return await self._stream(request, upstream, exchange, scrubber, dialect)
                return await self._whole(upstream, exchange, scrubber)
        except asyncio.CancelledError:
            # The client went away (the agent was stopped): keep the call, then let the cancellation through.
            self.record_now(exchange, "cancelled")
            raise
        except web.HTTPRequestEntityTooLarge:
            return await self._answer_locally(exchange, TOO_LARGE, attempted=False)
        except Exception:
            # A bug of ours must still leave a record and a clean answer, never a call in flight forever.
            log.exception("capture proxy failed on %s %s", request.method, request.path)
            if exchange.recorded:
                raise
            return await self._answer_locally(exchange, PROXY_FAILED, attempted=False)

    async def _request_body(self, request: web.Request, exchange: Exchange, dialect: Dialect | None) -> bytes:
        raw = await request.read()
        if not raw:
            return raw
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            exchange.keep_request(raw, None)
            return raw
        sent = rewrite_request(parsed, dialect, token_ids=self.config.token_ids, params=self.config.params)
        recorded = sent
        if self.config.token_ids and dialect is not None:
            sent, carried = self.answers.carry(dialect, sent)
            exchange.call.carried_token_ids = carried or None
        data = raw if sent == parsed else json.dumps(sent).encode()
        # Recorded without the carried token ids (the record names their calls, whose records hold them).
        exchange.keep_request(data if recorded is sent else json.dumps(recorded).encode(), recorded)
        return data

    async def _answer_locally(
        self, exchange: Exchange, failure: Failure, *, attempted: bool = True, detail: str | None = None
    ) -> web.Response:
        exchange.call.upstream_attempted = attempted
        response = failure.response(detail)
        if detail is not None:
            exchange.keep(failure.body(detail))  # the record says why, as the client was told
        await self.record(exchange.finish(failure.category, status=failure.status, local=failure), exchange)
        return response

    async def _whole(self, upstream: aiohttp.ClientResponse, exchange: Exchange, scrubber: KeyScrubber) -> web.Response:
        body = bytearray()
        try:
            async for chunk in upstream.content.iter_any():
                exchange.first_byte()
                body.extend(chunk)
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            return await self._answer_locally(exchange, failure_of(error))
        scrubbed = scrubber.whole(bytes(body))
        exchange.keep(scrubbed)
        call = exchange.finish(classify_status(upstream.status), status=upstream.status)
        await self.record(call, exchange)
        return web.Response(status=upstream.status, body=scrubbed, headers=downstream_headers(upstream.headers))

    async def _stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        exchange: Exchange,
        scrubber: KeyScrubber,
        dialect: Dialect,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers=downstream_headers(upstream.headers))
        await response.prepare(request)
        scanner = SseScanner(dialect)
        held: list[bytes] = []  # from the chunk that ends the stream on: sent once the record is stored
        failure: Failure | None = None
        chunks = upstream.content.iter_any()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                failure = failure_of(error)
                break
            exchange.first_byte()
            chunk = scrubber.feed(chunk)
            exchange.keep(chunk)
            if held or scanner.feed(chunk) is not None:
                held.append(chunk)
            elif chunk and not await self._send(response, chunk, exchange):
                return response
        held.append(scrubber.flush())
        exchange.keep(held[-1])
        category = (
            failure.category if failure else classify_status(upstream.status) or STREAM_END_CATEGORIES[scanner.end]
        )
        await self.record(exchange.finish(category, status=upstream.status), exchange)
        if failure is not None:
            held.append(failure.sse_event())
        for chunk in held:
            if chunk and not await self._send(response, chunk, exchange):
                return response
        await response.write_eof()
        return response

    async def _send(self, response: web.StreamResponse, chunk: bytes, exchange: Exchange) -> bool:
        """Pass a chunk on; False when the client has gone (the call is then recorded as cancelled)."""
        try:
            await response.write(chunk)
        except ConnectionError:  # aiohttp's ClientConnectionResetError is one
            self.record_now(exchange, "cancelled")
            return False
        return True


def build_app(config: ProxyConfig) -> web.Application:
    proxy = Proxy(config)
    app = web.Application(client_max_size=config.max_request_bytes)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app


async def start(config: ProxyConfig, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Listen (port 0: any free one); returns the runner to clean up and the port."""
    runner = web.AppRunner(build_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    return runner, server.sockets[0].getsockname()[1]


async def serve(config: ProxyConfig, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT; ``STORE/ready.json`` exists while listening (for an exec readiness probe).

    On the way out, calls still in flight are recorded as cancelled.
    """
    stop = asyncio.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signal_number, stop.set)
    runner, port = await start(config, host, port)
    ready = config.store / "ready.json"
    config.store.mkdir(parents=True, exist_ok=True)
    # Renamed into place: a probe never reads half of it.
    written = config.store / ".ready.json"
    written.write_text(json.dumps({"listen": f"{host}:{port}", "upstream": config.upstream}) + "\n")
    written.replace(ready)
    try:
        await stop.wait()
    finally:
        ready.unlink(missing_ok=True)
        await runner.cleanup()
