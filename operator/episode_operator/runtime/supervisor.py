"""The commands the operator execs in a sandbox pod, and how to read their answers.

The operator never holds an exec stream for the lifetime of a command. At seed it places a
small POSIX-shell supervisor (``supervisor.sh``, shipped in this package) at
``SUPERVISOR_PATH`` in an emptyDir shared by the pod's containers; afterwards every command
(setup.sh, healthcheck, agent, collect hooks, test.sh, the oracle's solve.sh) runs as a *job*
under it. This module is pure: it builds each exec as a :class:`Command` (argv plus optional
stdin bytes) and parses each answer, so the kube layer only ships bytes and the protocol is
tested against the real script without a cluster.

Protocol (``sh SUPERVISOR_PATH VERB ...``; values are always separate argv entries, never
spliced into shell text, so any character survives):

``start ID [--user U] [--timeout S] [--kill-after S] [--cwd DIR] [--output PATH]
[--shell bash|sh] [--env NAME=VALUE]... [--wait S] [--clear PATH]...
[--upload-to DEST --upload-bytes N] -- COMMAND``
    Creates ``jobs/ID/`` atomically (mkdir) and launches ``<shell> -c COMMAND`` detached, in
    its own session and process group, stdin from /dev/null, stdout and stderr appended to
    PATH (default ``jobs/ID/output``), bounded by a watchdog (TERM to the group at the
    timeout, KILL ``--kill-after`` seconds later; required). If ``jobs/ID`` exists nothing
    is started: the answer is the existing job's state, so retries never run a command twice.
    Only when it starts the job, it first clears the ``--clear`` paths and extracts the tar
    of N bytes on stdin into DEST, as ``upload`` does (a failure there starts nothing).
    ``--wait S`` waits up to S seconds for the job before answering. The default ``--cwd``
    is the working directory recorded when the supervisor was placed in this container. With
    ``--user`` (name or uid; a uid without a passwd entry gets gid 0 and HOME=/, as under
    docker) HOME, USER and LOGNAME are the user's unless ``--env`` sets them. Environment
    names starting with ``_EO_`` are reserved.
``wait ID S``
    The state after a bounded long poll (``S`` 0: the state now).
``output ID BYTES``
    The last BYTES bytes of the job's own output, raw: what it appended to its output file
    (several jobs may share one, e.g. every turn's solve.sh appends to the oracle's log).

A state is one line: ``id=ID phase=running|exited|unstartable|unknown [exit_code=N]
[timed_out=0|1] [started_at=EPOCH] [finished_at=EPOCH] [reason=PERCENT-ENCODED]``. A job is
*unstartable* when its shell is missing, its user does not exist or cannot be switched to,
or its directory or output file is unusable; it never hangs. A job whose supervising process
vanished (e.g. an agent ran ``kill -9 -1``) reads ``phase=exited`` with no exit code and a
``reason`` starting with ``lost:``.

Helpers, one exec each: ``place [FOLDER]...`` (the second half of :func:`placement`: the
layout folders, the working directory recorded, then the probe's ``key=value`` lines, values
percent-encoded; see :func:`parse_probe`), ``upload DEST BYTES`` (a tar on stdin),
``download [--exclude P]... -- PATH...`` (a tar on stdout), ``read -- FILE...`` (framed
contents, see :func:`parse_files`), ``clear -- PATH...``, ``chown-workdir USER DIR``. A verb
exits 0 when it did its work (a job's own failure is in its state), 1 when the operation failed
and 2 when the call was malformed, with one line on stderr either way.

Execs use Kubernetes' websocket v4 protocol, whose stdin cannot be half-closed: every verb
that reads stdin reads a known length with ``head -c``. Argument lists too large for an exec
URL travel on stdin too (``--argv-stdin BYTES [REST]``, REST the verb's own stdin bytes that
follow them; :func:`_command` decides).
"""

from __future__ import annotations

import io
import math
import os
import secrets
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Final, Literal, cast, get_args
from urllib.parse import unquote_to_bytes

from episode_operator.runtime.limits import (
    CHUNK_BYTES,
    LIMIT_FLAGS,
    AnswerSink,
    OutputLimitExceeded,
    OutputLimits,
    Spool,
    bound_name,
)
from episode_operator.runtime.sandbox_protocol import ArchiveFile, FileContent, JobPhase, JobSpec, JobState, Upload
from episode_operator.runtime.timing import KILL_AFTER_SEC

