"""Where an episode's logs and artifacts outlive its pods — and the replica that drove it.

One :class:`BlobStore` per operator, through ``obstore`` (Apache Arrow's ``object_store``): the
operator's data directory by default (a single replica, or replicas sharing a ReadWriteMany
volume), or an S3-compatible bucket, so that any replica serves any Episode's files and losing a
replica loses none. Blobs are named per Episode (namespace, name and uid, so a re-created Episode
never reads an old one's files), attempt, turn, kind and name::

    <namespace>/<name>/<uid>/attempt-<n>/<turn>/<kind>/<name>   (logs, artifacts)
    <namespace>/<name>/<uid>/attempt-<n>/<turn>/<record>        (instruction, model calls, trajectory)
    <namespace>/<name>/<uid>/attempt-<n>/logs.order             (the order the logs were first saved)

:class:`EpisodeBlobs` is one Episode's view, the runner's :class:`EpisodeStore`. The kinds so far:
``logs`` (``<job>.txt``) and ``artifacts`` (``NNN.tar`` for manifest entry NNN, and
``manifest.json``); a turn's records (``save_file``) sit beside them. Artifact
entries are kept as the operator re-packed the tars collected from the sandbox (regular files and
directories of the artifact's source only, member names relative to ``/``: ``runtime/archive.py``),
which is also exactly what a separate verifier pod needs to recreate them at their original
absolute paths. Artifacts go to and from the store as files, streamed, never whole in memory.
The local layout is the one the data directory always had, so existing data stays readable.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import obstore
from obstore.store import LocalStore, MemoryStore, S3Store

from episode_operator.api.export import CALLS_RECORD, INSTRUCTION_RECORD, TRAJECTORY_RECORD
from episode_operator.runtime.archive import RefusedMember, extract_files
from episode_operator.runtime.limits import CHUNK_BYTES
from episode_operator.runtime.sandbox_protocol import ArchiveFile

if TYPE_CHECKING:  # the typed configurations exist in obstore's stubs only
    from obstore.store import ClientConfig, ObjectStore, S3Config

MANIFEST = "manifest.json"
LOGS = "logs"
ARTIFACTS = "artifacts"
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
# Parts of a large blob sent at once to a bucket (5 MiB each): what an upload holds in memory.
PUT_CONCURRENCY = 2
# What the store keeps of a turn whose agent acted: its instruction, its recorded model calls (the capture
# proxy's journal) and its ATIF trajectory — what ``kubectl episode export`` and ``trajectory`` read.
INSTRUCTION_FILE, CALLS_FILE, TRAJECTORY_FILE = INSTRUCTION_RECORD, CALLS_RECORD, TRAJECTORY_RECORD
TURN_RECORDS = (INSTRUCTION_FILE, CALLS_FILE, TRAJECTORY_FILE)
# Per attempt: the logs in the order they were first saved ("<turn>/<name>" lines), which is
# the order the turns and their jobs ran in; names alone sort turn 10 before turn 2, and S3 keeps
# modification times to the second only.
LOG_ORDER = "logs.order"


class EpisodeStore(Protocol):
    """Per-episode storage of logs and artifacts."""

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None: ...

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: ArchiveFile) -> None:
        """Archive ``index`` of a turn: the tar of manifest entry ``index``, streamed from its file."""
        ...

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None: ...

    async def artifact_archives(self, attempt: int, turn: str) -> list[ArchiveFile]:
        """A turn's archives in manifest order, each copied to a file the caller discards."""
        ...

    async def save_file(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        """A named record of a turn (its model calls, its trajectory)."""
        ...

    async def read_file(self, attempt: int, turn: str, name: str) -> bytes | None:
        """A record :meth:`save_file` kept, or None."""
        ...


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


# Where an attempt's seed keeps its logs (the replay, builds, the agent's setup), beside its turns'.
SEED_LOGS = "seed"


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

    # obstore's blocking calls, each in a worker thread, not its ``*_async`` ones: those hand
    # Python futures to tokio threads that may drop them while the interpreter finalizes, and the
    # process then aborts at exit (SIGABRT, about one run in fifty of ``kubectl episode logs
    # --data-dir``; pyo3-async-runtimes issue 40). The blocking calls release the GIL as they wait.
    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(obstore.put, self.store, key, data)

    async def get(self, key: str) -> bytes | None:
        """The blob's bytes; None when there is none."""
        return await asyncio.to_thread(self._get, key)

    def _get(self, key: str) -> bytes | None:
        try:
            return bytes(obstore.get(self.store, key).bytes())
        except FileNotFoundError:
            return None

    async def put_file(self, key: str, archive: ArchiveFile) -> None:
        """A blob streamed from a file (in parts of a few MiB, never read whole)."""
        await asyncio.to_thread(obstore.put, self.store, key, archive.path, max_concurrency=PUT_CONCURRENCY)

    async def get_file(self, key: str) -> ArchiveFile | None:
        """The blob streamed into a new temporary file (the caller discards it); None when there is none."""
        return await asyncio.to_thread(self._get_file, key)

    def _get_file(self, key: str) -> ArchiveFile | None:
        try:
            result = obstore.get(self.store, key)
        except FileNotFoundError:
            return None
        descriptor, name = tempfile.mkstemp(prefix="episode-operator-blob-")
        size = 0
        try:
            with os.fdopen(descriptor, "wb") as file:
                for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                    file.write(chunk)
                    size += len(chunk)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        return ArchiveFile(Path(name), size)

    async def list(self, prefix: str) -> list[Blob]:
        """The blobs below ``prefix`` (a folder: whole path segments)."""
        listed = await asyncio.to_thread(lambda: obstore.list(self.store, prefix).collect())
        return [Blob(meta["path"], meta["last_modified"], meta["size"]) for meta in listed]

    def episode(self, namespace: str, name: str, uid: str) -> EpisodeBlobs:
        return EpisodeBlobs(self, f"{safe(namespace)}/{safe(name)}/{safe(uid)}")

    async def latest_episode(self, namespace: str, name: str) -> EpisodeBlobs | None:
        """Of the Episodes of that name (one uid each), the one written to last; None if none."""
        newest: dict[str, datetime] = {}
        for blob in await self.list(f"{safe(namespace)}/{safe(name)}"):
            parts = blob.key.split("/")  # namespace, name, uid, attempt-N, …
            if len(parts) > 3:
                newest[parts[2]] = max(newest.get(parts[2], blob.modified), blob.modified)
        uid = max(newest, key=lambda found: newest[found], default=None)
        return self.episode(namespace, name, uid) if uid else None


@dataclass(frozen=True)
class KeptBlob:
    """One blob of an Episode, by where it belongs (``kind`` "" for a turn's record)."""

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

    def key(self, attempt: int, *parts: str) -> str:
        path = "/".join([f"attempt-{attempt}", *map(safe, parts)])
        return f"{self.prefix}/{path}" if self.prefix else path

    async def put(self, attempt: int, turn: str, *path_and_data: Any) -> None:
        """``put(attempt, turn, [kind,] name, data)``: a blob of a turn."""
        *path, data = path_and_data
        await self.store.put(self.key(attempt, turn, *path), data)

    async def get(self, attempt: int, turn: str, *path: str) -> bytes | None:
        """``get(attempt, turn, [kind,] name)``: a blob of a turn, or None."""
        return await self.store.get(self.key(attempt, turn, *path))

    async def kept(self) -> list[KeptBlob]:
        """Everything kept for the Episode: oldest attempt first, then as written (:func:`kept_logs`
        orders logs by the recorded order instead)."""
        kept = []
        for listed in await self.store.list(self.prefix):
            parts = listed.key.removeprefix(self.prefix).strip("/").split("/")
            if len(parts) not in (3, 4) or not parts[0].startswith("attempt-") or not parts[0][8:].isdigit():
                continue
            kind, name = (parts[2], parts[3]) if len(parts) == 4 else ("", parts[2])
            kept.append(KeptBlob(int(parts[0][8:]), parts[1], kind, name, listed.key, listed.modified))
        return sorted(kept, key=lambda blob: (blob.attempt, blob.modified, blob.key))

    async def log_order(self, attempt: int) -> list[str]:
        data = await self.store.get(self.key(attempt, LOG_ORDER))
        return data.decode().splitlines() if data else []

    # EpisodeStore -------------------------------------------------------------------------------
    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await self.put(attempt, turn, LOGS, f"{name}.txt", data)
        # One driver at a time writes an Episode's blobs (docs/replicas.md): read, append, write is safe.
        order = await self.log_order(attempt)
        entry = f"{safe(turn)}/{safe(name)}"
        if entry not in order:  # a log saved again (a restarted runner) keeps its place
            lines = "".join(f"{line}\n" for line in [*order, entry])
            await self.store.put(self.key(attempt, LOG_ORDER), lines.encode())

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: ArchiveFile) -> None:
        await self.store.put_file(self.key(attempt, turn, ARTIFACTS, f"{index:03d}.tar"), archive)

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None:
        await self.put(attempt, turn, ARTIFACTS, MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())

    async def artifact_archives(self, attempt: int, turn: str) -> list[ArchiveFile]:
        found = [
            blob
            for blob in await self.kept()
            if (blob.attempt, blob.turn, blob.kind) == (attempt, safe(turn), ARTIFACTS)
        ]
        archives = []
        try:
            for blob in sorted(found, key=lambda blob: blob.name):
                if blob.name.endswith(".tar") and (archive := await self.store.get_file(blob.key)) is not None:
                    archives.append(archive)
        except BaseException:
            for archive in archives:
                archive.discard()
            raise
        return archives

    async def save_file(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await self.put(attempt, turn, name, data)

    async def read_file(self, attempt: int, turn: str, name: str) -> bytes | None:
        return await self.get(attempt, turn, name)


# --- reading what was kept (the operator's HTTP endpoint, kubectl episode) ------------------------------
@dataclass(frozen=True)
class KeptLog:
    attempt: int
    turn: str
    name: str
    data: bytes


async def kept_logs(
    blobs: EpisodeBlobs, *, turn: str | None = None, attempt: int | None = None, name: str | None = None
) -> list[KeptLog]:
    """The logs kept for one Episode, oldest attempt first, each attempt's in the order they ran;
    ``name``: only the logs of that name (``agent``, ``verifier``…).

    That order is the attempt's ``logs.order``; logs it does not name (kept before it existed)
    follow, by modification time.
    """
    found = [
        blob
        for blob in await blobs.kept()
        if blob.kind == LOGS
        and (turn is None or blob.turn == safe(turn))
        and (attempt is None or blob.attempt == attempt)
        and (name is None or blob.name.removesuffix(".txt") == safe(name))
    ]
    positions: dict[int, dict[str, int]] = {}
    for number in sorted({blob.attempt for blob in found}):
        positions[number] = {entry: index for index, entry in enumerate(await blobs.log_order(number))}

    def order(blob: KeptBlob) -> tuple[Any, ...]:
        known = positions[blob.attempt]
        return (blob.attempt, known.get(f"{blob.turn}/{blob.name.removesuffix('.txt')}", len(known)), blob.modified)

    logs = []
    for blob in sorted(found, key=order):
        data = await blobs.store.get(blob.key)
        if data is not None:
            logs.append(KeptLog(blob.attempt, blob.turn, blob.name.removesuffix(".txt"), data))
    return logs


async def turn_records(blobs: EpisodeBlobs, *, attempt: int | None = None) -> dict[str, Any]:
    """The records of every turn of an attempt (the latest by default), by turn, as text.

    ``{"attempt": N, "turns": {turn: {"instruction.md": …, "model-calls.jsonl": …, "trajectory.json": …}}}``,
    a file not kept left out.
    """
    kept = await blobs.kept()
    number = attempt if attempt is not None else max((blob.attempt for blob in kept), default=None)
    turns: dict[str, dict[str, str]] = {}
    for blob in sorted(kept, key=lambda blob: (blob.turn, blob.name)):
        if blob.attempt == number and blob.kind == "" and blob.name in TURN_RECORDS:
            data = await blobs.store.get(blob.key)
            if data is not None:
                turns.setdefault(blob.turn, {})[blob.name] = data.decode("utf-8", "replace")
    return {"attempt": number, "turns": turns}


def render_logs(logs: Sequence[KeptLog]) -> bytes:
    """Logs as ``kubectl episode logs`` prints them: a header line before each."""
    chunks: list[bytes] = []
    for log in logs:
        chunks += [f"==> attempt {log.attempt} turn {log.turn}: {log.name} <==\n".encode(), log.data, b"\n"]
    return b"".join(chunks)


def unprinted(kept: bytes, printed: int, head: bytes, tail: bytes) -> bytes | None:
    """What a kept log holds past the ``printed`` bytes a follower already showed of the same output, or
    None when it cannot be the same output: it must begin with what was printed first (``head``) and hold
    what was printed last (``tail``) where the printing stopped. (A log kept as the tail of a longer
    output does not begin with its first bytes: its place is not known.)"""
    if len(kept) < printed or not kept.startswith(head) or kept[printed - len(tail) : printed] != tail:
        return None
    return kept[printed:]


@dataclass(frozen=True)
class Exported:
    """What :func:`export_artifacts` wrote, and the members it refused (a link, a device, a name
    leaving the folder…: what an operator before the re-packing of artifacts may have kept)."""

    written: list[Path]
    refused: list[RefusedMember]


async def export_artifacts(blobs: EpisodeBlobs, destination: Path, *, attempt: int | None = None) -> Exported:
    """Unpack the latest attempt's artifacts as ``<destination>/<turn>/<artifact destination>/…``.

    Each turn also gets its ``manifest.json``. Archives came from a sandbox an agent
    controlled (re-packed, but kept data may predate that), so only regular files and
    directories are unpacked, never outside the folder and through no link
    (``runtime/archive.py`` :func:`extract_files`). Each archive is streamed to a scratch file
    and unpacked in a worker thread.
    """
    artifacts = [blob for blob in await blobs.kept() if blob.kind == ARTIFACTS]
    number = attempt if attempt is not None else max((blob.attempt for blob in artifacts), default=None)
    exported = Exported([], [])
    for turn in sorted({blob.turn for blob in artifacts if blob.attempt == number}):
        manifest_data = await blobs.get(number or 0, turn, ARTIFACTS, MANIFEST)
        if manifest_data is None:
            continue
        target = destination / turn
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).write_bytes(manifest_data)
        exported.written.append(target / MANIFEST)
        manifest = json.loads(manifest_data)
        # Archive N holds manifest entry N (collection order).
        for blob in sorted(artifacts, key=lambda blob: blob.name):
            if blob.attempt != number or blob.turn != turn or not blob.name.endswith(".tar"):
                continue
            position = int(blob.name.removesuffix(".tar"))
            if position >= len(manifest) or (archive := await blobs.store.get_file(blob.key)) is None:
                continue
            entry = manifest[position]
            try:
                written, refused = await asyncio.to_thread(
                    _unpack_renamed, archive, entry["source"], entry["destination"], target
                )
            finally:
                archive.discard()
            exported.written.extend(written)
            exported.refused.extend(refused)
    return exported


def _unpack_renamed(
    archive: ArchiveFile, source: str, destination: str, target: Path
) -> tuple[list[Path], list[RefusedMember]]:
    """The members of ``archive`` under ``source`` unpacked as ``destination`` below ``target``."""
    prefix = source.strip("/")

    def rename(name: str) -> str | None:
        if name == prefix:
            return destination
        if name.startswith(prefix + "/"):
            return destination.rstrip("/") + name[len(prefix) :]
        return None

    with tarfile.open(archive.path, mode="r|") as stream:
        return extract_files(stream, target, rename)
