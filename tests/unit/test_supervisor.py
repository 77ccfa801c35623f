"""The in-pod supervisor: the real script, run by real shells with real processes.

Each test places ``supervisor.sh`` in a temporary directory (as the operator's first exec
does in a pod) and runs the argv the builders of ``runtime.supervisor`` produce, with the
pod path swapped for the temporary one. Two flavours of "container": ``host`` (dash as sh,
coreutils, util-linux, GNU tar: a Debian image) and ``busybox`` (a PATH of busybox applets
only: no bash, no util-linux setpriv/runuser/su, busybox tar, find and date). Every process
a test starts is killed in its teardown.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import pytest

from episode_operator.runtime import supervisor
from episode_operator.runtime.sandbox_protocol import JOB_USER, ArchiveFile, JobSpec, JobState, Upload, sealed
from episode_operator.runtime.supervisor import SUPERVISOR_PATH, Command
from tests.unit.local_sandbox import kill_jobs
from tests.unit.tools import tool

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOBODY_UID = 65534


@dataclass
class Pod:
    """A supervisor placed in ``base``, run as a container of one flavour would run it."""

    base: Path
    workdir: Path
    path: str
    flavour: Literal["host", "busybox"]
    extra_pids: list[int] = field(default_factory=list)

    @property
    def shell(self) -> Literal["bash", "sh"]:
        return "bash" if self.flavour == "host" else "sh"

    def argv(self, command: Command) -> list[str]:
        argv = list(command.argv)
        if argv[:2] == ["sh", SUPERVISOR_PATH]:
            argv[1] = str(self.base / "supervisor.sh")
        return argv

    def popen(self, command: Command, path: str | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv(command),
            stdin=subprocess.PIPE if command.stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.base.parent,  # not the recorded workdir: jobs must not inherit the exec's
            env={"PATH": path or self.path, "HOME": "/root", "LC_ALL": "C.UTF-8"},
        )

    def run(self, command: Command, *, ok: bool = True, path: str | None = None) -> subprocess.CompletedProcess[bytes]:
        process = self.popen(command, path)
        stdout, stderr = process.communicate(command.stdin, timeout=30)
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        if ok:
            assert result.returncode == 0, result.stderr.decode(errors="replace")
        return result

    def spec(self, job_id: str, command: str, **overrides: object) -> JobSpec:
        base = JobSpec(id=job_id, command=command, timeout_sec=60, shell=self.shell)
        return replace(base, **overrides)  # type: ignore[arg-type]

    def start(
        self, spec: JobSpec, *, wait_sec: float = 0.0, kill_after_sec: float = 5.0, upload: Upload | None = None
    ) -> JobState:
        command = supervisor.start(spec, wait_sec=wait_sec, kill_after_sec=kill_after_sec, upload=upload)
        return supervisor.parse_state(spec.id, self.run(command).stdout)

    def wait(self, job_id: str, seconds: float = 10) -> JobState:
        spec = JobSpec(id=job_id, command="", timeout_sec=1)
        state = supervisor.parse_state(job_id, self.run(supervisor.wait(spec, seconds)).stdout)
        assert state.done, f"{job_id} still {state.phase} after {seconds}s"
        return state

    def state(self, job_id: str) -> JobState:
        """The job's state now: a wait that does not wait."""
        spec = JobSpec(id=job_id, command="", timeout_sec=1)
        return supervisor.parse_state(job_id, self.run(supervisor.wait(spec, 0)).stdout)

    def output(self, job_id: str, limit: int = 1 << 20) -> bytes:
        return self.run(supervisor.output(job_id, limit)).stdout

    def job_file(self, job_id: str, name: str) -> str:
        return (self.base / "jobs" / job_id / name).read_text()

    def cleanup(self) -> None:
        """KILL every process group a job or runner made, and every pid a test recorded."""
        kill_jobs(self.base / "jobs")
        for pid in self.extra_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _applet_dir(root: Path) -> str:
    """A PATH that holds busybox's applets and nothing else."""
    busybox = tool("busybox")
    root.mkdir()
    applets = subprocess.run([busybox, "--list"], capture_output=True, check=True, text=True).stdout.split()
    for applet in applets:
        (root / applet).symlink_to(busybox)
    return str(root)


@pytest.fixture(scope="session")
def busybox_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _applet_dir(tmp_path_factory.mktemp("busybox") / "bin")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Until ``condition()`` holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still waiting after {timeout} s for {what}"
        time.sleep(0.01)


# What the script and the tests' jobs run: a PATH of these stands for a Debian image.
HOST_TOOLS = (  # noqa: SIM905 (a list literal would take forty lines)
    "sh dash bash cat mv cp rm ln ls mkdir chmod chown touch stat readlink date sleep env id od tr head tail wc "
    "seq grep cut printf true false pwd getent find tar gzip setsid setpriv runuser su timeout"
).split()


def _host_path_without(root: Path, *missing: str) -> str:
    """The host's tools minus ``missing``: an image without them."""
    root.mkdir()
    for name in HOST_TOOLS:
        found = shutil.which(name, path=HOST_PATH)
        if name not in missing and found:
            (root / name).symlink_to(found)
    return str(root)


