"""Episodes on the real cluster: the operator runs task folders and scores them as Gym does."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from tests.cluster.conftest import delete_namespace_while_watched, namespace_prefix, wait_for_default_service_account
from tests.cluster.harness import (
    EXAMPLES,
    SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
    TASKS,
    OperatorProcess,
    create_episode,
    episode_spec,
    install_crd,
    pod_file,
    pods_of,
    read_episode,
    run_episode,
    running_operator,
    wait_for_episode,
)
from tests.gym_row_schema import check_rows

SCORED = TASKS / "scored-steps"


def wants(*rewards: str) -> dict[str, str]:
    """Edits making step one, two, three of scored-steps ask for these rewards."""
    return {
        f"steps/{step}/solution/solve.sh": f"echo {reward} > /app/reward-wanted.txt\n"
        for step, reward in zip(("one", "two", "three"), rewards, strict=True)
    }


def scored(
    strategy: str = "mean",
    *,
    edits: dict[str, str | None] | None = None,
    step_tables: dict[str, str] | None = None,
    rewards: tuple[str, str, str] = ("1", "1", "1"),
) -> dict[str, Any]:
    toml = (SCORED / "task.toml").read_text().replace('"mean"', f'"{strategy}"')
    for step, table in (step_tables or {}).items():
        toml = toml.replace(f'name = "{step}"\n', f'name = "{step}"\n{table}\n')
    return episode_spec(SCORED, edits={"task.toml": toml, **wants(*rewards), **(edits or {})})


# --- the examples -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("example", "reward", "turns"),
    [
        ("hello", 1.0, "1/1"),
        ("three-step-ledger", 1.0, "3/3"),
        ("separate-verifier-handoff", 1.0, "2/2"),
        ("sidecar-lookup", 1.0, "1/1"),
    ],
)
def test_examples_succeed(
    example: str,
    reward: float,
    turns: str,
    api_client: client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
    kubeconfig: Path,
) -> None:
    status = run_episode(api_client, namespace, example, episode_spec(EXAMPLES / example), operator)
    assert (status["phase"], status["outcome"], status["reward"], status["progress"]) == (
        "Succeeded",
        "Graded",
        reward,
        turns,
    ), status
    printed = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "get", "episodes", "-n", namespace],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = printed.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "REWARD", "TURNS", "OUTCOME"]
    assert row.split()[:5] == [example, "Succeeded", "1", turns, "Graded"]


def test_separate_verifier_sees_declared_artifacts_only(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    status = run_episode(
        api_client, namespace, "handoff", episode_spec(EXAMPLES / "separate-verifier-handoff"), operator
    )
    assert status["turns"][1]["verifierRewards"] == {"reward": 1.0, "published": 1.0, "isolated": 1.0}
    assert status["verifierMode"] == "mixed"


def test_sidecar_by_name_and_collect_hook_in_the_sidecar(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, kubeconfig: Path, tmp_path: Path
) -> None:
    run_episode(api_client, namespace, "sidecar", episode_spec(EXAMPLES / "sidecar-lookup"), operator)
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "kubectl-episode"),
            "artifacts",
            "sidecar",
            str(tmp_path / "out"),
            "-n",
            namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--data-dir",
            str(operator.data_dir),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "task" / "api" / "served.txt").read_text().strip() == "tangerine-42"


# --- roll-up and gates ----------------------------------------------------------------------------
@pytest.mark.parametrize(("strategy", "expected"), [("mean", 0.5), ("final", 0.25)])
def test_mean_and_final(
    strategy: str, expected: float, api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    status = run_episode(api_client, namespace, strategy, scored(strategy, rewards=("1", "0.25", "0.25")), operator)
    assert status["reward"] == expected
    assert [turn["reward"] for turn in status["turns"]] == [1.0, 0.25, 0.25]


def test_min_reward_miss_stops_the_episode(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    spec = scored(step_tables={"two": "min_reward = 0.5"}, rewards=("1", "0.25", "1"))
    status = run_episode(api_client, namespace, "gated", spec, operator)
    assert status["stoppedAfterTurn"] == "two"
    assert [turn["phase"] for turn in status["turns"]] == ["Succeeded", "Succeeded", "Skipped"]
    assert status["reward"] == 0.625


def test_setup_failing_at_step_one_is_terminal(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    status = run_episode(
        api_client, namespace, "setup-one", scored(edits={"steps/one/workdir/setup.sh": "exit 3\n"}), operator
    )
    assert (status["phase"], status["outcome"], status["failureKind"]) == (
        "Failed",
        "TerminalFailure",
        "harbor:step_setup_failed",
    )
    assert status.get("reward") is None and len(status["attempts"]) == 1


def test_setup_failing_at_step_two_is_a_measured_zero(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    status = run_episode(
        api_client,
        namespace,
        "setup-two",
        scored(edits={"steps/two/workdir/setup.sh": "echo broken >&2; exit 1\n"}),
        operator,
    )
    assert (status["phase"], status["outcome"], status["reward"]) == ("Succeeded", "Graded", 0.5)
    assert status["turns"][1]["failureKind"] == "harbor:step_setup_failed"
    assert status["stoppedAfterTurn"] == "two"


def test_step_healthcheck_passes_only_after_its_start_period(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    # Ready 3 s after setup.sh; retries = 0 would fail the first counted attempt, so passing proves
    # the attempts before t0 + start_period did not count.
    table = (
        '[steps.healthcheck]\ncommand = "test -f /tmp/ready"\nstart_period_sec = 8.0\n'
        "start_interval_sec = 1.0\ninterval_sec = 1.0\nretries = 0\ntimeout_sec = 5.0"
    )
    edits = {"steps/two/workdir/setup.sh": "(sleep 3; touch /tmp/ready) > /dev/null 2>&1 &\n"}
    status = run_episode(api_client, namespace, "health", scored(step_tables={"two": table}, edits=edits), operator)
    assert status["reward"] == 1.0, status


def test_no_reward_file_is_a_measured_zero(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    edits = {"steps/two/tests/test.sh": "echo 'this verifier forgot the reward'\n"}
    status = run_episode(api_client, namespace, "no-reward", scored(edits=edits), operator)
    assert status["reward"] == 0.5 and status["stoppedAfterTurn"] == "two"
    assert status["turns"][1]["rewardValid"] is False
    assert "neither reward.json nor reward.txt" in status["turns"][1]["message"]


def test_reward_json_beats_reward_txt_and_the_exit_code(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    test_sh = "echo '{\"reward\": 0.75}' > /logs/verifier/reward.json\necho 1 > /logs/verifier/reward.txt\nexit 7\n"
    spec = episode_spec(EXAMPLES / "hello", edits={"tests/test.sh": test_sh})
    assert run_episode(api_client, namespace, "json-wins", spec, operator)["reward"] == 0.75


def test_kubectl_episode_logs_shows_each_turns_own_output_in_turn_order(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, kubeconfig: Path
) -> None:
    """Every turn's solve.sh appends to /logs/agent/oracle.txt; each turn's log is its own part,
    and the turns come as they ran (one, two, three), not by name (one, three, two)."""
    solves = {
        f"steps/{step}/solution/solve.sh": f"echo output of {step}\necho 1 > /app/reward-wanted.txt\n"
        for step in ("one", "two", "three")
    }
    status = run_episode(api_client, namespace, "logged", episode_spec(SCORED, edits=solves), operator)
    assert status["reward"] == 1.0, status
    printed = subprocess.run(
        [
            str(Path(sys.executable).parent / "kubectl-episode"),
            *("logs", "logged", "-n", namespace, "--kubeconfig", str(kubeconfig)),
            *("--data-dir", str(operator.data_dir)),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sections = [part for part in printed.split("==> ") if part]
    assert [section.split(" <==")[0] for section in sections] == [
        f"attempt 1 turn {step}: {log}" for step in ("one", "two", "three") for log in ("agent", "verifier")
    ], printed
    agent_logs = [section.split(" <==\n", 1)[1] for section in sections if section.split(" <==")[0].endswith("agent")]
    assert agent_logs == [f"output of {step}\n\n" for step in ("one", "two", "three")], printed


# --- turn state --------------------------------------------------------------------------------
def test_state_between_turns(api_client: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    """Files and processes stay; workdir/ replaces; grading files go; the user switches."""
    status = run_episode(api_client, namespace, "turn-state", episode_spec(TASKS / "turn-state"), operator)
    assert status["turns"][1]["verifierRewards"] == {
        "reward": 1.0,
        "workdir_replaced": 1.0,
        "kept": 1.0,
        "process_alive": 1.0,
        "user_switched": 1.0,
        "owner_switched": 1.0,
        "tests_cleared": 1.0,
        "verifier_cleared": 1.0,
    }


def test_command_agent_with_a_secret(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess, kubeconfig: Path
) -> None:
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="model-key"),
            data={"API_TOKEN": base64.b64encode(b"s3cret-token").decode()},
        ),
    )
    command = 'cp "$EPISODE_INSTRUCTION_FILE" /app/instruction-seen.md && printf %s "$API_TOKEN" > /app/token.txt'
    test_sh = (
        '[ "$(cat /app/token.txt)" = s3cret-token ] && grep -q "Hello, world" /app/instruction-seen.md '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    spec = episode_spec(
        EXAMPLES / "hello",
        edits={"tests/test.sh": test_sh},
        agent={"kind": "command", "command": command, "envFrom": [{"secretRef": {"name": "model-key"}}]},
    )
    status = run_episode(api_client, namespace, "command-agent", spec, operator)
    assert status["reward"] == 1.0, status
    assert status["turns"][0]["agentExitCode"] == 0


# --- crash safety --------------------------------------------------------------------------------
def test_operator_killed_during_an_agent_turn(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """SIGKILL the operator mid-turn, start a new one: same reward, the turn ran once, its output kept."""
    install_crd(api_client)
    namespace = f"crash-{namespace_prefix()}{int(time.time() * 1000) % 10**8:x}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        command = "echo run >> /app/runs.txt; echo agent-started; sleep 12; echo agent-finished"
        test_sh = (
            '[ "$(grep -c run /app/runs.txt)" = 1 ] && echo 1 > /logs/verifier/reward.txt '
            "|| echo 0 > /logs/verifier/reward.txt\n"
        )
        spec = episode_spec(
            EXAMPLES / "hello", edits={"tests/test.sh": test_sh}, agent={"kind": "command", "command": command}
        )
        glob = f"crash-{namespace_prefix()}*"
        first = OperatorProcess(kubeconfig, tmp_path / "data", tmp_path / "operator.log", glob)
        first.start()
        try:
            wait_for_default_service_account(core, namespace)
            create_episode(api_client, namespace, "crash", spec)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                turns = (read_episode(api_client, namespace, "crash").get("status") or {}).get("turns") or [{}]
                if turns[0].get("stage") == "agent":
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"the agent turn never started:\n{first.log_tail()}")
            # The stage is published just before the agent's job starts: kill once it runs.
            while pod_file(core, namespace, "crash-a1", "/app/runs.txt") != "run\n":
                assert time.monotonic() < deadline, f"the agent never ran:\n{first.log_tail()}"
                time.sleep(0.2)
        finally:
            first.kill()
        with running_operator(kubeconfig, tmp_path / "data", tmp_path / "operator.log", glob) as second:
            status = wait_for_episode(api_client, namespace, "crash", second)
            assert (status["phase"], status["reward"], status["attempt"]) == ("Succeeded", 1.0, 1), status
            logs = subprocess.run(
                [
                    str(Path(sys.executable).parent / "kubectl-episode"),
                    "logs",
                    "crash",
                    "-n",
                    namespace,
                    "--kubeconfig",
                    str(kubeconfig),
                    "--data-dir",
                    str(tmp_path / "data"),
                    "--turn",
                    "task",
                ],
                capture_output=True,
                text=True,
            )
            assert "agent-started" in logs.stdout and "agent-finished" in logs.stdout, logs.stdout + logs.stderr
            delete_namespace_while_watched(core, namespace)  # its Episodes' finalizers need an operator
    finally:
        with contextlib.suppress(ApiException):  # gone already when the test passed
            core.delete_namespace(namespace, propagation_policy="Background")


def test_the_operator_drives_the_cluster_its_kubeconfig_names(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """``episode-operator run --kubeconfig K`` with a $KUBECONFIG naming another cluster (one that
    is not there): kopf's watches too must go where K says, or no Episode ever starts."""
    install_crd(api_client)
    namespace = f"kcfg-{namespace_prefix()}{int(time.time() * 1000) % 10**8:x}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    elsewhere = tmp_path / "elsewhere.kubeconfig"
    elsewhere.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "gone", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "nobody", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "nobody"}}],
                "current-context": "gone",
            }
        )
    )
    operator = OperatorProcess(
        kubeconfig,
        tmp_path / "data",
        tmp_path / "operator.log",
        f"kcfg-{namespace_prefix()}*",
        env={"KUBECONFIG": str(elsewhere)},
    )
    try:
        operator.start()
        wait_for_default_service_account(core, namespace)
        status = run_episode(api_client, namespace, "hello", episode_spec(EXAMPLES / "hello"), operator)
        assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), status
        delete_namespace_while_watched(core, namespace)  # its Episodes' finalizers need an operator
    finally:
        operator.stop()
        with contextlib.suppress(ApiException):  # gone already when the test passed
            core.delete_namespace(namespace, propagation_policy="Background")


