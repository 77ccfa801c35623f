"""Reliability and security on the real cluster: outages, restarts, hostile agents.

What the operator guarantees against a hostile agent, exactly (tested below, each part
deterministically):
- files it plants in ``/tests`` or ``/logs/verifier`` are gone before its turn verifies
  (the grading folders are emptied right before the tests are uploaded);
- what a process it leaves behind writes once ``test.sh`` has exited and been read does not
  change the turn's reward; a reward file changed after ``test.sh`` exited but before it was
  read is refused (the turn counts 0: tested in the unit tier, where that order is certain);
- in a separate verifier pod the agent has no processes at all and only the declared
  artifacts arrive.
What it cannot promise in a shared sandbox: a process that writes the reward file *while*
``test.sh`` runs races the verifier's own write (the verifier's last write wins only if it
is last), and file times tick coarsely (a write a few milliseconds after ``test.sh`` exited
may carry an earlier time). Tasks that must be safe against root agents verify separately.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import (
    CLUSTER_DIR,
    HACK_CLUSTER,
    delete_namespace_while_watched,
    namespace_prefix,
    wait_for_default_service_account,
)
from tests.cluster.harness import (
    EXAMPLES,
    TASKS,
    OperatorProcess,
    create_episode,
    episode_spec,
    install_crd,
    pods_of,
    read_episode,
    run_episode,
    wait_for_episode,
)

# Plants a test.sh and a reward of its own in the grading folders, once.
PLANTER = (
    "echo 1 > /logs/verifier/reward.txt; mkdir -p /tests; echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh"
)
# Leaves a process that rewrites the reward file for good, from some seconds after test.sh exited
# (the supervisor's exit record of turn 1's verification, its id keyed: root lists the records) on:
# by then the reward was read.
LEFTOVER = (
    "nohup sh -c 'until [ -s /episode-operator/jobs/a1.t1.verify.*/exit ]; do sleep 0.05; done; sleep 5; "
    "while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done' >/dev/null 2>&1 &"
)
# Both, with a process writing the reward all along: only a separate verifier is safe from it.
HOSTILE = (
    f"{PLANTER}; nohup sh -c 'while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done' "
    ">/dev/null 2>&1 &"
)


def wait_until(predicate: Any, what: str, operator: OperatorProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}\n{operator.log_tail()}"
        time.sleep(0.2)


def stage_of(api: client.ApiClient, namespace: str, name: str) -> tuple[int | None, str | None]:
    status = read_episode(api, namespace, name).get("status") or {}
    turn = status.get("currentTurn")
    turns = status.get("turns") or []
    return turn, turns[turn].get("stage") if turn is not None and turn < len(turns) else None


def hello_with(mode: str, command: str) -> dict[str, Any]:
    toml = (EXAMPLES / "hello" / "task.toml").read_text()
    if mode == "separate":
        toml = toml.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    return episode_spec(EXAMPLES / "hello", edits={"task.toml": toml}, agent={"kind": "command", "command": command})


@pytest.mark.parametrize(
    ("mode", "agent"),
    [("shared", PLANTER), ("shared", LEFTOVER), ("separate", HOSTILE)],
    ids=["shared-planted-files", "shared-leftover-after-exit", "separate-all-of-it"],
)
def test_hostile_agent_cannot_forge_a_reward(
    mode: str, agent: str, api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The honest test.sh of hello writes 0 (no hello.txt): that 0 is the turn's reward."""
    status = run_episode(api_client, namespace, f"hostile-{mode}", hello_with(mode, agent), operator)
    assert status["phase"] == "Succeeded" and status["reward"] == 0.0, status
    assert (status["turns"][0]["rewardValid"], status["turns"][0]["verifierRewards"]) == (True, {"reward": 0.0})


