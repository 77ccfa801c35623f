"""The operator's request counter names requests as the API server's apiserver_request_total does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from episode_operator.kube.client import KubeClient, KubeError, environment_applies, request_kind
from episode_operator.runtime.metrics import Metrics
from tests.ports import free_port

HOST = "https://198.18.255.1:6443"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods/p", None, ("GET", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", [("labelSelector", "a=b")], ("LIST", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", [("watch", True)], ("WATCH", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods/p/exec", [("command", "sh")], ("GET", "pods/exec")),
        ("POST", "/api/v1/namespaces/ns/events", None, ("POST", "events")),
        (
            "DELETE",
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies",
            None,
            ("DELETECOLLECTION", "networkpolicies"),
        ),
        (
            "PATCH",
            "/apis/episode-operator.dev/v1alpha1/namespaces/ns/episodes/e/status",
            None,
            ("PATCH", "episodes/status"),
        ),
        ("GET", "/apis/episode-operator.dev/v1alpha1/episodes", None, ("LIST", "episodes")),
        ("GET", "/api/v1/namespaces/ns/services/web/proxy/a/b", None, ("GET", "services/proxy")),
        ("GET", "/api/v1/namespaces/ns", None, ("GET", "namespaces")),
        ("PUT", "/apis/apiregistration.k8s.io/v1/apiservices/v1.x", None, ("PUT", "apiservices")),
        ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", None, ("POST", "subjectaccessreviews")),
    ],
)
def test_a_request_is_named_by_verb_and_resource(
    method: str, path: str, query: list[tuple[str, object]] | None, expected: tuple[str, str]
) -> None:
    assert request_kind(method, HOST + path, query) == expected


@contextlib.asynccontextmanager
async def plain_http_api(app: web.Application, tmp_path: Path) -> AsyncIterator[Path]:
    """``app`` served on 127.0.0.1 as an API server over plain HTTP, and a kubeconfig that reaches it."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", port)
    kubeconfig.write_text(kubeconfig.read_text().replace("https://", "http://"))
    try:
        yield kubeconfig
    finally:
        await runner.cleanup()


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_a_request_that_gets_no_answer_is_counted_as_an_api_error(tmp_path: Path) -> None:
    """An API server that is down: the request is counted, and counted again as failed."""
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", free_port())  # a port nothing listens on
    metrics = Metrics()

    async def scenario() -> None:
        client = await KubeClient.connect(str(kubeconfig), metrics=metrics)
        try:
            with pytest.raises(aiohttp.ClientConnectionError):  # as kopf's daemons see it, and retry
                await client.get_episode("ns", "e")
        finally:
            await client.close()

    asyncio.run(scenario())

    def counted(counter: Any) -> dict[tuple[str, str], float]:
        samples = next(iter(counter.collect())).samples
        return {(s.labels["verb"], s.labels["resource"]): s.value for s in samples if s.name.endswith("_total")}

    assert counted(metrics.api_errors) == {("GET", "episodes"): counted(metrics.api_requests)[("GET", "episodes")]}


def test_a_client_with_a_request_timeout_ends_a_request_the_api_server_never_answers(tmp_path: Path) -> None:
    """The replicas' membership client: a listing left waiting would stop its renewals for good."""
    metrics = Metrics()

    async def scenario() -> str:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # holds the connection open and never answers (not even TLS)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await KubeClient.connect(
            str(_kubeconfig(tmp_path / "kubeconfig", port)), metrics=metrics, request_timeout_sec=0.5
        )
        try:
            with pytest.raises(KubeError) as raised:
                await asyncio.wait_for(client.list_leases("ns", "a=b"), 30)
            return str(raised.value)
        finally:
            await client.close()
            server.close()
            for writer in accepted:
                writer.close()

    assert asyncio.run(scenario()) == "LIST leases: no answer within 0.5 s"


