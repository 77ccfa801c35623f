"""Where an episode's logs and artifacts outlive its pods — and the replica that drove it.

One :class:`BlobStore` per operator, through ``obstore`` (Apache Arrow's ``object_store``): the
operator's data directory by default (a single replica, or replicas sharing a ReadWriteMany
volume), or an S3-compatible bucket, so that any replica serves any Episode's files and losing a
replica loses none. Blobs are named per Episode (namespace, name and uid, so a re-created Episode
never reads an old one's files), attempt, turn, kind and name::

    <namespace>/<name>/<uid>/attempt-<n>/<turn>/<kind>/<name>

:class:`EpisodeBlobs` is one Episode's view, the runner's :class:`EpisodeStore`. The kinds so far:
``logs`` (``<job>.txt``) and ``artifacts`` (``NNN.tar`` for manifest entry NNN, and
``manifest.json``); trajectories and model-call captures are more kinds of the same. Artifact
entries are kept as the tars collected from the sandbox (member names relative to ``/``), which is
also exactly what a separate verifier pod needs to recreate them at their original absolute paths.
The local layout is the one the data directory always had, so existing data stays readable.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import obstore
from obstore.store import LocalStore, MemoryStore, S3Store

if TYPE_CHECKING:  # the typed configurations exist in obstore's stubs only
    from obstore.store import ClientConfig, ObjectStore, S3Config

MANIFEST = "manifest.json"
LOGS = "logs"
ARTIFACTS = "artifacts"
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
# The jobs of a turn (and the seed's agent setup) in the order they run, by their logs' names
# (collect-1, collect-2… are "collect"); other names follow, by time.
LOG_ORDER = ("agent-setup", "setup", "healthcheck", "agent", "collect", "verifier")


class EpisodeStore(Protocol):
    """Per-episode storage of logs and artifacts."""

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None: ...

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None:
        """Archive ``index`` of a turn: the tar of manifest entry ``index``."""
        ...

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None: ...

    async def artifact_archives(self, attempt: int, turn: str) -> list[bytes]: ...


def safe(name: str) -> str:
    """A path component that cannot escape its folder."""
    cleaned = SAFE_NAME.sub("_", name)
    return cleaned if cleaned not in ("", ".", "..") else "_"


@dataclass(frozen=True)
class StoreSettings:
    """``episode-operator run``'s store flags: no URL keeps everything in the data directory."""

    url: str | None = None  # s3://bucket/prefix
    endpoint: str | None = None  # an S3-compatible server (MinIO, Ceph, …); None: AWS
    region: str | None = None
    allow_http: bool = False

    def open(self, data_dir: Path) -> BlobStore:
        """The store these settings name; credentials come from the environment (AWS_ACCESS_KEY_ID…)."""
        if self.url is None:
            return BlobStore.local(data_dir)
        config: S3Config = {}
        if self.endpoint:
            config["endpoint"] = self.endpoint
            config["virtual_hosted_style_request"] = False  # path-style, as S3-compatible servers expect
        if self.region:
            config["region"] = self.region
        client_options: ClientConfig = {"allow_http": self.allow_http}
        return BlobStore(S3Store.from_url(self.url, config=config, client_options=client_options), self.url)


@dataclass(frozen=True)
class Blob:
    key: str
    modified: datetime
    size: int


class BlobStore:
    """Named blobs in an object store (a directory, a bucket, or memory for tests)."""

    def __init__(self, store: ObjectStore, where: str) -> None:
        self.store = store
        self.where = where

    @classmethod
    def local(cls, root: Path) -> BlobStore:
        root.mkdir(parents=True, exist_ok=True)
        return cls(LocalStore(root, mkdir=True), str(root))

    @classmethod
    def memory(cls) -> BlobStore:
        return cls(MemoryStore(), "memory")

    async def put(self, key: str, data: bytes) -> None:
        await obstore.put_async(self.store, key, data)

    async def get(self, key: str) -> bytes | None:
        """The blob's bytes; None when there is none."""
        try:
            result = await obstore.get_async(self.store, key)
            return bytes(await result.bytes_async())
        except FileNotFoundError:
            return None

    async def list(self, prefix: str) -> list[Blob]:
        """The blobs below ``prefix`` (a folder: whole path segments)."""
        blobs = []
        async for chunk in obstore.list(self.store, prefix):
            blobs += [Blob(meta["path"], meta["last_modified"], meta["size"]) for meta in chunk]
        return blobs

    def episode(self, namespace: str, name: str, uid: str) -> EpisodeBlobs:
        return EpisodeBlobs(self, f"{safe(namespace)}/{safe(name)}/{safe(uid)}")


@dataclass(frozen=True)
class KeptBlob:
    """One blob of an Episode, by where it belongs."""

    attempt: int
    turn: str
    kind: str
    name: str
    key: str
    modified: datetime