SUPERVISOR_DIR = "/episode-operator"
SUPERVISOR_PATH = f"{SUPERVISOR_DIR}/supervisor.sh"
# Each job's records (supervisor.sh: jobs/<id>/output_path, output_offset, …).
JOBS_DIR = f"{SUPERVISOR_DIR}/jobs"
# What ``kubectl episode logs -f`` runs in the agent's container: the job's output from byte $2 of
# its own (after the offset the file had when the job started), at most $3 bytes; exit 3 while the
# job has no records yet, 4 when it had ended before the read (what was read is the rest of it).
# The records are the agent's to change: the answer is bounded, shown, never trusted.
FOLLOW_SCRIPT = (
    'd=$1; p=$(cat "$d/output_path" 2>/dev/null) || exit 3; e=0; '
    '{ [ -s "$d/exit" ] || [ -f "$d/unstartable" ] || [ -f "$d/lost" ]; } && e=4; '
    'o=$(cat "$d/output_offset" 2>/dev/null); case $o in "" | *[!0-9]*) o=0 ;; esac; '
    'tail -c +$((o + $2 + 1)) "$p" 2>/dev/null | head -c "$3"; exit $e'
)
FOLLOW_NO_RECORDS, FOLLOW_ENDED = 3, 4

#: Above this many bytes of arguments a command sends them on stdin: exec arguments travel
#: in the request URL, which API servers and proxies bound.
ARGV_STDIN_THRESHOLD = 16 * 1024

_PHASES: frozenset[str] = frozenset(get_args(JobPhase))
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")

# The first exec into a pod: write the script from stdin (exactly N bytes, then atomically
# into place, so a running job's shell keeps reading the old inode), then let the script
# record the exec's working directory (the container's) and print the probe.
_PLACEMENT = """\
d=$1 n=$2 t=$1/.supervisor.sh.$$
mkdir -p "$d/jobs" "$d/tmp" || { echo "placement: cannot create $d/jobs" >&2; exit 1; }
head -c "$n" >"$t" || { echo "placement: cannot write $t" >&2; exit 1; }
s=$(($(wc -c <"$t")))
[ "$s" -eq "$n" ] || { rm -f "$t"; echo "placement: got $s of $n bytes" >&2; exit 1; }
chmod 0755 "$t" && mv -f "$t" "$d/supervisor.sh" || { echo "placement: cannot install $d/supervisor.sh" >&2; exit 1; }
shift 2
exec sh "$d/supervisor.sh" place "$@"
"""


#: The default bounds (``runtime/limits.py``), for builders called without the operator's own.
DEFAULT_LIMITS = OutputLimits()
#: Room for a frame's header line (``download 1073741824``) besides the bytes it frames.
_FRAME_HEADER = 64


@dataclass(frozen=True)
class AnswerBound:
    """How much a command's answer may hold, and how an error names it: ``what`` passed ``bound``.

    ``stdout`` bounds the answer as it streams (the transport stops reading past it); ``stderr``
    bounds its stderr.
    """

    stdout: int
    what: str
    bound: str
    stderr: int = DEFAULT_LIMITS.answer_bytes

    def spool(self) -> Spool:
        """Where the answer's stdout goes as it arrives."""
        return Spool(self.stdout, self.what, self.bound)

    def check_stderr(self, size: int) -> None:
        if size > self.stderr:
            flag = LIMIT_FLAGS["answer_bytes"].flag
            raise OutputLimitExceeded(
                f"the stderr with {self.what} ({size} bytes)", f"its bound ({flag} {self.stderr})"
            )


#: The bound of an answer of a command built without one (the session's own ``serve``, tests).
DEFAULT_ANSWER: Final = AnswerBound(
    DEFAULT_LIMITS.answer_bytes, "an answer", bound_name("answer_bytes", DEFAULT_LIMITS)
)


@dataclass(frozen=True)
class Command:
    """One exec: the argv to run and what to send on its stdin: ``stdin`` (None: no stdin), then
    the file ``stdin_file`` streamed in frames (an artifact's tar), and the bound of its answer.

    A supervisor verb also keeps its own words and stdin (``words``, and ``payload`` or
    ``payload_file``), from which a session call is made (:func:`session_call`); other commands
    (placement) have no words.
    """

    argv: list[str]
    stdin: bytes | None = None
    words: tuple[str, ...] | None = None
    payload: bytes | None = None
    answer: AnswerBound = AnswerBound(
        DEFAULT_LIMITS.answer_bytes, "an answer", bound_name("answer_bytes", DEFAULT_LIMITS)
    )
    stdin_file: ArchiveFile | None = None
    payload_file: ArchiveFile | None = None

    @property
    def has_stdin(self) -> bool:
        return self.stdin is not None or self.stdin_file is not None

    @property
    def payload_size(self) -> int:
        """How many bytes the verb itself reads on its stdin."""
        return len(self.payload or b"") + (self.payload_file.size if self.payload_file is not None else 0)


def script_text() -> str:
    """The supervisor script as shipped in the package (package-data ``**/*.sh``)."""
    return resources.files("episode_operator.runtime").joinpath("supervisor.sh").read_text(encoding="utf-8")


