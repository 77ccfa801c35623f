"""Where an episode's logs and artifacts outlive its pods.

The operator keeps them in its data directory (a volume in the Helm chart), one folder per
Episode (by namespace, name and uid, so a re-created Episode never reads an old one's
files) and attempt, and serves them to ``kubectl episode logs`` and ``artifacts``. Artifact
entries are kept as the tars collected from the sandbox (member names relative to ``/``),
which is also exactly what a separate verifier pod needs to recreate them at their
original absolute paths.
"""

from __future__ import annotations

import asyncio
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MANIFEST = "manifest.json"
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


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
class FileStore:
    """An :class:`EpisodeStore` in a directory: ``<root>/<namespace>/<name>/<uid>/attempt-N/<turn>/``."""

    root: Path

    def turn_dir(self, attempt: int, turn: str) -> Path:
        return self.root / f"attempt-{attempt}" / safe(turn)

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self.turn_dir(attempt, turn) / "logs" / f"{safe(name)}.txt", data)

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None:
        await asyncio.to_thread(self._write, self.turn_dir(attempt, turn) / "artifacts" / f"{index:03d}.tar", archive)

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None:
        data = (json.dumps(manifest, indent=2) + "\n").encode()
        await asyncio.to_thread(self._write, self.turn_dir(attempt, turn) / "artifacts" / MANIFEST, data)

    async def artifact_archives(self, attempt: int, turn: str) -> list[bytes]:
        folder = self.turn_dir(attempt, turn) / "artifacts"
        return await asyncio.to_thread(lambda: [path.read_bytes() for path in sorted(folder.glob("*.tar"))])

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_bytes(data)
        temporary.replace(path)


# Where an attempt's seed keeps its logs (the replay, builds, the agent's setup), beside its turns'.
SEED_LOGS = "seed"


def episode_store_root(data_dir: Path, namespace: str, name: str, uid: str) -> Path:
    """The folder of one Episode in the operator's data directory."""
    return data_dir / safe(namespace) / safe(name) / safe(uid)


@dataclass(frozen=True)
class StoredLog:
    attempt: int
    turn: str
    name: str
    path: Path


def stored_logs(root: Path, *, turn: str | None = None, attempt: int | None = None) -> list[StoredLog]:
    """The logs kept for one Episode, oldest attempt first, the seed's before the turns'."""
    logs: list[StoredLog] = []
    for attempt_dir in sorted(root.glob("attempt-*"), key=lambda path: int(path.name.split("-")[1])):
        number = int(attempt_dir.name.split("-")[1])
        if attempt is not None and number != attempt:
            continue
        for turn_dir in sorted(attempt_dir.iterdir(), key=lambda path: (path.name != SEED_LOGS, path.name)):
            if turn is not None and turn_dir.name != safe(turn):
                continue
            for log in sorted((turn_dir / "logs").glob("*.txt"), key=lambda path: path.stat().st_mtime_ns):
                logs.append(StoredLog(number, turn_dir.name, log.stem, log))
    return logs


def latest_attempt(root: Path) -> int | None:
    numbers = [int(path.name.split("-")[1]) for path in root.glob("attempt-*")]
    return max(numbers) if numbers else None


def export_artifacts(root: Path, destination: Path, *, attempt: int | None = None) -> list[Path]:
    """Unpack the latest attempt's artifacts as ``<destination>/<turn>/<artifact destination>/…``.

    Each turn also gets its ``manifest.json``. Archives come from a sandbox an agent
    controlled, so they are unpacked with the ``data`` filter: no absolute paths, no
    ``..``, no links leaving the folder, no device files.
    """
    number = attempt if attempt is not None else latest_attempt(root)
    written: list[Path] = []
    if number is None:
        return written
    for turn_dir in sorted((root / f"attempt-{number}").iterdir()):
        artifacts = turn_dir / "artifacts"
        manifest_path = artifacts / MANIFEST
        if not manifest_path.is_file():
            continue
        target = destination / turn_dir.name
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).write_bytes(manifest_path.read_bytes())
        written.append(target / MANIFEST)
        manifest = json.loads(manifest_path.read_text())
        # Archive N holds manifest entry N (collection order).
        for archive_path in sorted(artifacts.glob("*.tar")):
            position = int(archive_path.stem)
            if position < len(manifest):
                entry = manifest[position]
                written += _unpack_renamed(archive_path, entry["source"], entry["destination"], target)
    return written


def _unpack_renamed(archive_path: Path, source: str, destination: str, target: Path) -> list[Path]:
    prefix = source.strip("/")
    written: list[Path] = []
    with tarfile.open(archive_path) as archive:
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
