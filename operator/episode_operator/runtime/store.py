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

from episode_operator.api.export import CALLS_RECORD, INSTRUCTION_RECORD, TRAJECTORY_RECORD
from episode_operator.runtime.archive import extract_safely

MANIFEST = "manifest.json"
# What the store keeps of a turn whose agent acted: its instruction, its recorded model calls (the capture
# proxy's journal) and its ATIF trajectory — what ``kubectl episode export`` and ``trajectory`` read.
INSTRUCTION_FILE, CALLS_FILE, TRAJECTORY_FILE = INSTRUCTION_RECORD, CALLS_RECORD, TRAJECTORY_RECORD
TURN_RECORDS = (INSTRUCTION_FILE, CALLS_FILE, TRAJECTORY_FILE)
# Per attempt: the logs in the order they were first saved ("<turn>/<name>" lines), which is
# the order the turns and their jobs ran in; names alone sort turn 10 before turn 2.
LOG_ORDER = "logs.order"
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class EpisodeStore(Protocol):
    """Per-episode storage of logs and artifacts."""

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None: ...

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None:
        """Archive ``index`` of a turn: the tar of manifest entry ``index``."""
        ...

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None: ...

    async def artifact_archives(self, attempt: int, turn: str) -> list[bytes]: ...

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
class FileStore:
    """An :class:`EpisodeStore` in a directory: ``<root>/<namespace>/<name>/<uid>/attempt-N/<turn>/``."""

    root: Path

    def turn_dir(self, attempt: int, turn: str) -> Path:
        return self.root / f"attempt-{attempt}" / safe(turn)

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._write_log, attempt, turn, name, data)

    def _write_log(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        self._write(self.turn_dir(attempt, turn) / "logs" / f"{safe(name)}.txt", data)
        order = self.root / f"attempt-{attempt}" / LOG_ORDER
        entry = f"{safe(turn)}/{safe(name)}"
        if entry not in _log_order(order):  # a log saved again (a restarted runner) keeps its place
            with order.open("a") as stream:
                stream.write(entry + "\n")

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None:
        await asyncio.to_thread(self._write, self.turn_dir(attempt, turn) / "artifacts" / f"{index:03d}.tar", archive)

    async def save_manifest(self, attempt: int, turn: str, manifest: list[dict[str, Any]]) -> None:
        data = (json.dumps(manifest, indent=2) + "\n").encode()
        await asyncio.to_thread(self._write, self.turn_dir(attempt, turn) / "artifacts" / MANIFEST, data)

    async def artifact_archives(self, attempt: int, turn: str) -> list[bytes]:
        folder = self.turn_dir(attempt, turn) / "artifacts"
        return await asyncio.to_thread(lambda: [path.read_bytes() for path in sorted(folder.glob("*.tar"))])

    async def save_file(self, attempt: int, turn: str, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self.turn_dir(attempt, turn) / safe(name), data)

    async def read_file(self, attempt: int, turn: str, name: str) -> bytes | None:
        path = self.turn_dir(attempt, turn) / safe(name)
        return await asyncio.to_thread(lambda: path.read_bytes() if path.is_file() else None)

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
    """The logs kept for one Episode, oldest attempt first, each attempt's in the order they ran.

    That order is the attempt's ``logs.order``; logs it does not name (kept before it existed)
    follow, by modification time.
    """
    logs: list[StoredLog] = []
    for attempt_dir in sorted(root.glob("attempt-*"), key=lambda path: int(path.name.split("-")[1])):
        number = int(attempt_dir.name.split("-")[1])
        if attempt is not None and number != attempt:
            continue
        position = {entry: index for index, entry in enumerate(_log_order(attempt_dir / LOG_ORDER))}
        found = [
            (position.get(f"{turn_dir.name}/{log.stem}", len(position)), log.stat().st_mtime_ns, turn_dir.name, log)
            for turn_dir in attempt_dir.iterdir()
            if turn_dir.is_dir() and (turn is None or turn_dir.name == safe(turn))
            for log in (turn_dir / "logs").glob("*.txt")
        ]
        logs += [StoredLog(number, turn_name, log.stem, log) for *_, turn_name, log in sorted(found)]
    return logs


def turn_records(root: Path, *, attempt: int | None = None) -> dict[str, Any]:
    """The records of every turn of an attempt (the latest by default), by turn, as text.

    ``{"attempt": N, "turns": {turn: {"instruction.md": …, "model-calls.jsonl": …, "trajectory.json": …}}}``,
    a file not kept left out.
    """
    number = attempt if attempt is not None else latest_attempt(root)
    if number is None:
        return {"attempt": None, "turns": {}}
    turns: dict[str, dict[str, str]] = {}
    folder = root / f"attempt-{number}"
    for turn_dir in sorted(path for path in folder.iterdir() if path.is_dir()):
        kept = {
            name: (turn_dir / name).read_text("utf-8", "replace")
            for name in TURN_RECORDS
            if (turn_dir / name).is_file()
        }
        if kept:
            turns[turn_dir.name] = kept
    return {"attempt": number, "turns": turns}


def _log_order(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


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
    for turn_dir in sorted(path for path in (root / f"attempt-{number}").iterdir() if path.is_dir()):
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
        extract_safely(archive, target, members)
        written += [target / member.name for member in members if member.isfile()]
    return written