def placement(
    directory: str = SUPERVISOR_DIR, *, layout: Sequence[str] = (), limits: OutputLimits = DEFAULT_LIMITS
) -> Command:
    """The first exec: install the supervisor in ``directory``, make the ``layout`` folders that are
    missing (mode 0777, as Harbor makes them; one that exists is left as it is: a restart's placement
    must not open a folder sealed for a running verifier) and answer the probe.

    Safe to repeat (an operator restart re-places it): the script is replaced atomically and
    existing jobs are kept. The exec's working directory (the container's) is recorded as the
    default ``cwd`` of jobs, per container (mount namespace) since the pod's containers share
    the directory; a container never placed into falls back to the last placement's. Parse
    the answer with :func:`parse_probe`.
    """
    script = script_text().encode("utf-8")
    for folder in layout:
        if not folder.startswith("/") or not folder.strip("/"):
            raise ValueError(f"a layout folder is an absolute path below /: {folder!r}")
        _check_arg(folder, "layout folder")
    return Command(
        ["sh", "-c", _PLACEMENT, "sh", directory, str(len(script)), *layout],
        stdin=script,
        answer=_control("the answer to the supervisor's placement", limits),
    )


def start(
    spec: JobSpec,
    *,
    wait_sec: float = 0.0,
    kill_after_sec: float = KILL_AFTER_SEC,
    upload: Upload | None = None,
    limits: OutputLimits = DEFAULT_LIMITS,
) -> Command:
    """Start ``spec`` unless its id exists; answers the job's state (parse with :func:`parse_state`).

    ``wait_sec`` > 0 waits that long for the job in the same exec, saving a round trip for
    short jobs. A non-finite ``spec.timeout_sec`` means no bound. ``upload`` (its archive on
    stdin) is cleared and extracted as :func:`upload` does, only when the job is started.
    """
    _check_id(spec.id)
    args = ["start", spec.id]
    if upload is not None:
        args += _upload_args(upload.archive, upload.destination, upload.clear, option="--upload-to")
    if math.isfinite(spec.timeout_sec):
        if spec.timeout_sec <= 0:
            raise ValueError(f"job {spec.id}: timeout_sec must be positive, got {spec.timeout_sec}")
        args += ["--timeout", _seconds(spec.timeout_sec, "timeout_sec")]
    args += ["--kill-after", _seconds(kill_after_sec, "kill_after_sec")]
    args += ["--shell", spec.shell]
    if spec.user is not None:
        user = str(spec.user)
        if not user or ":" in user or "\n" in user or (isinstance(spec.user, int) and spec.user < 0):
            raise ValueError(f"job {spec.id}: invalid user {spec.user!r}")
        args += ["--user", user]
    if spec.cwd is not None:
        args += ["--cwd", spec.cwd]
    if spec.output is not None:
        args += ["--output", spec.output]
    for name, value in spec.env.items():
        if not name or name[0] not in _NAME_START or not set(name) <= _NAME_CHARS or name.startswith("_EO_"):
            raise ValueError(f"job {spec.id}: invalid environment variable name {name!r} (_EO_* is reserved)")
        args += ["--env", f"{name}={value}"]
    if wait_sec > 0:
        args += ["--wait", _seconds(wait_sec, "wait_sec")]
    args += _extras(spec)
    args += ["--", spec.command]
    return _command(
        args,
        _job_answer(spec, "start", limits),
        stdin=upload.archive if upload is not None else None,
        private=spec.private,
    )


def _job_answer(spec: JobSpec, verb: str, limits: OutputLimits) -> AnswerBound:
    """The bound of a start or wait answer: its state line and read frames, then the tail and the
    download asked for (each frame is checked against its own part by :func:`parse_answer`)."""
    parts = [bound_name("answer_bytes", limits)]
    size = limits.answer_bytes
    if spec.tail > 0:
        size += spec.tail + _FRAME_HEADER
        parts.append(f"the {spec.tail}-byte tail asked for")
    if spec.download_after is not None:
        size += limits.artifact_bytes + _FRAME_HEADER
        parts.append(f"{bound_name('artifact_bytes', limits)} for {spec.download_after}")
    return AnswerBound(size, f"the answer to `{verb} {spec.id}`", " + ".join(parts), limits.answer_bytes)


def _control(what: str, limits: OutputLimits) -> AnswerBound:
    """The bound of an answer that only says how a verb went (a state, a probe, read files)."""
    return AnswerBound(limits.answer_bytes, what, bound_name("answer_bytes", limits), limits.answer_bytes)


def _extras(spec: JobSpec) -> list[str]:
    """The options that bring the output's tail, the ``read_after`` files and the
    ``download_after`` tar back with a final state."""
    args: list[str] = []
    if spec.tail > 0:
        args += ["--tail", str(int(spec.tail))]
    for path in spec.read_after:
        _check_arg(path, "read_after path")
        args += ["--then-read", path]
    if spec.download_after is not None:
        if not spec.download_after.startswith("/"):
            raise ValueError(f"job {spec.id}: download_after must be absolute, got {spec.download_after!r}")
        for pattern in spec.download_exclude:
            _check_arg(pattern, "download_exclude pattern")
            args += ["--then-exclude", pattern]
        args += ["--then-download", spec.download_after]
    return args


