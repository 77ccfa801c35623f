"""What ``kubectl episode logs -f`` follows — the agent job of the turn running now, in its pod (pure) —
and how it follows it through a pod that stops answering for a while."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import click
import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.cli import episodes as episodes_cli
from episode_operator.kube.client import ExecTransportError, KubeClient, KubeError, NotFound
from episode_operator.runtime.sandbox_protocol import MAIN_CONTAINER, keyed_job_id
from episode_operator.runtime.supervisor import JOBS_DIR
from episode_operator.runtime.turn.context import running_agent_job


def status(**change: Any) -> EpisodeStatus:
    document: dict[str, Any] = {
        "phase": "Running",
        "attempt": 2,
        "currentTurn": 1,
        "attempts": [
            {"number": 1, "jobKey": "k1", "pods": [{"role": "agent", "name": "e-a1", "uid": "u1"}]},
            {"number": 2, "jobKey": "k2", "pods": [{"role": "agent", "name": "e-a2", "uid": "u2"}]},
        ],
        "turns": [{"name": "one", "phase": "Succeeded", "stage": "verify"}, {"name": "two", "stage": "agent"}],
    }
    return EpisodeStatus.model_validate(document | change)


def test_the_running_turns_agent_job_in_the_current_attempts_pod() -> None:
    # The operator's own id of that job (TurnContext.job_id, under the attempt's key).
    assert running_agent_job(status()) == ("e-a2", keyed_job_id("k2", "a2.t2.agent"))


@pytest.mark.parametrize(
    "change",
    [
        {"phase": "Succeeded"},
        {"phase": "Pending", "currentTurn": None},
        {"turns": [{"name": "one", "stage": "verify"}, {"name": "two", "stage": "setup"}]},
        {"attempts": [{"number": 2, "jobKey": "k2", "pods": []}]},
        {"attempts": [{"number": 2, "pods": [{"role": "agent", "name": "e-a2", "uid": "u2"}]}]},
        {"currentTurn": 5},
    ],
    ids=["finished", "not started", "between stages", "pod not recorded", "no job key", "no such turn"],
)
def test_nothing_to_follow(change: dict[str, Any]) -> None:
    assert running_agent_job(status(**change)) is None


class FollowedPod:
    """What ``logs -f`` needs of a ``KubeClient`` (the Episode, exec), for one agent job whose
    records are a local directory: its exec runs the command ``logs -f`` sends (the real
    FOLLOW_SCRIPT, under sh) with the pod's job directory mapped to that one. ``refusals`` execs
    from the ``refuse_from``-th on fail as an API server under load fails them. Each exec takes
    EXEC_SEC on the follower's clock (``now``), as one retried for a while does."""

    def __init__(self, tmp_path: Path, refuse: type[KubeError] = ExecTransportError) -> None:
        self.jobs, self.output = tmp_path / "jobs", tmp_path / "agent.log"
        self.job_id = keyed_job_id("k2", "a2.t2.agent")
        self.job = self.jobs / self.job_id
        self.job.mkdir(parents=True)
        self.output.write_bytes(b"written before the job\n")
        (self.job / "output_offset").write_text(str(self.output.stat().st_size))
        (self.job / "output_path").write_text(str(self.output))
        self.refuse, self.refusals, self.refuse_from = refuse, 0, 0
        self.execs, self.now = 0, 0.0
        self.before_exec: Callable[[int], None] = lambda number: None

    def write(self, data: bytes, *, ended: bool = False) -> None:
        with self.output.open("ab") as stream:
            stream.write(data)
        if ended:
            (self.job / "exit").write_text("0")

    async def get_episode(self, namespace: str, name: str) -> dict[str, Any]:
        return {"status": status().model_dump(by_alias=True, exclude_none=True)}

    async def exec(
        self, namespace: str, pod: str, container: str, argv: Sequence[str], *, stdout: Any, stderr: Any, **_: Any
    ) -> int:
        self.execs += 1
        self.now += EXEC_SEC
        self.before_exec(self.execs)
        assert (pod, container, argv[4]) == ("e-a2", MAIN_CONTAINER, f"{JOBS_DIR}/{self.job_id}")
        if self.execs >= self.refuse_from and self.refusals:
            self.refusals -= 1
            raise self.refuse(f"exec in {pod}/{container}: 500 Invalid response status", status=500)
        process = await asyncio.create_subprocess_exec(
            *argv[:4], str(self.job), *argv[5:], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await process.communicate()
        stdout.write(out)
        stderr.write(err)
        assert process.returncode is not None
        return process.returncode


EXEC_SEC = 25.0  # a refused exec's time: FOLLOW_OUTAGE_SEC (60 s) is passed at the third in a row


@pytest.fixture
def quick_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(episodes_cli, "FOLLOW_POLL_SEC", 0)


def follow(pod: FollowedPod, monkeypatch: pytest.MonkeyPatch) -> bool:
    """``logs -f`` of the pod's job, on the pod's clock."""
    monkeypatch.setattr(episodes_cli, "time", SimpleNamespace(monotonic=lambda: pod.now))
    return asyncio.run(episodes_cli._follow_agent(cast(KubeClient, pod), "ns", "e"))


def test_follow_prints_the_jobs_own_output_to_its_end(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")
    pod.before_exec = lambda number: pod.write(b"second-line\n", ended=True) if number == 3 else None
    assert follow(pod, monkeypatch)
    assert capsysbinary.readouterr().out == b"first-line\nsecond-line\n"


def test_follow_rides_out_an_api_server_refusing_execs_and_loses_nothing(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The fault CI met: after the first line the API server answered the exec's handshake with
    500 for longer than the exec's own retries, while the agent worked on."""
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")
    pod.refuse_from, pod.refusals = 2, 2  # 50 s without an answer
    pod.before_exec = lambda number: pod.write(b"second-line\n", ended=True) if number == 4 else None
    assert follow(pod, monkeypatch)
    captured = capsysbinary.readouterr()
    assert captured.out == b"first-line\nsecond-line\n"
    assert captured.err.count(b"does not answer") == 1, captured.err  # said once, not per refusal
    assert b"500 Invalid response status" in captured.err


def test_follow_counts_each_outage_from_its_own_start(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """Two refusals (50 s), an answer, two refusals again: no single outage reaches 60 s."""
    pod = FollowedPod(tmp_path)
    refused = {2, 3, 5, 6}

    def before(number: int) -> None:
        pod.refusals = 1 if number in refused else 0
        if number == 4:
            pod.write(b"second-line\n")
        if number == 7:
            pod.write(b"third-line\n", ended=True)

    pod.before_exec = before
    pod.write(b"first-line\n")
    assert follow(pod, monkeypatch)
    captured = capsysbinary.readouterr()
    assert captured.out == b"first-line\nsecond-line\nthird-line\n"
    assert captured.err.count(b"does not answer") == 2, captured.err


def test_follow_gives_up_on_a_pod_that_never_answers_again(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")
    pod.refuse_from, pod.refusals = 2, 10**9
    with pytest.raises(click.ClickException, match=r"no longer answers \(exec in e-a2/main: 500") as raised:
        follow(pod, monkeypatch)
    assert "after 11 bytes" in raised.value.message and "logs e --turn 2" in raised.value.message
    assert pod.execs == 5  # refused at 50, 75, 100 and 125 s: the first 60 s past the first refusal
    assert capsysbinary.readouterr().out == b"first-line\n"


def test_follow_of_a_deleted_pod_says_so_at_once(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    pod = FollowedPod(tmp_path, refuse=NotFound)
    pod.refuse_from, pod.refusals = 1, 10**9
    with pytest.raises(click.ClickException, match="is gone after 0 bytes"):
        follow(pod, monkeypatch)
    assert pod.execs == 1  # not retried: a pod that is gone does not come back
