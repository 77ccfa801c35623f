"""A small OCI distribution registry in a thread, honest or hostile, for the task artifact tests.

It speaks what ``runtime/oci_tasks.py`` calls (manifests and blobs by digest, monolithic blob
uploads) and counts every request, so a test sees what was uploaded and downloaded. ``tamper`` makes
it lie: ``blob`` serves other bytes than the digest asked for, ``longer`` more bytes than stored,
``manifest`` another manifest than the digest asked for. The unit tier runs it on 127.0.0.1; the cluster
tier runs it as an attacker's registry beside the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import uuid
from collections import Counter
from collections.abc import Iterator

from aiohttp import web


class FakeRegistry:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}
        self.requests: Counter[str] = Counter()
        self.tamper: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # --- what a test puts in directly, as an attacker with push rights would --------------------------
    def put_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest

    def put_manifest(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.manifests[digest] = data
        return digest

    # --- the API ---------------------------------------------------------------------------------------
    def _application(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/v2/{name:.+}/manifests/{digest}", self._manifest)
        app.router.add_route("*", "/v2/{name:.+}/blobs/uploads/{upload:.*}", self._upload)
        app.router.add_route("*", "/v2/{name:.+}/blobs/{digest}", self._blob)
        return app

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        digest = request.match_info["digest"]
        self.requests[f"{request.method} manifest"] += 1
        if request.method == "PUT":
            body = await request.read()
            if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
                return web.Response(status=400, text="digest mismatch")
            self.manifests[digest] = body
            return web.Response(status=201)
        if digest not in self.manifests:
            return web.Response(status=404)
        body = self.manifests[digest]
        if self.tamper == "manifest":
            body = body.replace(b'"schemaVersion":2', b'"schemaVersion": 2')
        if request.method == "HEAD":
            return web.Response(status=200, headers={"Content-Length": str(len(body))})
        return web.Response(body=body, content_type="application/vnd.oci.image.manifest.v1+json")

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        self.requests[f"{request.method} upload"] += 1
        if request.method == "POST":
            name = request.match_info["name"]
            return web.Response(status=202, headers={"Location": f"/v2/{name}/blobs/uploads/{uuid.uuid4()}?x=1"})
        body = await request.read()
        digest = request.query["digest"]
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            return web.Response(status=400, text="digest mismatch")
        self.blobs[digest] = body
        return web.Response(status=201)

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        digest = request.match_info["digest"]
        self.requests[f"{request.method} blob"] += 1
        if digest not in self.blobs:
            return web.Response(status=404)
        body = self.blobs[digest]
        if request.method == "HEAD":
            return web.Response(status=200, headers={"Content-Length": str(len(body))})
        if self.tamper == "blob":
            body = bytes([body[0] ^ 1]) + body[1:]
        elif self.tamper == "longer":
            body = body + b"\0" * (1024 * 1024)
        response = web.StreamResponse()  # chunked: no Content-Length to trust
        await response.prepare(request)
        for start in range(0, len(body), 65536):
            await response.write(body[start : start + 65536])
        await response.write_eof()
        return response

    # --- lifetime ------------------------------------------------------------------------------------
    def start(self) -> None:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            runner = web.AppRunner(self._application(), access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, 0)
            loop.run_until_complete(site.start())
            self.port = runner.addresses[0][1]
            self._runner = runner
            started.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the fake registry did not start")

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)


@contextlib.contextmanager
def fake_registry(host: str = "127.0.0.1") -> Iterator[FakeRegistry]:
    registry = FakeRegistry(host)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()
