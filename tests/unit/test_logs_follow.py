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
from episode_operator.cli.cluster import Cluster
from episode_operator.kube.client import ExecTransportError, KubeClient, KubeError, NotFound
from episode_operator.runtime.episode_store import unprinted
from episode_operator.runtime.sandbox_protocol import MAIN_CONTAINER, keyed_job_id
from episode_operator.runtime.supervisor import JOBS_DIR
from episode_operator.runtime.turn.context import RunningAgent, running_agent_job


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
    assert running_agent_job(status()) == RunningAgent("e-a2", keyed_job_id("k2", "a2.t2.agent"), "two", 2, 2)


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
        self.episode = status()

    def agent_ends(self, data: bytes) -> None:
        """The agent writes ``data`` and ends, the Episode finishes and its pod is deleted."""
        self.write(data, ended=True)
        self.episode = status(phase="Succeeded")
        self.refuse, self.refusals = NotFound, 10**9

    def write(self, data: bytes, *, ended: bool = False) -> None:
        with self.output.open("ab") as stream:
            stream.write(data)
        if ended:
            (self.job / "exit").write_text("0")

    async def get_episode(self, namespace: str, name: str) -> dict[str, Any]:
        return {"status": self.episode.model_dump(by_alias=True, exclude_none=True)}

    def kept(self) -> bytes:
        """The agent's log as the operator keeps it: the job's own output."""
        return self.output.read_bytes()[int((self.job / "output_offset").read_text()) :]

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


def follow(pod: FollowedPod, monkeypatch: pytest.MonkeyPatch) -> bool | episodes_cli.FollowLost:
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


class KeptLogs:
    """What the operator kept (KeptData): the agent log of turn "two" of attempt 2, if any."""

    def __init__(self, agent_log: Callable[[], bytes | None]) -> None:
        self.agent_log = agent_log

    def log(self, *, turn: str, attempt: int, name: str) -> bytes | None:
        return self.agent_log() if (turn, attempt, name) == ("two", 2, "agent") else None


def follow_command(pod: FollowedPod, kept: Callable[[], bytes | None], monkeypatch: pytest.MonkeyPatch) -> None:
    """``logs e -f`` as the command runs it: the follow, then the rest from what the operator ``kept``
    (read when the follow needs it)."""
    followed = follow(pod, monkeypatch)
    if isinstance(followed, episodes_cli.FollowLost):
        monkeypatch.setattr(episodes_cli, "_episode", lambda cluster, name: {})
        monkeypatch.setattr(episodes_cli, "kept_data", lambda cluster, episode, data_dir: KeptLogs(kept))
        episodes_cli._print_the_rest(cast(Cluster, SimpleNamespace(namespace="ns")), "e", None, followed)


def test_follow_gives_up_on_a_pod_that_never_answers_again(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")
    pod.refuse_from, pod.refusals = 2, 10**9
    with pytest.raises(click.ClickException, match=r"no longer answers \(exec in e-a2/main: 500") as raised:
        follow_command(pod, lambda: None, monkeypatch)
    assert "after 11 bytes" in raised.value.message and "logs e --turn 2" in raised.value.message
    assert pod.execs == 5  # refused at 50, 75, 100 and 125 s: the first 60 s past the first refusal
    assert capsysbinary.readouterr().out == b"first-line\n"


def test_the_rest_of_an_agent_whose_pod_went_before_its_end_was_read_comes_from_what_was_kept(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """CI's failure, twice: released, the agent wrote its last line and ended, the Episode finished and
    its pod was deleted before the next read; the follow must still print every line, once."""
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")
    pod.before_exec = lambda number: pod.agent_ends(b"second-line\n") if number == 2 else None
    follow_command(pod, pod.kept, monkeypatch)  # kept as the pod had it when it went
    captured = capsysbinary.readouterr()
    assert captured.out == b"first-line\nsecond-line\n"
    assert b"is gone after 11 bytes of its output; the rest is what the operator kept" in captured.err
    assert pod.execs == 2


def test_a_pod_refusing_execs_after_its_agent_ended_is_not_waited_for(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A 500 from a pod going away: the Episode no longer runs that agent, so its kept log is read at once."""
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")

    def before(number: int) -> None:
        if number == 2:
            pod.agent_ends(b"second-line\n")
            pod.refuse = ExecTransportError

    pod.before_exec = before
    follow_command(pod, pod.kept, monkeypatch)
    captured = capsysbinary.readouterr()
    assert captured.out == b"first-line\nsecond-line\n" and pod.execs == 2
    assert b"does not answer" not in captured.err


def test_a_kept_log_that_is_not_the_followed_output_is_not_spliced_in(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The operator keeps the tail of a long output: it does not begin as printed, so where the printing
    stopped in it is not known — said, nothing printed twice or skipped."""
    pod = FollowedPod(tmp_path)
    pod.write(b"first-line\n")
    pod.before_exec = lambda number: pod.agent_ends(b"second-line\n") if number == 2 else None
    with pytest.raises(click.ClickException, match="is gone after 11 bytes of its output: kubectl episode logs e"):
        follow_command(pod, lambda: b"-line\nsecond-line\n", monkeypatch)
    assert capsysbinary.readouterr().out == b"first-line\n"


def test_follow_of_a_deleted_pod_prints_all_that_was_kept(
    tmp_path: Path, quick_follow: None, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    pod = FollowedPod(tmp_path, refuse=NotFound)
    pod.refuse_from, pod.refusals = 1, 10**9
    follow_command(pod, lambda: b"all of it\n", monkeypatch)
    assert capsysbinary.readouterr().out == b"all of it\n"
    assert pod.execs == 1  # not retried: a pod that is gone does not come back


@pytest.mark.parametrize(
    ("kept", "rest"),
    [
        (b"a" * 4096 + b"b" * 4096 + b"rest", b"rest"),  # the whole output, kept
        (b"a" * 4096 + b"b" * 4096, b""),  # nothing after
        (b"c" * 4096 + b"b" * 4096 + b"rest", None),  # the end as printed, not the beginning
        (b"a" * 4096 + b"c" * 4096 + b"rest", None),  # the beginning, not the end
        (b"a" * 4096, None),  # shorter than what was printed
    ],
    ids=["whole", "nothing-after", "other-beginning", "other-end", "shorter"],
)
def test_the_rest_of_a_kept_log_only_when_it_is_the_printed_output(kept: bytes, rest: bytes | None) -> None:
    printed = b"a" * 4096 + b"b" * 4096
    followed = episodes_cli.Followed(RunningAgent("p", "j", "t", 1, 1))
    for start in range(0, len(printed), 1000):  # printed a chunk at a time
        followed.add(printed[start : start + 1000])
    assert (followed.printed, followed.head, followed.tail) == (8192, b"a" * 4096, b"b" * 4096)
    assert unprinted(kept, followed.printed, followed.head, followed.tail) == rest