def wait(spec: JobSpec, max_wait_sec: float, *, limits: OutputLimits = DEFAULT_LIMITS) -> Command:
    """A bounded long poll: the state once the job is done or after ``max_wait_sec``.

    The exec lasts up to ``max_wait_sec`` plus a little: give its transport more time. Once
    the job is done the answer carries what ``spec`` asks back (see :func:`parse_answer`).
    """
    _check_id(spec.id)
    args = ["wait", spec.id, _seconds(max_wait_sec, "max_wait_sec"), *_extras(spec)]
    return _command(args, _job_answer(spec, "wait", limits))


def output(job_id: str, limit: int, *, limits: OutputLimits = DEFAULT_LIMITS) -> Command:
    """The last ``limit`` bytes of the job's own output (raw stdout of the exec, at most ``limit``).

    Only what the job appended to its output file: an output file shared with earlier jobs
    keeps their bytes out (the size at the job's start is recorded).
    """
    _check_id(job_id)
    if limit < 0:
        raise ValueError(f"output limit must be >= 0, got {limit}")
    answer = AnswerBound(limit, f"the output of job {job_id}", f"the {limit} bytes asked for", limits.answer_bytes)
    return _command(["output", job_id, str(limit)], answer)


def upload(
    archive: bytes | ArchiveFile,
    destination: str,
    *,
    clear: Sequence[str] = (),
    limits: OutputLimits = DEFAULT_LIMITS,
) -> Command:
    """Extract the tar ``archive`` into ``destination`` as root (a file is streamed).

    Modes are kept, files are owned by root, files of the same name are replaced, nothing is
    removed and directories that exist keep their owner and mode. ``clear`` paths are cleared
    first (as :func:`clear` does), in the same exec.
    """
    answer = _control(f"the answer to `upload {destination}`", limits)
    return _command(["upload", *_upload_args(archive, destination, clear)], answer, stdin=archive)


def _upload_args(
    archive: bytes | ArchiveFile, destination: str, clear: Sequence[str], *, option: str = ""
) -> list[str]:
    """``[--clear PATH]... DEST BYTES`` of the upload verb, or the same as ``start`` options
    (``--clear PATH``... ``--upload-to DEST --upload-bytes BYTES``) when ``option`` is given."""
    _check_arg(destination, "destination")
    if not destination:
        raise ValueError("upload destination must not be empty")
    args: list[str] = []
    for path in clear:
        if not path.strip("/"):
            raise ValueError(f"refusing to clear {path!r}")
        _check_arg(path, "clear path")
        args += ["--clear", path]
    size = archive.size if isinstance(archive, ArchiveFile) else len(archive)
    if option:
        return [*args, option, destination, "--upload-bytes", str(size)]
    return [*args, destination, str(size)]


def download(paths: Sequence[str], exclude: Sequence[str] = (), *, limits: OutputLimits = DEFAULT_LIMITS) -> Command:
    """A tar of the absolute ``paths`` on stdout, member names relative to ``/``, at most the
    artifact bound.

    Paths that do not exist are left out (no paths: an empty archive). ``exclude`` patterns
    are tar's ``--exclude`` (GNU semantics; busybox tar cannot exclude and fails). The exit
    status must be checked: a failure can come after part of the archive was written.
    """
    args = ["download"]
    for pattern in exclude:
        args += ["--exclude", pattern]
    args.append("--")
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"download paths must be absolute, got {path!r}")
        args.append(path)
    what = f"the download of {', '.join(paths) or 'nothing'}"
    answer = AnswerBound(limits.artifact_bytes, what, bound_name("artifact_bytes", limits), limits.answer_bytes)
    return _command(args, answer)


def read_files(paths: Sequence[str], *, limits: OutputLimits = DEFAULT_LIMITS) -> Command:
    """The contents of small files, framed (see :func:`parse_files`), at most the answer bound in all."""
    return _command(["read", "--", *paths], _control(f"the read of {', '.join(paths)}", limits))


def clear(paths: Sequence[str], *, limits: OutputLimits = DEFAULT_LIMITS) -> Command:
    """Reset grading paths before a turn.

    A directory is emptied (dotfiles too) and kept with mode 0777; a file or symlink is
    deleted; a path ending in ``/`` must be a directory: whatever else is there is removed
    and a missing one is created with mode 0777. Other missing paths are ignored.
    """
    for path in paths:
        if not path.strip("/"):
            raise ValueError(f"refusing to clear {path!r}")
    return _command(["clear", "--", *paths], _control("the answer to `clear`", limits))


