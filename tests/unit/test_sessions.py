"""A container's session (kube/session.py): many supervisor calls over one exec, never the only way.

Against the real supervisor in local pods (local_sandbox.py: the session's shell in the pod's
namespace, its stdout read back in pieces of any size), and a scripted stream where a real one
cannot misbehave on cue.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from episode_operator.kube.client import ExecTransportError, NotFound
from episode_operator.kube.pod_sandbox import KubeSandbox
from episode_operator.kube.session import FAILURES_BEFORE_GIVING_UP, Session, SessionFailed
from episode_operator.runtime import supervisor
from episode_operator.runtime.archive import text_tar
from episode_operator.runtime.limits import Spool
from episode_operator.runtime.sandbox_protocol import ArchiveFile, JobSpec, SandboxError, Upload
from episode_operator.runtime.turn.context import REWARD_TXT_PATH
from tests.unit.local_sandbox import LocalPods

#: The state of job x now (a wait of 0 s): a verb without stdin.
STATE_OF_X = supervisor.wait(JobSpec(id="x", command="", timeout_sec=1), 0)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[LocalPods]:
    local = LocalPods(tmp_path / "local")
    local.create("p", {})
    try:
        yield local
    finally:
        local.kill("p")
        local.end_streams()


def sandbox_in(pods: LocalPods) -> KubeSandbox:
    return KubeSandbox(pods, "local", "p")  # type: ignore[arg-type]  # the exec half of a KubeClient


def spec(job: str, command: str, **extra: object) -> JobSpec:
    return JobSpec(id=job, command=command, timeout_sec=30, tail=1000, **extra)  # type: ignore[arg-type]


def test_a_sandboxs_calls_share_one_exec(pods: LocalPods) -> None:
    """Placement is an exec of its own (it installs the script); every call after it, inputs
    and answers with bytes included, rides on one session."""

    async def scenario() -> None:
        sandbox = sandbox_in(pods)
        await sandbox.place_supervisor()
        assert pods.execs == 1
        tests = text_tar({"test.sh": "echo 0.75 > /logs/verifier/reward.txt\n"})
        for turn in range(3):
            upload = Upload(tests, "/tests", clear=("/tests/", "/logs/verifier/"))
            state = await sandbox.start_job(
                spec(f"t{turn}", "bash /tests/test.sh", read_after=(REWARD_TXT_PATH,)), wait_sec=10, upload=upload
            )
            assert state.succeeded and state.files is not None and state.files[REWARD_TXT_PATH].data == b"0.75\n"
        assert await sandbox.read_files(["/tests/test.sh"]) == await sandbox.read_files(["/tests/test.sh"])
        assert pods.execs == 2 and sandbox.sessions["main"].calls == 5
        await sandbox.close()
        assert pods.streams[0].closed

    asyncio.run(scenario())


def test_a_session_that_dies_mid_call_is_replaced_and_the_call_made_by_exec(pods: LocalPods) -> None:
    """An agent's ``kill -9 -1`` takes the session's shell too: the call in flight is made again
    by exec (the verbs are idempotent: the job is not started twice), the next opens a session."""

    async def scenario() -> None:
        sandbox = sandbox_in(pods)
        await sandbox.place_supervisor()
        slow = spec("slow", "echo ran >> /tmp/runs; sleep 1")
        assert (await sandbox.start_job(slow, wait_sec=0)).phase == "running"
        polling = asyncio.create_task(sandbox.wait_job(slow, max_wait_sec=10))
        async with asyncio.timeout(10):
            while not sandbox.sessions["main"]._lock.locked():
                await asyncio.sleep(0.01)
        os.kill(pods.streams[0].process.pid, signal.SIGKILL)
        assert (await polling).succeeded  # by exec
        assert (await sandbox.start_job(slow, wait_sec=10)).succeeded  # a new session: re-attached
        assert len(pods.streams) == 2 and not pods.streams[1].closed
        assert pods.path("p", "/tmp/runs").read_text() == "ran\n"
        await sandbox.close()

    asyncio.run(scenario())


def test_a_call_while_the_session_is_busy_goes_by_exec(pods: LocalPods) -> None:
    async def scenario() -> None:
        sandbox = sandbox_in(pods)
        await sandbox.place_supervisor()
        await sandbox.start_job(spec("long", "sleep 2"), wait_sec=0)
        polling = asyncio.create_task(sandbox.wait_job(spec("long", "sleep 2"), max_wait_sec=10))
        async with asyncio.timeout(10):
            while not sandbox.sessions["main"]._lock.locked():
                await asyncio.sleep(0.01)
        execs = pods.execs
        state = await sandbox.start_job(spec("quick", "true"), wait_sec=10)
        assert state.succeeded and not polling.done() and pods.execs == execs + 1
        assert (await polling).succeeded
        await sandbox.close()

    asyncio.run(scenario())


def test_an_idle_session_is_closed(pods: LocalPods) -> None:
    async def scenario() -> None:
        sandbox = sandbox_in(pods)
        await sandbox.place_supervisor()
        sandbox.sessions["main"] = Session(sandbox.sessions["main"]._opener, idle_sec=0.2)
        assert (await sandbox.start_job(spec("one", "true"), wait_sec=10)).succeeded
        stream = pods.streams[-1]
        async with asyncio.timeout(10):
            while not stream.closed:
                await asyncio.sleep(0.05)
        assert not sandbox.sessions["main"].open
        assert (await sandbox.start_job(spec("two", "true"), wait_sec=10)).succeeded  # opened again
        assert pods.streams[-1] is not stream
        await sandbox.close()

    asyncio.run(scenario())


class ScriptedStream:
    """A stream that says what it is told to, for a session that misbehaves."""

    def __init__(self, ready: bytes) -> None:
        self.messages: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self.messages.put_nowait((1, ready))
        self.sent: list[bytes] = []

    async def send(self, data: bytes, file: ArchiveFile | None = None) -> None:
        self.sent.append(data)
        nonce = data.split(b" ", 1)[0]
        self.messages.put_nowait((1, b"id=x phase=unknown\n\n@@EO " + nonce + b" 0 0\n"))

    async def receive(self) -> tuple[int, bytes] | None:
        return await self.messages.get()

    async def close(self, *, abort: bool = False) -> None:
        self.messages.put_nowait(None)


def test_stdin_goes_by_exec_where_head_may_read_past_a_request() -> None:
    async def scenario() -> None:
        streams: list[ScriptedStream] = []

        async def opener() -> ScriptedStream:
            streams.append(ScriptedStream(b"@@EO ready 1 other\n"))
            return streams[-1]

        session = Session(opener)
        with Spool(1000, "the answer", "a bound") as stdout:
            assert (await session.call(STATE_OF_X, 5, stdout))[0] == 0
            assert stdout.getvalue() == b"id=x phase=unknown\n"
        upload = supervisor.upload(text_tar({"a": "b"}), "/tmp/x")
        assert session.takes(STATE_OF_X) and not session.takes(upload)
        assert not session.takes(supervisor.placement())  # not a verb: it installs the script
        await session.close()

    asyncio.run(scenario())


def test_a_container_without_sessions_is_asked_a_few_times_then_left_to_exec() -> None:
    """A container whose supervisor cannot serve (its exec ends at once) costs an exec more for
    its first calls only."""

    async def scenario() -> None:
        opened = 0

        async def opener() -> ScriptedStream:
            nonlocal opened
            opened += 1
            stream = ScriptedStream(b"")
            stream.messages = asyncio.Queue()
            stream.messages.put_nowait(None)  # exits before saying it is ready
            return stream

        session = Session(opener)
        for _ in range(FAILURES_BEFORE_GIVING_UP):
            assert session.takes(STATE_OF_X)
            with pytest.raises(Exception, match="ended"), Spool(1000, "the answer", "a bound") as stdout:
                await session.call(STATE_OF_X, 5, stdout)
        assert not session.takes(STATE_OF_X) and opened == FAILURES_BEFORE_GIVING_UP

    asyncio.run(scenario())


def test_a_pod_gone_is_not_a_session_failure() -> None:
    """A missing pod says so at once, as an exec would: the episode's outage, not a retry by exec."""

    class Gone:
        execs = 0

        async def exec_stream(self, *_: object) -> None:
            raise NotFound("pod local/p not found", status=404)

        async def exec(self, *_: object, **__: object) -> None:
            self.execs += 1
            raise NotFound("pod local/p not found", status=404)

    async def scenario() -> None:
        client = Gone()
        sandbox = KubeSandbox(client, "local", "p")  # type: ignore[arg-type]
        with pytest.raises(SandboxError) as raised:
            await sandbox.start_job(spec("x", "true"), wait_sec=1)
        assert raised.value.kind == "pod_lost" and client.execs == 0

    asyncio.run(scenario())