def test_a_replicas_requests_name_it_in_their_user_agent(tmp_path: Path) -> None:
    """The API server's audit log tells the replicas (and their incarnations) apart by it."""
    seen: list[str] = []

    async def episode(request: web.Request) -> web.Response:
        seen.append(request.headers.get("User-Agent", ""))
        return web.json_response({"metadata": {"name": "e", "namespace": "ns"}})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/apis/episode-operator.dev/v1alpha1/namespaces/ns/episodes/e", episode)
        async with plain_http_api(app, tmp_path) as kubeconfig:
            for replica in ("r1.ab12cd", None):
                client = await KubeClient.connect(str(kubeconfig), replica=replica)
                try:
                    await client.get_episode("ns", "e")
                finally:
                    await client.close()

    asyncio.run(scenario())
    assert seen == ["episode-operator/0.1.0 (replica r1.ab12cd)", "episode-operator/0.1.0"]


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No proxy variables, no NETRC, and a HOME without a .netrc: returns that HOME."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "ws_proxy", "wss_proxy", "no_proxy", "netrc"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("variables", "netrc", "proxied", "applies"),
    [
        ({}, False, False, False),
        ({"HTTPS_PROXY": "http://198.18.0.9:3128"}, False, False, True),
        ({"HTTP_PROXY": "http://198.18.0.9:3128"}, False, False, True),  # aiohttp's http proxy, for ws:// too
        ({"HTTPS_PROXY": "http://198.18.0.9:3128", "NO_PROXY": "198.18.255.1"}, False, False, False),
        ({"HTTPS_PROXY": "http://198.18.0.9:3128"}, False, True, False),  # the kubeconfig's proxy-url wins
        ({}, True, False, True),
        ({}, True, True, True),  # a netrc still gives a password to a server asked without credentials
    ],
)
def test_the_environment_is_consulted_only_when_a_proxy_or_netrc_could_apply(
    bare_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    netrc: bool,
    proxied: bool,
    applies: bool,
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    if netrc:
        (bare_environment / ".netrc").write_text("machine 198.18.255.1 login u password p\n")
    assert environment_applies(HOST, proxied=proxied) is applies


@pytest.mark.parametrize("proxy", [None, "http://198.18.0.9:3128"])
def test_the_clients_sessions_trust_the_environment_only_when_it_applies(
    bare_environment: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, proxy: str | None
) -> None:
    """Without a proxy or netrc aiohttp's per-request lookups are off (each cost a worker thread's turn);
    with one, requests and exec's websockets still honour it."""
    if proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy)

    async def scenario() -> list[bool]:
        client = await KubeClient.connect(str(_kubeconfig(tmp_path / "kubeconfig", 6443)))
        try:
            return [session.rest_client.pool_manager.trust_env for session in (client.api, client.ws_api)]
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [proxy is not None] * 2


def test_writes_whose_reply_is_not_read_still_raise_the_api_servers_errors(tmp_path: Path) -> None:
    """Events, status writes and merge patches skip deserialising their replies; an error status is still
    this module's typed error with the API server's message (an Event already posted is a Conflict)."""
    answers = {"events": 409, "episodes/status": 422, "episodes": 404, "episodesets/status": 201}

    async def answer(request: web.Request) -> web.Response:
        tail = request.path.split("/namespaces/ns/")[1]
        resource = "/".join(tail.split("/")[0:3:2])
        code = answers[resource]
        return web.json_response({"kind": "Status", "message": f"said {code}"}, status=code)

    async def scenario() -> list[tuple[str, int]]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        async with plain_http_api(app, tmp_path) as kubeconfig:
            client = await KubeClient.connect(str(kubeconfig))
            raised: list[tuple[str, int]] = []
            try:
                for call in (
                    client.create_event("ns", {"metadata": {"name": "x"}}),
                    client.replace_episode_status("ns", "e", {"phase": "Running"}),
                    client.patch_episode("ns", "e", {"spec": {"suspend": True}}),
                    client.replace_episodeset_status("ns", "s", {}),
                ):
                    try:
                        await call
                    except KubeError as error:
                        raised.append((f"{type(error).__name__}: {error}", error.status))
            finally:
                await client.close()
        return raised

    assert asyncio.run(scenario()) == [
        ("Conflict: event: said 409", 409),
        ("KubeError: status of episode ns/e: said 422", 422),
        ("NotFound: episode ns/e: said 404", 404),
    ]
