"""Red team, on the real cluster: an agent that wants its reward without earning it (issue 23).

Each attack runs beside an honest control on the same task: the task's test.sh gives 1 only
when ``/app/answer.txt`` holds 42, which the honest agent writes and no attacker does. The
attacker's reward must be the task's honest 0, as a valid reward (never a forged 1, never an
outage that buys another try). Agents run as root (Harbor's default) and as ``nobody``;
verifiers in the agent's sandbox (shared) and in their own pod (separate).

What a root agent in a shared sandbox owns anyway (the programs test.sh runs, the reward file
while test.sh runs) is README's "what a shared sandbox cannot promise"; the attacks here are
the ones that must fail whoever the agent is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import namespace_name, wait_for_default_service_account
from tests.cluster.harness import OperatorProcess, create_episode, episode_spec, wait_for_episode

# One namespace and every Episode of the module at once (they mostly wait), each test reading its own.
pytestmark = pytest.mark.xdist_group("red-team-verifier")

TEST_SH = 'if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
HONEST = "echo 42 > /app/answer.txt"
# The two lines of shell that used to score 1: the verifier's job record as the supervisor writes
# one (under the id it had before ids were keyed, and under every id the agent can see), and a reward.
FORGE_RECORD = r"""
jobs=/episode-operator/jobs
for id in a1.t1.verify $(ls "$jobs" 2>/dev/null | sed 's/\.agent\./.verify./'); do
  mkdir -p "$jobs/$id" && : > "$jobs/$id/created" && echo 0 > "$jobs/$id/exit" &&
    date +%s > "$jobs/$id/started_at" && date +%s > "$jobs/$id/finished_at"
done
mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt
mkdir -p /tests && echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh
exit 0
"""
# Processes left behind that keep at the grading folders while the verifier runs: a reward of 1,
# a test.sh of their own renamed over the verifier's (from a file made elsewhere, as a non-root
# agent would to beat a permission check on the file itself).
LEFTOVER = r"""
nohup sh -c 'while :; do
  echo 1 > /logs/verifier/reward.txt 2>/dev/null
  echo "echo 1 > /logs/verifier/reward.txt" > /tmp/forged.sh 2>/dev/null &&
    mv -f /tmp/forged.sh /tests/test.sh 2>/dev/null
  sleep 0.02