@dataclass(frozen=True)
class EpisodeBlobs:
    """One Episode's blobs: named by attempt, turn, kind and name (an :class:`EpisodeStore`)."""

    store: BlobStore
    prefix: str

    @classmethod
    def local(cls, root: Path) -> EpisodeBlobs:
        """An Episode's blobs directly in ``root`` (a local replay's logs)."""
        return cls(BlobStore.local(root), "")

    def key(self, attempt: int, turn: str, kind: str, name: str) -> str:
        path = f"attempt-{attempt}/{safe(turn)}/{kind}/{safe(name)}"
        return f"{self.prefix}/{path}" if self.prefix else path

    async def put(self, attempt: int, turn: str, kind: str, name: str, data: bytes) -> None:
        await self.store.put(self.key(attempt, turn, kind, name), data)

    async def get(self, attempt: int, turn: str, kind: str, name: str) -> bytes | None:
        return await self.store.get(self.key(attempt, turn, kind, name))

    async def kept(self) -> list[KeptBlob]:
        """Everything kept for the Episode: oldest attempt first, its turns in the order they were
        first written to, each turn's logs in the order a turn runs its jobs (:data:`LOG_ORDER`;
        S3 keeps modification times to the second only, too coarse for jobs of one turn)."""
        kept = []
        for listed in await self.store.list(self.prefix):
            parts = listed.key.removeprefix(self.prefix).strip("/").split("/")
            if len(parts) != 4 or not parts[0].startswith("attempt-") or not parts[0][8:].isdigit():
                continue
            kept.append(KeptBlob(int(parts[0][8:]), parts[1], parts[2], parts[3], listed.key, listed.modified))
        started: dict[tuple[int, str], datetime] = {}
        for blob in kept:
            key = (blob.attempt, blob.turn)
            started[key] = min(started.get(key, blob.modified), blob.modified)

        def order(blob: KeptBlob) -> tuple[Any, ...]:
            stem = blob.name.removesuffix(".txt")
            stem = "collect" if stem.startswith("collect-") else stem
            rank = LOG_ORDER.index(stem) if stem in LOG_ORDER else len(LOG_ORDER)
            return (blob.attempt, started[(blob.attempt, blob.turn)], blob.turn, rank, blob.modified, blob.name)

        return sorted(kept, key=order)

    # EpisodeStore -------------------------------------------------------------------------------
    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await self.put(attempt, turn, LOGS, f"{name}.txt", data)

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None:
        await self.put(attempt, turn, ARTIFACTS, f"{index:03d}.tar", archive)

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None:
        await self.put(attempt, turn, ARTIFACTS, MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())

    async def artifact_archives(self, attempt: int, turn: str) -> list[bytes]:
        found = [
            blob
            for blob in await self.kept()
            if (blob.attempt, blob.turn, blob.kind) == (attempt, safe(turn), ARTIFACTS)
        ]
        archives = []
        for blob in sorted(found, key=lambda blob: blob.name):
            if blob.name.endswith(".tar") and (data := await self.store.get(blob.key)) is not None:
                archives.append(data)
        return archives


# --- reading what was kept (the operator's HTTP endpoint, kubectl episode) ------------------------------
@dataclass(frozen=True)
class KeptLog:
    attempt: int
    turn: str
    name: str
    data: bytes


async def kept_logs(blobs: EpisodeBlobs, *, turn: str | None = None, attempt: int | None = None) -> list[KeptLog]:
    """The logs kept for one Episode, oldest attempt first, in the order they were written."""
    logs = []
    for blob in await blobs.kept():
        if blob.kind != LOGS or (turn is not None and blob.turn != safe(turn)):
            continue
        if attempt is not None and blob.attempt != attempt:
            continue
        data = await blobs.store.get(blob.key)
        if data is not None:
            logs.append(KeptLog(blob.attempt, blob.turn, blob.name.removesuffix(".txt"), data))
    return logs


def render_logs(logs: Sequence[KeptLog]) -> bytes:
    """Logs as ``kubectl episode logs`` prints them: a header line before each."""
    chunks: list[bytes] = []
    for log in logs:
        chunks += [f"==> attempt {log.attempt} turn {log.turn}: {log.name} <==\n".encode(), log.data, b"\n"]
    return b"".join(chunks)


async def export_artifacts(blobs: EpisodeBlobs, destination: Path, *, attempt: int | None = None) -> list[Path]:
    """Unpack the latest attempt's artifacts as ``<destination>/<turn>/<artifact destination>/…``.

    Each turn also gets its ``manifest.json``. Archives come from a sandbox an agent
    controlled, so they are unpacked with the ``data`` filter: no absolute paths, no
    ``..``, no links leaving the folder, no device files.
    """
    artifacts = [blob for blob in await blobs.kept() if blob.kind == ARTIFACTS]
    number = attempt if attempt is not None else max((blob.attempt for blob in artifacts), default=None)
    written: list[Path] = []
    for turn in sorted({blob.turn for blob in artifacts if blob.attempt == number}):
        manifest_data = await blobs.get(number or 0, turn, ARTIFACTS, MANIFEST)
        if manifest_data is None:
            continue
        target = destination / turn
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).write_bytes(manifest_data)
        written.append(target / MANIFEST)
        manifest = json.loads(manifest_data)
        # Archive N holds manifest entry N (collection order).
        for blob in sorted(artifacts, key=lambda blob: blob.name):
            if blob.attempt != number or blob.turn != turn or not blob.name.endswith(".tar"):
                continue
            position = int(blob.name.removesuffix(".tar"))
            archive = await blobs.store.get(blob.key)
            if archive is not None and position < len(manifest):
                entry = manifest[position]
                written += _unpack_renamed(archive, entry["source"], entry["destination"], target)
    return written


def _unpack_renamed(archive_data: bytes, source: str, destination: str, target: Path) -> list[Path]:
    prefix = source.strip("/")
    written: list[Path] = []
    with tarfile.open(fileobj=io.BytesIO(archive_data)) as archive:
        members = []
        for member in archive.getmembers():
            name = member.name.rstrip("/")
            if name == prefix:
                member.name = destination
            elif name.startswith(prefix + "/"):
                member.name = destination.rstrip("/") + name[len(prefix) :]
            else:
                continue
            members.append(member)
        archive.extractall(target, members=members, filter="data")
        written += [target / member.name for member in members if member.isfile()]
    return written
