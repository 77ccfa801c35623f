"""The store of logs and artifacts: the data directory, and an S3-compatible bucket (moto's server).

The same scenario runs against every kind of store: what one process (a replica) writes, another
store object on the same place (another replica) reads — named per Episode, attempt, turn, kind
and name, in the order written (the data API serves these readings: tests/unit/test_server.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest

from episode_operator.runtime.archive import tar_bytes
from episode_operator.runtime.episode_store import BlobStore, EpisodeBlobs, StoreSettings, export_artifacts, kept_logs
from episode_operator.runtime.sandbox_protocol import ArchiveFile
from tests.s3server import CREDENTIALS, S3Server, s3_server

obstore_list = obstore.list

MANIFEST = [
    {
        "source": "/app/out",
        "destination": "out",
        "type": "directory",
        "status": "ok",
        "service": "main",
        "origin": "task",
    }
]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)


def stores(kind: str, tmp_path: Path, s3: S3Server | None) -> tuple[BlobStore, BlobStore]:
    """Two store objects on the same place, as two replicas have."""
    if kind == "local":
        return BlobStore.local(tmp_path), BlobStore.local(tmp_path)
    assert s3 is not None
    bucket = f"bucket-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    s3.create_bucket(bucket)
    settings = StoreSettings(url=f"s3://{bucket}/episodes", endpoint=s3.endpoint, region="us-east-1", allow_http=True)
    return settings.open(tmp_path), settings.open(tmp_path)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_what_one_replica_keeps_another_reads_and_serves(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    s3 = request.getfixturevalue("s3") if kind == "s3" else None
    if kind == "s3":
        request.getfixturevalue("s3_env")
    writer, reader = stores(kind, tmp_path, s3)

    async def scenario() -> None:
        episode = writer.episode("ns", "ep", "uid-1")
        await episode.save_log(1, "one", "setup", b"setup ran\n")
        await episode.save_log(1, "one", "agent", b"agent says hi\n")
        await episode.save_log(2, "one", "agent", b"second attempt\n")
        await episode.save_log(2, "two/../x", "verifier", b"a turn name that tries to escape\n")
        kept = ArchiveFile.of_bytes(tar_bytes([("app/out/result.txt", b"42", 0o644)]))
        try:
            await episode.save_artifact(2, "one", 0, kept)  # streamed from its file
        finally:
            kept.discard()
        await episode.save_manifest(2, "one", MANIFEST)
        await episode.put(2, "one", "trajectories", "agent.json", b"{}")  # a kind of the future: the same API
        await writer.episode("ns", "ep", "uid-2").save_log(1, "one", "agent", b"another Episode of that name\n")

        other = reader.episode("ns", "ep", "uid-1")
        logs = await kept_logs(other)
        assert [(log.attempt, log.turn, log.name) for log in logs] == [
            (1, "one", "setup"),
            (1, "one", "agent"),
            (2, "one", "agent"),
            (2, "two_.._x", "verifier"),
        ]
        assert [log.data for log in await kept_logs(other, turn="one", attempt=2)] == [b"second attempt\n"]
        archives = await other.artifact_archives(2, "one")
        assert [archive.read_bytes() for archive in archives] == [tar_bytes([("app/out/result.txt", b"42", 0o644)])]
        for archive in archives:
            archive.discard()
        assert await other.get(2, "one", "trajectories", "agent.json") == b"{}"
        assert await other.get(2, "one", "trajectories", "missing.json") is None
        exported = await export_artifacts(other, tmp_path / "exported")
        assert (tmp_path / "exported" / "one" / "out" / "result.txt").read_text() == "42"
        assert json.loads((tmp_path / "exported" / "one" / "manifest.json").read_text()) == MANIFEST
        assert len(exported.written) == 2 and exported.refused == []

    asyncio.run(scenario())


def test_the_local_layout_is_the_data_directorys_as_before(tmp_path: Path) -> None:
    """An operator upgraded in place reads what the previous version kept."""
    old = tmp_path / "ns" / "ep" / "uid-1" / "attempt-1" / "one"
    (old / "logs").mkdir(parents=True)
    (old / "logs" / "agent.txt").write_bytes(b"kept before\n")

    async def scenario() -> None:
        episode = BlobStore.local(tmp_path).episode("ns", "ep", "uid-1")
        assert [log.data for log in await kept_logs(episode)] == [b"kept before\n"]
        await episode.save_log(1, "two", "agent", b"new\n")
        assert (tmp_path / "ns" / "ep" / "uid-1" / "attempt-1" / "two" / "logs" / "agent.txt").read_bytes() == b"new\n"

    asyncio.run(scenario())


def test_an_unreachable_bucket_is_an_error_naming_it(tmp_path: Path, s3_env: None) -> None:
    settings = StoreSettings(url="s3://no-such-bucket/x", endpoint="http://127.0.0.1:9", allow_http=True)
    store = settings.open(tmp_path)

    async def scenario() -> None:
        with pytest.raises(Exception, match=r"127\.0\.0\.1:9"):
            await asyncio.wait_for(store.get("a"), 60)

    asyncio.run(scenario())


def test_the_store_never_hands_obstore_an_asyncio_future(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """obstore's ``*_async`` calls leave Python futures with tokio threads, which may drop them while
    the interpreter finalizes: the process then aborts at exit (CI saw ``kubectl episode logs
    --data-dir`` die of SIGABRT; about one run in fifty). The store uses the blocking calls in
    worker threads; here the async ones fail, and every operation still works."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("obstore's asyncio API was called")

    for name in ("put_async", "get_async", "delete_async", "head_async"):
        monkeypatch.setattr(obstore, name, refused)
    monkeypatch.setattr(obstore, "list", lambda *args, **kwargs: _SyncOnlyListing(obstore_list(*args, **kwargs)))

    async def scenario() -> None:
        episode = BlobStore.local(tmp_path).episode("ns", "ep", "uid-1")
        await episode.save_log(1, "one", "agent", b"hi\n")
        assert [log.data for log in await kept_logs(episode)] == [b"hi\n"]
        assert await episode.get(1, "one", "logs", "missing.txt") is None

    asyncio.run(scenario())


