"""An API server on 127.0.0.1 (plain HTTP) that answers what ``kubectl episode`` reads of it: Episodes and
EpisodeSets (get, list with an equality label selector), the discovery of the data API, and the data
API's subresources, answered by the operator's own handlers (``runtime/data_api_server.py``) over a store.

Errors are Kubernetes ``Status`` objects, as the API server sends them: a missing object is 404
``NotFound``; with ``data_api="absent"`` the group is not there (404 "the server could not find the
requested resource", as for an APIService never registered); with ``data_api="unavailable"`` it is
registered but its operator does not answer (503, as the aggregator answers then).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml
from aiohttp import web

from episode_operator.api.vocabulary import GROUP, VERSION
from episode_operator.runtime.data_api_server import DATA_GROUP, DATA_VERSION, SUBRESOURCES, discovery
from episode_operator.runtime.episode_store import BlobStore

DataApi = Literal["served", "absent", "unavailable"]


def status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message}
    return web.json_response(body | {"reason": reason, "code": code}, status=code)


def not_found_resource() -> web.Response:
    return status(404, "NotFound", "the server could not find the requested resource")


def matches(labels: dict[str, str], selector: str | None) -> bool:
    """An equality-based selector (``a=b,c=d``), the only kind these tests use."""
    for requirement in filter(None, (selector or "").split(",")):
        key, _, value = requirement.partition("=")
        assert value, f"the fake API server understands key=value selectors only, not {requirement!r}"
        if labels.get(key) != value:
            return False
    return True


class FakeApiServer:
    def __init__(self, objects: dict[str, list[dict[str, Any]]], store: BlobStore | None, data_api: DataApi) -> None:
        self.objects = objects  # plural → objects
        self.store = store
        self.data_api = data_api
        self.port = 0
        self.requests: list[str] = []

    def application(self) -> web.Application:
        app = web.Application()
        custom = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{{plural}}"
        app.router.add_get(custom, self.list_objects)
        app.router.add_get(custom + "/{name}", self.get_object)
        data = f"/apis/{DATA_GROUP}/{DATA_VERSION}"
        app.router.add_get(data, self.discovery)
        app.router.add_get(data + "/namespaces/{namespace}/episodes/{name}/{subresource}", self.data)
        return app

    def _of(self, request: web.Request) -> list[dict[str, Any]]:
        self.requests.append(request.path_qs)
        namespace, plural = request.match_info["namespace"], request.match_info["plural"]
        return [item for item in self.objects.get(plural, []) if item["metadata"]["namespace"] == namespace]

    async def list_objects(self, request: web.Request) -> web.Response:
        selector = request.query.get("labelSelector")
        items = [item for item in self._of(request) if matches(item["metadata"].get("labels") or {}, selector)]
        return web.json_response({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})

    async def get_object(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        for item in self._of(request):
            if item["metadata"]["name"] == name:
                return web.json_response(item)
        plural = request.match_info["plural"]
        return status(404, "NotFound", f'{plural}.{GROUP} "{name}" not found')

    async def discovery(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        if self.data_api == "absent":
            return not_found_resource()
        if self.data_api == "unavailable":
            return status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        return web.json_response(discovery())

    async def data(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path_qs)
        if self.data_api != "served" or self.store is None:
            return discovery_refusal(self.data_api)
        info = request.match_info
        entry = SUBRESOURCES.get(info["subresource"])
        if entry is None:
            return not_found_resource()
        uid = request.query.get("uid")
        blobs = (
            self.store.episode(info["namespace"], info["name"], uid)
            if uid
            else await self.store.latest_episode(info["namespace"], info["name"])
        )
        if blobs is None or not await blobs.kept():
            return status(404, "NotFound", f"nothing kept for {info['namespace']}/{info['name']}")
        try:
            return await entry.serve(blobs, request.query)
        except web.HTTPException as error:  # the handlers' own Status answers
            return web.Response(status=error.status, text=error.text, content_type="application/json")

    def kubeconfig(self, path: Path, namespace: str) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "work", "context": {"cluster": "fake", "user": "u", "namespace": namespace}}],
                    "current-context": "work",
                }
            )
        )
        return path


def discovery_refusal(data_api: DataApi) -> web.Response:
    if data_api == "unavailable":
        return status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
    return not_found_resource()


@contextmanager
def fake_api_server(
    objects: dict[str, list[dict[str, Any]]], store: BlobStore | None = None, data_api: DataApi = "served"
) -> Iterator[FakeApiServer]:
    """The fake API server, serving on a thread of its own until the block ends."""
    server = FakeApiServer(objects, store, data_api)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner = web.AppRunner(server.application(), access_log=None)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30), "the fake API server did not start"
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
