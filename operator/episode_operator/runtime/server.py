"""The operator's open HTTP endpoint: Prometheus metrics, on a port of its own.

Nothing here is private: the kept logs and artifacts are served by the data API
(``runtime/data_api_server.py``), on another port, only to callers the API server authorises.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from episode_operator.runtime.metrics import Metrics


def application(metrics: Metrics) -> web.Application:
    """The aiohttp application (separate from serving it, for tests)."""

    async def show_metrics(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", show_metrics)
    return app


async def serve(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """Start serving; the caller keeps the runner and cleans it up at shutdown."""
    runner = web.AppRunner(application(metrics), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