class _SyncOnlyListing:
    """obstore's listing stream with its asyncio side refused."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __iter__(self) -> Any:
        return iter(self.stream)

    def collect(self) -> Any:
        return self.stream.collect()

    def __aiter__(self) -> Any:
        raise AssertionError("obstore's asyncio listing was used")

    async def collect_async(self) -> Any:
        raise AssertionError("obstore's asyncio listing was used")


def listing(root: Path, **filters: Any) -> list[tuple[int, str, str]]:
    logs = asyncio.run(kept_logs(EpisodeBlobs.local(root), **filters))
    return [(log.attempt, log.turn, log.name) for log in logs]


def test_logs_are_listed_in_the_order_the_turns_ran(tmp_path: Path) -> None:
    """Turn names sort differently from the run order ("one", "three", "two"; "10" before "2"),
    and logs saved within one clock tick have equal modification times."""
    store = EpisodeBlobs.local(tmp_path)
    ran = [
        (1, "seed", "agent-setup"),
        (1, "one", "setup"),
        (1, "one", "agent"),
        (1, "one", "verifier"),
        (1, "two", "agent"),
        (1, "two", "verifier"),
        (1, "three", "agent"),
        (1, "three", "collect-0"),
        (1, "three", "verifier"),
        (2, "one", "agent"),
    ]

    async def save_all() -> None:
        for attempt, turn, name in ran:
            await store.save_log(attempt, turn, name, f"{turn} {name}\n".encode())
        await store.save_log(1, "one", "agent", b"saved again by a restarted runner\n")

    asyncio.run(save_all())
    for log in (tmp_path / "attempt-1").glob("*/logs/*.txt"):
        os.utime(log, ns=(0, 0))  # no help from the clock
    assert listing(tmp_path) == ran
    assert listing(tmp_path, turn="two") == [(1, "two", "agent"), (1, "two", "verifier")]
    assert listing(tmp_path, attempt=2) == [(2, "one", "agent")]


def test_logs_kept_before_the_order_was_recorded_follow_their_times(tmp_path: Path) -> None:
    for age, (turn, name) in enumerate([("b", "verifier"), ("b", "agent"), ("a", "agent")]):
        log = tmp_path / "attempt-1" / turn / "logs" / f"{name}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("old\n")
        os.utime(log, ns=(10 - age, 10 - age))
    assert listing(tmp_path) == [(1, "a", "agent"), (1, "b", "agent"), (1, "b", "verifier")]