@pytest.fixture(scope="session")
def path_without_bash(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _host_path_without(tmp_path_factory.mktemp("nobash") / "bin", "bash", "rbash")


def _make_pod(tmp_path: Path, flavour: Literal["host", "busybox"], path: str) -> Iterator[Pod]:
    pod = Pod(base=tmp_path / "episode-operator", workdir=tmp_path / "work", path=path, flavour=flavour)
    pod.workdir.mkdir()
    placement = supervisor.placement(str(pod.base))
    process = subprocess.run(
        placement.argv,
        input=placement.stdin,
        capture_output=True,
        cwd=pod.workdir,
        env={"PATH": path},
        timeout=30,
    )
    assert process.returncode == 0, process.stderr
    facts = supervisor.parse_probe(process.stdout)
    assert facts["workdir"] == str(pod.workdir)
    try:
        yield pod
    finally:
        pod.cleanup()


@pytest.fixture(params=["host", "busybox"])
def pod(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pod]:
    if request.param == "host":
        yield from _make_pod(tmp_path, "host", HOST_PATH)
    else:
        yield from _make_pod(tmp_path, "busybox", request.getfixturevalue("busybox_path"))


@pytest.fixture
def host_pod(tmp_path: Path) -> Iterator[Pod]:
    yield from _make_pod(tmp_path, "host", HOST_PATH)


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------------- jobs


def test_start_wait_state_round_trip(pod: Pod) -> None:
    ok = pod.start(pod.spec("ok", "echo out; echo err >&2"))
    failing = pod.start(pod.spec("failing", "exit 7"))
    assert ok.phase in ("running", "exited") and failing.id == "failing"
    done = pod.wait("ok")
    assert (done.phase, done.exit_code, done.timed_out, done.succeeded) == ("exited", 0, False, True)
    assert done.started_at is not None and done.finished_at is not None and done.finished_at >= done.started_at
    assert pod.wait("failing").exit_code == 7
    assert pod.state("failing") == pod.wait("failing")
    assert pod.output("ok") == b"out\nerr\n"
    assert pod.state("never-started") == JobState(id="never-started", phase="unknown")


def test_start_with_wait_answers_a_finished_job_in_one_exec(pod: Pod) -> None:
    state = pod.start(pod.spec("quick", "exit 3"), wait_sec=10)
    assert (state.phase, state.exit_code) == ("exited", 3)


def test_wait_returns_running_after_its_bound(pod: Pod) -> None:
    pod.start(pod.spec("slow", "sleep 30"))
    began = time.monotonic()
    slow = JobSpec(id="slow", command="", timeout_sec=1)
    state = supervisor.parse_state("slow", pod.run(supervisor.wait(slow, 0.3)).stdout)
    assert state.phase == "running" and state.started_at is not None
    assert time.monotonic() - began < 5


def test_starting_an_existing_id_runs_nothing(pod: Pod, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    spec = pod.spec("once", f"echo run >> '{marker}'; sleep 0.3")
    pod.start(spec)
    again = pod.start(replace(spec, command=f"echo other >> '{marker}'"), wait_sec=10)
    assert again.phase == "exited"
    assert marker.read_text() == "run\n"


def test_concurrent_starts_of_one_id_run_it_once(pod: Pod, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    command = supervisor.start(pod.spec("race", f"echo run >> '{marker}'"), wait_sec=10)
    starters = [pod.popen(command) for _ in range(6)]
    answers = [starter.communicate(timeout=30) for starter in starters]
    assert all(starter.returncode == 0 for starter in starters), answers
    states = [supervisor.parse_state("race", stdout) for stdout, _ in answers]
    assert {state.phase for state in states} == {"exited"}
    assert marker.read_text() == "run\n"


def test_timeout_terms_the_group_then_kills_what_ignores_term(pod: Pod) -> None:
    pod.start(pod.spec("polite", "sleep 30", timeout_sec=0.5), kill_after_sec=0.5)
    pod.start(pod.spec("stubborn", "trap '' TERM; sleep 30; sleep 30", timeout_sec=0.5), kill_after_sec=0.5)
    began = time.monotonic()
    polite, stubborn = pod.wait("polite"), pod.wait("stubborn")
    assert time.monotonic() - began < 8
    assert (polite.timed_out, polite.exit_code) == (True, 128 + signal.SIGTERM)
    assert (stubborn.timed_out, stubborn.exit_code) == (True, 128 + signal.SIGKILL)
    assert not polite.succeeded


AWKWARD = {
    "SPACES": "a  b   c",
    "QUOTES": """it's "quoted" `ticks` \\ back""",
    "DOLLAR": "$HOME ${PATH} $(echo no) $((1+1))",
    "NEWLINES": "line1\nline2\n\n",
    "UNICODE": "héllo wörld ✓ 日本",
    "EMPTY": "",
    "EQUALS": "a=b=c",
    "GLOB": "* ? [a-z]",
}


def test_environment_values_arrive_intact(pod: Pod, tmp_path: Path) -> None:
    dump = tmp_path / "env"
    script = "; ".join(f"printf '%s' \"${name}\" > '{dump}.{name}'" for name in AWKWARD)
    state = pod.start(pod.spec("env", script, env=AWKWARD), wait_sec=10)
    assert state.succeeded, pod.output("env")
    for name, value in AWKWARD.items():
        assert Path(f"{dump}.{name}").read_text() == value, name


def test_the_job_environment_cannot_disturb_the_runner(pod: Pod) -> None:
    env = {"IFS": "s/-", "PATH": f"/opt/bin:{pod.path}", "CDPATH": "/", "_d": "x", "_got": "y", "HOME": "/h"}
    command = 'printf "%s|%s|%s|%s" "$PATH" "$_d" "$_got" "$HOME"'  # shells reset IFS themselves
    state = pod.start(pod.spec("hostile", command, env=env, timeout_sec=30), wait_sec=10)
    assert state.succeeded and state.started_at and state.finished_at
    assert pod.output("hostile") == f"/opt/bin:{pod.path}|x|y|/h".encode()
    with pytest.raises(ValueError):
        supervisor.start(pod.spec("reserved", "true", env={"_EO_CAT": "x"}))


def test_arguments_too_long_for_a_url_travel_on_stdin(pod: Pod, tmp_path: Path) -> None:
    big = "x$'\"\n" * 10_000
    spec = pod.spec("big", f"printf '%s' \"$BIG\" > '{tmp_path / 'big'}'", env={"BIG": big})
    assert supervisor.start(spec).stdin is not None
    assert pod.start(spec, wait_sec=10).succeeded
    assert (tmp_path / "big").read_text() == big


def test_working_directory_defaults_to_the_one_recorded_at_placement(pod: Pod, tmp_path: Path) -> None:
    other = tmp_path / "other dir"
    other.mkdir()
    assert pod.start(pod.spec("default", "pwd"), wait_sec=10).succeeded
    assert pod.start(pod.spec("explicit", "pwd", cwd=str(other)), wait_sec=10).succeeded
    assert pod.output("default") == f"{pod.workdir}\n".encode()
    assert pod.output("explicit") == f"{other}\n".encode()
    missing = pod.start(pod.spec("missing", "pwd", cwd=str(tmp_path / "nope")), wait_sec=10)
    assert missing.phase == "unstartable" and missing.reason and "nope" in missing.reason


def test_output_to_a_custom_path_and_its_tail(pod: Pod, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "agent" / "out.txt"
    state = pod.start(pod.spec("custom", "seq 1 1000; echo oops >&2", output=str(log)), wait_sec=10)
    assert state.succeeded
    assert log.read_text().endswith("999\n1000\noops\n")
    assert pod.output("custom", 9) == b"000\noops\n"
    assert pod.output("custom", 0) == b""
    assert pod.run(supervisor.output("ghost", 10), ok=False).returncode == 1


def test_jobs_sharing_an_output_file_each_get_their_own_output(pod: Pod, tmp_path: Path) -> None:
    """The oracle's solve.sh of every turn appends to /logs/agent/oracle.txt: turn 2's kept log
    (its tail, or ``output``) must hold turn 2's output only, never turn 1's again."""
    shared = str(tmp_path / "logs" / "agent" / "oracle.txt")
    first = pod.spec("turn-1", "echo turn one", output=shared, tail=1000)
    second = pod.spec("turn-2", "echo turn two; echo more", output=shared, tail=1000)
    for spec in (first, second):
        assert supervisor.parse_answer(spec, pod.run(supervisor.start(spec, wait_sec=10)).stdout).succeeded
    assert Path(shared).read_bytes() == b"turn one\nturn two\nmore\n"  # the file has everything
    answer = supervisor.parse_answer(second, pod.run(supervisor.wait(second, 1)).stdout)
    assert answer.output == b"turn two\nmore\n"
    assert pod.output("turn-2") == b"turn two\nmore\n" and pod.output("turn-2", 5) == b"more\n"
    assert pod.output("turn-1") == b"turn one\nturn two\nmore\n"  # it never knows what came after it
    # A file truncated since a job started holds only newer bytes: all of them are the job's.
    Path(shared).write_bytes(b"new\n")
    assert pod.output("turn-2") == b"new\n"
    # A job recorded by a supervisor without offsets (an upgrade mid-episode) gets the file's tail.
    (pod.base / "jobs" / "turn-2" / "output_offset").unlink()
    Path(shared).write_bytes(b"a\nb\n")
    assert pod.output("turn-2", 2) == b"b\n"


def test_background_processes_outlive_the_job_without_holding_it(pod: Pod, tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper"
    began = time.monotonic()
    state = pod.start(pod.spec("server", f"sleep 30 & echo $! > '{pidfile}'; echo started"), wait_sec=10)
    assert state.phase == "exited" and state.exit_code == 0
    assert time.monotonic() - began < 5
    sleeper = int(pidfile.read_text())
    pod.extra_pids.append(sleeper)
    assert _alive(sleeper)
    assert pod.state("server").phase == "exited"
    assert _alive(sleeper)


def test_missing_shell_is_unstartable(pod: Pod, path_without_bash: str) -> None:
    spec = pod.spec("nobash", "echo hi", shell="bash")
    path = pod.path if pod.flavour == "busybox" else path_without_bash
    command = supervisor.start(spec, wait_sec=10)
    began = time.monotonic()
    state = supervisor.parse_state("nobash", pod.run(command, path=path).stdout)
    assert time.monotonic() - began < 5
    assert state.phase == "unstartable" and state.reason == "shell not found: bash"
    assert state.exit_code is None and not state.succeeded


def test_unknown_user_is_unstartable(pod: Pod) -> None:
    state = pod.start(pod.spec("ghost", "id", user="no-such-user", cwd="/"), wait_sec=10)
    assert (state.phase, state.reason) == ("unstartable", "no such user: no-such-user")


def test_jobs_run_as_a_named_user_or_a_bare_uid(host_pod: Pod) -> None:
    pod = host_pod
    command = 'id -u; id -g; echo "$HOME"'
    assert pod.start(pod.spec("nobody", command, user="nobody", cwd="/"), wait_sec=10).succeeded
    assert pod.start(pod.spec("uid", command, user=12345, cwd="/"), wait_sec=10).succeeded
    assert pod.output("nobody") == f"{NOBODY_UID}\n{NOBODY_UID}\n/nonexistent\n".encode()
    assert pod.output("uid") == b"12345\n0\n/\n"


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory other users can traverse (pytest's tmp_path is private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="supervisor-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


@pytest.mark.parametrize("missing", [("setpriv",), ("setpriv", "runuser")], ids=["runuser", "su"])
def test_users_are_switched_with_runuser_or_su_without_setpriv(
    host_pod: Pod, public_dir: Path, missing: tuple[str, ...]
) -> None:
    path = _host_path_without(public_dir / "bin", *missing)
    command = 'id -u; echo "$HOME $E"; cut -d" " -f5 /proc/self/stat'  # uid, env, process group
    spec = host_pod.spec("named", command, user="nobody", cwd="/", env={"E": "e"})
    named = host_pod.run(supervisor.start(spec, wait_sec=10), path=path)
    assert supervisor.parse_state("named", named.stdout).succeeded, named.stdout
    group = host_pod.job_file("named", "jobpid").strip()
    assert host_pod.output("named") == f"{NOBODY_UID}\n/nonexistent e\n{group}\n".encode()
    bare = host_pod.run(supervisor.start(host_pod.spec("bare", "id -u", user=12345, cwd="/"), wait_sec=10), path=path)
    state = supervisor.parse_state("bare", bare.stdout)
    assert state.phase == "unstartable" and state.reason and "setpriv" in state.reason


def test_a_directory_the_user_cannot_enter_is_unstartable(host_pod: Pod, tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    state = host_pod.start(host_pod.spec("denied", "pwd", user="nobody", cwd=str(private)), wait_sec=10)
    assert state.phase == "unstartable"
    assert state.reason and state.reason.startswith(f"cannot start as user nobody in {private}")


def test_users_cannot_be_switched_without_setpriv_runuser_or_su(busybox_path: str, tmp_path: Path) -> None:
    for pod in _make_pod(tmp_path, "busybox", busybox_path):
        named = pod.start(pod.spec("named", "id", user="nobody", cwd="/"), wait_sec=10)
        bare = pod.start(pod.spec("bare", "id", user=12345, cwd="/"), wait_sec=10)
        assert named.phase == bare.phase == "unstartable"
        assert named.reason == "cannot switch to user nobody: none of setpriv, runuser, su"
        assert bare.reason and "setpriv" in bare.reason


def test_jobs_get_default_sigint_and_sigquit(host_pod: Pod) -> None:
    """As under docker exec: a job-control-less shell's `&` would leave them ignored."""
    state = host_pod.start(host_pod.spec("signals", "grep SigIgn /proc/self/status"), wait_sec=10)
    assert state.succeeded
    ignored = int(host_pod.output("signals").split()[-1], 16)
    assert ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)) == 0


def test_a_job_whose_runner_is_killed_is_reported_lost(host_pod: Pod) -> None:
    pod = host_pod
    pod.start(pod.spec("orphan", "sleep 30"))
    jobpid = pod.base / "jobs" / "orphan" / "jobpid"
    wait_for(lambda: jobpid.is_file() and jobpid.read_text().strip().isdigit(), "the job's pid")
    runner = int(pod.job_file("orphan", "runner").split()[0])
    job = int(jobpid.read_text())
    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: not _alive(runner), "the runner to die")
    state = pod.state("orphan")
    assert (state.phase, state.exit_code) == ("exited", None)
    assert state.reason and state.reason.startswith("lost:")
    wait_for(lambda: not _alive(job), "the lost job to be killed")


def test_a_job_never_launched_is_reported_lost(pod: Pod) -> None:
    """A start exec killed between creating the job and launching its runner: lost once its
    ``created`` marker is a minute old (its modification time)."""
    for name, age in (("stillborn", 120), ("recent", 10)):
        job = pod.base / "jobs" / name
        job.mkdir()
        (job / "created").write_text("")
        os.utime(job / "created", (time.time() - age, time.time() - age))
    assert (pod.state("recent").phase, pod.state("recent").reason) == ("running", None)
    state = pod.state("stillborn")
    assert (state.phase, state.reason) == ("exited", "lost: the job was never launched")


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, ProcessLookupError):
            continue
        if fields[3] == str(session) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def test_the_runner_and_its_watchdog_leave_with_the_job(host_pod: Pod) -> None:
    assert host_pod.start(host_pod.spec("short", "true", timeout_sec=3600), wait_sec=10).succeeded
    runner = int(host_pod.job_file("short", "runner").split()[0])
    wait_for(lambda: _session_members(runner) == [], "the runner's session to empty")


def test_each_container_keeps_its_own_working_directory(host_pod: Pod, tmp_path: Path) -> None:
    """Containers share the supervisor's emptyDir; placement in another one must not move ours."""
    sidecar = tmp_path / "sidecar"
    sidecar.mkdir()
    placement = supervisor.placement(str(host_pod.base))
    other = subprocess.run(
        [tool("unshare"), "--mount", *placement.argv],
        input=placement.stdin,
        capture_output=True,
        cwd=sidecar,
        timeout=30,
    )
    assert other.returncode == 0, other.stderr
    assert (host_pod.base / "workdir").read_text() == str(sidecar)
    assert host_pod.start(host_pod.spec("mine", "pwd"), wait_sec=10).succeeded
    assert host_pod.output("mine") == f"{host_pod.workdir}\n".encode()


def test_the_script_rejects_malformed_calls(pod: Pod) -> None:
    script = str(pod.base / "supervisor.sh")
    malformed = (
        ["wait", "../etc", "1"],
        ["start", "x", "--kill-after", "5", "--", "a", "b"],
        ["start", "x", "--kill-after", "5", "--timeout", "t", "--", "a"],
        ["start", "x", "--", "a"],
    )
    gone = (["status", "x"], ["kill", "x"], ["probe"])  # verbs no caller used: removed
    for argv in (*malformed, *gone):
        result = subprocess.run(["sh", script, *argv], capture_output=True, env={"PATH": pod.path}, timeout=30)
        assert result.returncode == 2, argv
        assert result.stderr.count(b"\n") == 1 and result.stderr.startswith(b"supervisor: ")
    assert not (pod.base / "jobs" / "x").exists()


# ------------------------------------------------------------------------------- helpers


def test_placement_answers_the_probe(pod: Pod) -> None:
    facts = supervisor.parse_probe(pod.run(supervisor.placement(str(pod.base))).stdout)
    assert facts["workdir"] == str(pod.base.parent)
    assert facts["uid"] == "0" and facts["user"] == "root"
    expected_bash = "1" if pod.flavour == "host" else "0"
    assert facts["has_bash"] == expected_bash and facts["has_head"] == "1" and facts["has_tar"] == "1"
    assert facts["tar"] == ("gnu" if pod.flavour == "host" else "busybox")
    assert facts["can_switch_uid"] == expected_bash


def _tar(members: Sequence[tuple[str, int, bytes | None]]) -> bytes:
    """A tar of (name, mode, content) members; None content is a directory. Owned by uid 1000."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, mode, content in members:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid, info.mtime = mode, 1000, 1000, 1_700_000_000
            if content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_upload_extracts_as_root_keeping_modes_and_existing_directories(pod: Pod, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / "app").mkdir(parents=True)
    os.chmod(dest / "app", 0o750)
    os.chown(dest / "app", 12345, 12345)
    (dest / "app" / "keep.txt").write_text("keep")
    (dest / "app" / "replace.txt").write_text("old")
    archive = _tar(
        [
            ("app", 0o755, None),
            ("app/replace.txt", 0o644, b"new"),
            ("app/tests", 0o755, None),
            ("app/tests/nested", 0o755, None),
            ("app/tests/nested/run.sh", 0o755, b"#!/bin/sh\n"),
            ("app/tests/secret", 0o600, b"\x00\xffbinary"),
        ]
    )
    pod.run(supervisor.upload(archive, str(dest)))
    app = dest / "app"
    assert (stat.S_IMODE(app.stat().st_mode), app.stat().st_uid, app.stat().st_gid) == (0o750, 12345, 12345)
    assert (app / "keep.txt").read_text() == "keep"
    assert (app / "replace.txt").read_text() == "new"
    assert stat.S_IMODE((app / "tests/nested/run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((app / "tests/secret").stat().st_mode) == 0o600
    assert (app / "tests/secret").read_bytes() == b"\x00\xffbinary"
    assert (app / "tests/secret").stat().st_uid == 0


def test_upload_creates_its_destination_and_rejects_short_input(pod: Pod, tmp_path: Path) -> None:
    archive = _tar([("f", 0o644, b"x")])
    pod.run(supervisor.upload(archive, str(tmp_path / "new" / "dir")))
    assert (tmp_path / "new" / "dir" / "f").read_text() == "x"
    short = Command(supervisor.upload(archive, str(tmp_path / "short")).argv, stdin=archive[:100])
    result = pod.run(short, ok=False)
    assert result.returncode == 1 and b"got 100 of" in result.stderr


def _names(archive: bytes | ArchiveFile) -> set[str]:
    data = archive.read_bytes() if isinstance(archive, ArchiveFile) else archive
    with tarfile.open(fileobj=io.BytesIO(data)) as opened:
        return set(opened.getnames())


def test_a_download_keeps_holes_holes(host_pod: Pod, tmp_path: Path) -> None:
    """GNU tar's --sparse: a 1 GiB sparse file is a tar of a few KiB (its member says 1 GiB, so the
    operator refuses it past the artifact bound without a byte of it sent, written or read)."""
    hole = tmp_path / "out" / "hole"
    hole.parent.mkdir()
    with hole.open("wb") as file:
        file.truncate(1 << 30)
    answer = host_pod.run(supervisor.download([str(hole.parent)])).stdout
    assert len(answer) < 64 * 1024
    with tarfile.open(fileobj=io.BytesIO(answer)) as opened:
        assert [member.size for member in opened if member.isfile()] == [1 << 30]


def test_download_names_members_from_root_and_skips_missing_paths(pod: Pod, tmp_path: Path) -> None:
    out = tmp_path / "app" / "out"
    (out / "sub").mkdir(parents=True)
    (out / "x").write_text("x")
    (out / "sub" / "y.log").write_text("y")
    (tmp_path / "single.txt").write_text("s")
    rel = str(tmp_path).lstrip("/")
    paths = [str(out), str(tmp_path / "single.txt"), str(tmp_path / "missing")]
    names = _names(pod.run(supervisor.download(paths)).stdout)
    tree = {f"{rel}/app/out", f"{rel}/app/out/x", f"{rel}/app/out/sub"}
    assert names == tree | {f"{rel}/app/out/sub/y.log", f"{rel}/single.txt"}
    assert _names(pod.run(supervisor.download([str(tmp_path / "missing")])).stdout) == set()
    excluding = supervisor.download([str(out)], exclude=["*.log"])
    if pod.flavour == "host":
        assert _names(pod.run(excluding).stdout) == tree
    else:
        result = pod.run(excluding, ok=False)
        assert result.returncode == 1 and b"cannot exclude" in result.stderr


def test_read_frames_binary_empty_and_missing_files(pod: Pod, tmp_path: Path) -> None:
    binary = tmp_path / "odd name\nwith ünïcode"
    binary.write_bytes(b"\x00\n1 /fake header\n\xff" * 3)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    reward = tmp_path / "reward.txt"
    reward.write_text("1\n")
    paths = [str(binary), str(empty), str(tmp_path / "missing"), str(tmp_path), str(reward)]
    files = supervisor.parse_files(pod.run(supervisor.read_files(paths)).stdout, paths)
    assert {path: content.data for path, content in files.items()} == {
        str(binary): binary.read_bytes(),
        str(empty): b"",
        str(tmp_path / "missing"): None,
        str(tmp_path): None,
        str(reward): b"1\n",
    }
    # Modification times come along (whole seconds under busybox), to tell a reward file
    # written after test.sh exited.
    assert files[str(tmp_path / "missing")].modified is None
    modified = files[str(reward)].modified
    assert modified is not None and abs(modified - reward.stat().st_mtime) < 1.0


def test_clear(pod: Pod, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "verifier" / "deep").mkdir(parents=True)
    (logs / "verifier" / "reward.txt").write_text("1")
    (logs / "verifier" / ".hidden").write_text("h")
    (logs / "verifier" / "..dots").write_text("d")
    (logs / "verifier" / "deep" / "f").write_text("f")
    os.chmod(logs / "verifier", 0o700)
    (logs / "file.txt").write_text("f")
    target = tmp_path / "target"
    target.mkdir()
    (target / "precious").write_text("p")
    (logs / "link").symlink_to(target)
    (logs / "dirlink").symlink_to(target)
    (logs / "notdir").write_text("n")
    paths = [
        f"{logs}/verifier",
        f"{logs}/file.txt",
        f"{logs}/link",
        f"{logs}/dirlink/",
        f"{logs}/notdir/",
        f"{logs}/created/",
        f"{logs}/ignored",
    ]
    pod.run(supervisor.clear(paths))
    verifier = logs / "verifier"
    assert list(verifier.iterdir()) == [] and stat.S_IMODE(verifier.stat().st_mode) == 0o777
    assert not (logs / "file.txt").exists() and not (logs / "link").is_symlink()
    for name in ("dirlink", "notdir", "created"):
        made = logs / name
        assert made.is_dir() and not made.is_symlink() and stat.S_IMODE(made.stat().st_mode) == 0o777, name
        assert list(made.iterdir()) == []
    assert not (logs / "ignored").exists()
    assert (target / "precious").read_text() == "p"
    with pytest.raises(ValueError):
        supervisor.clear(["/"])


def as_user(uid: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child runs as ``uid`` (gid nobody's), as a job of that user would."""

    def switch() -> None:
        os.setgroups([])
        os.setgid(NOBODY_UID)
        os.setuid(uid)

    return switch


def can_write(uid: int, shell_command: str) -> bool:
    """Whether ``shell_command`` succeeds as ``uid`` (an agent's leftover process, say)."""
    done = subprocess.run(["sh", "-c", shell_command], preexec_fn=as_user(uid), capture_output=True, timeout=30)
    return done.returncode == 0


AGENT_UID = 4321  # a non-root agent: no passwd entry, as a bare uid under docker


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A scratch folder other users can reach (pytest's are root's alone), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="episode-operator-test-", dir="/var/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def open_host_pod(open_tmp: Path) -> Iterator[Pod]:
    """A host pod placed in :func:`open_tmp`, its tools reachable by any user."""
    yield from _make_pod(open_tmp, "host", HOST_PATH)


@pytest.fixture(params=["host", "busybox"])
def open_pod(request: pytest.FixtureRequest, open_tmp: Path) -> Iterator[Pod]:
    """A pod (both flavours) placed in :func:`open_tmp`."""
    path = HOST_PATH if request.param == "host" else request.getfixturevalue("busybox_path")
    yield from _make_pod(open_tmp, request.param, path)


def test_placement_keeps_the_records_out_of_other_users_reach(pod: Pod) -> None:
    """The pod's volume comes world-writable; a non-root agent must not reach the job records."""
    modes = {
        path.name: (stat.S_IMODE(path.stat().st_mode), path.stat().st_uid)
        for path in (pod.base, pod.base / "jobs", pod.base / "tmp")
    }
    assert modes == {"episode-operator": (0o755, 0), "jobs": (0o700, 0), "tmp": (0o711, 0)}
    assert not can_write(AGENT_UID, f"mkdir {pod.base}/jobs/a1.t1.verify")
    assert not can_write(AGENT_UID, f"echo x > {pod.base}/supervisor.sh")


def test_placement_makes_the_missing_layout_folders_and_leaves_the_others(open_tmp: Path) -> None:
    """Harbor's /logs/agent, /logs/verifier, /logs/artifacts exist from the sandbox's start, 0777 for
    the agent; a folder that exists — sealed for a verifier that runs — is not opened by a restart."""
    sealed_folder = open_tmp / "logs" / "verifier"
    sealed_folder.mkdir(parents=True)
    sealed_folder.chmod(0o755)
    layout = [str(open_tmp / "logs" / name) for name in ("agent", "verifier", "artifacts")]
    placement = supervisor.placement(str(open_tmp / "episode-operator"), layout=layout)
    done = subprocess.run(
        placement.argv, input=placement.stdin, capture_output=True, env={"PATH": HOST_PATH}, timeout=30
    )
    assert done.returncode == 0, done.stderr
    modes = {Path(folder).name: stat.S_IMODE(Path(folder).stat().st_mode) for folder in layout}
    assert modes == {"agent": 0o777, "verifier": 0o755, "artifacts": 0o777}
    assert stat.S_IMODE((open_tmp / "logs").stat().st_mode) == 0o755
    with pytest.raises(ValueError):
        supervisor.placement(layout=["logs/agent"])


@pytest.mark.parametrize("owner", [None, AGENT_UID + 1, "nobody"], ids=["root", "uid", "name"])
def test_a_sealed_folder_is_roots_emptied_then_given_to_its_owner(open_pod: Pod, open_tmp: Path, owner: object) -> None:
    """What an agent left in a verifier's folder is gone, and its processes can neither add to the
    folder nor rename it (or the folder above it) away; a symlink in its place is replaced."""
    logs = open_tmp / "logs"
    verifier = logs / "verifier"
    (verifier / "deep").mkdir(parents=True)
    (verifier / "reward.txt").write_text("1")
    (verifier / "deep" / "f").write_text("f")
    for path in (logs, verifier, verifier / "deep"):
        os.chown(path, AGENT_UID, AGENT_UID)
        os.chmod(path, 0o777)
    elsewhere = open_tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("k")
    (open_tmp / "tests").symlink_to(elsewhere)
    open_pod.run(supervisor.clear([sealed(f"{verifier}/", owner), sealed(f"{open_tmp}/tests/")]))  # type: ignore[arg-type]
    assert list(verifier.iterdir()) == [] and stat.S_IMODE(verifier.stat().st_mode) == 0o755
    assert verifier.stat().st_uid == {None: 0, "nobody": NOBODY_UID}.get(owner, owner)  # type: ignore[call-overload]
    assert (logs.stat().st_uid, stat.S_IMODE(logs.stat().st_mode)) == (0, 0o755)
    tests = open_tmp / "tests"
    assert tests.is_dir() and not tests.is_symlink() and (elsewhere / "kept").read_text() == "k"
    assert not can_write(AGENT_UID, f"echo 1 > {verifier}/reward.txt")
    assert not can_write(AGENT_UID, f"mv {verifier} {logs}/old && mkdir {verifier}")
    assert not can_write(AGENT_UID, f"echo 1 > {tests}/test.sh")
    assert stat.S_IMODE(Path("/tmp").stat().st_mode) == 0o1777  # a sticky folder above is left as it is


def test_a_start_seals_the_rewards_folder_for_its_jobs_user(open_host_pod: Pod, open_tmp: Path) -> None:
    verifier = open_tmp / "logs" / "verifier"
    verifier.mkdir(parents=True)
    os.chmod(verifier, 0o777)
    (verifier / "reward.txt").write_text("1")
    script = b"echo 0 > $REWARDS/reward.txt\n"
    tests = Upload(_tar([("test.sh", 0o755, script)]), str(open_tmp / "tests"), (sealed(f"{verifier}/", JOB_USER),))
    spec = open_host_pod.spec("v", f"bash {open_tmp}/tests/test.sh", user=AGENT_UID + 1, env={"REWARDS": str(verifier)})
    assert open_host_pod.start(spec, wait_sec=10, upload=tests).succeeded
    assert (verifier.stat().st_uid, (verifier / "reward.txt").read_text()) == (AGENT_UID + 1, "0\n")


def test_a_seal_for_a_user_that_does_not_exist_leaves_the_job_unstartable(open_host_pod: Pod, open_tmp: Path) -> None:
    """As without a seal: a verifier whose user is missing cannot start (masked), not a failed clear (an outage)."""
    verifier = open_tmp / "logs" / "verifier"
    tests = Upload(_tar([("test.sh", 0o755, b"true\n")]), str(open_tmp / "tests"), (sealed(f"{verifier}/", JOB_USER),))
    state = open_host_pod.start(open_host_pod.spec("v", "true", user="no-such-user"), wait_sec=10, upload=tests)
    assert state.phase == "unstartable" and "no such user" in (state.reason or "")
    assert verifier.is_dir() and verifier.stat().st_uid == 0


def test_a_container_that_is_not_root_only_clears_a_sealed_folder(open_host_pod: Pod, open_tmp: Path) -> None:
    """An image whose USER is not root runs everything as that user: nothing can be sealed there."""
    folder = open_tmp / "logs" / "verifier"
    folder.mkdir(parents=True)
    (folder / "planted").write_text("1")
    os.chown(open_tmp / "logs", AGENT_UID, AGENT_UID)
    os.chown(folder, AGENT_UID, AGENT_UID)
    command = supervisor.clear([sealed(f"{folder}/")])
    done = subprocess.run(
        open_host_pod.argv(command),
        preexec_fn=as_user(AGENT_UID),
        env={"PATH": open_host_pod.path},
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert list(folder.iterdir()) == [] and folder.stat().st_uid == AGENT_UID


def test_chown_workdir_is_not_recursive_and_needs_a_real_user(pod: Pod, tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    (workdir / "inner").mkdir(parents=True)
    pod.run(supervisor.chown_workdir("nobody", str(workdir)))
    assert workdir.stat().st_uid == NOBODY_UID and (workdir / "inner").stat().st_uid == 0
    pod.run(supervisor.chown_workdir(12345, str(workdir)))
    assert workdir.stat().st_uid == 12345
    pod.run(supervisor.chown_workdir(4242))  # the workdir recorded at placement
    assert pod.workdir.stat().st_uid == 4242
    result = pod.run(supervisor.chown_workdir("no-such-user", str(workdir)), ok=False)
    assert result.returncode == 1
    assert result.stderr == b"supervisor: chown-workdir: no such user: no-such-user\n"
    assert workdir.stat().st_uid == 12345


# ---------------------------------------------------------------------------- pure Python


@pytest.mark.parametrize(
    "stdout",
    [
        b"",
        b"hello\n",
        b"id=job phase=bogus\n",
        b"id=other phase=running\n",
        b"id=job phase=exited exit_code=abc\n",
        b"id=job phase=exited timed_out=maybe\n",
        b"id=job phase=exited junk\n",
        b"id=job\n",
    ],
)
def test_parse_state_refuses_garbage(stdout: bytes) -> None:
    with pytest.raises(ValueError):
        supervisor.parse_state("job", stdout)


def test_parse_state_reads_every_field_and_ignores_unknown_keys() -> None:
    line = b"id=j phase=unstartable started_at=1.5 finished_at=2 future=x reason=no%20such%20user:%20%C3%BC\n"
    assert supervisor.parse_state("j", line) == JobState(
        id="j", phase="unstartable", reason="no such user: ü", started_at=1.5, finished_at=2.0
    )
    exited = supervisor.parse_state("j", b"id=j phase=exited exit_code=0 timed_out=1\n")
    assert exited.timed_out and not exited.succeeded and exited.done


def test_builders_refuse_what_the_script_could_not_carry() -> None:
    spec = JobSpec(id="ok", command="true", timeout_sec=1)
    for bad in (replace(spec, id="../x"), replace(spec, id=".hidden"), replace(spec, id="a b"), replace(spec, id="")):
        with pytest.raises(ValueError):
            supervisor.start(bad)
    with pytest.raises(ValueError):
        supervisor.start(replace(spec, env={"1BAD": "x"}))
    with pytest.raises(ValueError):
        supervisor.start(replace(spec, command="a\0b"))
    with pytest.raises(ValueError):
        supervisor.start(replace(spec, timeout_sec=0))
    with pytest.raises(ValueError):
        supervisor.download(["relative/path"])
    unbounded = supervisor.start(replace(spec, timeout_sec=float("inf"))).argv
    assert "--timeout" not in unbounded and unbounded[:3] == ["sh", SUPERVISOR_PATH, "start"]


def test_values_are_separate_argv_entries() -> None:
    spec = JobSpec(id="j", command="echo '$x' \"; rm -rf /\"", timeout_sec=1.25, cwd="/a b", env={"K": "v w"})
    argv = supervisor.start(spec, wait_sec=2).argv
    assert argv[-2:] == ["--", spec.command]
    assert argv[argv.index("--timeout") : argv.index("--timeout") + 2] == ["--timeout", "1.25"]
    assert "--cwd" in argv and "/a b" in argv and "K=v w" in argv


def test_the_script_ships_with_the_package() -> None:
    text = supervisor.script_text()
    assert text.startswith("#!/bin/sh\n") and "cmd_start" in text
    placement = supervisor.placement()
    assert placement.stdin == text.encode() and placement.argv[4:] == [
        supervisor.SUPERVISOR_DIR,
        str(len(text.encode())),
    ]


def test_final_answer_brings_the_output_tail_and_files(pod: Pod, tmp_path: Path) -> None:
    """--tail and --then-read ride on start and wait once the job is done: no extra exec."""
    reward = tmp_path / "reward.txt"
    spec = JobSpec(
        id="verify",
        command=f"echo lots of output; echo 0.5 > {reward}",
        timeout_sec=10,
        shell="sh",
        tail=8,
        read_after=(str(reward), str(tmp_path / "reward.json")),
    )
    state = supervisor.parse_answer(spec, pod.run(supervisor.start(spec, wait_sec=5)).stdout)
    assert state.succeeded and state.output == b" output\n"
    assert state.files is not None
    assert state.files[str(reward)].data == b"0.5\n" and state.files[str(tmp_path / "reward.json")].data is None
    again = supervisor.parse_answer(spec, pod.run(supervisor.wait(spec, 1)).stdout)
    assert again == state
    # While the job runs, only the state comes back.
    slow = JobSpec(id="slow-tail", command="sleep 2", timeout_sec=10, shell="sh", tail=100, read_after=(str(reward),))
    running = supervisor.parse_answer(slow, pod.run(supervisor.start(slow)).stdout)
    assert running.phase == "running" and running.output is None and running.files is None
    done = supervisor.parse_answer(slow, pod.run(supervisor.wait(slow, 10)).stdout)
    assert done.succeeded and done.output == b"" and done.files is not None


def test_final_answer_brings_a_download(pod: Pod, tmp_path: Path) -> None:
    """--then-download rides on the final answer as the download verb would answer, after the
    tail and the read frames; a tar that fails (busybox cannot exclude) brings None."""
    out = tmp_path / "artifacts"
    rel = str(out).lstrip("/")
    spec = JobSpec(
        id="agent",
        command=f"mkdir -p {out}/sub && echo x > {out}/x && echo y > {out}/sub/y.log && echo said",
        timeout_sec=10,
        shell="sh",
        tail=100,
        read_after=(str(out / "x"),),
        download_after=str(out),
    )
    archives: list[ArchiveFile] = []  # each answer's tar, a scratch file: discarded at the end

    def answer(job: JobSpec, command: Command) -> JobState:
        state = supervisor.parse_answer(job, pod.run(command).stdout)
        if state.archive is not None:
            archives.append(state.archive)
        return state

    state = answer(spec, supervisor.start(spec, wait_sec=5))
    assert state.succeeded and state.output == b"said\n" and state.files is not None
    assert state.files[str(out / "x")].data == b"x\n"
    assert state.archive is not None and _names(state.archive) == {rel, f"{rel}/x", f"{rel}/sub", f"{rel}/sub/y.log"}
    assert state.archive.read_bytes() == pod.run(supervisor.download([str(out)])).stdout
    again = answer(spec, supervisor.wait(spec, 1))
    assert again.archive is not None and again.archive.read_bytes() == state.archive.read_bytes()
    missing = replace(spec, id="nothing", command="true", download_after=str(tmp_path / "missing"))
    state = answer(missing, supervisor.start(missing, wait_sec=5))
    assert state.archive is not None and _names(state.archive) == set()
    excluding = replace(spec, id="excluding", command="true", download_exclude=("*.log",))
    state = answer(excluding, supervisor.start(excluding, wait_sec=5))
    if pod.flavour == "host":
        assert state.archive is not None and _names(state.archive) == {rel, f"{rel}/x", f"{rel}/sub"}
    else:
        assert state.succeeded and state.archive is None
    # While the job runs, only the state comes back.
    slow = replace(spec, id="slow", command="sleep 2")
    running = answer(slow, supervisor.start(slow))
    assert running.phase == "running" and running.archive is None
    for archive in archives:
        archive.discard()


def test_the_job_environment_is_not_written_to_disk(pod: Pod) -> None:
    """Its values reach the job through the runner's environment only (a verifier's secrets)."""
    secret = "s3cr3t-value-for-the-verifier"
    # The job checks the value without naming it (its command is on disk).
    state = pod.start(pod.spec("secret", f'test "${{#TOKEN}}" -eq {len(secret)}', env={"TOKEN": secret}), wait_sec=10)
    assert state.succeeded
    for path in (pod.base / "jobs" / "secret").rglob("*"):
        assert not path.is_dir() or path.name != "env"
        assert path.is_dir() or secret.encode() not in path.read_bytes(), path


def test_a_runner_started_without_its_spec_runs_nothing(host_pod: Pod, tmp_path: Path) -> None:
    """The spec reaches a runner only from its start exec: a runner launched otherwise (by hand, by a
    script of another version) runs nothing, and the job is found lost like any that never ran."""
    job = host_pod.base / "jobs" / "bare"
    job.mkdir(parents=True)
    (job / "created").write_text("")
    (job / "command").write_text(f"touch {tmp_path / 'ran'}")
    launched = subprocess.run(
        ["sh", str(host_pod.base / "supervisor.sh"), "_run", "bare", "bg"],
        env={"PATH": host_pod.path},
        capture_output=True,
        timeout=30,
    )
    assert launched.returncode == 1, launched
    assert not (job / "runner").exists() and not (tmp_path / "ran").exists()
    os.utime(job / "created", (time.time() - 120, time.time() - 120))
    state = host_pod.state("bare")
    assert (state.phase, state.reason) == ("exited", "lost: the job was never launched")


def test_upload_clears_first_in_the_same_exec(pod: Pod, tmp_path: Path) -> None:
    target = tmp_path / "solution"
    target.mkdir()
    (target / "stale.sh").write_text("old")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("solve.sh")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"new\n"))
    pod.run(supervisor.upload(archive.getvalue(), str(target), clear=[f"{target}/"]))
    assert sorted(path.name for path in target.iterdir()) == ["solve.sh"]
    with pytest.raises(ValueError, match="refusing to clear"):
        supervisor.upload(b"", "/x", clear=["/"])


def test_a_failed_upload_names_the_step_that_failed(pod: Pod, tmp_path: Path) -> None:
    """A clear that fails reads as ``clear`` (the runner's outage); a bad archive does not."""
    (tmp_path / "file.txt").write_text("a file, not a directory")
    target = tmp_path / "dest"
    cleared = pod.run(supervisor.upload(b"", str(target), clear=[f"{tmp_path}/file.txt/sub/"]), ok=False)
    assert cleared.returncode != 0 and supervisor.failed_step(cleared.stderr) == "clear"
    unpacked = pod.run(supervisor.upload(b"not a tar archive" * 64, str(target)), ok=False)
    assert unpacked.returncode != 0 and supervisor.failed_step(unpacked.stderr) != "clear"


def test_a_start_places_its_job_inputs_first_and_only_once(pod: Pod, tmp_path: Path) -> None:
    """The inputs (cleared, then extracted) travel with the exec that starts the job; a
    start that finds the job re-attaches and leaves them as the job saw them."""
    target = tmp_path / "solution"
    target.mkdir()
    (target / "stale.sh").write_text("old")
    spec = pod.spec("agent", f"cat '{target}/solve.sh'")
    first = Upload(_tar([("solve.sh", 0o755, b"first\n")]), str(target), (f"{target}/",))
    state = pod.start(spec, wait_sec=10, upload=first)
    assert state.succeeded and pod.output("agent") == b"first\n"
    assert sorted(path.name for path in target.iterdir()) == ["solve.sh"]
    again = Upload(_tar([("solve.sh", 0o755, b"second\n"), ("new.sh", 0o755, b"")]), str(target), (f"{target}/",))
    assert pod.start(spec, wait_sec=10, upload=again).succeeded
    assert sorted(path.name for path in target.iterdir()) == ["solve.sh"]
    assert (target / "solve.sh").read_text() == "first\n"
    assert not list((pod.base / "tmp").iterdir())  # no scratch files left behind


def test_a_start_whose_inputs_fail_starts_nothing(pod: Pod, tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("a file, not a directory")
    bad_clear = Upload(_tar([("f", 0o644, b"x")]), str(tmp_path / "d"), (f"{tmp_path}/file.txt/sub/",))
    result = pod.run(supervisor.start(pod.spec("c", "true"), upload=bad_clear), ok=False)
    assert result.returncode == 1 and supervisor.failed_step(result.stderr) == "clear"
    assert pod.state("c").phase == "unknown"
    bad_tar = Upload(b"not a tar archive" * 64, str(tmp_path / "d"))
    result = pod.run(supervisor.start(pod.spec("u", "true"), upload=bad_tar), ok=False)
    assert result.returncode == 1 and supervisor.failed_step(result.stderr) == "upload"
    assert pod.state("u").phase == "unknown"
    # Nothing was claimed: the same id starts once its inputs can be placed.
    good = Upload(_tar([("f", 0o644, b"x")]), str(tmp_path / "d"))
    assert pod.start(pod.spec("u", "true"), wait_sec=10, upload=good).succeeded


def test_long_arguments_and_job_inputs_share_stdin(pod: Pod, tmp_path: Path) -> None:
    big = "y" * (supervisor.ARGV_STDIN_THRESHOLD + 10)
    spec = pod.spec(
        "both",
        f"printf '%s' \"$BIG\" > '{tmp_path / 'big'}'; cat '{tmp_path}/in/f' >> '{tmp_path / 'big'}'",
        env={"BIG": big},
    )
    inputs = Upload(_tar([("f", 0o644, b"+input")]), str(tmp_path / "in"))
    command = supervisor.start(spec, upload=inputs)
    assert command.argv[2] == "--argv-stdin" and command.stdin is not None and command.stdin.endswith(inputs.archive)
    assert pod.start(spec, wait_sec=10, upload=inputs).succeeded
    assert (tmp_path / "big").read_text() == big + "+input"
    assert not list((pod.base / "tmp").iterdir())  # no scratch files left behind


# -------------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class Answered:
    """A session's answer with its stdout, as an exec's would be."""

    status: int
    stdout: bytes
    stderr: bytes


class Served:
    """``serve`` as a session runs it: requests written to its stdin, answers read back in
    pieces of any size (as an exec's websocket messages come)."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.process = pod.popen(Command(["sh", SUPERVISOR_PATH, "serve"], stdin=b""))  # a pipe, kept open
        self.answers = supervisor.SessionAnswers()
        self.pieces = iter([1, 3, 64, 5, 4096] * 10_000)
        while self.answers.ready is None:
            self._read()

    def _read(self) -> None:
        assert self.process.stdout is not None
        data = os.read(self.process.stdout.fileno(), next(self.pieces))
        assert data, "the session ended"
        self.answers.feed(data)

    def call(self, command: Command) -> Answered:
        call = supervisor.session_call(command)
        assert call is not None and self.process.stdin is not None
        with command.answer.spool() as stdout:
            self.answers.expect(call.nonce, stdout, command.answer)
            self.process.stdin.write(call.request + (call.file.read_bytes() if call.file is not None else b""))
            self.process.stdin.flush()
            while (answer := self.answers.take(call.nonce)) is None:
                self._read()
            return Answered(answer.status, stdout.getvalue(), answer.stderr)

    def end(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=30)


@pytest.fixture
def served(pod: Pod) -> Iterator[Served]:
    session = Served(pod)
    try:
        yield session
    finally:
        if session.process.poll() is None:
            session.process.kill()
            session.process.wait()


def test_a_session_answers_every_call_as_its_exec_would(served: Served, tmp_path: Path) -> None:
    """Awkward words, a failing verb, one that exits (die), long arguments, an empty stdout:
    each answer is the exec's stdout, exit status and stderr; the session goes on."""
    pod = served.pod
    assert served.answers.ready == supervisor.SessionReady("1", exact_head=pod.flavour == "host")
    spec = pod.spec("awk", 'printf \'%s|\' "$1" "$AWKWARD" > out.txt', env={"AWKWARD": 'it\'s\n"$HOME" `x` ✓\\'})
    commands = [
        supervisor.start(spec, wait_sec=10),
        supervisor.wait(JobSpec(id="nothing-here", command="", timeout_sec=1), 0),
        Command(["sh", SUPERVISOR_PATH, "bogus-verb"], words=("bogus-verb",)),
        supervisor.read_files([str(tmp_path / "missing")]),
        supervisor.start(pod.spec("big", f"printf '%s' \"$BIG\" > '{tmp_path / 'big'}'", env={"BIG": "y\n" * 20_000})),
        supervisor.clear([str(tmp_path / "made") + "/"]),
    ]
    answers = [served.call(command) for command in commands]
    direct = [pod.run(command, ok=False) for command in commands[1:4]]  # the same calls by exec
    assert [(a.status, a.stdout, a.stderr) for a in answers[1:4]] == [
        (d.returncode, d.stdout, d.stderr) for d in direct
    ]
    assert answers[0].status == 0 and supervisor.parse_state("awk", answers[0].stdout).succeeded
    assert (pod.workdir / "out.txt").read_text() == '|it\'s\n"$HOME" `x` ✓\\|'
    assert answers[2].status == 2 and b"unknown verb: bogus-verb" in answers[2].stderr
    assert answers[4].status == 0 and pod.wait("big").succeeded and (tmp_path / "big").read_text() == "y\n" * 20_000
    assert answers[5] == Answered(0, b"", b"") and (tmp_path / "made").is_dir()
    assert served.end() == 0


def test_a_session_carries_stdin_where_head_reads_exactly(served: Served, tmp_path: Path) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        data = b"\x00binary\nbytes\xff" * 100
        info = tarfile.TarInfo("blob")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    if served.pod.flavour != "host":  # busybox head reads ahead: the operator sends it no stdin
        assert served.answers.ready is not None and not served.answers.ready.exact_head
        return
    for number in range(3):
        answer = served.call(supervisor.upload(archive.getvalue(), str(tmp_path / f"up{number}")))
        assert answer == Answered(0, b"", b"")
        assert (tmp_path / f"up{number}" / "blob").read_bytes() == data
    assert served.call(supervisor.wait(JobSpec(id="still-served", command="", timeout_sec=1), 0)).status == 0


def test_a_malformed_request_ends_the_session(served: Served) -> None:
    assert served.process.stdin is not None
    served.process.stdin.write(b"not-a-nonce! 1 0\nwait x 0\n")
    served.process.stdin.flush()
    assert served.process.wait(timeout=30) == 2