def test_a_session_opened_ahead_carries_the_first_call(pods: LocalPods) -> None:
    """Opened once the supervisor is placed, before any call (the pod's first job then waits on no exec of
    its own): the first call rides on it. The control: a sandbox not asked opens nothing until its call."""

    async def scenario() -> None:
        control = sandbox_in(pods)
        await control.place_supervisor()
        await asyncio.sleep(0.2)
        assert pods.streams == []
        sandbox = sandbox_in(pods)
        await sandbox.place_supervisor()
        sandbox.open_session()
        async with asyncio.timeout(10):
            while not sandbox.sessions["main"].open:
                await asyncio.sleep(0.01)
        assert len(pods.streams) == 1
        execs = pods.execs
        assert (await sandbox.start_job(spec("first", "true"), wait_sec=10)).succeeded
        assert pods.execs == execs and len(pods.streams) == 1 and sandbox.sessions["main"].calls == 1
        await sandbox.close()
        await control.close()

    asyncio.run(scenario())


def test_the_first_call_waits_for_the_opening_and_a_second_goes_by_exec() -> None:
    """The call that comes while the session opens ahead waits for it rather than paying an exec; one more
    at the same time would wait behind that call (a long poll, maybe), so it goes by exec."""

    async def scenario() -> None:
        release = asyncio.Event()
        streams: list[ScriptedStream] = []

        async def opener() -> ScriptedStream:
            await release.wait()
            streams.append(ScriptedStream(b"@@EO ready 1 exact\n"))
            return streams[-1]

        session = Session(opener)
        session.open_ahead()
        await asyncio.sleep(0)
        assert session.takes(STATE_OF_X)
        with Spool(1000, "the answer", "a bound") as first, Spool(1000, "the answer", "a bound") as second:
            waiting = asyncio.create_task(session.call(STATE_OF_X, 5, first))
            await asyncio.sleep(0.05)
            assert not waiting.done() and not session.takes(STATE_OF_X)
            with pytest.raises(SessionFailed, match="carrying another call"):
                await session.call(STATE_OF_X, 5, second)
            release.set()
            assert (await waiting)[0] == 0 and first.getvalue() == b"id=x phase=unknown\n"
        assert len(streams) == 1 and session.calls == 1 and session.takes(STATE_OF_X)
        await session.close()

    asyncio.run(scenario())


