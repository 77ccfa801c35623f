"""The capture proxy against an agent that attacks it: root beside it in the pod, sharing its network
namespace and its ``/etc/hosts``. The key must reach only the model, only on the model API's routes,
and what the proxy stores must stay bounded. Each attack has its honest control beside it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from episode_operator.capture.capture_store import CaptureStore, CurrentTurn
from episode_operator.capture.proxy import PinnedResolver, ProxyConfig, start
from episode_operator.capture.records import CAPTURE_LIMIT, ROUTE_REFUSED, CapturedCall
from episode_operator.capture.wire import KEY_ENV, ROUTES, Refused, route_of
from episode_operator.kube.data_api_registration import self_signed_certificate
from tests.unit.model_upstream import JSON_ANSWERS, KEY, OTHER_ANSWERS, Upstream, running_upstream

MODEL_HOST = "model.test"  # resolvable by nobody but the patched resolver below and the pinned addresses
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT = json.dumps(BODY).encode()
PLACEHOLDER = "placeholder-key"


@dataclass
class Proxy:
    port: int
    store: CaptureStore

    def calls(self, turn: str | None = "one") -> list[CapturedCall]:
        harvest = self.store.harvest(1, turn, settle_seconds=5)
        assert harvest.complete, harvest
        return harvest.calls


@asynccontextmanager
async def proxy(tmp_path: Path, upstream: str, **config: Any) -> AsyncIterator[Proxy]:
    store = CaptureStore(tmp_path / "store")
    store.set_current_turn(CurrentTurn(attempt=1, turn="one"))
    runner, port = await start(ProxyConfig(upstream=upstream, store=store.root, api_key=KEY, **config), "127.0.0.1", 0)
    try:
        yield Proxy(port, store)
    finally:
        await runner.cleanup()


async def send(port: int, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Any:
    """One request written byte for byte (an HTTP client would normalise the target): (status, JSON body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = {"host": "127.0.0.1", "authorization": f"Bearer {PLACEHOLDER}", "connection": "close", **(headers or {})}
    if body:
        head |= {"content-type": "application/json", "content-length": str(len(body))}
    lines = [f"{method} {target} HTTP/1.1", *(f"{name}: {value}" for name, value in head.items())]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=30)
    writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    payload = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(payload) if payload.startswith(b"{") else payload


def keys_seen(upstream: Upstream) -> list[str]:
    return [value for received in upstream.received for _, value in received["header_items"] if KEY in value]


