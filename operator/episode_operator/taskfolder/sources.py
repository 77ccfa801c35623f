"""Task-folder file sources: a directory, a tar(.gz) stream or a mapping of path to bytes.

Everything above this module sees one thing, :class:`TaskFiles`, so the three sources
cannot disagree about what a folder holds. Problems met while reading (paths escaping the
folder, symlinks pointing outside it, names that are not UTF-8, limits exceeded) are
collected on the tree and reported with the loader's other refusals instead of raising:
a task author sees every problem at once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from episode_operator.taskfolder.errors import Problem

DEFAULT_FILE_MODE = 0o644
# A symlink may point at a symlink, and so on, this many links deep at most: a folder needs no more,
# and a longer chain is refused as the loop it may be.
MAX_SYMLINK_HOPS = 8
TASK_CONFIG = "task.toml"


@dataclass(frozen=True)
class TaskFile:
    """A regular file of a task folder: its bytes and permission bits."""

    data: bytes
    mode: int = DEFAULT_FILE_MODE


@dataclass(frozen=True)
class SourceLimits:
    """Bounds that keep a hostile or mistaken folder from exhausting memory."""

    max_files: int = 20_000
    max_total_bytes: int = 512 * 1024 * 1024
    max_depth: int = 48


@dataclass
class _Collector:
    """Accumulates entries from any source, checking paths and limits uniformly."""

    limits: SourceLimits
    origin: str
    files: dict[str, TaskFile] = field(default_factory=dict)
    directories: set[str] = field(default_factory=set)
    symlinks: dict[str, str] = field(default_factory=dict)
    hardlinks: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    total_bytes: int = 0
    full: bool = False

    def path(self, raw: str) -> str | None:
        """Normalize ``raw`` to a relative POSIX path, or record why it is refused."""
        text = raw
        shown = text.encode("utf-8", "backslashreplace").decode("utf-8")
        if "\x00" in text:
            self.problems.append(Problem(shown, None, "file name contains a NUL byte"))
            return None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.problems.append(Problem(shown, None, "file name is not valid UTF-8"))
            return None
        if text.startswith("/"):
            self.problems.append(Problem(shown, None, "absolute path in a task folder source"))
            return None
        parts = [part for part in text.split("/") if part not in ("", ".")]
        if ".." in parts:
            self.problems.append(Problem(shown, None, "path escapes the task folder ('..')"))
            return None
        if len(parts) > self.limits.max_depth:
            self.problems.append(Problem(shown, None, f"nested deeper than {self.limits.max_depth} levels"))
            return None
        return "/".join(parts)

    @property
    def entries(self) -> int:
        """Files and links so far: each counts against ``max_files`` (a link becomes a file)."""
        return len(self.files) + len(self.symlinks) + len(self.hardlinks)

    def room_for_link(self, path: str) -> bool:
        """True if one more link fits the count; its resolved size is counted when it is resolved."""
        return self.room_for(path, 0)

    def room_for(self, path: str, size: int) -> bool:
        """True if one more file of ``size`` bytes fits the limits; records the refusal once."""
        if self.full:
            return False
        if self.entries + 1 > self.limits.max_files:
            self.problems.append(
                Problem(path, None, f"more than {self.limits.max_files} files and links; refusing to read on")
            )
            self.full = True
            return False
        if self.total_bytes + size > self.limits.max_total_bytes:
            self.problems.append(
                Problem(
                    path,
                    None,
                    f"task folder exceeds {self.limits.max_total_bytes} bytes in all; refusing to read on",
                )
            )
            self.full = True
            return False
        return True

    def add_file(self, path: str, data: bytes, mode: int) -> None:
        self.files[path] = TaskFile(data, mode & 0o7777)
        self.total_bytes += len(data)

    def build(self) -> TaskFiles:
        self._resolve_links()
        return TaskFiles(self.files, self.directories, self.problems)

    def _resolve_links(self) -> None:
        """Replace links by copies of their targets inside the folder; refuse the rest.

        A link's target is only read from this tree, never from the machine, so a link to
        ``/etc/shadow`` or ``../../secret`` cannot leak anything: it is refused. Each copy counts
        against the limits as it is made, as the file it becomes (one file of 10 MiB and 20,000
        links to it would otherwise be a folder of 200 GiB from an archive of a few KiB), and a
        chain of links deeper than :data:`MAX_SYMLINK_HOPS` is refused.
        """
        links = [*sorted(self.hardlinks.items()), *((link, None) for link in sorted(self.symlinks))]
        self.hardlinks, symlinks, self.symlinks = {}, self.symlinks, {}  # counted again as each is resolved
        for link, target in links:
            resolved = self._hard(link, target) if target is not None else self._follow(link, symlinks)
            if isinstance(resolved, Problem):
                self.problems.append(resolved)
            if not isinstance(resolved, str):
                continue
            entry = self.files[resolved]
            if not self.room_for(link, len(entry.data)):
                return
            self.files[link] = entry
            self.total_bytes += len(entry.data)

    def _hard(self, link: str, target: str) -> str | Problem | None:
        """The file a hard link names; None when its name was refused (and said so) already."""
        resolved = self.path(target)
        if resolved is None:
            return None
        if resolved not in self.files:
            return Problem(link, None, f"hard link to {target!r}, which is not a file here")
        return resolved

    def _follow(self, link: str, symlinks: Mapping[str, str]) -> str | Problem:
        current = link
        for _ in range(MAX_SYMLINK_HOPS):
            target = symlinks[current]
            if target.startswith("/"):
                return Problem(link, None, f"symlink to the absolute path {target!r} outside the task folder")
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
            if joined == ".." or joined.startswith("../"):
                return Problem(link, None, f"symlink to {target!r} points outside the task folder")
            if joined in self.files:
                return joined
            if joined in symlinks:
                current = joined
                continue
            if joined in self.directories or joined == ".":
                return Problem(link, None, f"symlink to the directory {target!r} is not supported; copy it")
            return Problem(link, None, f"dangling symlink to {target!r}")
        return Problem(link, None, f"a loop, or a chain of more than {MAX_SYMLINK_HOPS} symlinks")


class TaskFiles(Mapping[str, TaskFile]):
    """An immutable task folder: relative POSIX path → :class:`TaskFile`.

    Directories are implied by file paths and may also be listed explicitly (an empty
    ``steps/x/tests/`` folder changes what the loader accepts). ``problems`` holds what
    went wrong while reading the source.
    """

    def __init__(
        self,
        files: Mapping[str, TaskFile],
        directories: Iterable[str] = (),
        problems: Iterable[Problem] = (),
    ) -> None:
        self._files = dict(sorted(files.items()))
        dirs = {d for d in directories if d}
        for path in self._files:
            parent = posixpath.dirname(path)
            while parent and parent not in dirs:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        self._directories = frozenset(dirs)
        self.problems: tuple[Problem, ...] = tuple(problems)

    # Mapping protocol -------------------------------------------------------------
    def __getitem__(self, path: str) -> TaskFile:
        return self._files[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    # Queries ------------------------------------------------------------------------
    def has_file(self, path: str) -> bool:
        """True if ``path`` is a regular file of the folder."""
        return path in self._files

    def has_dir(self, path: str) -> bool:
        """True if ``path`` is a directory of the folder (explicit or implied)."""
        return path.strip("/") in self._directories

    @property
    def directories(self) -> frozenset[str]:
        """Every directory, explicit or implied by a file path."""
        return self._directories

    def files_under(self, directory: str) -> list[str]:
        """Paths of the files below ``directory``, relative to it, in sorted order."""
        prefix = directory.strip("/") + "/"
        return [path[len(prefix) :] for path in self._files if path.startswith(prefix)]

    def digest(self) -> str:
        """``sha256:`` of every path, mode and content: the identity of the folder."""
        hasher = hashlib.sha256()
        for path, entry in self._files.items():
            hasher.update(f"{path}\x00{entry.mode:o}\x00{len(entry.data)}\x00".encode())
            hasher.update(entry.data)
        for directory in sorted(self._directories):
            hasher.update(f"{directory}/\x00".encode())
        return "sha256:" + hasher.hexdigest()

    # Constructors ---------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, mapping: Mapping[str, bytes | str], *, limits: SourceLimits | None = None) -> TaskFiles:
        """A folder from ``{relative path: content}``; a key ending in ``/`` is an empty directory.

        Text values are encoded as UTF-8. Modes are not part of a mapping: every file gets
        ``0644`` (scripts run through ``bash``, so nothing needs the execute bit).
        """
        collector = _Collector(limits or SourceLimits(), "<files>")
        for raw, content in sorted(mapping.items()):
            path = collector.path(raw)
            if path is None or not path:
                continue
            if raw.endswith("/"):
                collector.directories.add(path)
                continue
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            if collector.room_for(path, len(data)):
                collector.add_file(path, data, DEFAULT_FILE_MODE)
        return collector.build()

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], *, limits: SourceLimits | None = None) -> TaskFiles:
        """A folder from a directory, or from a tar(.gz) file at ``path``."""
        if Path(path).is_dir() or Path(path).is_symlink() or not Path(path).exists():
            return cls.from_directory(path, limits=limits)
        with open(path, "rb") as stream:
            return cls.from_tar(stream, limits=limits)

    @classmethod
    def from_directory(cls, root: str | os.PathLike[str], *, limits: SourceLimits | None = None) -> TaskFiles:
        """A folder read from disk. Symlinks are resolved inside the folder only."""
        base = Path(root)
        collector = _Collector(limits or SourceLimits(), str(base))
        if base.is_symlink():
            collector.problems.append(Problem(str(base), None, "a task folder must not be a symlink"))
            return collector.build()
        if not base.is_dir():
            collector.problems.append(Problem(str(base), None, "not a directory"))
            return collector.build()
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            relative_dir = os.path.relpath(dirpath, base)
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                raw = name if relative_dir == "." else f"{relative_dir}/{name}"
                path = collector.path(raw)
                if path is None:
                    if name in dirnames:
                        dirnames.remove(name)
                    continue
                info = os.lstat(full)
                if stat.S_ISLNK(info.st_mode):
                    if collector.room_for_link(path):
                        collector.symlinks[path] = os.readlink(full)
                    if name in dirnames:
                        dirnames.remove(name)
                elif stat.S_ISDIR(info.st_mode):
                    collector.directories.add(path)
                elif stat.S_ISREG(info.st_mode):
                    if collector.room_for(path, info.st_size):
                        collector.add_file(path, Path(full).read_bytes(), info.st_mode)
                else:
                    collector.problems.append(Problem(path, None, "not a regular file, directory or symlink"))
        return collector.build()

    @classmethod
    def from_tar(cls, source: bytes | BinaryIO, *, limits: SourceLimits | None = None) -> TaskFiles:
        """A folder from a tar or gzipped tar, as ``kubectl episode pack`` writes it.

        An archive whose only top-level entry is a directory holding ``task.toml``
        (``tar czf t.tgz my-task/``) is read as that directory.
        """
        collector = _Collector(limits or SourceLimits(), "<tar>")
        stream = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
        try:
            with tarfile.open(fileobj=stream, mode="r|*") as archive:
                for member in archive:
                    _collect_member(collector, archive, member)
        except (tarfile.TarError, EOFError, OSError) as error:
            collector.problems.append(Problem("<tar>", None, f"not a readable tar archive: {error}"))
        _strip_single_top_directory(collector)
        return collector.build()


def _collect_member(collector: _Collector, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
    path = collector.path(member.name)
    if path is None or not path:
        return
    if member.isdir():
        collector.directories.add(path)
    elif member.issym():
        if collector.room_for_link(path):
            collector.symlinks[path] = member.linkname
    elif member.islnk():
        if collector.room_for_link(path):
            collector.hardlinks[path] = member.linkname
    elif member.isreg():
        if collector.room_for(path, member.size):
            extracted = archive.extractfile(member)
            data = extracted.read() if extracted is not None else b""
            collector.add_file(path, data, member.mode)
    else:
        collector.problems.append(Problem(path, None, "not a regular file, directory or link"))


def _strip_single_top_directory(collector: _Collector) -> None:
    if TASK_CONFIG in collector.files:
        return
    tops = {path.split("/", 1)[0] for path in [*collector.files, *collector.symlinks, *collector.hardlinks]}
    tops |= {path.split("/", 1)[0] for path in collector.directories}
    if len(tops) != 1:
        return
    (top,) = tops
    if f"{top}/{TASK_CONFIG}" not in collector.files:
        return
    prefix = top + "/"

    def strip(paths: Iterable[str]) -> list[str]:
        return [path[len(prefix) :] for path in paths if path.startswith(prefix)]

    collector.files = {path[len(prefix) :]: entry for path, entry in collector.files.items() if path.startswith(prefix)}
    collector.directories = set(strip(collector.directories))
    collector.symlinks = {path[len(prefix) :]: target for path, target in collector.symlinks.items()}
    collector.hardlinks = {
        path[len(prefix) :]: target[len(prefix) :] if target.startswith(prefix) else target
        for path, target in collector.hardlinks.items()
    }


def pack_tar(files: TaskFiles) -> bytes:
    """A reproducible gzipped tar of ``files`` (sorted, zero mtimes, root-owned).

    The same folder always packs to the same bytes, so a ConfigMap named after the
    digest of the pack is content-addressed.
    """
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for directory in sorted(files.directories):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            archive.addfile(info)
        for path, entry in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(entry.data)
            info.mode = entry.mode
            archive.addfile(info, io.BytesIO(entry.data))
    return buffer.getvalue()