def test_an_opening_ahead_that_fails_leaves_the_call_to_open_again() -> None:
    """The opening's failure is no call's: the call that waited for it opens a session itself."""

    async def scenario() -> None:
        opened = 0

        async def opener() -> ScriptedStream:
            nonlocal opened
            opened += 1
            if opened == 1:
                raise ExecTransportError("the API server went away")
            return ScriptedStream(b"@@EO ready 1 exact\n")

        session = Session(opener)
        session.open_ahead()
        with Spool(1000, "the answer", "a bound") as stdout:
            assert (await session.call(STATE_OF_X, 5, stdout))[0] == 0
        assert opened == 2 and session.open
        await session.close()
        assert not session.open

    asyncio.run(scenario())


def test_closing_a_session_still_opening_ahead_ends_it() -> None:
    async def scenario() -> None:
        async def opener() -> ScriptedStream:
            await asyncio.Event().wait()  # never answers
            raise AssertionError("unreachable")

        session = Session(opener)
        session.open_ahead()
        await asyncio.sleep(0)
        async with asyncio.timeout(5):
            await session.close()
        assert not session.open

    asyncio.run(scenario())


def test_a_session_closed_before_its_opening_began_takes_calls_again() -> None:
    """An opening cancelled before it ran leaves no trace: later calls open and ride the session as usual."""

    async def scenario() -> None:
        opened = 0

        async def opener() -> ScriptedStream:
            nonlocal opened
            opened += 1
            return ScriptedStream(b"@@EO ready 1 exact\n")

        session = Session(opener)
        session.open_ahead()
        await session.close()  # at once: the opening's task never began
        for _ in range(2):
            assert session.takes(STATE_OF_X)
            with Spool(1000, "the answer", "a bound") as stdout:
                assert (await session.call(STATE_OF_X, 5, stdout))[0] == 0
        assert opened == 1 and session.calls == 2
        await session.close()

    asyncio.run(scenario())