def chown_workdir(user: str | int, directory: str | None = None, *, limits: OutputLimits = DEFAULT_LIMITS) -> Command:
    """Make ``user`` (name or uid) own ``directory`` itself, not its content.

    ``directory`` None is the working directory recorded at placement; a missing directory
    is created. Fails (exit 1) for a user name without a passwd entry; uids always work.
    """
    name = str(user)
    if not name or (isinstance(user, int) and user < 0):
        raise ValueError(f"invalid user {user!r}")
    return _command(["chown-workdir", name, directory or ""], _control("the answer to `chown-workdir`", limits))


def parse_state(job_id: str, stdout: bytes) -> JobState:
    """Read the one-line state the supervisor prints after start and wait.

    Unknown keys are ignored (a newer script may say more); anything that is not a state of
    ``job_id`` raises ValueError, since acting on a misread state could re-run or lose a turn.
    """
    text = stdout.decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("id=")]
    if not lines:
        raise ValueError(f"no job state in supervisor answer for {job_id}: {_excerpt(stdout)}")
    fields: dict[str, str] = {}
    for token in lines[-1].split():
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"malformed field {token!r} in supervisor answer for {job_id}: {_excerpt(stdout)}")
        fields[key] = value
    if fields.get("id") != job_id:
        raise ValueError(f"supervisor answered for job {fields.get('id')!r}, not {job_id!r}")
    phase = fields.get("phase", "")
    if phase not in _PHASES:
        raise ValueError(f"unknown phase {phase!r} in supervisor answer for {job_id}")
    try:
        exit_code = int(fields["exit_code"]) if "exit_code" in fields else None
        started_at = float(fields["started_at"]) if "started_at" in fields else None
        finished_at = float(fields["finished_at"]) if "finished_at" in fields else None
    except ValueError as error:
        raise ValueError(f"malformed number in supervisor answer for {job_id}: {error}") from None
    timed_out = fields.get("timed_out", "0")
    if timed_out not in ("0", "1"):
        raise ValueError(f"malformed timed_out {timed_out!r} in supervisor answer for {job_id}")
    reason = _decode(fields["reason"]) if "reason" in fields else None
    return JobState(
        id=job_id,
        phase=cast(JobPhase, phase),  # checked against JobPhase above
        exit_code=exit_code,
        timed_out=timed_out == "1",
        reason=reason,
        started_at=started_at,
        finished_at=finished_at,
    )


def parse_probe(stdout: bytes) -> dict[str, str]:
    """Read ``key=value`` lines (values percent-encoded) into a dict of decoded values.

    Keys: ``version``, ``workdir``, ``user``, ``uid``, ``has_<tool>`` (0/1) for bash,
    timeout, tar, gzip, find, setsid, runuser, setpriv, su, head; ``tar`` (gnu, busybox,
    other or empty), ``can_switch_user`` and ``can_switch_uid`` (0/1: whether jobs can run
    as a named user / as a uid without a passwd entry).
    """
    facts: dict[str, str] = {}
    for line in stdout.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise ValueError(f"malformed probe line {line!r}")
        facts[key] = _decode(value)
    if "workdir" not in facts:
        raise ValueError(f"probe answer without a workdir: {_excerpt(stdout)}")
    return facts


def failed_step(stderr: bytes) -> str | None:
    """The step a failed verb names in its verdict (``supervisor: clear: ...`` → ``clear``).

    The verdict is the supervisor's last own line: tools it ran may have written before it.
    """
    verdicts = [
        line.removeprefix("supervisor: ")
        for line in stderr.decode("utf-8", errors="replace").splitlines()
        if line.startswith("supervisor: ")
    ]
    if not verdicts:
        return None
    step, colon, _ = verdicts[-1].partition(":")
    return step if colon and step.replace("-", "").isalpha() else None


def parse_answer(spec: JobSpec, answer: bytes | Spool, limits: OutputLimits = DEFAULT_LIMITS) -> JobState:
    """Read the answer of :func:`start` or :func:`wait` for ``spec``: the state line, then, once
    the job is done, the output's tail (``tail <length>`` and its bytes), the read frames of
    ``spec.read_after`` and the tar of ``spec.download_after`` (``download <length>`` and its
    bytes, or ``download -1`` when tar failed), as asked.

    Each frame is held to its own part of the answer's bound — the tail to what was asked, the
    read files to the answer bound, the tar to the artifact bound — whatever the answer's total:
    past one, :class:`OutputLimitExceeded`. The tar is copied to a file the caller owns."""
    with _Reader.of(answer, spec.id) as reader:
        state = parse_state(spec.id, reader.line(limits.answer_bytes))
        if not state.done or (spec.tail <= 0 and not spec.read_after and spec.download_after is None):
            return state
        output: bytes | None = None
        if spec.tail > 0:
            length = reader.frame("tail", spec.tail, f"the tail of job {spec.id}", f"the {spec.tail} bytes asked for")
            output = reader.take(length) if length is not None else None
        files: dict[str, FileContent] | None = None
        if spec.read_after:
            files = _files(reader, spec.read_after, limits)
        archive: ArchiveFile | None = None
        if spec.download_after is not None:
            what = f"the download of {spec.download_after} with job {spec.id}'s answer"
            length = reader.frame("download", limits.artifact_bytes, what, bound_name("artifact_bytes", limits))
            archive = reader.copy(length) if length is not None else None
        try:
            reader.end()
        except ValueError:
            if archive is not None:
                archive.discard()
            raise
        return replace(state, output=output, files=files, archive=archive)


