"""The operator's HTTP endpoint: metrics text, and the logs and artifacts kept per Episode."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from episode_operator.runtime.archive import tar_bytes
from episode_operator.runtime.metrics import Metrics
from episode_operator.runtime.server import application
from episode_operator.runtime.store import BlobStore
from tests.unit.test_store import MANIFEST


def test_metrics_logs_and_artifacts(tmp_path: Path) -> None:
    metrics = Metrics()
    metrics.episode_finished("Graded", None, 0.5)
    store = BlobStore.local(tmp_path).episode("ns", "ep", "uid-1")

    async def scenario() -> None:
        await store.save_log(1, "one", "agent", b"agent says hi\n")
        await store.save_log(1, "two", "verifier", b"verifier output\n")
        await store.save_artifact(1, "one", 0, tar_bytes([("app/out/result.txt", b"42", 0o644)]))
        await store.save_manifest(1, "one", MANIFEST)
        async with TestClient(TestServer(application(metrics, BlobStore.local(tmp_path)))) as http:
            text = await (await http.get("/metrics")).text()
            assert 'episode_operator_episodes_total{failure_kind="",outcome="Graded"} 1.0' in text
            logs = await (await http.get("/v1/episodes/ns/ep/uid-1/logs", params={"turn": "two"})).text()
            assert logs == "==> attempt 1 turn two: verifier <==\nverifier output\n\n"
            assert (await http.get("/v1/episodes/ns/ep/other-uid/logs")).status == 404
            answer = await http.get("/v1/episodes/ns/ep/uid-1/artifacts.tar.gz")
            assert answer.status == 200
            with tarfile.open(fileobj=io.BytesIO(await answer.read())) as archive:
                names = archive.getnames()
                assert "one/out/result.txt" in names
                manifest = archive.extractfile("one/manifest.json")
                assert manifest is not None and json.loads(manifest.read())[0]["destination"] == "out"

    asyncio.run(scenario())
