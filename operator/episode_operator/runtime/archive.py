"""Tar archives built from task-folder files, in the shapes the sandbox commands expect.

Every archive is deterministic (sorted, zero mtimes) and root-owned, as Gym merges
``workdir/`` ("root-owned files with the folder's modes").
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Mapping

from episode_operator.taskfolder import TaskFiles


def tar_bytes(entries: Iterable[tuple[str, bytes, int]]) -> bytes:
    """A tar of ``(name, content, mode)`` files, with their parent directories (0755)."""
    buffer = io.BytesIO()
    seen_dirs: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data, mode in sorted(entries):
            parts = name.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directory not in seen_dirs:
                    seen_dirs.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    archive.addfile(info)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode & 0o7777
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def folder_tar(files: TaskFiles, folder: str) -> bytes:
    """The files below ``folder`` of the task, named relative to it (a ``workdir/`` or ``solution/``)."""
    prefix = folder.strip("/") + "/"
    return tar_bytes(
        (path[len(prefix) :], entry.data, entry.mode) for path, entry in files.items() if path.startswith(prefix)
    )


def mapped_tar(files: TaskFiles, mapping: Mapping[str, str]) -> bytes:
    """A tar whose member ``name`` holds the task file ``mapping[name]`` (the layered ``/tests``)."""
    return tar_bytes((name, files[source].data, files[source].mode) for name, source in mapping.items())


def text_tar(files: Mapping[str, str], mode: int = 0o644) -> bytes:
    """A tar of text files (instructions for the command agent)."""
    return tar_bytes((name, content.encode("utf-8"), mode) for name, content in files.items())


def archive_summary(archive: bytes, source: str) -> tuple[str, int, bool]:
    """``(type, file count, present)`` of a downloaded artifact (``file`` or ``directory``).

    Member names are relative to ``/``; ``source`` is the artifact's absolute path. An
    empty archive means the source did not exist.
    """
    root = source.strip("/")
    kind = "directory"
    count = 0
    present = False
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            for member in tar:
                present = True
                if member.name.rstrip("/") == root and not member.isdir():
                    kind = "file"
                if not member.isdir():
                    count += 1
    except tarfile.TarError:
        return kind, 0, False
    return kind, count, present