class _Reader:
    """An answer read front to back: lines, frames, exact lengths; nothing is read past what a
    frame says, and a line is looked for only within its bound."""

    def __init__(self, stream: BinaryIO, job: str) -> None:
        self.stream = stream
        self.job = job

    @classmethod
    def of(cls, answer: bytes | Spool, job: str) -> _Reader:
        return cls(io.BytesIO(answer) if isinstance(answer, bytes) else answer.reader(), job)

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *_: object) -> None:
        self.stream.close()

    def line(self, limit: int) -> bytes:
        """The next line (with its newline, or what is left when none follows within ``limit``)."""
        return self.stream.readline(limit + 1)

    def frame(self, word: str, limit: int, what: str, bound: str) -> int | None:
        """A ``<word> <length>`` header: the length (None for -1, no bytes), at most ``limit``."""
        header = self.stream.readline(_FRAME_HEADER)
        found, _, length_text = header.decode("ascii", errors="replace").rstrip("\n").partition(" ")
        if found == word and length_text == "-1":
            return None
        if found != word or not header.endswith(b"\n") or not length_text.isdigit():
            raise ValueError(f"malformed {word} frame in the answer for {self.job}: {_excerpt(header)}")
        if int(length_text) > limit:
            raise OutputLimitExceeded(f"{what} ({length_text} bytes)", bound)
        return int(length_text)

    def take(self, length: int) -> bytes:
        data = self.stream.read(length)
        if len(data) != length:
            raise ValueError(f"the answer for {self.job} is short of a {length}-byte frame")
        return data

    def copy(self, length: int) -> ArchiveFile:
        """The next ``length`` bytes, copied to a new file in pieces."""
        descriptor, name = tempfile.mkstemp(prefix="episode-operator-archive-")
        archive = ArchiveFile(Path(name), length)
        with os.fdopen(descriptor, "wb") as file:
            left = length
            while left:
                piece = self.stream.read(min(left, CHUNK_BYTES))
                if not piece:
                    archive.discard()
                    raise ValueError(f"the answer for {self.job} is short of a {length}-byte frame")
                file.write(piece)
                left -= len(piece)
        return archive

    def end(self) -> None:
        rest = self.stream.read(1)
        if rest:
            raise ValueError(f"unexpected bytes after the answer for {self.job}")


def parse_files(
    stdout: bytes | Spool, paths: Sequence[str], limits: OutputLimits = DEFAULT_LIMITS
) -> dict[str, FileContent]:
    """Read the answer of :func:`read_files`: per path, its bytes and modification time.

    Framing: for each requested path in order, a header line ``<length> <percent-encoded
    path> [<mtime>]`` (length -1: no such regular file), then exactly ``length`` raw bytes.
    """
    with _Reader.of(stdout, "read") as reader:
        result = _files(reader, paths, limits)
        reader.end()
    return result


def _files(reader: _Reader, paths: Sequence[str], limits: OutputLimits) -> dict[str, FileContent]:
    """The read frames of ``paths`` next in ``reader``, their contents at most the answer bound in all."""
    result: dict[str, FileContent] = {}
    left = limits.answer_bytes
    for path in paths:
        line = reader.line(_FRAME_HEADER + 3 * len(path.encode("utf-8")))
        if not line.endswith(b"\n"):
            raise ValueError(f"read answer ends before the header of {path!r}")
        header = line[:-1].decode("ascii", errors="replace")
        fields = header.split(" ")
        try:
            length = int(fields[0])
        except ValueError:
            raise ValueError(f"malformed read header {header!r}") from None
        if len(fields) < 2 or unquote_to_bytes(fields[1]) != path.encode("utf-8") or length < -1:
            raise ValueError(f"read header {header!r} does not frame {path!r}")
        if length < 0:
            result[path] = FileContent(None, None)
            continue
        if length > left:
            raise OutputLimitExceeded(f"the read of {path} ({length} bytes)", bound_name("answer_bytes", limits))
        left -= length
        result[path] = FileContent(reader.take(length), _mtime(fields[2] if len(fields) > 2 else "-"))
    return result


