"""The operator's HTTP endpoint: Prometheus metrics, and each Episode's kept logs and artifacts.

``kubectl episode logs`` and ``artifacts`` reach an in-cluster operator through the API
server's service proxy (so they need no port-forward and obey RBAC on ``services/proxy``);
an operator running on the same machine is read directly from its data directory. Every replica
serves every Episode: they are read from the operator's store (runtime/store.py), not from what
this replica drove.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import tempfile
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from episode_operator.runtime.metrics import Metrics
from episode_operator.runtime.store import (
    BlobStore,
    EpisodeBlobs,
    export_artifacts,
    kept_logs,
    render_logs,
    turn_records,
)

API_PREFIX = "/v1/episodes/{namespace}/{name}/{uid}"


def application(metrics: Metrics, store: BlobStore) -> web.Application:
    """The aiohttp application (separate from serving it, for tests)."""

    async def show_metrics(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def blobs_of(request: web.Request) -> EpisodeBlobs:
        info = request.match_info
        blobs = store.episode(info["namespace"], info["name"], info["uid"])
        if not await blobs.kept():
            raise web.HTTPNotFound(text=f"nothing kept for {info['namespace']}/{info['name']}\n")
        return blobs

    async def show_logs(request: web.Request) -> web.Response:
        blobs = await blobs_of(request)
        turn = request.query.get("turn")
        attempt = int(request.query["attempt"]) if request.query.get("attempt", "").isdigit() else None
        logs = await kept_logs(blobs, turn=turn, attempt=attempt)
        if not logs:
            raise web.HTTPNotFound(text="no logs kept" + (f" for turn {turn}" if turn else "") + "\n")
        return web.Response(body=render_logs(logs), content_type="text/plain")

    async def send_artifacts(request: web.Request) -> web.Response:
        blobs = await blobs_of(request)
        body = await _artifacts_tar(blobs)
        if body is None:
            raise web.HTTPNotFound(text="no artifacts kept\n")
        return web.Response(body=body, content_type="application/gzip")

    async def show_turns(request: web.Request) -> web.Response:
        """Each turn's instruction, recorded model calls and trajectory (export, ``kubectl episode trajectory``)."""
        blobs = await blobs_of(request)
        attempt = int(request.query["attempt"]) if request.query.get("attempt", "").isdigit() else None
        return web.json_response(await turn_records(blobs, attempt=attempt))

    app = web.Application()
    app.router.add_get("/metrics", show_metrics)
    app.router.add_get(f"{API_PREFIX}/logs", show_logs)
    app.router.add_get(f"{API_PREFIX}/artifacts.tar.gz", send_artifacts)
    app.router.add_get(f"{API_PREFIX}/turns", show_turns)
    return app


async def _artifacts_tar(blobs: EpisodeBlobs) -> bytes | None:
    with tempfile.TemporaryDirectory() as scratch:
        written = await export_artifacts(blobs, Path(scratch))
        if not written:
            return None
        return await asyncio.to_thread(_gzip_tar, Path(scratch))


def _gzip_tar(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for child in sorted(folder.iterdir()):
            archive.add(child, arcname=child.name)
    return buffer.getvalue()


async def serve(metrics: Metrics, store: BlobStore, host: str, port: int) -> web.AppRunner:
    """Start serving; the caller keeps the runner and cleans it up at shutdown."""
    runner = web.AppRunner(application(metrics, store), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
