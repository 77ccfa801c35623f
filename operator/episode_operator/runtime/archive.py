"""Tar archives: built from task-folder files, in the shapes the sandbox commands expect; and
the artifacts an agent's pod sends, re-packed clean before anything else sees them.

Every archive built is deterministic (sorted, zero mtimes) and root-owned, as Gym merges
``workdir/`` ("root-owned files with the folder's modes").
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from episode_operator.runtime.limits import OutputLimitExceeded, OutputLimits, bound_name
from episode_operator.runtime.sandbox_protocol import ArchiveFile
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


# --- artifacts: what an agent's pod sent, re-packed by the operator --------------------------------
#
# The tar an agent's pod answers a download with is hostile: its supervisor and its tar may be the
# agent's own. Nothing of it reaches a verifier, the store or a user's disk as it came: it is read
# member by member and only what an honest download of the artifact's source holds is written again.


@dataclass(frozen=True)
class RefusedMember:
    """A member of a downloaded artifact left out, and why (recorded in the turn's manifest)."""

    name: str
    reason: str


@dataclass(frozen=True)
class Repacked:
    """An artifact as the operator re-packed it: only regular files and directories inside its
    source, named relative to ``/`` (so a separate verifier unpacks it at its original absolute
    path), permission bits only, root-owned; ``kind`` ``file`` or ``directory``; ``files`` the
    regular files kept, of ``size`` bytes in all; ``present`` whether the download held anything."""

    archive: ArchiveFile
    kind: Literal["file", "directory"]
    files: int
    size: int
    present: bool
    refused: tuple[RefusedMember, ...]


#: Member types an honest download has besides regular files and directories, said in a refusal.
_MEMBER_KINDS: Final = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}


def repack_artifact(raw: ArchiveFile, source: str, limits: OutputLimits, *, turn_left: int) -> Repacked:
    """Re-pack the downloaded tar ``raw`` of the artifact ``source``, streaming, member by member.

    Kept: regular files and directories whose normalised name is the source or inside it, each
    once and never under a file of the artifact (so the result always unpacks); their permission
    bits (no setuid, setgid or sticky bit), owned by root. Everything else is refused, with why.
    Past ``limits.artifact_members`` members read, or past ``limits.artifact_bytes`` (or
    ``turn_left``, what the turn's artifacts bound leaves) bytes of files: :class:`OutputLimitExceeded`.
    A download that cannot be read to its end keeps nothing (``present`` False) and says why.
    Blocking: run it in a worker thread.
    """
    try:
        return _Repacker(source, limits, turn_left).repack(raw)
    except (tarfile.TarError, EOFError, OSError) as error:  # a truncated member's copy raises OSError
        empty = ArchiveFile.of_bytes(tar_bytes(()))
        return Repacked(empty, "directory", 0, 0, False, (RefusedMember("", f"cannot be re-packed: {error}"),))


@dataclass
class _Repacker:
    source: str
    limits: OutputLimits
    turn_left: int
    kinds: dict[str, bool] = field(default_factory=dict)  # kept name → a directory? (implied ones too)
    refused: list[RefusedMember] = field(default_factory=list)
    files: int = 0
    size: int = 0
    count: int = 0

    def repack(self, raw: ArchiveFile) -> Repacked:
        descriptor, name = tempfile.mkstemp(prefix="episode-operator-artifact-")
        path = Path(name)
        try:
            with (
                os.fdopen(descriptor, "wb") as output,
                tarfile.open(fileobj=output, mode="w", format=tarfile.GNU_FORMAT) as packed,
                raw.path.open("rb") as stream,
                tarfile.open(fileobj=stream, mode="r|") as archive,
            ):
                while (member := archive.next()) is not None:
                    # tarfile keeps every member it read (typeshed does not say so): not needed, and there may be many
                    archive.members.clear()  # type: ignore[attr-defined]
                    self._keep(member, archive, packed)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        root = self.source.strip("/")
        kind: Literal["file", "directory"] = "directory" if self.kinds.get(root, True) else "file"
        archive_file = ArchiveFile(path, path.stat().st_size)
        return Repacked(archive_file, kind, self.files, self.size, self.count > 0, tuple(self.refused))

    def _keep(self, member: tarfile.TarInfo, archive: tarfile.TarFile, packed: tarfile.TarFile) -> None:
        limits, what = self.limits, f"artifact {self.source}"
        self.count += 1
        if self.count > limits.artifact_members:
            more = f"the members of {what} (more than {limits.artifact_members})"
            raise OutputLimitExceeded(more, bound_name("artifact_members", limits))
        reason, name = _member_verdict(member, self.source.strip("/"), self.kinds)
        if reason is not None:
            self.refused.append(RefusedMember(_shown(member.name), reason))
            return
        if not name:
            return  # the archive's own root directory ("."): nothing to keep
        info = tarfile.TarInfo(name)
        info.mode = member.mode & 0o777
        info.mtime = member.mtime if 0 <= member.mtime < 2**33 else 0
        if member.isdir():
            info.type = tarfile.DIRTYPE
            packed.addfile(info)
            _claim(self.kinds, name, directory=True)
            return
        self.size += member.size
        if self.size > limits.artifact_bytes:
            raise OutputLimitExceeded(f"the files of {what} ({self.size} bytes)", bound_name("artifact_bytes", limits))
        if self.size > self.turn_left:
            more = f"the turn's artifacts, with {what}"
            raise OutputLimitExceeded(more, bound_name("turn_artifact_bytes", limits))
        info.size = member.size
        packed.addfile(info, archive.extractfile(member))
        _claim(self.kinds, name, directory=False)
        self.files += 1