# --- bad input ---------------------------------------------------------------------------------
def test_bad_input_fails_clearly_and_the_operator_keeps_serving(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    broken = episode_spec(EXAMPLES / "hello", edits={"task.toml": "[environment\n"})
    no_image_toml = (
        (EXAMPLES / "hello" / "task.toml")
        .read_text()
        .replace('docker_image = "episode-operator.local/sandbox:bookworm"\n', "")
    )
    no_image = episode_spec(EXAMPLES / "hello", edits={"task.toml": no_image_toml})
    missing_image = episode_spec(
        EXAMPLES / "hello", image="episode-operator.local/does-not-exist:1", retries={"outages": 0}
    )
    for name, spec in (("broken", broken), ("no-image", no_image), ("missing-image", missing_image)):
        create_episode(api_client, namespace, name, spec)
    with pytest.raises(ApiException) as unknown_kind:
        create_episode(api_client, namespace, "unknown-kind", episode_spec(EXAMPLES / "hello", agent={"kind": "human"}))
    assert unknown_kind.value.status == 422 and "spec.agent.kind" in unknown_kind.value.body

    broken_status = wait_for_episode(api_client, namespace, "broken", operator)
    assert (broken_status["phase"], broken_status["failureKind"]) == ("Failed", "harbor:invalid_task")
    assert "task.toml: TOML syntax error" in broken_status["message"]
    no_image_status = wait_for_episode(api_client, namespace, "no-image", operator)
    assert no_image_status["failureKind"] == "harbor:seed_refused"
    assert (
        "environment.docker_image: not set, no environment/Dockerfile to make the image from, and the Episode gives "
        "no spec.image"
    ) in no_image_status["message"]
    missing = wait_for_episode(api_client, namespace, "missing-image", operator)
    assert (missing["phase"], missing["outcome"], missing["failureKind"]) == ("Failed", "Ungraded", "outage:image_pull")
    assert "does-not-exist" in missing["message"]
    assert pods_of(core, namespace, "missing-image") == []
    # The operator is still serving.
    assert run_episode(api_client, namespace, "after", episode_spec(EXAMPLES / "hello"), operator)["reward"] == 1.0


def test_deleting_a_running_episode_removes_its_pods(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    spec = episode_spec(EXAMPLES / "hello", agent={"kind": "command", "command": "sleep 600"})
    create_episode(api_client, namespace, "doomed", spec)
    deadline = time.monotonic() + 120
    while not pods_of(core, namespace, "doomed"):
        assert time.monotonic() < deadline, operator.log_tail()
        time.sleep(0.5)
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        "episode-operator.dev", "v1alpha1", namespace, "episodes", "doomed"
    )
    deadline = time.monotonic() + 180  # a bound for a loaded machine (workers side by side), not a budget
    while pods_of(core, namespace, "doomed") or _exists(api_client, namespace, "doomed"):
        assert time.monotonic() < deadline, f"pods or episode left: {pods_of(core, namespace, 'doomed')}"
        time.sleep(0.5)


def _exists(api_client: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        read_episode(api_client, namespace, name)
        return True
    except ApiException as error:
        if error.status == 404:
            return False
        raise


def test_finished_episode_pods_are_removed(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    run_episode(api_client, namespace, "tidy", episode_spec(EXAMPLES / "hello"), operator)
    deadline = time.monotonic() + 120  # a bound for a loaded machine, not a budget
    while pods_of(core, namespace, "tidy"):
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_metrics_move_after_an_episode(api_client: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    before = operator.metrics()
    run_episode(api_client, namespace, "measured", episode_spec(EXAMPLES / "hello"), operator)
    after = operator.metrics()
    graded = 'episode_operator_episodes_total{failure_kind="",outcome="Graded"}'
    assert after[graded] == before.get(graded, 0) + 1
    assert after['episode_operator_turns_total{failure_kind="",result="graded"}'] >= 1
    for phase in ("pod_start", "agent", "collect", "verify"):
        key = f'episode_operator_phase_duration_seconds_count{{phase="{phase}"}}'
        assert after[key] == before.get(key, 0) + 1, key
    assert after["episode_operator_episode_reward_count"] == before.get("episode_operator_episode_reward_count", 0) + 1
    assert after["episode_operator_active_episodes"] == 0


def test_suspend_holds_an_episode_and_resume_starts_it_over(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    """spec.suspend (how Kueue admits or preempts): held Pending without pods; a resumed run starts over."""
    episodes = client.CustomObjectsApi(api_client)
    command = "echo run >> /app/runs.txt; sleep 8; echo 'Hello, world!' > /app/hello.txt"
    spec = episode_spec(EXAMPLES / "hello", agent={"kind": "command", "command": command}, suspend=True)
    body = {
        "apiVersion": "episode-operator.dev/v1alpha1",
        "kind": "Episode",
        "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": "evals"}},
        "spec": spec,
    }
    episodes.create_namespaced_custom_object("episode-operator.dev", "v1alpha1", namespace, "episodes", body)

    def status() -> dict[str, Any]:
        return read_episode(api_client, namespace, "queued").get("status") or {}

    def set_suspend(value: bool) -> None:
        episodes.patch_namespaced_custom_object(
            "episode-operator.dev", "v1alpha1", namespace, "episodes", "queued", {"spec": {"suspend": value}}
        )

    def wait_until(predicate: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"{what}: {status()}\n{operator.log_tail()}"
            time.sleep(0.3)

    # The message is the operator's answer: it has seen the Episode and decided to hold it.
    wait_until(lambda: status().get("phase") == "Pending" and "suspended" in (status().get("message") or ""), "held")
    assert pods_of(core, namespace, "queued") == []
    set_suspend(False)
    wait_until(lambda: (status().get("turns") or [{}])[0].get("stage") == "agent", "running its agent")
    pods = core.list_namespaced_pod(namespace, label_selector="episode-operator.dev/episode=queued").items
    assert pods and pods[0].metadata.labels["kueue.x-k8s.io/queue-name"] == "evals"
    set_suspend(True)  # preempted mid-turn
    wait_until(lambda: status().get("phase") == "Pending" and not pods_of(core, namespace, "queued"), "stopped")
    set_suspend(False)
    final = wait_for_episode(api_client, namespace, "queued", operator)
    assert (final["phase"], final["reward"], final["attempt"]) == ("Succeeded", 1.0, 1), final


def test_export_gym_jsonl(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, kubeconfig: Path, tmp_path: Path
) -> None:
    run_episode(api_client, namespace, "good", episode_spec(EXAMPLES / "three-step-ledger"), operator)
    run_episode(
        api_client, namespace, "bad", episode_spec(EXAMPLES / "hello", edits={"task.toml": "[oops\n"}), operator
    )
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "kubectl-episode"),
            "export",
            "-n",
            namespace,
            "--kubeconfig",
            str(kubeconfig),
            "-o",
            "gym-jsonl",
            "--output-dir",
            str(tmp_path),
            "--environment-server",
            "harbor_env",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    failures = [json.loads(line) for line in (tmp_path / "rollouts_failures.jsonl").read_text().splitlines()]
    check_rows(rollouts, failures)
    assert [(row["episode"], row["reward"], len(row["turns"])) for row in rollouts] == [(f"{namespace}/good", 1.0, 3)]
    assert [(row["episode"], row["failure_kind"]) for row in failures] == [(f"{namespace}/bad", "harbor:invalid_task")]
    # Two standalone Episodes of two tasks: numbered as Gym numbers a dataset's, under the server named.
    rows = [*rollouts, *failures]
    assert sorted((row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows) == [(0, 0), (1, 0)]
    assert {row["_ng_environment_server"] for row in rows} == {"harbor_env"}


def test_ttl_deletes_a_finished_episode(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    spec = episode_spec(EXAMPLES / "hello", ttlSecondsAfterFinished=2)
    assert run_episode(api_client, namespace, "short-lived", spec, operator)["phase"] == "Succeeded"
    deadline = time.monotonic() + 120  # a bound for a loaded machine, not a budget
    while _exists(api_client, namespace, "short-lived"):
        assert time.monotonic() < deadline, operator.log_tail()
        time.sleep(0.5)


def test_network_policies_follow_the_phases(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """no-network baseline, an allowlist for the agent: the pod's NetworkPolicy says so in each phase.
    The same task with a hostname in its allowlist is refused at seed naming the key (a policy
    cannot name a host: it would block the host it names), before any pod.

    The test cluster's bridge CNI stores NetworkPolicies without enforcing them; what is
    checked is what a policy-capable CNI would enforce.
    """
    networking = client.NetworkingV1Api(api_client)
    toml = (
        '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["198.18.0.0/24", "198.18.255.1"]\n'
        '[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\nworkdir = "/app"\n'
        'network_mode = "no-network"\n'
    )
    named = toml.replace('"198.18.255.1"]', '"pypi.org"]')
    # Every version of the pod's policy, from a watch: the phases after the agent's are too
    # short (collect, verify) for polling to see reliably.
    versions: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    policies = watch.Watch()

    def record() -> None:
        try:
            # Open longer than the Episode may take on a loaded machine: the test stops it at its end.
            for event in policies.stream(networking.list_namespaced_network_policy, namespace, timeout_seconds=600):
                if event["type"] in ("ADDED", "MODIFIED"):
                    versions.append(event["object"].spec.to_dict())
        except urllib3.exceptions.ProtocolError:
            pass  # the API server ended the stream; what it delivered is checked below
        except Exception as error:  # reported by the test, not lost in a thread
            errors.append(error)

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    command = "sleep 3; echo 'Hello, world!' > /app/hello.txt"
    create_episode(
        api_client,
        namespace,
        "fenced",
        episode_spec(EXAMPLES / "hello", edits={"task.toml": toml}, agent={"kind": "command", "command": command}),
    )
    create_episode(
        api_client,
        namespace,
        "named-host",
        episode_spec(EXAMPLES / "hello", edits={"task.toml": named}, agent={"kind": "command", "command": command}),
    )
    refused = wait_for_episode(api_client, namespace, "named-host", operator)
    assert (refused["phase"], refused["outcome"], refused["failureKind"]) == (
        "Failed",
        "TerminalFailure",
        "harbor:seed_refused",
    ), refused
    assert refused["message"].startswith("refused at seed: task.toml: agent.allowed_hosts: 'pypi.org' is a hostname")
    assert "podName" not in refused
    status = wait_for_episode(api_client, namespace, "fenced", operator)
    policies.stop()  # the stream ends at its next event: the policy's deletion
    deadline = time.monotonic() + 120  # a bound for a loaded machine, not a budget
    while networking.list_namespaced_network_policy(namespace).items:
        assert time.monotonic() < deadline, "the NetworkPolicy outlived the episode's pods"
        time.sleep(0.5)
    recorder.join(timeout=60)
    assert not recorder.is_alive() and not errors, errors
    assert status["phase"] == "Succeeded", status
    fenced = [index for index, version in enumerate(versions) if version["egress"]]
    assert fenced, versions
    agent = versions[fenced[0]]
    assert agent["pod_selector"]["match_labels"]["episode-operator.dev/role"] == "agent"
    assert agent["policy_types"] == ["Ingress", "Egress"] and not agent["ingress"]
    assert [peer["ip_block"]["cidr"] for peer in agent["egress"][0]["to"]] == ["198.18.0.0/24", "198.18.255.1/32"]
    assert len(agent["egress"]) == 1
    before, after = versions[: fenced[0]], versions[fenced[-1] + 1 :]
    assert before and not before[-1]["egress"]  # no-network before the agent (the pod was created fenced)
    assert after and not after[-1]["egress"]  # no-network again after the agent


def test_sandbox_pods_are_confined(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    spec = episode_spec(
        EXAMPLES / "sidecar-lookup",
        debug={"keepPods": True},
        edits={"tests/test.sh": "echo 0 > /logs/verifier/reward.txt\n"},
    )
    spec["agent"] = {"kind": "command", "command": "exit 3"}
    status = run_episode(api_client, namespace, "confined", spec, operator)
    assert status["reward"] == 0.0
    # keepPods keeps the sandbox of an episode that did not succeed… but this one is Graded: gone.
    pods = core.list_namespaced_pod(namespace).items
    assert all(p.metadata.deletion_timestamp for p in pods)
    failing = episode_spec(
        EXAMPLES / "hello",
        debug={"keepPods": True},
        edits={
            "task.toml": (EXAMPLES / "hello" / "task.toml").read_text() + '\n[[steps]]\nname = "x"\n',
            "steps/x/instruction.md": "x",
            "steps/x/workdir/setup.sh": "exit 1\n",
        },
    )
    assert run_episode(api_client, namespace, "kept", failing, operator)["outcome"] == "TerminalFailure"
    kept = core.read_namespaced_pod("kept-a1", namespace)
    assert kept.metadata.deletion_timestamp is None
    assert kept.spec.automount_service_account_token is False
    assert kept.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    main = kept.spec.containers[0].security_context
    assert main.allow_privilege_escalation is False and main.capabilities.drop == ["NET_RAW"]


# The CFS quota and period of the container's cgroup (cgroup v2's cpu.max, else v1's files), as one line.
CPU_QUOTA = (
    "if [ -e /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max; "
    "else echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); fi"
)


def test_a_sandbox_requests_the_operators_share_of_its_cpus_and_is_limited_to_all_of_them(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    """--cpu-request-fraction (the tier's operators run with one): hello's `cpus = 1` is the pod's CPU
    limit, the kernel's quota of one CPU, as Docker's --cpus is in Harbor; the pod asks the scheduler
    for that fraction of it only. Memory is requested in full."""
    command = (
        f"({CPU_QUOTA}) > /app/cpu.txt; until [ -e /app/release ]; do sleep 0.2; done; "
        "echo 'Hello, world!' > /app/hello.txt"
    )
    create_episode(
        api_client, namespace, "sized", episode_spec(EXAMPLES / "hello", agent={"kind": "command", "command": command})
    )
    deadline = time.monotonic() + 240
    while not (quota := pod_file(core, namespace, "sized-a1", "/app/cpu.txt")):
        assert time.monotonic() < deadline, f"the agent never ran:\n{operator.log_tail()}"
        time.sleep(0.5)
    main = core.read_namespaced_pod("sized-a1", namespace).spec.containers[0]
    millicores = round(SIDE_BY_SIDE_CPU_REQUEST_FRACTION * 1000)
    assert (main.resources.requests, main.resources.limits) == (
        {"cpu": f"{millicores}m", "memory": "2Gi"},
        {"cpu": "1", "memory": "2Gi"},
    ), main.resources
    limit, period = quota.split()
    assert int(limit) == int(period), quota  # one CPU's worth of every period
    stream(
        core.connect_get_namespaced_pod_exec, "sized-a1", namespace, container="main",
        command=["touch", "/app/release"], stderr=True, stdout=True, stdin=False, tty=False,
    )  # fmt: skip
    status = wait_for_episode(api_client, namespace, "sized", operator)
    assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), status


# --- Gym's harbor server settings ----------------------------------------------------------------------
LEDGER = EXAMPLES / "three-step-ledger"


def test_the_harbor_settings_change_what_runs_as_gyms_server_would(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """``spec.harbor`` on the cluster, each setting beside the Episode that shows it (docs/task-format.md
    §2.14): the ledger's turns verify separately, with its artifacts only; a prompt template reaches the agent
    of turn 1; a setup.sh past its bound fails its turn; a deadline that cannot fit the sandbox start is
    refused at seed."""
    template = "Harbor-wrapped: {instruction}"
    copy = 'cp "$EPISODE_INSTRUCTION_FILE" /app/instruction-seen.md'
    wrapped = (
        'head -n 1 /app/instruction-seen.md | grep -q "^Harbor-wrapped: " && grep -q "Hello, world" '
        "/app/instruction-seen.md && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    specs = {
        "separated": episode_spec(LEDGER, harbor={"separateVerifierForArtifacts": True}),
        "templated": episode_spec(
            EXAMPLES / "hello",
            edits={"tests/test.sh": wrapped},
            agent={"kind": "command", "command": copy},
            harbor={"promptTemplate": template},
        ),
        "untemplated": episode_spec(
            EXAMPLES / "hello", edits={"tests/test.sh": wrapped}, agent={"kind": "command", "command": copy}
        ),
        "slow-setup": episode_spec(
            LEDGER,
            # Within the step's agent budget (120 s), past the setting's 3 s: only the setting fails it.
            edits={"steps/01-record/workdir/setup.sh": "#!/usr/bin/env bash\nsleep 20\n"},
            harbor={"stepSetupTimeoutSec": 3},
        ),
        "no-room": episode_spec(
            EXAMPLES / "hello", harbor={"enforceTaskTimeouts": False, "defaultEpisodeTimeoutSec": 10}
        ),
    }
    for name, spec in specs.items():
        create_episode(api_client, namespace, name, spec)
    status = {name: wait_for_episode(api_client, namespace, name, operator, timeout=420) for name in specs}

    # The ledger declares artifacts (/app/ledger): every turn verifies in its own sandbox, which gets the
    # ledger and not /app/total.txt, so turn 2's total_ok misses its gate (shared, the ledger scores 1:
    # test_the_examples_reach_their_rewards_in_cluster).
    separated = status["separated"]
    ran = [turn for turn in separated["turns"] if turn["phase"] != "Skipped"]
    assert [turn["verifierMode"] for turn in ran] == ["separate", "separate"], separated["turns"]
    assert (ran[0]["reward"], ran[1]["verifierRewards"]) == (1.0, {"reward": 0.5, "total_ok": 0.0, "rows_ok": 1.0})
    assert separated["stoppedAfterTurn"] == "02-total", separated
    assert status["templated"]["reward"] == 1.0, status["templated"]
    assert status["untemplated"]["reward"] == 0.0, status["untemplated"]  # the control: no template, no prefix
    slow = status["slow-setup"]
    assert (slow["failureKind"], slow["turns"][0]["failureKind"]) == ("harbor:step_setup_failed",) * 2, slow
    refused = status["no-room"]
    assert (refused["phase"], refused["failureKind"]) == ("Failed", "harbor:seed_refused"), refused
    assert "environment.build_timeout_sec" in refused["message"], refused["message"]
