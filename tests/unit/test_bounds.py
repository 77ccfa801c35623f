"""Every answer from a sandbox is bounded while it streams (runtime/limits.py).

A root agent can replace its pod's ``supervisor.sh``: any answer of any verb may then be endless or
crafted. Each command carries the bound its answer may have; the transport (an exec, a session)
counts the bytes as they come, stops reading past the bound, closes the exec and raises
:class:`OutputLimitExceeded` naming what passed which bound; big answers go to a scratch file,
never to memory. Tested against peers that send endless output: an exec's websocket (the API
server's protocol, served here), a session's stream, and the real supervisor replaced by a hostile
one in a local pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from aiohttp import WSMsgType, web

from episode_operator.kube.client import ExecTransportError, KubeClient
from episode_operator.kube.pod_sandbox import KubeSandbox
from episode_operator.kube.session import Session
from episode_operator.runtime import supervisor
from episode_operator.runtime.limits import (
    SPOOL_MEMORY_BYTES,
    OutputLimitExceeded,
    OutputLimits,
    Spool,
    parse_size,
)
from episode_operator.runtime.sandbox_protocol import ArchiveFile, JobSpec
from episode_operator.runtime.supervisor import SUPERVISOR_PATH, SessionAnswers
from tests.unit.local_sandbox import LocalPods

SMALL = OutputLimits(answer_bytes=64 * 1024, log_bytes=16 * 1024, artifact_bytes=1 << 20)
#: A job asked for its state alone (a wait of 0 s, no tail): a verb whose answer is the answer bound.
STATE = JobSpec(id="j", command="", timeout_sec=1)
PIECE = b"y" * 65536


# --- the spool ------------------------------------------------------------------------------------


def test_a_spool_holds_a_small_answer_in_memory_and_a_big_one_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with Spool(4 * SPOOL_MEMORY_BYTES, "the answer", "its bound") as spool:
        spool.write(b"x" * 100)
        assert list(tmp_path.iterdir()) == []
        spool.write(b"y" * SPOOL_MEMORY_BYTES)
        assert len(list(tmp_path.iterdir())) == 1  # moved to the scratch space
        assert spool.getvalue() == b"x" * 100 + b"y" * SPOOL_MEMORY_BYTES
        with pytest.raises(OutputLimitExceeded, match=r"^the answer passed its bound$"):
            spool.write(b"z" * 3 * SPOOL_MEMORY_BYTES)
        spool.reset()
        spool.write(b"again")
        archive = spool.to_file()
    assert archive.read_bytes() == b"again" and list(tmp_path.iterdir()) == [archive.path]
    archive.discard()
    with Spool(10, "the answer", "its bound") as spool:
        spool.write(b"x" * 10)
        with pytest.raises(OutputLimitExceeded):
            spool.write(b"x")


@pytest.mark.parametrize(("text", "size"), [("4Mi", 4 << 20), ("1Gi", 1 << 30), ("512Ki", 512 << 10), ("100", 100)])
def test_sizes_are_read_with_kubernetes_suffixes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "-1", "1.5Gi", "1G", "lots", ""])
def test_a_size_that_is_not_one_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


# --- what each command may answer ------------------------------------------------------------------


def test_each_command_carries_the_bound_of_its_answer() -> None:
    spec = JobSpec(id="a1.t1.agent", command="x", timeout_sec=10, tail=SMALL.log_bytes)
    with_download = JobSpec(id="j", command="x", timeout_sec=10, tail=100, download_after="/logs/artifacts")
    assert supervisor.read_files(["/j"], limits=SMALL).answer.stdout == SMALL.answer_bytes
    assert supervisor.wait(STATE, 0, limits=SMALL).answer.stdout == SMALL.answer_bytes
    assert supervisor.wait(spec, 30, limits=SMALL).answer.stdout == SMALL.answer_bytes + SMALL.log_bytes + 64
    assert supervisor.start(with_download, limits=SMALL).answer.stdout == SMALL.answer_bytes + 100 + 64 + (1 << 20) + 64
    assert supervisor.download(["/logs/artifacts"], limits=SMALL).answer.stdout == SMALL.artifact_bytes
    assert supervisor.output("j", 500, limits=SMALL).answer.stdout == 500
    assert supervisor.read_files(["/logs/verifier/reward.txt"], limits=SMALL).answer.stdout == SMALL.answer_bytes
    wait = supervisor.wait(with_download, 30, limits=SMALL).answer
    assert wait.what == "the answer to `wait j`"
    assert wait.bound == (
        "the answer bound (--answer-limit 65536) + the 100-byte tail asked for"
        " + the artifact bound (--artifact-limit 1048576) for /logs/artifacts"
    )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            b"id=j phase=exited exit_code=0\ntail 101\n" + b"x" * 101,
            r"the tail of job j \(101 bytes\) passed the 100 bytes asked for",
        ),
        (
            b"id=j phase=exited exit_code=0\ntail 0\ndownload 1048577\n",
            r"the download of /logs/artifacts with job j's answer \(1048577 bytes\) passed the artifact bound",
        ),
    ],
    ids=["tail", "download"],
)
def test_each_frame_is_held_to_its_own_part_of_the_bound(answer: bytes, message: str) -> None:
    """A crafted answer within the total may still not pass a tail off as a download, or a read."""
    spec = JobSpec(id="j", command="x", timeout_sec=10, tail=100, download_after="/logs/artifacts")
    with pytest.raises(OutputLimitExceeded, match=message):
        supervisor.parse_answer(spec, answer, SMALL)


def test_read_files_are_held_to_the_answer_bound_in_all() -> None:
    spec = JobSpec(id="v", command="x", timeout_sec=10, read_after=("/a", "/b"))
    half = SMALL.answer_bytes // 2 + 1
    answer = b"id=v phase=exited exit_code=0\n" + b"".join(
        f"{half} {name} 0\n".encode() + b"r" * half for name in ("/a", "/b")
    )
    with pytest.raises(OutputLimitExceeded, match=r"the read of /b \(32769 bytes\) passed the answer bound"):
        supervisor.parse_answer(spec, answer, SMALL)


# --- a session's stream ----------------------------------------------------------------------------


def test_a_sessions_answer_streams_to_its_spool_scanning_each_byte_once() -> None:
    """Linear: after each piece, all of the answer's stdout but the few bytes that may begin the
    end mark is in the spool, and nothing else is held (the answer is fed a byte at a time)."""
    answers = SessionAnswers()
    answers.feed(b"@@EO ready 1 exact\n")
    nonce = "ab" * 16
    stdout_bytes = b"id=j phase=running\n" + b"\n@@EO not-the-nonce 0 0\n" * 10 + b"x" * 5000
    stream = stdout_bytes + f"\n@@EO {nonce} 3 5\n".encode() + b"oops!"
    with Spool(1 << 20, "the answer", "its bound") as spool:
        answers.expect(nonce, spool)
        mark = len(f"\n@@EO {nonce} ")
        for index in range(len(stdout_bytes)):
            answers.feed(stream[index : index + 1])
            assert index + 1 - spool.size < mark  # held back: at most the mark's length
        for index in range(len(stdout_bytes), len(stream)):
            assert answers.take(nonce) is None
            answers.feed(stream[index : index + 1])
        answer = answers.take(nonce)
        assert answer is not None and (answer.status, answer.stderr) == (3, b"oops!")
        assert spool.getvalue() == stdout_bytes


def test_a_sessions_endless_answer_stops_at_its_bound() -> None:
    answers = SessionAnswers()
    answers.feed(b"@@EO ready 1 exact\n")
    command = supervisor.wait(STATE, 0, limits=SMALL)
    with command.answer.spool() as spool:
        answers.expect("cd" * 16, spool, command.answer)
        with pytest.raises(OutputLimitExceeded, match=r"^the answer to `wait j` passed the answer bound"):
            for _ in range(SMALL.answer_bytes // len(PIECE) + 2):
                answers.feed(PIECE)
        assert spool.size <= SMALL.answer_bytes


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        (b"\n@@EO NONCE 0 99999999\n", OutputLimitExceeded),  # a stderr that says it is huge
        (b"\n@@EO NONCE " + b"1" * 100, ValueError),  # a trailer without its end
        (b"\n@@EO NONCE 0 0\nmore", ValueError),  # bytes after the answer
    ],
    ids=["stderr", "trailer", "after"],
)
def test_every_part_of_a_sessions_answer_is_bounded(stream: bytes, error: type[Exception]) -> None:
    answers = SessionAnswers()
    answers.feed(b"@@EO ready 1 exact\n")
    nonce = "ef" * 16
    with Spool(100, "the answer", "its bound") as spool:
        answers.expect(nonce, spool, supervisor.wait(STATE, 0, limits=SMALL).answer)
        with pytest.raises(error):
            answers.feed(stream.replace(b"NONCE", nonce.encode()))


def test_a_ready_line_that_never_ends_is_not_a_session() -> None:
    answers = SessionAnswers()
    with pytest.raises(ValueError, match="not a supervisor session"):
        for _ in range(10):
            answers.feed(b"@@EO ready " + b"1" * 50)


# --- an exec's websocket, as the API server speaks it ----------------------------------------------


@dataclass
class Peer:
    """An exec endpoint that answers every exec with endless output on one channel (1 stdout, 2
    stderr), or, for a session (stdin open), a ready line and endless output once asked."""

    channel: int = 1
    sent: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def exec(self, request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await websocket.prepare(request)
        try:
            if request.query.get("stdin", "").lower() == "true":
                await websocket.send_bytes(b"\x01@@EO ready 1 exact\n")
                message = await websocket.receive()
                assert message.type == WSMsgType.BINARY
            while True:
                await websocket.send_bytes(bytes([self.channel]) + PIECE)
                self.sent += len(PIECE)
                await asyncio.sleep(0)
        except (ConnectionResetError, RuntimeError, AssertionError):
            pass  # the operator closed the exec
        finally:
            self.ended.set()
        return websocket


@contextlib.asynccontextmanager
async def peer_client(peer: Peer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/p/exec", peer.exec)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = tmp_path / "kubeconfig"
    cluster = {"server": f"http://127.0.0.1:{port}"}
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    client = await KubeClient.connect(str(kubeconfig))
    try:
        yield client
    finally:
        await client.close()
        await runner.cleanup()


@pytest.mark.parametrize("channel", [1, 2], ids=["stdout", "stderr"])
def test_an_exec_that_answers_endlessly_is_closed_at_its_bound(channel: int, tmp_path: Path) -> None:
    peer = Peer(channel)

    async def scenario() -> None:
        async with peer_client(peer, tmp_path) as client:
            command = supervisor.wait(STATE, 0, limits=SMALL)
            with command.answer.spool() as stdout, Spool(SMALL.answer_bytes, "the stderr", "its bound") as stderr:
                with pytest.raises(OutputLimitExceeded) as raised:
                    await client.exec(
                        "ns", "p", "main", command.argv, stdout=stdout, stderr=stderr, timeout_sec=30, attempts=1
                    )
                assert max(stdout.size, stderr.size) <= SMALL.answer_bytes
            async with asyncio.timeout(60):
                await peer.ended.wait()  # the exec was closed: the peer's writes failed
        what = "the answer to `wait j`" if channel == 1 else "the stderr"
        assert str(raised.value).startswith(f"{what} passed")

    asyncio.run(scenario())


def test_a_session_that_answers_endlessly_is_closed_at_its_bound_and_not_retried_by_exec(tmp_path: Path) -> None:
    peer = Peer()

    async def scenario() -> None:
        async with peer_client(peer, tmp_path) as client:

            async def opener():  # type: ignore[no-untyped-def]
                return await client.exec_stream("ns", "p", "main", supervisor.serve().argv)

            session = Session(opener)
            command = supervisor.wait(STATE, 0, limits=SMALL)
            with command.answer.spool() as stdout, pytest.raises(OutputLimitExceeded):
                await session.call(command, 60, stdout)
            assert not session.open
            async with asyncio.timeout(60):
                await peer.ended.wait()

    asyncio.run(scenario())


# --- the real supervisor, replaced by a hostile one ------------------------------------------------

HOSTILE = """#!/bin/sh
# What a root agent may leave at /episode-operator/supervisor.sh: endless answers, to every verb.
case $1 in serve) printf '@@EO ready 1 exact\\n'; while read -r line; do yes; done ;; esac
yes
"""


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[LocalPods]:
    local = LocalPods(tmp_path / "local")
    local.create("p", {})
    try:
        yield local
    finally:
        local.kill("p")
        local.end_streams()


@pytest.mark.parametrize("way", ["session", "exec"])
def test_a_replaced_supervisors_endless_answers_stop_at_each_bound(way: str, pods: LocalPods) -> None:
    async def scenario() -> None:
        sandbox = KubeSandbox(pods, "local", "p", limits=SMALL)  # type: ignore[arg-type]
        await sandbox.place_supervisor()
        pods.path("p", SUPERVISOR_PATH).write_text(HOSTILE)
        if way == "exec":
            await sandbox.close()
            sandbox.sessions["main"] = Session(_no_session)
        spec = JobSpec(id="a1.t1.agent", command="true", timeout_sec=10, tail=SMALL.log_bytes)
        with pytest.raises(OutputLimitExceeded, match=r"^the answer to `start a1.t1.agent` passed"):
            await sandbox.start_job(spec, wait_sec=1)
        with pytest.raises(OutputLimitExceeded, match=r"^the download of /logs/artifacts passed the artifact bound"):
            await sandbox.download(["/logs/artifacts"])
        with pytest.raises(OutputLimitExceeded, match=r"^the read of /logs/verifier/reward.txt passed"):
            await sandbox.read_files(["/logs/verifier/reward.txt"])
        await sandbox.close()

    asyncio.run(scenario())


async def _no_session() -> None:
    raise ExecTransportError("no sessions in this test: every call by exec")


def test_an_archive_streams_to_a_sessions_stdin(pods: LocalPods, tmp_path: Path) -> None:
    """An upload from a file (an artifact for a verifier) is sent in frames, never read whole."""
    from episode_operator.runtime.archive import tar_bytes

    async def scenario() -> None:
        sandbox = KubeSandbox(pods, "local", "p")  # type: ignore[arg-type]
        await sandbox.place_supervisor()
        data = bytes(range(256)) * 4096  # 1 MiB: several frames
        archive = ArchiveFile.of_bytes(tar_bytes([("logs/artifacts/blob", data, 0o644)]))
        try:
            await sandbox.upload(archive, "/")
        finally:
            archive.discard()
        assert pods.path("p", "/logs/artifacts/blob").read_bytes() == data
        assert sandbox.sessions["main"].calls == 1  # on the session
        await sandbox.close()

    asyncio.run(scenario())
