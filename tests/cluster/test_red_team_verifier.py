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

from typing import Any

import pytest
from kubernetes import client

from tests.cluster.harness import OperatorProcess, episode_spec, run_episode

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


def run_agent(
    api: client.ApiClient,
    namespace: str,
    name: str,
    command: str,
    mode: str,
    user: str | None,
    operator: OperatorProcess,
    **extra: Any,
) -> dict[str, Any]:
    spec = episode_spec(files=task(mode, user), agent={"kind": "command", "command": command, **extra})
    return run_episode(api, namespace, name, spec, operator, timeout=300)


def assert_honest_zero(status: dict[str, Any]) -> None:
    turn = status["turns"][0]
    assert (status["phase"], status["outcome"], status["reward"], status["attempt"]) == (
        "Succeeded",
        "Graded",
        0.0,
        1,
    ), status
    assert (turn["rewardValid"], turn["verifierRewards"]) == (True, {"reward": 0.0}), status


USERS = [None, "nobody"]
USER_IDS = ["root", "non-root"]


@pytest.mark.parametrize("mode", ["shared", "separate"])
@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_the_honest_control_scores_what_the_task_gives(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, mode: str, user: str | None
) -> None:
    status = run_agent(api_client, namespace, "honest", HONEST, mode, user, operator)
    assert (status["phase"], status["reward"], status["attempt"]) == ("Succeeded", 1.0, 1), status


@pytest.mark.parametrize("mode", ["shared", "separate"])
@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_a_forged_verifier_job_record_and_reward_are_not_graded(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, mode: str, user: str | None
) -> None:
    """Reward 1, Graded, used to follow from these lines (shared): test.sh never ran."""
    assert_honest_zero(run_agent(api_client, namespace, "forger", FORGE_RECORD, mode, user, operator))


def test_a_non_root_agents_leftover_processes_cannot_reach_the_verifier(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """/tests and /logs/verifier were left 0777 without the sticky bit: a leftover process renamed its
    own test.sh in after the upload, and it ran as the verifier's user (root). Sealed, they cannot."""
    assert_honest_zero(run_agent(api_client, namespace, "leftover", LEFTOVER, "shared", "nobody", operator))


def test_the_agents_secrets_reach_the_agent_and_not_the_tasks_code(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    """The task's own setup.sh and test.sh (possibly from a dataset nobody audited) see no agent secret;
    the agent does (the control): test.sh scores 1 only when both hold."""
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="agent-keys"), string_data={"TOKEN": "s3cret-7"})
    )
    toml = (
        'schema_version = "1.4"\n[task]\nname = "red-team/secrets"\n[agent]\ntimeout_sec = 60.0\n'
        '[verifier]\ntimeout_sec = 60.0\n[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\n'
        'workdir = "/app"\n[[steps]]\nname = "only"\n'
    )
    check = (
        "saw=$(cat /app/agent-saw.txt); leaked=$(grep -c s3cret-7 /app/setup-env.txt /proc/1/environ 2>/dev/null "
        "| grep -vc ':0$'); mine=$(env | grep -c s3cret-7)\n"
        'if [ "$saw" = s3cret-7 ] && [ "$leaked" = 0 ] && [ "$mine" = 0 ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )
    files = {
        "task.toml": toml,
        "steps/only/instruction.md": "Say the token.\n",
        "steps/only/workdir/setup.sh": "env > /app/setup-env.txt\n",
        "steps/only/tests/test.sh": check,
    }
    agent = {
        "kind": "command",
        "command": 'printf %s "$TOKEN" > /app/agent-saw.txt',
        "envFrom": [{"secretRef": {"name": "agent-keys"}}],
    }
    status = run_episode(
        api_client, namespace, "secrets", episode_spec(files=files, agent=agent), operator, timeout=300
    )
    assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), status
