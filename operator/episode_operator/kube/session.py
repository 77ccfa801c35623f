"""A container's session: one exec of the supervisor's ``serve`` verb carrying many calls.

An exec costs a new connection and TLS handshake, the API server's and the kubelet's work and a
process started in the container by the runtime (~70 ms on the project's cluster, ~10 ms of the
operator's CPU); a call on an open session costs a round trip on the stream (~5 ms). The framing
is pure (``runtime/supervisor.py``: :func:`session_call`, :class:`SessionAnswers`); this module
holds the stream.

A session is a cache, never the only way: a call it cannot take (one already running, stdin for
a container whose ``head`` may read too far, a command that is not a verb) goes by exec, and a
session that fails in any way — the stream closes, an answer does not come in time, a malformed
answer — is closed and its call made again by exec. Every supervisor verb is idempotent (jobs
are started by id), so a call that ran before its answer was lost is safe to make again. A
session idle for ``idle_sec`` is closed, so a pod waiting on a long agent holds no stream.

A session may be opened ahead of its first call (:meth:`Session.open_ahead`): the pod's first job then
does not wait for the exec that opens it, which runs while the runner writes its status.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

from episode_operator.kube.client import ExecTransportError
from episode_operator.runtime import supervisor
from episode_operator.runtime.limits import AnswerSink, OutputLimitExceeded
from episode_operator.runtime.sandbox_protocol import ArchiveFile
from episode_operator.runtime.supervisor import Command, SessionAnswers, SessionReady

#: Channels of the exec protocol a session reads.
STDOUT, ERROR = 1, 3
#: How long a session may stay open without a call.
IDLE_SEC = 10.0
#: How long a session may take to say it is ready.
READY_TIMEOUT_SEC = 30.0
#: Sessions that failed in a row before a container's calls all go by exec.
FAILURES_BEFORE_GIVING_UP = 3


class ExecStream(Protocol):
    """An open exec: bytes to its stdin, messages of its channels back."""

    async def send(self, data: bytes, file: ArchiveFile | None = None) -> None:
        """``data``, then ``file`` streamed in frames, to the exec's stdin."""
        ...

    async def receive(self) -> tuple[int, bytes] | None:
        """The next message as (channel, bytes); None once the exec ended."""
        ...

    async def close(self, *, abort: bool = False) -> None:
        """End the exec; ``abort``: drop it at once (it sent more than it may)."""
        ...


class SessionFailed(Exception):
    """The session could not carry the call: make it by exec."""


class Session:
    """One container's session, opened at its first call and closed when idle or failed."""

    def __init__(self, opener: Callable[[], Awaitable[ExecStream]], *, idle_sec: float = IDLE_SEC) -> None:
        self._opener = opener
        self._idle_sec = idle_sec
        self._stream: ExecStream | None = None
        self._answers = SessionAnswers()
        self._lock = asyncio.Lock()
        self._idle: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._failures = 0  # in a row: a container that cannot hold one (no serve verb…) stops being asked
        self._opening: asyncio.Task[None] | None = None  # an opening ahead of the next call, while it runs
        self._awaited = False  # whether a call waits for that opening
        self.calls = 0

    def takes(self, command: Command) -> bool:
        """Whether a call of ``command`` can go on this session now."""
        if self._failures >= FAILURES_BEFORE_GIVING_UP or command.words is None or self._carrying():
            return False
        ready = self._answers.ready
        return not command.payload_size or ready is None or ready.exact_head

    async def call(self, command: Command, timeout_sec: float, stdout: AnswerSink) -> tuple[int, bytes]:
        """(exit status, stderr) of ``command``, its stdout written to ``stdout``; :class:`SessionFailed`
        when it must go by exec. An answer past its bound closes the session and raises
        :class:`OutputLimitExceeded`: the exec would be refused alike."""
        call = supervisor.session_call(command)
        if call is None:
            raise SessionFailed("not a supervisor verb")
        if self._carrying():  # a long poll holds it: this call goes by exec rather than wait
            raise SessionFailed("the session is carrying another call")
        if self._opening_now():
            assert self._opening is not None
            self._awaited = True
            await asyncio.wait({self._opening})  # it never raises; a cancelled call leaves it opening
        async with self._lock:
            self._cancel_idle()
            try:
                async with asyncio.timeout(timeout_sec):
                    ready = await self._open()
                    if command.payload_size and not ready.exact_head:
                        raise SessionFailed("this container's head may read past a request")
                    assert self._stream is not None
                    self._answers.expect(call.nonce, stdout, command.answer)
                    await self._stream.send(call.request, call.file)
                    while (answer := self._answers.take(call.nonce)) is None:
                        await self._receive()
            except OutputLimitExceeded:
                await self._discard(abort=True)
                raise
            except SessionFailed:
                self._failures += 1
                await self._discard()
                raise
            except (TimeoutError, ValueError, ExecTransportError) as error:
                self._failures += 1
                await self._discard()
                raise SessionFailed(f"{type(error).__name__}: {error}") from error
            self._failures = 0
            self.calls += 1
            self._schedule_idle()
            return answer.status, answer.stderr

    def open_ahead(self) -> None:
        """Open the session now, in the background: the next call then waits for it (rather than going by
        exec) and finds it ready. A failed opening counts as a failed session; that call opens it again."""
        if self._stream is not None or self._opening_now() or self._failures >= FAILURES_BEFORE_GIVING_UP:
            return
        self._awaited = False
        self._opening = asyncio.get_running_loop().create_task(self._open_now())

    async def _open_now(self) -> None:
        async with self._lock:
            try:
                await self._open()
            except asyncio.CancelledError:
                await self._discard()
                raise
            except Exception:  # whatever it was (a pod gone too): the next call opens it again, and says why
                self._failures += 1
                await self._discard()
            else:
                self._schedule_idle()
            finally:
                self._opening = None
                self._awaited = False

    def _carrying(self) -> bool:
        """Whether a call holds the session. While it opens ahead, the first call to come waits for it and
        any other goes by exec (it would wait for that call too)."""
        return self._awaited if self._opening_now() else self._lock.locked()

    def _opening_now(self) -> bool:
        """Whether an opening ahead is under way (one cancelled before it began never reset itself)."""
        return self._opening is not None and not self._opening.done()

    async def _open(self) -> SessionReady:
        if self._stream is None:
            self._answers = SessionAnswers()
            self._stream = await self._opener()
            async with asyncio.timeout(READY_TIMEOUT_SEC):
                while self._answers.ready is None:
                    await self._receive()
        assert self._answers.ready is not None
        return self._answers.ready

    async def _receive(self) -> None:
        assert self._stream is not None
        message = await self._stream.receive()
        if message is None or message[0] == ERROR:
            raise SessionFailed("the session's exec ended")
        if message[0] == STDOUT:
            self._answers.feed(message[1])

    async def _discard(self, *, abort: bool = False) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):  # it failed already; closing is best effort
                await stream.close(abort=abort)

    def _schedule_idle(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self._idle_sec, self._close_when_idle)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _close_when_idle(self) -> None:
        self._idle = None
        if self._stream is not None and not self._lock.locked():
            task = asyncio.get_running_loop().create_task(self.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the stream (the session's shell ends at the end of its stdin); idempotent."""
        self._cancel_idle()
        if self._opening is not None:
            self._opening.cancel()
        async with self._lock:
            await self._discard()

    @property
    def open(self) -> bool:
        return self._stream is not None
