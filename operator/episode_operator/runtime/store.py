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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MANIFEST = "manifest.json"
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class EpisodeStore(Protocol):
    """Per-episode storage of logs and artifacts."""

    async def save_log(self, attempt: int, turn: str, name: str, data: bytes) -> None: ...

    async def save_artifact(self, attempt: int, turn: str, index: int, archive: bytes) -> None: ...

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


def episode_store_root(data_dir: Path, namespace: str, name: str, uid: str) -> Path:
    """The folder of one Episode in the operator's data directory."""
    return data_dir / safe(namespace) / safe(name) / safe(uid)
