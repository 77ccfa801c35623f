"""Tar archives built from task-folder files, in the shapes the sandbox commands expect.

Every archive is deterministic (sorted, zero mtimes) and root-owned, as Gym merges
``workdir/`` ("root-owned files with the folder's modes").
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

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


def folder_tar(files: TaskFiles, folder: str, *, script: str | None = None) -> bytes:
    """The files below ``folder`` of the task, named relative to it (a ``workdir/`` or ``solution/``);
    ``script``, the member run from it, made executable."""
    prefix = folder.strip("/") + "/"
    return tar_bytes(
        (name, entry.data, _runnable(name, entry.mode, script))
        for name, entry in ((path[len(prefix) :], entry) for path, entry in files.items() if path.startswith(prefix))
    )


def mapped_tar(files: TaskFiles, mapping: Mapping[str, str], *, script: str | None = None) -> bytes:
    """A tar whose member ``name`` holds the task file ``mapping[name]`` (the layered ``/tests``);
    ``script``, the member run from it, made executable."""
    return tar_bytes(
        (name, files[source].data, _runnable(name, files[source].mode, script)) for name, source in mapping.items()
    )


def _runnable(name: str, mode: int, script: str | None) -> int:
    """Harbor runs ``chmod +x`` on the script it runs (solve.sh, test.sh) as root first."""
    return mode | 0o111 if name == script else mode


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


def extract_safely(
    archive: tarfile.TarFile,
    target: Path,
    members: list[tarfile.TarInfo] | None = None,
    *,
    native: bool = hasattr(tarfile, "data_filter"),
) -> None:
    """``extractall`` under the "data" filter (PEP 706): nothing outside ``target``, no devices, no
    ownership or special mode bits. Pythons before 3.11.4 lack the filter (Debian 12's is 3.11.2, the
    operator image's on the test cluster): there the same refusals are made here before extracting
    (as ``tarfile.TarError``: the filter's own exception classes came with it)."""
    if native:
        archive.extractall(target, members=members, filter="data")
        return
    root = target.resolve()
    chosen = archive.getmembers() if members is None else members
    for member in chosen:
        member.name = member.name.lstrip("/")  # as the filter does: an absolute name lands inside target
        destination = (root / member.name).resolve()
        if not destination.is_relative_to(root):
            raise tarfile.TarError(f"{member.name}: would be extracted outside {target}")
        if member.issym() or member.islnk():
            link = member.linkname if member.islnk() else str(Path(member.name).parent / member.linkname)
            if member.linkname.startswith("/") or not (root / link).resolve().is_relative_to(root):
                raise tarfile.TarError(f"{member.name}: links outside {target} ({member.linkname})")
        elif not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"{member.name}: not a file, directory or link")
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        member.mode = (member.mode & 0o755) | (0o600 if member.isfile() else 0o700)
    archive.extractall(target, members=chosen)