@contextmanager
def hosts_rewritten(hostname: str, address: str) -> Iterator[None]:
    """What root in the agent's container does to the pod's /etc/hosts: ``hostname`` now names ``address``,
    for every resolution through the C library (``getaddrinfo``, what aiohttp's default resolver calls)."""
    real = socket.getaddrinfo

    def rewritten(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real(address if host == hostname else host, port, *args, **kwargs)

    socket.getaddrinfo = rewritten
    try:
        yield
    finally:
        socket.getaddrinfo = real


@asynccontextmanager
async def model_and_attacker() -> AsyncIterator[tuple[Upstream, Upstream, int]]:
    """The real model on 127.0.0.1 and the agent's own listener on 127.0.0.2, on the same port."""
    async with running_upstream("127.0.0.1") as model:
        port = int(model.url.rsplit(":", 1)[1].split("/")[0])
        async with running_upstream("127.0.0.2", port) as attacker:
            yield model, attacker, port


# --- the key reaches only the pinned address -----------------------------------------------------------
def test_a_rewritten_hosts_file_does_not_move_the_upstream(tmp_path: Path) -> None:
    """The agent points the model's hostname at its own listener: the proxy still reaches only the address
    the operator pinned, and the listener never sees the key. Control: any client that resolves the name
    itself (aiohttp's default resolver) is fooled by the same rewrite."""

    async def scenario() -> None:
        async with model_and_attacker() as (model, attacker, port):
            url = f"http://{MODEL_HOST}:{port}/v1"
            with hosts_rewritten(MODEL_HOST, "127.0.0.2"):
                async with aiohttp.ClientSession() as naive, naive.get(url + "/models") as response:
                    assert response.status == 200
                assert len(attacker.received) == 1 and not model.received  # the rewrite works

                async with proxy(tmp_path, url, upstream_addresses=("127.0.0.1",)) as pinned:
                    status, answer = await send(pinned.port, "POST", "/v1/chat/completions", CHAT)
                    assert (status, answer) == (200, JSON_ANSWERS["chat"])
                    (call,) = pinned.calls()
            assert (call.response_source, call.response) == ("upstream", JSON_ANSWERS["chat"])
            assert keys_seen(model) == [f"Bearer {KEY}"]
            assert keys_seen(attacker) == [] and len(attacker.received) == 1
            assert model.received[0]["headers"]["Host"] == f"{MODEL_HOST}:{port}"  # the name kept on the wire

    asyncio.run(scenario())


def test_without_a_pinned_address_a_hostname_is_never_resolved(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with model_and_attacker() as (model, attacker, port):
            with hosts_rewritten(MODEL_HOST, "127.0.0.2"):
                async with proxy(tmp_path, f"http://{MODEL_HOST}:{port}/v1") as unpinned:
                    status, answer = await send(unpinned.port, "POST", "/v1/chat/completions", CHAT)
                    (call,) = unpinned.calls()
            assert status == 502 and answer["error"]["type"] == "upstream_unreachable"
            assert (call.response_source, call.local_response_reason) == ("local", "upstream_unreachable")
            assert attacker.received == [] and model.received == []

    asyncio.run(scenario())


@asynccontextmanager
async def proxy_process(tmp_path: Path, upstream: str, address: str, ca_file: Path) -> AsyncIterator[int]:
    """``capture-proxy`` as the pod runs it, trusting the test's certificate (``SSL_CERT_FILE``, read at start)."""
    store = tmp_path / "store"
    environment = {**os.environ, KEY_ENV: KEY, "SSL_CERT_FILE": str(ca_file)}
    command = [str(Path(sys.executable).parent / "episode-operator"), "capture-proxy", "--listen", "127.0.0.1:0"]
    options = ["--upstream", upstream, "--upstream-address", address, "--store", str(store)]
    process = subprocess.Popen([*command, *options], env=environment, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a loaded machine starts Python slowly
        while not (store / "ready.json").exists():
            assert process.poll() is None and time.monotonic() < deadline, process.stderr and process.stderr.read()
            await asyncio.sleep(0.05)
        yield int(json.loads((store / "ready.json").read_text())["listen"].rsplit(":", 1)[1])
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0


@pytest.mark.parametrize(("certified", "forwarded"), [("localhost", True), ("model.test", False)])
def test_tls_to_the_pinned_address_still_checks_the_hostname(tmp_path: Path, certified: str, forwarded: bool) -> None:
    """Connected to the pinned IP, the proxy sends the URL's hostname as SNI and checks the certificate
    against it: a certificate for another name is refused (no request is made, the key stays). The name is
    ``localhost``, which the machine's hosts file answers: no test sends a DNS query, whatever is broken."""
    certificate, key = self_signed_certificate([certified])
    (tmp_path / "cert.pem").write_bytes(certificate)
    (tmp_path / "key.pem").write_bytes(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    names: list[str | None] = []
    context.sni_callback = lambda _socket, name, _context: names.append(name)  # type: ignore[assignment,misc]

    async def scenario() -> None:
        async with running_upstream(ssl_context=context) as model:
            upstream = model.url.replace("127.0.0.1", "localhost")
            async with proxy_process(tmp_path, upstream, "127.0.0.1", tmp_path / "cert.pem") as port:
                status, answer = await send(port, "POST", "/v1/chat/completions", CHAT)
        if forwarded:
            assert (status, answer) == (200, JSON_ANSWERS["chat"])
            assert keys_seen(model) == [f"Bearer {KEY}"] and model.received[0]["headers"]["Host"].startswith(
                "localhost"
            )
        else:
            assert status == 502 and model.received == []
        assert names and set(names) == {"localhost"}

    asyncio.run(scenario())


def test_the_pinned_resolver_answers_for_the_upstream_only() -> None:
    async def scenario() -> None:
        resolver = PinnedResolver("Model.Test.", ["127.0.0.1", "::1"])
        assert [(r["host"], r["family"]) for r in await resolver.resolve("model.test", 80)] == [
            ("127.0.0.1", socket.AF_INET),
            ("::1", socket.AF_INET6),
        ]
        for other in ("localhost", "attacker.test", "model.test.attacker.test"):
            with pytest.raises(OSError, match="not the pinned upstream"):
                await resolver.resolve(other, 80)

    asyncio.run(scenario())


def test_a_redirect_from_upstream_is_not_followed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with model_and_attacker() as (model, attacker, port):
            async with proxy(tmp_path, model.url) as forwarding:
                steal = f"http://127.0.0.2:{port}/v1/chat/completions"
                headers = {"x-behave": "redirect", "x-redirect-to": steal}
                status, _ = await send(forwarding.port, "POST", "/v1/chat/completions", CHAT, headers)
                (call,) = forwarding.calls()
            assert status == 307 and call.upstream_status_code == 307
            assert len(model.received) == 1 and attacker.received == []

    asyncio.run(scenario())


# --- only the model API's routes -----------------------------------------------------------------------
HOSTILE = [
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/organization/users"),
    ("POST", "/v1/../admin"),
    ("POST", "/v1/./chat/completions"),
    ("POST", "/v1/chat/completions/.."),
    ("POST", "/v1/models/m/../../files"),
    ("POST", "/v1/%2e%2e/admin"),
    ("POST", "/v1/%2E%2E/chat/completions"),
    ("POST", "/v1/chat%2Fcompletions"),
    ("POST", "/v1/chat/completions%00"),
    ("POST", "/v1//chat/completions"),
    ("POST", "//v1/chat/completions"),
    ("POST", "/v1/chat/completions/"),
    ("POST", "/v1\\..\\admin"),
    ("POST", "/v1/chat/completions;x=1"),
    ("POST", "/admin/chat/completions"),
    ("POST", "/v1x/chat/completions"),
    ("POST", "/chat/completions"),
    ("POST", "/ng-rollout/two/v1/chat/completions"),
    ("POST", "http://attacker.test/v1/chat/completions"),
    ("GET", "/v1/chat/completions"),
    ("DELETE", "/v1/models/m"),
    ("PUT", "/v1/responses"),
    ("GET", "/v1/models/m/x"),
    ("POST", "/v1/chat/completions?x=<script>"),
]


@pytest.mark.parametrize(("method", "target"), HOSTILE, ids=[f"{m} {t}" for m, t in HOSTILE])
def test_a_request_off_the_model_routes_is_refused_recorded_and_never_forwarded(
    tmp_path: Path, method: str, target: str
) -> None:
    async def scenario() -> None:
        async with running_upstream() as model, proxy(tmp_path, model.url) as forwarding:
            status, answer = await send(forwarding.port, method, target, json.dumps(BODY).encode())
            (call,) = forwarding.calls()
        assert status == 403 and answer["error"]["type"] == ROUTE_REFUSED
        assert model.received == []  # never forwarded, so the key never left
        assert (call.response_source, call.local_response_reason, call.upstream_attempted) == (
            "local",
            ROUTE_REFUSED,
            False,
        )
        assert (call.method, call.path) == (method, target.partition("?")[0])
        assert call.error_category == "client_error"  # the agent's doing: no model failure
        assert call.request is None and ROUTE_REFUSED in (call.response_raw or "")

    asyncio.run(scenario())


ALLOWED = [
    ("POST", "/v1/chat/completions", 200),
    ("POST", "/v1/chat/completions?beta=true", 200),
    ("POST", "/v1/completions", 200),
    ("POST", "/v1/responses", 200),
    ("POST", "/v1/messages?beta=true", 200),
    ("POST", "/v1/messages/count_tokens?beta=true", 200),
    ("GET", "/v1/models", 200),
    ("GET", "/v1/models/m", 200),
]


@pytest.mark.parametrize(("method", "target", "status"), ALLOWED, ids=[f"{m} {t}" for m, t, _ in ALLOWED])
def test_the_model_routes_are_forwarded_with_the_key(tmp_path: Path, method: str, target: str, status: int) -> None:
    """The control: what the harnesses call reaches the model, with the real key, as sent."""

    async def scenario() -> None:
        async with running_upstream() as model, proxy(tmp_path, model.url) as forwarding:
            body = b"" if method == "GET" else json.dumps(BODY).encode()
            answered, _ = await send(forwarding.port, method, target, body)
            (call,) = forwarding.calls()
        assert answered == status and call.response_source == "upstream"
        assert keys_seen(model) == [f"Bearer {KEY}"]
        assert model.received[0]["path"] == target.partition("?")[0]

    asyncio.run(scenario())


def test_the_routes_table_covers_every_answered_route() -> None:
    """The upstream double answers what ROUTES forwards (a route added to one is added to the other)."""
    answered = {("POST", f"/v1{path}") for path in ("/chat/completions", "/responses", "/messages")}
    answered |= {(method, path.replace("/models/m", "/models/{id}")) for method, path in OTHER_ANSWERS}
    assert {(route.method, f"/v1{route.path}") for route in ROUTES} == answered


@pytest.mark.parametrize(
    ("base", "target", "forwarded"),
    [
        ("", "/chat/completions", True),
        ("", "/v1/chat/completions", False),
        ("/openai/v1", "/openai/v1/responses", True),
        ("/openai/v1", "/openai/responses", False),
        ("/openai/v1", "/openai/v1/../v1/responses", False),
    ],
)
def test_routes_are_read_below_the_base_path(base: str, target: str, forwarded: bool) -> None:
    assert (not isinstance(route_of("POST", target, base), Refused)) is forwarded


# --- bounded records and journal -------------------------------------------------------------------
def test_a_huge_request_is_forwarded_whole_and_recorded_cut(tmp_path: Path) -> None:
    async def scenario() -> None:
        huge = {**BODY, "messages": [{"role": "user", "content": "y" * 50_000}]}
        data = json.dumps(huge).encode()
        async with running_upstream() as model, proxy(tmp_path, model.url, max_record_bytes=4096) as bounded:
            status, _ = await send(bounded.port, "POST", "/v1/chat/completions", data)
            (call,) = bounded.calls()
        assert status == 200 and model.received[0]["body"] == data
        assert call.request is None and call.request_raw == data[:4096].decode()
        assert call.truncated == {"request": len(data)}
        assert call.response == JSON_ANSWERS["chat"] and call.error_category is None

    asyncio.run(scenario())


@pytest.mark.parametrize("stream", [False, True])
def test_a_huge_answer_is_passed_on_whole_and_recorded_cut(tmp_path: Path, stream: bool) -> None:
    async def scenario() -> None:
        data = json.dumps({**BODY, "stream": stream}).encode()
        async with running_upstream() as model, proxy(tmp_path, model.url, max_record_bytes=4096) as bounded:
            status, answer = await send(bounded.port, "POST", "/v1/chat/completions", data, {"x-pad": "100000"})
            (call,) = bounded.calls()
        assert status == 200
        whole = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        assert len(whole) > 100_000
        assert call.response is None and len(call.response_raw or "") == 4096
        assert call.truncated is not None and call.truncated["response"] > 100_000
        assert call.error_category is None  # a call that went through, only recorded in part

    asyncio.run(scenario())


def test_past_the_journal_bound_calls_are_answered_here_and_recorded_once_per_turn(tmp_path: Path) -> None:
    async def scenario() -> None:
        data = json.dumps(BODY).encode()
        async with running_upstream() as model, proxy(tmp_path, model.url, max_journal_bytes=8192) as bounded:
            path = bounded.store.calls_path(1, "one")
            for _ in range(100):  # each record is about 1 KiB: the bound is passed within 10 calls
                status, answer = await send(bounded.port, "POST", "/v1/chat/completions", data)
                if status != 200:
                    break
            assert status == 400 and answer["error"]["type"] == CAPTURE_LIMIT
            forwarded, size = len(model.received), path.stat().st_size
            for _ in range(3):
                status, _ = await send(bounded.port, "POST", "/v1/chat/completions", data)
                assert status == 400
            assert (len(model.received), path.stat().st_size) == (forwarded, size)  # nothing more forwarded or kept
            calls = bounded.calls()
            limited = [call for call in calls if call.local_response_reason == CAPTURE_LIMIT]
            assert len(limited) == 1 and limited[0] is calls[-1] and not limited[0].upstream_attempted
            assert len(calls) - 1 == forwarded and 8192 <= size < 8192 + 4096

            bounded.store.set_current_turn(CurrentTurn(attempt=1, turn="two"))
            for _ in range(2):
                status, _ = await send(bounded.port, "POST", "/v1/chat/completions", data)
                assert status == 400
            (marker,) = bounded.calls("two")
            assert marker.local_response_reason == CAPTURE_LIMIT and len(model.received) == forwarded

    asyncio.run(scenario())
