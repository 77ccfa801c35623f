"""The operator's request counter names requests as the API server's apiserver_request_total does."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from episode_operator.kube.client import KubeClient, KubeError, request_kind
from episode_operator.runtime.metrics import Metrics

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
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", port)
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
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", port)
        kubeconfig.write_text(kubeconfig.read_text().replace("https://", "http://"))
        try:
            for replica in ("r1.ab12cd", None):
                client = await KubeClient.connect(str(kubeconfig), replica=replica)
                try:
                    await client.get_episode("ns", "e")
                finally:
                    await client.close()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert seen == ["episode-operator/0.1.0 (replica r1.ab12cd)", "episode-operator/0.1.0"]
