"""The bounds on what a sandbox may send back, and where its answers go while they arrive.

Every byte an agent's pod sends is hostile: the agent runs as root by default and can replace
its pod's ``supervisor.sh``, ``tar`` and ``sh``, so any answer of any supervisor verb may be
endless or crafted. Each command therefore carries the bound its answer may have
(``runtime/supervisor.py`` builds them from :class:`OutputLimits`), the transport counts the
bytes as they stream and stops reading past it (:class:`Spool`), and what passes a bound is an
:class:`OutputLimitExceeded` naming what passed which bound. In a turn that is the turn's
failure (``agent:output_limit``, a measured 0: the agent's doing, which a retry would repeat).

Answers are kept in memory only while small: past :data:`SPOOL_MEMORY_BYTES` a :class:`Spool`
moves to a temporary file in the operator's scratch space (Python's temporary directory:
``$TMPDIR``, else ``/tmp``, an emptyDir in the Helm chart), so the operator's memory stays flat
whatever the agent sends.
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO, Final, Protocol

from episode_operator.runtime.sandbox_protocol import ArchiveFile

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: An answer past this many bytes is kept in a temporary file rather than in memory.
SPOOL_MEMORY_BYTES: Final = 256 * KiB
#: Pieces in which spooled bytes are read back and copied.
CHUNK_BYTES: Final = 1 * MiB


@dataclass(frozen=True)
class OutputLimits:
    """What one answer of a sandbox, and one turn's artifacts, may hold (``episode-operator run``'s
    ``--*-limit`` flags, :data:`LIMIT_FLAGS`)."""

    # A supervisor's answer besides the tails and downloads it was asked for: a job's state line,
    # the files it reads (reward files), a probe; and any verb's stderr.
    answer_bytes: int = 4 * MiB
    # The tail of a job's output kept as its log (and read for the agent's failure patterns).
    log_bytes: int = 1 * MiB
    # One artifact: its tar as downloaded, and its files in all once re-packed.
    artifact_bytes: int = 1 * GiB
    # Files and directories in one artifact.
    artifact_members: int = 10_000
    # A turn's artifacts in all, re-packed.
    turn_artifact_bytes: int = 4 * GiB

    def __post_init__(self) -> None:
        for item in fields(self):
            if getattr(self, item.name) <= 0:
                raise ValueError(f"{LIMIT_FLAGS[item.name].flag} must be positive, got {getattr(self, item.name)}")


@dataclass(frozen=True)
class LimitFlag:
    """How one bound is named in errors, set (its ``episode-operator run`` flag and its Helm value
    under ``outputLimits``) and what it bounds."""

    name: str
    flag: str
    value: str
    bounds: str


#: Per field of :class:`OutputLimits`: its name, flag, Helm value and what it bounds (its flag's help).
LIMIT_FLAGS: Final[dict[str, LimitFlag]] = {
    "answer_bytes": LimitFlag(
        "answer",
        "--answer-limit",
        "answer",
        "The most one answer of a sandbox's supervisor may hold besides the tail and download it was asked "
        "for (a job's state, the files it reads, a probe), and any stderr.",
    ),
    "log_bytes": LimitFlag(
        "log",
        "--log-limit",
        "log",
        "How much of the end of a job's output is asked for and kept as its log (and read for an agent's "
        "failure patterns).",
    ),
    "artifact_bytes": LimitFlag(
        "artifact", "--artifact-limit", "artifact", "The most one artifact may hold: its tar as downloaded, its files."
    ),
    "artifact_members": LimitFlag(
        "artifact members", "--artifact-members", "artifactMembers", "The most files and directories in one artifact."
    ),
    "turn_artifact_bytes": LimitFlag(
        "turn artifacts", "--turn-artifacts-limit", "turnArtifacts", "The most a turn's artifacts may hold in all."
    ),
}
assert set(LIMIT_FLAGS) == {item.name for item in fields(OutputLimits)}


def bound_name(field_name: str, limits: OutputLimits) -> str:
    """``the artifact bound (--artifact-limit 1073741824)``: how an error names a bound."""
    flag = LIMIT_FLAGS[field_name]
    return f"the {flag.name} bound ({flag.flag} {getattr(limits, field_name)})"


class OutputLimitExceeded(Exception):
    """What a sandbox sent passed its bound: the transport stopped reading and closed the exec."""

    def __init__(self, what: str, bound: str) -> None:
        super().__init__(f"{what} passed {bound}")
        self.what = what
        self.bound = bound


def format_size(size: int) -> str:
    """``4Mi`` for 4194304: the largest binary suffix that divides it, as :func:`parse_size` reads it."""
    for suffix, factor in (("Ti", GiB << 10), ("Gi", GiB), ("Mi", MiB), ("Ki", KiB)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


def parse_size(text: str) -> int:
    """``4Mi``, ``1Gi``, ``512Ki`` or a plain number of bytes (Kubernetes' binary suffixes)."""
    units = {"Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": GiB << 10}
    number, unit = text.strip(), 1
    for suffix, factor in units.items():
        if number.endswith(suffix):
            number, unit = number[: -len(suffix)], factor
            break
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{text!r} is not a size: a positive whole number, optionally with Ki, Mi, Gi or Ti")
    return int(number) * unit


class AnswerSink(Protocol):
    """Where a transport writes an answer's bytes as they arrive (a :class:`Spool`)."""

    def write(self, data: bytes) -> None:
        """Take ``data``; past the sink's bound, raise :class:`OutputLimitExceeded`."""
        ...

    def reset(self) -> None:
        """Forget what was written (the call is made again from the start)."""
        ...


class Spool:
    """An answer's bytes as they stream in: in memory while small, then in a temporary file; past
    ``limit`` bytes :meth:`write` raises :class:`OutputLimitExceeded` (``what`` passed ``bound``).

    Close it (or hand its bytes over with :meth:`to_file`) when done: its file is removed then.
    """

    def __init__(self, limit: int, what: str, bound: str) -> None:
        self.limit = limit
        self.what = what
        self.bound = bound
        self.size = 0
        self._memory = bytearray()
        self._file: BinaryIO | None = None
        self._path: Path | None = None

    def write(self, data: bytes) -> None:
        if self.size + len(data) > self.limit:
            raise OutputLimitExceeded(self.what, self.bound)
        self.size += len(data)
        if self._file is None and len(self._memory) + len(data) <= SPOOL_MEMORY_BYTES:
            self._memory += data
            return
        if self._file is None:
            descriptor, name = tempfile.mkstemp(prefix="episode-operator-answer-")
            self._path = Path(name)
            self._file = os.fdopen(descriptor, "w+b")
            self._file.write(self._memory)
            self._memory = bytearray()
        self._file.write(data)

    @property
    def in_memory(self) -> bool:
        """Whether it is still small enough to be held in memory (reading it then does no I/O)."""
        return self._file is None

    def reset(self) -> None:
        """Empty again (an exec retried from the start)."""
        self.size = 0
        self._memory = bytearray()
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()

    def getvalue(self) -> bytes:
        """All of it, in memory: for answers whose bound is small."""
        with self.reader() as reader:
            return reader.read()

    def reader(self) -> BinaryIO:
        """Its bytes from the start (close the reader, not the spool, when done with it)."""
        if self._file is None:
            return io.BytesIO(bytes(self._memory))
        assert self._path is not None
        self._file.flush()
        return open(self._path, "rb")  # the caller closes it

    def to_file(self) -> ArchiveFile:
        """Its bytes as a file the caller now owns (and discards); the spool is empty afterwards."""
        if self._file is None:
            archive = ArchiveFile.of_bytes(bytes(self._memory))
        else:
            assert self._path is not None
            self._file.close()
            archive = ArchiveFile(self._path, self.size)
        self._file, self._path, self._memory, self.size = None, None, bytearray(), 0
        return archive

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._file, self._path, self._memory, self.size = None, None, bytearray(), 0

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def render_table(limits: OutputLimits | None = None) -> str:
    """The README's table of the bounds (``python -m episode_operator.runtime.limits``; a unit test
    fails when the README's copy drifts)."""
    limits = limits or OutputLimits()
    lines = ["| flag | Helm value | default | what it bounds |", "| --- | --- | --- | --- |"]
    for name, limit in LIMIT_FLAGS.items():
        value = getattr(limits, name)
        shown = format_size(value) if name.endswith("_bytes") else str(value)
        lines.append(f"| `{limit.flag}` | `outputLimits.{limit.value}` | {shown} | {limit.bounds} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