def _member_verdict(member: tarfile.TarInfo, root: str, kinds: dict[str, bool]) -> tuple[str | None, str]:
    """(why ``member`` is refused, or None; its normalised name). ``root``: the source, "" for any."""
    raw = member.name
    if raw.startswith("/"):
        return "an absolute name", raw
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        return "a name with '..'", raw
    name = "/".join(parts)
    if not (member.isreg() or member.isdir()):
        kind = _MEMBER_KINDS.get(member.type, f"a member of type {member.type!r}")
        link = f" to {_shown(member.linkname)}" if member.issym() or member.islnk() else ""
        return f"{kind}{link}: only regular files and directories are kept", name
    if not name:
        return (None if member.isdir() else "a file without a name"), name
    if root and name != root and not name.startswith(root + "/"):
        return f"outside the artifact's source /{root}", name
    if name in kinds:
        if kinds[name] and member.isdir():
            return None, name  # a directory named again: harmless, it unpacks
        return "a second member of that name", name
    blocking = next((parent for parent in _ancestors(name, root) if kinds.get(parent) is False), None)
    if blocking is not None:
        return f"inside /{blocking}, a file of the artifact", name
    return None, name


def _ancestors(name: str, root: str) -> list[str]:
    """The directories between the source (included) and ``name`` (excluded)."""
    parts = name.split("/")
    depth = len(root.split("/")) if root else 0
    return ["/".join(parts[:index]) for index in range(max(depth, 1), len(parts))]


def _claim(kinds: dict[str, bool], name: str, *, directory: bool) -> None:
    for parent in _ancestors(name, ""):
        kinds.setdefault(parent, True)
    kinds[name] = directory


def _shown(name: str) -> str:
    """A member name as a manifest says it: printable, at most 200 characters."""
    text = name.encode("utf-8", "backslashreplace").decode("utf-8").encode("unicode_escape").decode("ascii")
    return text if len(text) <= 200 else text[:200] + "…"


def read_member(raw: ArchiveFile, name: str, limits: OutputLimits) -> bytes | None:
    """The bytes of the regular file ``name`` in a downloaded tar (None: not in it), streaming,
    within the artifact bounds (members read, the file's size). Blocking: run it in a worker thread."""
    with raw.path.open("rb") as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        for count, member in enumerate(iter(archive.next, None), start=1):
            archive.members.clear()  # type: ignore[attr-defined]  # as in _Repacker.repack
            if count > limits.artifact_members:
                more = f"the members of the download of /{name} (more than {limits.artifact_members})"
                raise OutputLimitExceeded(more, bound_name("artifact_members", limits))
            if member.isreg() and member.name == name:
                if member.size > limits.artifact_bytes:
                    what = f"/{name} ({member.size} bytes)"
                    raise OutputLimitExceeded(what, bound_name("artifact_bytes", limits))
                extracted = archive.extractfile(member)
                return extracted.read() if extracted is not None else b""
    return None


# --- unpacking on a user's disk (kubectl episode artifacts) ---------------------------------------


def extract_files(
    archive: tarfile.TarFile, target: Path, rename: Callable[[str], str | None] = lambda name: name
) -> tuple[list[Path], list[RefusedMember]]:
    """Unpack the regular files and directories of ``archive`` below ``target``, refusing the rest.

    ``rename`` maps a member's normalised name to where it goes below ``target`` (None: not
    wanted). Nothing is written outside ``target``: names are normalised (no absolute names,
    no ``..``), links, devices and FIFOs are never made, no existing link below ``target`` is
    followed (each directory on the way must be a real one; a file's place is opened without
    following a link) and only permission bits are kept (no setuid, setgid, sticky; the caller's
    ownership). One rule on every Python, so no tar filter is relied on: Python's ``data`` filter
    is missing before 3.11.4 (Debian 12's 3.11.2) and had link-chain bypasses fixed as late as
    3.11.13 (CVE-2025-4517). Returns the files written and what was refused.
    """
    root = target.resolve()
    root.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    refused: list[RefusedMember] = []
    for member in archive:
        reason, name = _member_verdict(member, "", {})
        if reason is not None:
            refused.append(RefusedMember(_shown(member.name), reason))
            continue
        mapped = rename(name) if name else None
        if mapped is None:
            continue
        parts = [part for part in mapped.split("/") if part not in ("", ".")]
        if not parts or ".." in parts:
            refused.append(RefusedMember(_shown(member.name), f"renamed to {mapped!r}, outside the destination"))
            continue
        try:
            place = _real_directory(root, parts[:-1])
            path = place / parts[-1]
            if member.isdir():
                _real_directory(root, parts)
                continue
            if path.is_symlink():
                path.unlink()
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, member.mode & 0o777)
            with os.fdopen(descriptor, "wb") as output:
                data = archive.extractfile(member)
                if data is not None:
                    shutil.copyfileobj(data, output)
            os.chmod(path, member.mode & 0o777, follow_symlinks=False)
            written.append(path)
        except OSError as error:
            refused.append(RefusedMember(_shown(member.name), f"cannot be written: {error.strerror or error}"))
    return written, refused


def _real_directory(root: Path, parts: list[str]) -> Path:
    """``root/parts…``, each a directory made or found, never a link; OSError otherwise."""
    place = root
    for part in parts:
        place = place / part
        if place.is_symlink() or (place.exists() and not place.is_dir()):
            raise NotADirectoryError(0, "a link or a file is in the way", str(place))
        place.mkdir(mode=0o755, exist_ok=True)
    return place
