"""Time the capture proxy adds to a model call, against calling the same endpoint directly, in the same run.

Three processes, as in a pod: a model endpoint (this script with ``--serve-upstream``: canned chat
completions, JSON or SSE, answered at once so that only overhead is measured), the real proxy
(``episode-operator capture-proxy``, records written to a store on disk as in an emptyDir), and this
client (one keep-alive aiohttp session, as a harness's SDK holds). Calls alternate direct and
proxied, so drift on this shared machine falls on both alike. Each request carries a ~30 KB
conversation (a harness's system prompt, tools and history); a streamed answer is 40 chunks.

Measured per call: a JSON call's whole latency; a streamed call's time to first byte (the first
body chunk) and whole latency. Printed: p50 and p99 of each, direct and proxied, the added time
and the ratio, and the proxy's CPU time per call (from /proc: what the proxy costs whatever the machine's
load). Usage: ``.venv/bin/python bench/capture_latency.py [--calls 500] [--fsync]``;
writes ``bench/out/capture_latency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

OUT = Path(__file__).resolve().parent / "out"
PROGRAM = Path(sys.executable).parent / "episode-operator"
CHUNKS = 40
ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 200}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7000, "completion_tokens": 200, "total_tokens": 7200},
}


def request_body(stream: bool) -> dict[str, Any]:
    history = [{"role": "user" if turn % 2 else "assistant", "content": "x" * 1500} for turn in range(18)]
    return {"model": "bench", "stream": stream, "messages": [{"role": "system", "content": "s" * 3000}, *history]}


# --- the model endpoint ---------------------------------------------------------------------------------
async def answer(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(ANSWER)
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for index in range(CHUNKS):
        delta = {"content": "ok "} if index else {"role": "assistant", "content": ""}
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "model": "bench",
            "choices": [{"index": 0, "delta": delta}],
        }
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"id": "chatcmpl-bench", "choices": [], "usage": ANSWER["usage"]}
    await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response


def serve_upstream(port_file: Path) -> None:
    async def main() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_file.write_text(str(site._server.sockets[0].getsockname()[1]))  # type: ignore[union-attr]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# --- the client -----------------------------------------------------------------------------------------
async def timed_call(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[float, float]:
    """(time to first body byte, whole call) in ms."""
    body = request_body(stream)
    started = time.perf_counter()
    async with session.post(url, json=body, headers={"authorization": "Bearer placeholder"}) as response:
        first = await response.content.readany()
        ttfb = time.perf_counter() - started
        assert response.status == 200 and first, response.status
        await response.read()
    return ttfb * 1000, (time.perf_counter() - started) * 1000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def measure(direct: str, proxied: str, calls: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for stream in (False, True):
            for _ in range(20):  # warm: connections open, code paths hot
                await timed_call(session, direct, stream)
                await timed_call(session, proxied, stream)
            samples: dict[str, list[tuple[float, float]]] = {"direct": [], "proxied": []}
            for index in range(calls):
                order = ("direct", "proxied") if index % 2 else ("proxied", "direct")
                for mode in order:
                    samples[mode].append(await timed_call(session, direct if mode == "direct" else proxied, stream))
            results["stream" if stream else "json"] = samples
    return results


def report(results: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    headings = ("direct p50", "proxied p50", "added p50", "ratio", "direct p99", "proxied p99")
    print(f"{'measure':<28}" + "".join(f"{heading:>12}" for heading in headings))
    for kind, metric, index in (
        ("json", "JSON call", 1),
        ("stream", "stream: first byte", 0),
        ("stream", "stream: whole", 1),
    ):
        direct = [sample[index] for sample in results[kind]["direct"]]
        proxied = [sample[index] for sample in results[kind]["proxied"]]
        figures = {
            "direct_p50_ms": statistics.median(direct),
            "proxied_p50_ms": statistics.median(proxied),
            "direct_p99_ms": percentile(direct, 0.99),
            "proxied_p99_ms": percentile(proxied, 0.99),
        }
        figures["added_p50_ms"] = figures["proxied_p50_ms"] - figures["direct_p50_ms"]
        figures["added_p99_ms"] = figures["proxied_p99_ms"] - figures["direct_p99_ms"]
        figures["ratio_p50"] = figures["proxied_p50_ms"] / figures["direct_p50_ms"]
        rows[metric] = figures
        print(
            f"{metric:<28}{figures['direct_p50_ms']:>10.2f}ms{figures['proxied_p50_ms']:>10.2f}ms"
            f"{figures['added_p50_ms']:>10.2f}ms{figures['ratio_p50']:>12.2f}"
            f"{figures['direct_p99_ms']:>10.2f}ms{figures['proxied_p99_ms']:>10.2f}ms"
        )
    return rows


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(path: Path, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="calls per mode and shape (default 500)")
    parser.add_argument("--fsync", action="store_true", help="the proxy fsyncs each record")
    parser.add_argument("--serve-upstream", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve_upstream:
        serve_upstream(arguments.serve_upstream)
        return
    with tempfile.TemporaryDirectory(prefix="capture-bench-", dir=os.environ.get("BENCH_STORE_PARENT")) as folder:
        work = Path(folder)
        port_file, store = work / "upstream.port", work / "store"
        upstream = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port_file)])
        proxy: subprocess.Popen[bytes] | None = None
        try:
            wait_for(port_file, upstream, "the endpoint")
            base = f"http://127.0.0.1:{port_file.read_text()}/v1"
            command = [
                str(PROGRAM),
                "capture-proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                base,
                "--store",
                str(store),
            ]
            proxy = subprocess.Popen(command + (["--fsync"] if arguments.fsync else []))
            wait_for(store / "ready.json", proxy, "the proxy")
            listen = json.loads((store / "ready.json").read_text())["listen"]
            fsync = "on" if arguments.fsync else "off"
            print(f"upstream pid {upstream.pid}, proxy pid {proxy.pid} (fsync {fsync}), store {store}")
            cpu_before = cpu_seconds(proxy.pid)
            endpoints = (f"{base}/chat/completions", f"http://{listen}/v1/chat/completions")
            results = asyncio.run(measure(*endpoints, arguments.calls))
            proxy_cpu_ms = (cpu_seconds(proxy.pid) - cpu_before) * 1000 / (2 * (arguments.calls + 20))
            recorded = sum(not line.startswith('{"begun"') for path in store.rglob("*.jsonl") for line in path.open())
        finally:
            for process in (proxy, upstream):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(30)
    expected = 2 * (arguments.calls + 20)
    print(f"{recorded} calls recorded (expected {expected}); {arguments.calls} per mode and shape, alternating")
    figures = report(results)
    print(f"proxy CPU per call: {proxy_cpu_ms:.2f} ms (user+system, all shapes)")
    figures["proxy_cpu_ms_per_call"] = proxy_cpu_ms
    OUT.mkdir(exist_ok=True)
    document = {"calls": arguments.calls, "fsync": arguments.fsync, "recorded": recorded, "figures": figures}
    (OUT / "capture_latency.json").write_text(json.dumps(document, indent=2) + "\n")
    if recorded != expected:
        raise SystemExit("the proxy did not record every call")


if __name__ == "__main__":
    main()