done' >/dev/null 2>&1 &
exit 0
"""


def task(mode: str, user: str | None) -> dict[str, str]:
    toml = (
        'schema_version = "1.4"\n'
        + ('artifacts = ["/app/answer.txt"]\n' if mode == "separate" else "")
        + '[task]\nname = "red-team/answer"\n'
        + (f'[agent]\ntimeout_sec = 60.0\nuser = "{user}"\n' if user else "[agent]\ntimeout_sec = 60.0\n")
        + "[verifier]\ntimeout_sec = 60.0\n"
        + ('environment_mode = "separate"\n' if mode == "separate" else "")
        + '[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\nworkdir = "/app"\n'
    )
    return {"task.toml": toml, "instruction.md": "Write 42 into /app/answer.txt.\n", "tests/test.sh": TEST_SH}


USERS = {"root": None, "non-root": "nobody"}
MODES = ("shared", "separate")


def secrets_task(mode: str) -> dict[str, str]:
    """The task's own setup.sh and test.sh (possibly from a dataset nobody audited) must see no agent
    secret, while the agent does (the control): test.sh scores 1 only when both hold. A separate
    verifier gets what the agent and setup.sh saw as artifacts, and looks in its own pod too."""
    toml = (
        'schema_version = "1.4"\n[task]\nname = "red-team/secrets"\n[agent]\ntimeout_sec = 60.0\n'
        '[verifier]\ntimeout_sec = 60.0\n[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\n'
        'workdir = "/app"\n[[steps]]\nname = "only"\n'
    )
    if mode == "separate":
        toml += 'artifacts = ["/app/agent-saw.txt", "/app/setup-env.txt"]\n'
        toml += '[steps.verifier]\nenvironment_mode = "separate"\n'
    check = (
        "saw=$(cat /app/agent-saw.txt)\n"
        "leaked=0\n"
        'for where in /app/setup-env.txt /proc/1/environ; do grep -q s3cret-7 "$where" && leaked=1; done\n'
        "env | grep -q s3cret-7 && leaked=1\n"
        'if [ "$saw" = s3cret-7 ] && [ "$leaked" = 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    )
    return {
        "task.toml": toml,
        "steps/only/instruction.md": "Say the token.\n",
        "steps/only/workdir/setup.sh": "env > /app/setup-env.txt\n",
        "steps/only/tests/test.sh": check,
    }


# name → (task files, agent): the honest controls and the attacks, all run at once.
def episodes() -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    runs: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
    for mode in MODES:
        for who, user in USERS.items():
            runs[f"honest-{mode}-{who}"] = (task(mode, user), {"kind": "command", "command": HONEST})
            runs[f"forger-{mode}-{who}"] = (task(mode, user), {"kind": "command", "command": FORGE_RECORD})
    runs["leftover-shared-non-root"] = (task("shared", "nobody"), {"kind": "command", "command": LEFTOVER})
    for mode in MODES:
        runs[f"secrets-{mode}"] = (
            secrets_task(mode),
            {
                "kind": "command",
                "command": 'printf %s "$TOKEN" > /app/agent-saw.txt',
                "envFrom": [{"secretRef": {"name": "agent-keys"}}],
            },
        )
    return runs


@pytest.fixture(scope="module")
def outcomes(
    api_client: client.ApiClient, core: client.CoreV1Api, operator: OperatorProcess
) -> Iterator[dict[str, dict[str, Any]]]:
    """Every Episode of the module, created at once in one namespace, as each ended."""
    name = namespace_name("red-team-verifier")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        wait_for_default_service_account(core, name)
        secret = client.V1Secret(metadata=client.V1ObjectMeta(name="agent-keys"), string_data={"TOKEN": "s3cret-7"})
        core.create_namespaced_secret(name, secret)
        runs = episodes()
        for episode, (files, agent) in runs.items():
            create_episode(api_client, name, episode, episode_spec(files=files, agent=agent))
        yield {episode: wait_for_episode(api_client, name, episode, operator, timeout=600) for episode in runs}
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def assert_honest_zero(status: dict[str, Any]) -> None:
    turn = status["turns"][0]
    got = (status["phase"], status["outcome"], status["reward"], status["attempt"])
    assert got == ("Succeeded", "Graded", 0.0, 1), status
    assert (turn["rewardValid"], turn["verifierRewards"]) == (True, {"reward": 0.0}), status


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("who", USERS)
def test_the_honest_control_scores_what_the_task_gives(outcomes: dict[str, Any], mode: str, who: str) -> None:
    status = outcomes[f"honest-{mode}-{who}"]
    assert (status["phase"], status["reward"], status["attempt"]) == ("Succeeded", 1.0, 1), status


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("who", USERS)
def test_a_forged_verifier_job_record_and_reward_are_not_graded(outcomes: dict[str, Any], mode: str, who: str) -> None:
    """Reward 1, Graded, used to follow from these lines (shared): test.sh never ran."""
    assert_honest_zero(outcomes[f"forger-{mode}-{who}"])


def test_a_non_root_agents_leftover_processes_cannot_reach_the_verifier(outcomes: dict[str, Any]) -> None:
    """/tests and /logs/verifier were left 0777 without the sticky bit: a leftover process renamed its
    own test.sh in after the upload, and it ran as the verifier's user (root). Sealed, they cannot."""
    assert_honest_zero(outcomes["leftover-shared-non-root"])


@pytest.mark.parametrize("mode", MODES)
def test_the_agents_secrets_reach_the_agent_and_not_the_tasks_code(outcomes: dict[str, Any], mode: str) -> None:
    status = outcomes[f"secrets-{mode}"]
    assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), status