def test_an_agent_that_kills_every_process_it_can_still_gets_verified(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """``kill -9 -1`` as root takes the agent's own runner and the supervisor session the operator
    was calling on: the agent's job reads as lost, the next call goes by exec (a new session), and
    the verifier decides the turn as it would any agent's."""
    command = "echo 'Hello, world!' > /app/hello.txt; kill -9 -1; sleep 1"
    status = run_episode(api_client, namespace, "killer", hello_with("shared", command), operator)
    assert (status["phase"], status["reward"], status["attempt"]) == ("Succeeded", 1.0, 1), status
    assert status["turns"][0].get("agentExitCode") is None, status["turns"][0]


def test_agent_pod_deleted_mid_turn_starts_a_new_attempt(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    command = "sleep 6; echo 'Hello, world!' > /app/hello.txt"
    create_episode(
        api_client, namespace, "victim", episode_spec(EXAMPLES / "hello", agent={"kind": "command", "command": command})
    )
    wait_until(lambda: stage_of(api_client, namespace, "victim") == (0, "agent"), "agent turn", operator)
    core.delete_namespaced_pod("victim-a1", namespace, grace_period_seconds=0)
    status = wait_for_episode(api_client, namespace, "victim", operator)
    assert (status["phase"], status["reward"], status["attempt"]) == ("Succeeded", 1.0, 2), status
    assert len(status["attempts"]) == 2 and status["attempts"][0]["reason"].startswith(("pod_lost", "exec"))


def test_missing_image_is_retried_then_fails_clearly(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    spec = episode_spec(EXAMPLES / "hello", image="episode-operator.local/not-loaded:1", retries={"outages": 1})
    status = run_episode(api_client, namespace, "unpullable", spec, operator, timeout=300)
    assert (status["phase"], status["outcome"], status["failureKind"]) == ("Failed", "Ungraded", "outage:image_pull")
    assert [attempt["number"] for attempt in status["attempts"]] == [1, 2]
    assert all("not-loaded:1" in attempt["reason"] for attempt in status["attempts"])
    assert status.get("reward") is None
    assert pods_of(core, namespace, "unpullable") == []


def test_agent_ignoring_sigterm_is_killed_at_its_budget(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    toml = (EXAMPLES / "hello" / "task.toml").read_text().replace("timeout_sec = 120.0", "timeout_sec = 3.0", 1)
    command = "trap '' TERM; echo 'Hello, world!' > /app/hello.txt; sleep 600"
    spec = episode_spec(EXAMPLES / "hello", edits={"task.toml": toml}, agent={"kind": "command", "command": command})
    status = run_episode(api_client, namespace, "stubborn", spec, operator)
    turn = status["turns"][0]
    assert turn["agentExitCode"] == 137 and "ran out of its 3 s budget" in turn["message"], turn
    assert status["reward"] == 1.0  # the verifier still decides, as Harbor does after an agent timeout


@pytest.fixture
def private_operator(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> Iterator[tuple[str, OperatorProcess]]:
    """A namespace watched by an operator of this test's own (it gets killed)."""
    install_crd(api_client)
    prefix = f"own-{namespace_prefix()}"
    namespace = f"{prefix}{int(time.time() * 1000) % 10**8:x}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(kubeconfig, tmp_path / "data", tmp_path / "operator.log", f"{prefix}*")
    try:
        wait_for_default_service_account(core, namespace)
        yield namespace, operator
    finally:
        delete_namespace_while_watched(core, namespace)
        operator.stop()


def test_operator_killed_again_and_again(
    api_client: client.ApiClient, private_operator: tuple[str, OperatorProcess]
) -> None:
    """SIGKILL after every step of a three-step run: the same reward, every turn ran once."""
    namespace, operator = private_operator
    marker = {
        f"steps/{name}/solution/solve.sh": f"echo {name} >> /app/turns.txt; sleep 2\necho 1 > /app/reward-wanted.txt\n"
        for name in ("one", "two", "three")
    }
    check = (
        '[ "$(tr "\\n" " " < /app/turns.txt)" = "one two three " ] && cp /app/reward-wanted.txt '
        "/logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    spec = episode_spec(TASKS / "scored-steps", edits={**marker, "steps/three/tests/test.sh": check})
    operator.start()
    create_episode(api_client, namespace, "battered", spec)
    # Killed right after each status write that moves the episode on (a new turn or stage): at
    # every point a restart can meet, whatever the machine's speed.
    kills = 0
    deadline = time.monotonic() + 240
    seen: tuple[Any, ...] | None = None
    while True:
        status = read_episode(api_client, namespace, "battered").get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        assert time.monotonic() < deadline, operator.log_tail()
        progress = (status.get("currentTurn"), tuple(turn.get("stage") for turn in status.get("turns") or []))
        if seen is not None and progress != seen:
            operator.kill()
            kills += 1
            operator.start()
        seen = progress
        time.sleep(0.1)  # a poll of the status, not a wait for something to happen
    status = wait_for_episode(api_client, namespace, "battered", operator)
    assert kills >= 3, "the run ended before the operator was killed three times"
    assert (status["phase"], status["reward"], status["attempt"]) == ("Succeeded", 1.0, 1), status
    assert [turn["reward"] for turn in status["turns"]] == [1.0, 1.0, 1.0]


def _apiserver_pid() -> int:
    pid_file = CLUSTER_DIR / "pids" / "kube-apiserver.pid"
    return int(pid_file.read_text().split()[0])


@pytest.mark.exclusive("restarts the API server every other test and operator talks to")
def test_api_server_restart_mid_run(api_client: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    if not (CLUSTER_DIR / "pids" / "kube-apiserver.pid").exists():
        pytest.fail("this test restarts the bare cluster's API server by its recorded pid; no pid file found")
    command = "sleep 8; echo 'Hello, world!' > /app/hello.txt"
    create_episode(
        api_client,
        namespace,
        "weathered",
        episode_spec(EXAMPLES / "hello", agent={"kind": "command", "command": command}),
    )
    wait_until(lambda: stage_of(api_client, namespace, "weathered") == (0, "agent"), "agent turn", operator)
    # The operator meets the dead API server before it comes back: a request that gets no answer, or an
    # exec that breaks. (The sandbox's open session may carry the turn on through the API server's
    # graceful shutdown: it is the status write after it that finds the API server gone.) Counted from
    # before the kill: the first retries can come while the API server is still shutting down.
    broken = ("episode_operator_exec_errors_total", "episode_operator_api_errors_total")
    errors_before = sum(value for name, value in operator.metrics().items() if name.startswith(broken))
    pid = _apiserver_pid()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while Path(f"/proc/{pid}").exists():  # down for good before it is started again
        assert time.monotonic() < deadline, "the API server did not stop"
        time.sleep(0.2)
    while sum(value for name, value in operator.metrics().items() if name.startswith(broken)) <= errors_before:
        assert time.monotonic() < deadline, f"the operator never noticed the API server was gone\n{operator.log_tail()}"
        time.sleep(0.2)
    restarted = subprocess.run([str(HACK_CLUSTER), "up"], capture_output=True, text=True, timeout=300)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    status = wait_for_episode(api_client, namespace, "weathered", operator, timeout=300)
    assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), status
