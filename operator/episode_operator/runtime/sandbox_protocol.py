"""What the runtime needs from a sandbox, and nothing about Kubernetes.

A sandbox is one pod in production (the agent pod, or a separate verifier pod) and an
in-memory fake in the runtime's tests. Every command runs as a *job* under the in-pod
supervisor (``supervisor.sh``): started once by a deterministic id, bounded in the pod,
its exit code written atomically. Starting a job that exists returns its state, so a
restarted operator re-attaches instead of running a turn twice.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, Literal, Protocol

from episode_operator.api.vocabulary import OutageKind
from episode_operator.taskfolder.plan import NetworkPolicy, VerifierPlan

MAIN_CONTAINER = "main"
# The arguments of the main container's ENTRYPOINT (the image's CMD replaced, as Harbor's compose
# replaces it with `sleep infinity`): waits for ever, and exits at once on TERM so pods go away promptly.
KEEP_ALIVE = ("sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done")
JobPhase = Literal["running", "exited", "unstartable", "unknown"]


@dataclass(frozen=True)
class JobSpec:
    """One supervised command.

    ``output`` is a path in the container that receives stdout and stderr (the job's own
    file when None); ``cwd`` None is the container's working directory; ``shell`` runs
    ``command`` as ``<shell> -c command``.
    """

    id: str
    command: str
    timeout_sec: float
    user: str | int | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    output: str | None = None
    shell: Literal["bash", "sh"] = "bash"
    container: str = MAIN_CONTAINER
    # Brought back with the final state, saving an exec each: the output's last ``tail`` bytes,
    # the files at ``read_after`` (e.g. the reward files of test.sh) and a tar of
    # ``download_after`` without ``download_exclude``, as :meth:`Sandbox.download` makes it
    # (e.g. the agent's /logs/artifacts).
    tail: int = 0
    read_after: tuple[str, ...] = ()
    download_after: str | None = None
    download_exclude: tuple[str, ...] = ()
    # Its environment holds secrets (the agent's own env): it never travels in an exec's URL.
    private: bool = False


@dataclass(frozen=True)
class ArchiveFile:
    """A tar on the operator's disk (its scratch space): an artifact on its way from a sandbox to
    the store, or from the store to a verifier, never held in memory whole. Whoever holds one
    discards it when done."""

    path: Path
    size: int

    @classmethod
    def of_bytes(cls, data: bytes) -> ArchiveFile:
        """A new temporary file holding ``data``."""
        descriptor, name = tempfile.mkstemp(prefix="episode-operator-archive-")
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        return cls(Path(name), len(data))

    @classmethod
    def of_stream(cls, stream: BinaryIO) -> ArchiveFile:
        """A new temporary file holding what ``stream`` reads to its end."""
        descriptor, name = tempfile.mkstemp(prefix="episode-operator-archive-")
        with os.fdopen(descriptor, "wb") as file:
            shutil.copyfileobj(stream, file)
            size = file.tell()
        return cls(Path(name), size)

    def read_bytes(self) -> bytes:
        """All of it in memory: for tests and small archives only."""
        return self.path.read_bytes()

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class FileContent:
    """A file read from a sandbox: its bytes (None: no such regular file) and modification time."""

    data: bytes | None
    modified: float | None = None


@dataclass(frozen=True)
class JobState:
    """What the supervisor knows of a job."""

    id: str
    phase: JobPhase
    exit_code: int | None = None
    timed_out: bool = False
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    output: bytes | None = None
    files: Mapping[str, FileContent] | None = None
    # The tar of the spec's ``download_after``; None when not asked, not done yet, or tar failed.
    # The receiver discards it.
    archive: ArchiveFile | None = None

    @property
    def done(self) -> bool:
        return self.phase in ("exited", "unstartable")

    @property
    def succeeded(self) -> bool:
        return self.phase == "exited" and self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class Waiting:
    """Why a pod the episode needs does not run yet, from its state and its Events.

    ``role`` is ``agent``, ``verifier`` or ``build``; ``reason`` is CamelCase (``Unschedulable``,
    ``ErrImagePull``, ``ImagePullBackOff``, ``ContainerCreating``, an Event's reason…).
    """

    pod: str
    role: str
    reason: str
    message: str


# Told why a starting pod waits, again when the reason or message changes, and None once it runs.
WaitingReport = Callable[[Waiting | None], Awaitable[None]]


class SandboxError(Exception):
    """The sandbox failed under us (pod lost, image pull, exec transport…): an outage.

    ``kind`` names the outage for status and metrics (``pod_lost``, ``image_pull``, ``exec``…).
    """

    def __init__(self, message: str, *, kind: OutageKind) -> None:
        super().__init__(message)
        self.kind: OutageKind = kind


@dataclass(frozen=True)
class Upload:
    """A tar to extract (as :meth:`Sandbox.upload` does) just before a job starts, in its exec."""

    archive: bytes | ArchiveFile
    destination: str
    clear: tuple[str, ...] = ()


# Who owns a sealed folder: root (None), a user, or the user of the job whose start carries the clear.
JOB_USER = "@job"


def sealed(directory: str, owner: str | int | None = None) -> str:
    """A clear (of :meth:`Sandbox.clear`, an :class:`Upload`'s ``clear``) that seals ``directory`` for a
    verifier: made root's and mode 0755 before it is emptied — from then on no other user adds to it,
    or renames it or a folder above it away (those are made root's, not writable by others) — then
    given to ``owner`` (:data:`JOB_USER`: the user of the job whose start carries the clear).

    A plain path is cleared and left mode 0777, as Gym leaves the agent's folders; a sealed one is how
    a verifier's folders must be while it runs: an agent's leftover processes cannot reach them."""
    if not directory.startswith("/") or not directory.endswith("/"):
        raise ValueError(f"a sealed folder is an absolute directory path ending in /: {directory!r}")
    who = "" if owner is None else str(owner)
    if ":" in who or "\n" in who:
        raise ValueError(f"invalid owner {owner!r}")
    return f"0755:{who}:{directory}"


class CommandFailed(Exception):
    """A sandbox command ran and failed (e.g. tar could not unpack): the task's problem, not an outage.

    ``step`` names the part of a combined command that failed (``clear`` before an upload).
    """

    def __init__(self, message: str, *, step: str | None = None) -> None:
        super().__init__(message)
        self.step = step


class Sandbox(Protocol):
    """One running sandbox (pod). Every method is safe to retry after an operator restart.

    Every answer is bounded (``runtime/limits.py``): one that passes its bound raises
    :class:`~episode_operator.runtime.limits.OutputLimitExceeded` and nothing of it is kept.
    """

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str:
        """This incarnation of the sandbox (the pod's uid): a sandbox created again under the same name has another."""
        ...

    @property
    def workdir(self) -> str:
        """The working directory jobs run in by default."""
        ...

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        """Start ``spec`` unless a job with its id exists; its state, after up to ``wait_sec`` for it to end.

        ``upload`` is cleared and extracted first, in the same round trip, only when the job
        is started: a job that exists (a restarted runner re-attaching) keeps the inputs it
        started with. A failed upload raises :class:`CommandFailed` (step ``clear`` or
        ``upload``) and starts nothing.
        """
        ...

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        """The job's state once it is done, or after ``max_wait_sec`` (a bounded long poll)."""
        ...

    async def job_output(self, job_id: str, *, container: str = MAIN_CONTAINER, limit: int) -> bytes:
        """The last ``limit`` bytes of the job's output file."""
        ...

    async def upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        *,
        container: str = MAIN_CONTAINER,
        clear: Sequence[str] = (),
    ) -> None:
        """Extract a tar into ``destination`` as root: modes kept, same names replaced, nothing removed.

        ``clear`` paths are cleared first (as :meth:`clear` does), in the same round trip. A file is
        streamed, never read whole.
        """
        ...

    async def download(
        self, paths: Sequence[str], *, container: str = MAIN_CONTAINER, exclude: Sequence[str] = ()
    ) -> ArchiveFile:
        """A tar of ``paths`` (absolute), member names relative to ``/``; missing paths are left out.

        Bounded by the artifact bound; the caller discards the file.
        """
        ...

    async def read_files(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> dict[str, FileContent]:
        """The contents and modification times of small files."""
        ...

    async def clear(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> None:
        """Empty directories (keeping them, mode 0777) and delete files at ``paths``."""
        ...

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        """Make ``user`` own the working directory (not the files in it); fail if it cannot."""
        ...


class SandboxProvider(Protocol):
    """Creates, re-attaches and removes the sandboxes of one episode."""

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None) -> Sandbox:
        """The attempt's agent sandbox, created if needed, ready, with the supervisor in place.

        ``waiting`` hears why the pod does not run yet while it waits (and None once it runs).
        ``uid`` is the sandbox the attempt recorded (None: none yet): a recorded sandbox that is
        gone, or there with another uid, raises :class:`SandboxError` (``pod_lost``) and is never
        created again — what the attempt did in it is lost with it.
        """
        ...

    async def verifier(
        self,
        attempt: int,
        turn: int,
        plan: VerifierPlan,
        *,
        waiting: WaitingReport | None = None,
        uid: str | None = None,
    ) -> Sandbox:
        """A fresh verifier sandbox for a separate turn (re-attached if it exists); ``uid`` as for :meth:`agent`."""
        ...

    def pin_images(self, pins: Mapping[str, str]) -> None:
        """Pods made from now on run ``pins[image]`` where they would run ``image``: a built image's tag
        is replaced by its manifest digest (runtime/sandbox_images.py ``BuildReady.pinned``)."""
        ...

    async def apply_network(self, attempt: int, policy: NetworkPolicy) -> None:
        """Put the agent pod under ``policy`` for the phase about to run (a no-op when unchanged)."""
        ...

    async def release_verifier(self, attempt: int, turn: int) -> None: ...

    async def release_agent(self, attempt: int) -> None: ...

    async def release_all(self, *, keep: bool) -> None:
        """Remove every sandbox of the episode, unless ``keep`` (debugging a failure)."""
        ...


def keyed_job_id(key: str, job_id: str) -> str:
    """``job_id`` with a suffix only the holder of ``key`` can compute (an HMAC of the id).

    Job ids are deterministic so that a restarted operator re-attaches to its jobs, and the
    supervisor's records live in the agent's own container: an agent that could name the
    verifier's job before it starts could create its record and pre-empt it (a job that exists
    is never started again). With the attempt's key in every id (kept in the Episode's status,
    which the pod cannot read), no agent can name a job it did not see started.
    """
    digest = hmac.new(key.encode(), job_id.encode(), hashlib.sha256).hexdigest()[:16]
    return f"{job_id}.{digest}"


class SandboxWrapper:
    """A sandbox that passes every call to ``inner``: subclasses change what they must (job defaults, ids)."""

    inner: Sandbox

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def uid(self) -> str:
        return self.inner.uid

    @property
    def workdir(self) -> str:
        return self.inner.workdir

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        return await self.inner.start_job(spec, wait_sec=wait_sec, upload=upload)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        return await self.inner.wait_job(spec, max_wait_sec=max_wait_sec)

    async def job_output(self, job_id: str, *, container: str = MAIN_CONTAINER, limit: int) -> bytes:
        return await self.inner.job_output(job_id, container=container, limit=limit)

    async def upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        *,
        container: str = MAIN_CONTAINER,
        clear: Sequence[str] = (),
    ) -> None:
        await self.inner.upload(archive, destination, container=container, clear=clear)

    async def download(
        self, paths: Sequence[str], *, container: str = MAIN_CONTAINER, exclude: Sequence[str] = ()
    ) -> ArchiveFile:
        return await self.inner.download(paths, container=container, exclude=exclude)

    async def read_files(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> dict[str, FileContent]:
        return await self.inner.read_files(paths, container=container)

    async def clear(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> None:
        await self.inner.clear(paths, container=container)

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        await self.inner.switch_user(user, workdir)


@dataclass
class KeyedSandbox(SandboxWrapper):
    """A sandbox whose jobs run under keyed ids (:func:`keyed_job_id`); its answers name them as asked."""

    inner: Sandbox
    key: str

    def _keyed(self, spec: JobSpec) -> JobSpec:
        return replace(spec, id=keyed_job_id(self.key, spec.id))

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        state = await self.inner.start_job(self._keyed(spec), wait_sec=wait_sec, upload=upload)
        return replace(state, id=spec.id)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        state = await self.inner.wait_job(self._keyed(spec), max_wait_sec=max_wait_sec)
        return replace(state, id=spec.id)

    async def job_output(self, job_id: str, *, container: str = MAIN_CONTAINER, limit: int) -> bytes:
        return await self.inner.job_output(keyed_job_id(self.key, job_id), container=container, limit=limit)
