"""The operator's HTTP endpoint: Prometheus metrics, and each Episode's kept logs and artifacts.

``kubectl episode logs`` and ``artifacts`` reach an in-cluster operator through the API
server's service proxy (so they need no port-forward and obey RBAC on ``services/proxy``);
an operator running on the same machine is read directly from its data directory.
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
from episode_operator.runtime.store import episode_store_root, export_artifacts, stored_logs, turn_records

API_PREFIX = "/v1/episodes/{namespace}/{name}/{uid}"


def application(metrics: Metrics, data_dir: Path) -> web.Application:
    """The aiohttp application (separate from serving it, for tests)."""

    async def show_metrics(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def root_of(request: web.Request) -> Path:
        info = request.match_info
        root = episode_store_root(data_dir, info["namespace"], info["name"], info["uid"])
        if not root.is_dir():
            raise web.HTTPNotFound(text=f"nothing kept for {info['namespace']}/{info['name']}\n")
        return root

    async def show_logs(request: web.Request) -> web.Response:
        root = root_of(request)
        turn = request.query.get("turn")
        attempt = int(request.query["attempt"]) if request.query.get("attempt", "").isdigit() else None
        chunks: list[bytes] = []
        for log in await asyncio.to_thread(stored_logs, root, turn=turn, attempt=attempt):
            chunks.append(f"==> attempt {log.attempt} turn {log.turn}: {log.name} <==\n".encode())
            chunks.append(await asyncio.to_thread(log.path.read_bytes))
            chunks.append(b"\n")
        if not chunks:
            raise web.HTTPNotFound(text="no logs kept" + (f" for turn {turn}" if turn else "") + "\n")
        return web.Response(body=b"".join(chunks), content_type="text/plain")

    async def send_artifacts(request: web.Request) -> web.Response:
        root = root_of(request)
        body = await asyncio.to_thread(_artifacts_tar, root)
        if body is None:
            raise web.HTTPNotFound(text="no artifacts kept\n")
        return web.Response(body=body, content_type="application/gzip")

    async def show_turns(request: web.Request) -> web.Response:
        """Each turn's instruction, recorded model calls and trajectory (export, ``kubectl episode trajectory``)."""
        root = root_of(request)
        attempt = int(request.query["attempt"]) if request.query.get("attempt", "").isdigit() else None
        return web.json_response(await asyncio.to_thread(turn_records, root, attempt=attempt))

    app = web.Application()
    app.router.add_get("/metrics", show_metrics)
    app.router.add_get(f"{API_PREFIX}/logs", show_logs)
    app.router.add_get(f"{API_PREFIX}/artifacts.tar.gz", send_artifacts)
    app.router.add_get(f"{API_PREFIX}/turns", show_turns)
    return app


def _artifacts_tar(root: Path) -> bytes | None:
    with tempfile.TemporaryDirectory() as scratch:
        written = export_artifacts(root, Path(scratch))
        if not written:
            return None
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for child in sorted(Path(scratch).iterdir()):
                archive.add(child, arcname=child.name)
        return buffer.getvalue()


async def serve(metrics: Metrics, data_dir: Path, host: str, port: int) -> web.AppRunner:
    """Start serving; the caller keeps the runner and cleans it up at shutdown."""
    runner = web.AppRunner(application(metrics, data_dir), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
