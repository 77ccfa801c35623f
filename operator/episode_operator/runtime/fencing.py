"""Fencing: the check before every sandbox action that this process still drives the episode.

Several operator replicas may run; exactly one of them drives an episode (``kube/replicas.py``
decides which, and docs/replicas.md says why it is safe). The runner cannot know about
replicas, so the driver hands it a :class:`Fence` and wraps its sandbox provider in
:class:`FencedProvider`: every call on a sandbox or on the provider asks the fence first. The
check is local and costs no request; a call that removes something (a pod, a network policy)
asks the fence to :meth:`Fence.confirm` with the API server first.

A fence says no in one of two ways, both exceptions the runner does not catch, so the driver
stops exactly where it was, as after a crash, and the status stays the only state:

- :class:`Fenced`: another replica may be driving the episode (this replica lost its claim or
  could not renew its membership): touch nothing more, not even the claim;
- :class:`HandOver`: the episode belongs to another replica now (one joined or left) and this
  is a safe point (between two sandbox calls, never inside one): stop and release the claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from episode_operator.runtime.sandbox_protocol import (
    MAIN_CONTAINER,
    ArchiveFile,
    FileContent,
    JobSpec,
    JobState,
    Sandbox,
    SandboxProvider,
    Upload,
    WaitingReport,
)
from episode_operator.taskfolder.plan import NetworkPolicy, VerifierPlan


class Fenced(Exception):
    """Another replica may drive this episode: stop at once, act no more."""


class HandOver(Exception):
    """The episode moves to another replica; this is a safe point to stop and let it go."""


class Fence(Protocol):
    def check(self) -> None:
        """Raise :class:`Fenced` or :class:`HandOver` unless this process may act now (no I/O)."""
        ...

    async def confirm(self) -> None:
        """As :meth:`check`, and asked of the API server: before anything that removes."""
        ...


class NoFence:
    """A sole operator: it may always act."""

    def check(self) -> None:
        pass

    async def confirm(self) -> None:
        pass


@dataclass
class FencedSandbox:
    """A :class:`Sandbox` whose every call is checked by a fence first."""

    sandbox: Sandbox
    fence: Fence
    name: str = field(init=False)
    uid: str = field(init=False)
    workdir: str = field(init=False)

    def __post_init__(self) -> None:
        self.name, self.uid, self.workdir = self.sandbox.name, self.sandbox.uid, self.sandbox.workdir

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        self.fence.check()
        return await self.sandbox.start_job(spec, wait_sec=wait_sec, upload=upload)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        self.fence.check()
        return await self.sandbox.wait_job(spec, max_wait_sec=max_wait_sec)

    async def job_output(self, job_id: str, *, container: str = MAIN_CONTAINER, limit: int) -> bytes:
        self.fence.check()
        return await self.sandbox.job_output(job_id, container=container, limit=limit)

    async def upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        *,
        container: str = MAIN_CONTAINER,
        clear: Sequence[str] = (),
    ) -> None:
        self.fence.check()
        await self.sandbox.upload(archive, destination, container=container, clear=clear)

    async def download(
        self, paths: Sequence[str], *, container: str = MAIN_CONTAINER, exclude: Sequence[str] = ()
    ) -> ArchiveFile:
        self.fence.check()
        return await self.sandbox.download(paths, container=container, exclude=exclude)

    async def read_files(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> dict[str, FileContent]:
        self.fence.check()
        return await self.sandbox.read_files(paths, container=container)

    async def clear(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> None:
        self.fence.check()
        await self.sandbox.clear(paths, container=container)

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        self.fence.check()
        await self.sandbox.switch_user(user, workdir)


@dataclass
class FencedProvider:
    """A :class:`SandboxProvider` checked by a fence; the sandboxes it returns are fenced too."""

    provider: SandboxProvider
    fence: Fence

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None) -> Sandbox:
        self.fence.check()
        return FencedSandbox(await self.provider.agent(attempt, waiting=waiting, uid=uid), self.fence)

    async def verifier(
        self,
        attempt: int,
        turn: int,
        plan: VerifierPlan,
        *,
        waiting: WaitingReport | None = None,
        uid: str | None = None,
    ) -> Sandbox:
        self.fence.check()
        return FencedSandbox(await self.provider.verifier(attempt, turn, plan, waiting=waiting, uid=uid), self.fence)

    def pin_images(self, pins: Mapping[str, str]) -> None:
        self.provider.pin_images(pins)

    async def apply_network(self, attempt: int, policy: NetworkPolicy) -> None:
        self.fence.check()
        await self.provider.apply_network(attempt, policy)

    async def release_verifier(self, attempt: int, turn: int) -> None:
        await self.fence.confirm()
        await self.provider.release_verifier(attempt, turn)

    async def release_agent(self, attempt: int) -> None:
        await self.fence.confirm()
        await self.provider.release_agent(attempt)

    async def release_all(self, *, keep: bool) -> None:
        await self.fence.confirm()
        await self.provider.release_all(keep=keep)