def _mtime(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _command(
    args: list[str], answer: AnswerBound, *, stdin: bytes | ArchiveFile | None = None, private: bool = False
) -> Command:
    """``sh SUPERVISOR_PATH *args``, or the args on stdin when too long for an exec URL or ``private``
    (they hold secrets: an exec's URL is in the API server's logs and the process's command line).

    ``stdin`` is what the verb itself reads (an upload's archive, a file streamed); arguments
    sent on stdin come before it, each part read by its exact length.
    """
    for arg in args:
        _check_arg(arg, "argument")
    encoded = [arg.encode("utf-8") for arg in args]
    words = tuple(args)
    data, file = (None, stdin) if isinstance(stdin, ArchiveFile) else (stdin, None)
    argv, sent = ["sh", SUPERVISOR_PATH, *args], data
    if private or sum(len(arg) for arg in encoded) > ARGV_STDIN_THRESHOLD:
        payload = b" ".join(str(len(arg)).encode() for arg in encoded) + b"\n" + b"".join(encoded)
        argv = ["sh", SUPERVISOR_PATH, "--argv-stdin", str(len(payload))]
        size = file.size if file is not None else len(data or b"")
        if size:
            argv.append(str(size))
        sent = payload + (data or b"")
    return Command(argv, stdin=sent, words=words, payload=data, answer=answer, stdin_file=file, payload_file=file)


# --- sessions: many calls over one exec ----------------------------------------------------------
#
# An exec costs a connection, the API server's and the kubelet's work and a process started in the
# container (~70 ms on the project's cluster); a call on an open stream, a few milliseconds. A
# session is one exec of ``serve`` that runs verbs as they come (supervisor.sh's cmd_serve): a
# request is a header ``NONCE LINES BYTES``, the verb's words shell-quoted on LINES lines, then BYTES
# bytes of its stdin; the answer is the verb's stdout, ``\n@@EO NONCE STATUS ERRBYTES\n`` and its
# stderr. The session first says ``@@EO ready VERSION HEAD``: HEAD ``exact`` when its ``head -c``
# reads no further than asked (GNU), so requests may carry stdin; otherwise they may not.

_MARK = b"@@EO "


def serve() -> Command:
    """The exec that holds a session (see :class:`SessionAnswers`)."""
    return Command(["sh", SUPERVISOR_PATH, "serve"])


@dataclass(frozen=True)
class SessionCall:
    """One request of a session (its bytes, then ``file`` streamed) and the nonce its answer carries."""

    nonce: str
    request: bytes
    file: ArchiveFile | None = None


def session_call(command: Command) -> SessionCall | None:
    """``command`` as a request of a session; None for a command that is not a supervisor verb."""
    if command.words is None:
        return None
    nonce = secrets.token_hex(16)
    text = " ".join(shlex.quote(word) for word in command.words)
    header = f"{nonce} {text.count(chr(10)) + 1} {command.payload_size}\n".encode()
    return SessionCall(nonce, header + text.encode("utf-8") + b"\n" + (command.payload or b""), command.payload_file)


@dataclass(frozen=True)
class SessionReady:
    """What a session says as it starts."""

    version: str
    exact_head: bool


@dataclass(frozen=True)
class SessionAnswer:
    """How a call went; its stdout went to the spool it was expected with."""

    status: int
    stderr: bytes


#: The most a session's ready line, and an answer's trailer line, may hold.
_READY_LINE, _TRAILER_LINE = 200, 64


_SESSION_ANSWER = AnswerBound(
    DEFAULT_LIMITS.answer_bytes, "a session's answer", bound_name("answer_bytes", DEFAULT_LIMITS)
)


@dataclass
class _Expected:
    """The call whose answer is streaming in: where its stdout goes, and how far the scan got."""

    nonce: str
    stdout: AnswerSink
    answer: AnswerBound
    mark: bytes
    phase: Literal["stdout", "trailer", "stderr", "done"] = "stdout"
    pending: bytearray = field(default_factory=bytearray)  # the stdout's end that may begin the mark; the trailer
    status: int = 0
    stderr_bytes: int = 0
    stderr: bytearray = field(default_factory=bytearray)


class SessionAnswers:
    """A session's stdout as it arrives, in pieces of any size: its ready line, then answers.

    Linear in what arrives: an answer's stdout streams into its spool as it comes, all but the
    last few bytes that may begin its end mark, and nothing before the scan position is looked
    at again. Every part is bounded: the ready line, the stdout (its spool), the trailer line,
    the stderr (the answer's bound).
    """

    def __init__(self) -> None:
        self._head = bytearray()  # the ready line as it comes
        self.ready: SessionReady | None = None
        self._call: _Expected | None = None

    def expect(self, nonce: str, stdout: AnswerSink, answer: AnswerBound = DEFAULT_ANSWER) -> None:
        """The next answer is the call ``nonce``'s: its stdout goes to ``stdout``. Calls are one at a
        time, and a session whose call was abandoned is closed: nothing else is in the stream."""
        self._call = _Expected(nonce, stdout, answer, b"\n" + _MARK + nonce.encode() + b" ")

    def feed(self, data: bytes) -> None:
        if self.ready is None:
            data = self._ready_line(data)
        call = self._call
        if data and (call is None or call.phase == "done"):
            raise ValueError(f"unexpected bytes from the session: {_excerpt(data)}")
        while data and call is not None:
            if call.phase == "stdout":
                data = self._stdout(call, data)
            elif call.phase == "trailer":
                data = self._trailer(call, data)
            elif call.phase == "stderr":
                missing = call.stderr_bytes - len(call.stderr)
                call.stderr += data[:missing]
                data = data[missing:]
                if len(call.stderr) == call.stderr_bytes:
                    call.phase = "done"
            else:
                raise ValueError(f"unexpected bytes after the session's answer for {call.nonce}")

    def _ready_line(self, data: bytes) -> bytes:
        end = data.find(b"\n")
        self._head += data if end < 0 else data[: end + 1]
        if len(self._head) > _READY_LINE or not _MARK.startswith(bytes(self._head[: len(_MARK)])):
            raise ValueError(f"not a supervisor session: {_excerpt(bytes(self._head))}")
        if end < 0:
            return b""
        fields = bytes(self._head[:-1]).decode("ascii", "replace").split()
        if fields[:2] != ["@@EO", "ready"] or len(fields) < 4:
            raise ValueError(f"not a supervisor session: {_excerpt(bytes(self._head))}")
        self.ready = SessionReady(fields[2], fields[3] == "exact")
        return data[end + 1 :]

    @staticmethod
    def _stdout(call: _Expected, data: bytes) -> bytes:
        """Scan for the end mark from the last scan position on; what cannot begin it is stdout."""
        scanned = bytes(call.pending) + data
        found = scanned.find(call.mark)
        if found < 0:
            keep = min(len(call.mark) - 1, len(scanned))
            call.stdout.write(scanned[: len(scanned) - keep])
            call.pending = bytearray(scanned[len(scanned) - keep :])
            return b""
        call.stdout.write(scanned[:found])
        call.pending = bytearray()
        call.phase = "trailer"
        return scanned[found + len(call.mark) :]

    @staticmethod
    def _trailer(call: _Expected, data: bytes) -> bytes:
        """``STATUS ERRBYTES`` up to its newline, bounded; the stderr's length checked against its bound."""
        end = data.find(b"\n")
        call.pending += data if end < 0 else data[:end]
        if len(call.pending) > _TRAILER_LINE:
            raise ValueError(f"malformed session answer for {call.nonce}: {_excerpt(bytes(call.pending))}")
        if end < 0:
            return b""
        fields = bytes(call.pending).decode("ascii", "replace").split()
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            raise ValueError(f"malformed session answer for {call.nonce}: {_excerpt(bytes(call.pending))}")
        call.status, call.stderr_bytes = int(fields[0]), int(fields[1])
        call.answer.check_stderr(call.stderr_bytes)
        call.phase = "stderr" if call.stderr_bytes else "done"
        return data[end + 1 :]

    def take(self, nonce: str) -> SessionAnswer | None:
        """The answer to the call ``nonce`` once all of it arrived (None before)."""
        call = self._call
        if call is None or call.nonce != nonce or call.phase != "done":
            return None
        self._call = None
        return SessionAnswer(call.status, bytes(call.stderr))


def _check_id(job_id: str) -> None:
    """Job ids name directories and appear unquoted in state lines: keep them plain."""
    if not job_id or job_id.startswith(".") or len(job_id) > 200 or not set(job_id) <= _ID_CHARS:
        raise ValueError(f"invalid job id {job_id!r}: want 1-200 of [A-Za-z0-9._-], not starting with a dot")


def _check_arg(value: str, what: str) -> None:
    """An argv entry cannot hold a NUL byte (C strings end there)."""
    if "\0" in value:
        raise ValueError(f"{what} contains a NUL character: {value[:80]!r}")


def _seconds(value: float, what: str) -> str:
    """A duration as the script reads it: plain decimal digits, no exponent, no sign."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value}")
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def _decode(value: str) -> str:
    """Undo the script's percent-encoding (bytes are UTF-8; invalid sequences replaced)."""
    return unquote_to_bytes(value).decode("utf-8", errors="replace")


def _excerpt(stdout: bytes, limit: int = 200) -> str:
    """A short printable piece of a bad answer, for error messages."""
    return repr(stdout[:limit]) + ("…" if len(stdout) > limit else "")


__all__ = [
    "ARGV_STDIN_THRESHOLD",
    "SUPERVISOR_DIR",
    "SUPERVISOR_PATH",
    "Command",
    "chown_workdir",
    "clear",
    "download",
    "output",
    "parse_files",
    "parse_probe",
    "parse_state",
    "placement",
    "read_files",
    "script_text",
    "serve",
    "session_call",
    "start",
    "upload",
    "wait",
]
