"""`kubectl episode regrade` on the real cluster: README's block as printed, and the refusal of a shared turn.

A finished Episode's kept artifacts are verified again with new tests in a fresh verifier pod of a new
Episode; no agent pod is made, the original's record is left as it was, and a turn verified in the agent's
own sandbox is refused, naming it, before anything is created.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from tests.cluster.harness import (
    EXAMPLES,
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    context_kubeconfig,
    folder_files,
    pods_of,
    read_episode,
    run_episode,
    wait_for_episode,
)
from tests.cluster.test_episodeset import kubectl_episode, readme_block
from tests.cluster.test_gitops import Shell

REGRADE_OF = "episode-operator.dev/regrade-of"


def regrades_of(api: client.ApiClient, namespace: str, original: str) -> list[dict[str, object]]:
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{REGRADE_OF}={original}"
    )
    return list(listed["items"])


def test_the_readme_regrades_a_run_with_stricter_tests_as_printed(
    kubeconfig: Path, namespace: str, api_client: client.ApiClient, operator: OperatorProcess, tmp_path: Path
) -> None:
    shell = Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace}), tmp_path / "repo")
    transcript = shell(readme_block("regrade"), timeout=900)
    assert "regrades report (attempt 1, reward 1.0), turns task, with the tests of stricter" in transcript, transcript
    assert "regraded report: reward 0.0 (it had 1.0)" in transcript, transcript
    original = read_episode(api_client, namespace, "report")["status"]
    assert (original["outcome"], original["reward"]) == ("Graded", 1.0)  # its record stays as its run wrote it
    [regrade] = regrades_of(api_client, namespace, "report")
    status = regrade["status"]  # type: ignore[index]
    assert (status["outcome"], status["reward"], status["verifierMode"]) == ("Graded", 0.0, "separate")
    assert (
        status["regrade"]["episode"] == "report"
        and status["regrade"]["uid"] == read_episode(api_client, namespace, "report")["metadata"]["uid"]
    )
    assert [turn["action"] for turn in status["regrade"]["turns"]] == ["verify"]
    # Only a verifier pod ran: the agent never did.
    assert [pod["role"] for attempt in status["attempts"] for pod in attempt["pods"]] == ["verifier"]
    # Its own logs are the new verifier's.
    logs = kubectl_episode(
        "logs",
        regrade["metadata"]["name"],
        "-n",
        namespace,
        "--data-dir",
        str(operator.data_dir),
        kubeconfig=kubeconfig,  # type: ignore[index]
    )
    assert logs.returncode == 0 and "verifier" in logs.stdout, logs.stdout + logs.stderr


def test_a_turn_verified_in_the_agents_own_sandbox_cannot_be_regraded(
    kubeconfig: Path, namespace: str, api_client: client.ApiClient, operator: OperatorProcess, tmp_path: Path
) -> None:
    shell = Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace}), tmp_path / "repo")
    shell("kubectl episode run examples/tasks/separate-verifier-handoff --name handoff --wait", timeout=900)
    refused = kubectl_episode("regrade", "handoff", "-n", namespace, kubeconfig=kubeconfig)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "turn 1 (01-draft) of episode handoff was verified in the agent's own sandbox" in refused.stderr
    assert "nothing was created" in refused.stderr and refused.stdout == ""
    assert regrades_of(api_client, namespace, "handoff") == []
    # Applied by hand all the same, the operator refuses it alike, before any pod.
    original = read_episode(api_client, namespace, "handoff")
    manifest = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Episode",
        "metadata": {"name": "handoff-by-hand"},
        "spec": {**original["spec"], "regrade": {"episode": "handoff"}},
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    status = wait_for_episode(api_client, namespace, "handoff-by-hand", operator)
    assert (status["outcome"], status["failureKind"]) == ("TerminalFailure", "episode:regrade_refused")
    assert "turn 1 (01-draft) of episode handoff was verified in the agent's own sandbox" in status["message"]
    assert pods_of(client.CoreV1Api(api_client), namespace, "handoff-by-hand") == []


# Both turns of the handoff verified in fresh verifier pods, turn 1's artifact declared.
ALL_SEPARATE = {
    "task.toml": (EXAMPLES / "separate-verifier-handoff" / "task.toml")
    .read_text()
    .replace(
        '[[steps]]\nname = "01-draft"\nmin_reward = 1.0\n',
        '[[steps]]\nname = "01-draft"\nmin_reward = 1.0\nartifacts = ["/app/draft.txt"]\n',
    )
    .replace(
        "[steps.verifier]\ntimeout_sec = 60.0\n\n[[steps]]",
        '[steps.verifier]\ntimeout_sec = 60.0\nenvironment_mode = "separate"\n\n[[steps]]',
    )
    .replace("cpus = 1\nmemory_mb = 256\n", "")
}


def test_a_run_verified_separately_at_every_turn_is_regraded_in_a_pod_per_turn_without_its_agent_pod(
    kubeconfig: Path, namespace: str, api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    """No agent pod holds capacity for a regrade's verifiers: each, the first turn's too, asks for its own."""
    files = folder_files(EXAMPLES / "separate-verifier-handoff", ALL_SEPARATE)
    assert 'environment_mode = "separate"' in files["task.toml"] and "/app/draft.txt" in files["task.toml"]
    first = run_episode(
        api_client, namespace, "handoff", {"task": {"inline": {"files": files}}, "agent": {"kind": "oracle"}}, operator
    )
    assert (first["outcome"], first["reward"], first["verifierMode"]) == ("Graded", 1.0, "separate")
    result = kubectl_episode(
        "regrade", "handoff", "--name", "handoff-again", "-n", namespace, "--wait", kubeconfig=kubeconfig
    )
    assert result.returncode == 0, result.stdout + result.stderr + operator.log_tail()
    status = read_episode(api_client, namespace, "handoff-again")["status"]
    assert (status["outcome"], status["reward"], status["attempt"]) == ("Graded", 1.0, 1)
    assert [(pod["role"], pod["turn"]) for pod in status["attempts"][0]["pods"]] == [("verifier", 1), ("verifier", 2)]
    assert [turn["reward"] for turn in status["turns"]] == [1.0, 1.0]
