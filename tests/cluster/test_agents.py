"""Episodes with real agent harnesses against a model endpoint, every model call captured (issue 12).

Everything is real but the model: the harness toolchains `hack/cluster images` built, copied into
agent pods by init containers; the capture proxy in its own container of the agent pod (the
operator's image); the operator driving turns; the scripted model server (the one allowed test
double) deployed as a pod, its answers making the harnesses run given commands.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes import client

from episode_operator.runtime.agents.harnesses import PRESETS
from tests.cluster.harness import (
    OperatorProcess,
    context_kubeconfig,
    create_episode,
    install_crd,
    pods_of,
    read_episode,
    run_episode,
    wait_for_episode,
)
from tests.cluster.test_gitops import Shell
from tests.reference import check_failure_row, check_rollout_row, harbor_trajectory
from tests.scripted_model.deploy import ScriptedModel, deploy_scripted_model

MODEL = "scripted-m1"
KEY = "sk-scripted-secret-7f3a9c"  # must reach the model, and appear nowhere the operator writes
TURN_ONE = "Agent episode, turn one: create the greeting file."
TURN_TWO = "Agent episode, turn two: append to the greeting file."
GREETING = "/app/greeting.txt"
SCRIPT = {
    "rules": [
        {
            "name": "turn-1",
            "when": {"prompt": TURN_ONE, "tools": True},
            "steps": [{"run": f"mkdir -p /app && echo hello > {GREETING}"}, {"finish": "Created it."}],
        },
        {
            "name": "turn-2",
            "when": {"prompt": TURN_TWO, "tools": True},
            # The previous turn's trajectory.json must be gone while this turn's agent runs.
            "steps": [
                {"run": f"test -e /logs/agent/trajectory.json || echo again >> {GREETING}"},
                {"finish": "Appended."},
            ],
        },
    ]
}
# The same turns for a harness whose model acts by the edits of its answer and runs no commands (its
# registry entry's `acts`: aider): each turn writes the file whole. The check that turn one's trajectory
# is gone while turn two's agent runs needs a command, so it rides on the other presets' runs.
EDITS_SCRIPT = {
    "rules": [
        {
            "name": "turn-1",
            "when": {"prompt": TURN_ONE, "tools": True},
            "steps": [{"write": GREETING, "content": "hello\n"}, {"finish": "Created it."}],
        },
        {
            "name": "turn-2",
            "when": {"prompt": TURN_TWO, "tools": True},
            "steps": [{"write": GREETING, "content": "hello\nagain\n"}, {"finish": "Appended."}],
        },
    ]
}
# The agent's budget is a bound for a loaded machine, not a measure: a harness done in seconds on an idle
# machine ran out of 240 s (opencode's first turn) with the cluster tier's workers and others' jobs beside it.
TASK_TOML = """
[agent]
timeout_sec = 600

[[steps]]
name = "one"

[[steps]]
name = "two"
"""
# Each verifier checks the turn's effect, and that its trajectory is its own turn's.
TEST_ONE = f"""#!/bin/bash
grep -qx hello {GREETING} || {{ echo 0 > /logs/verifier/reward.txt; exit 0; }}
grep -q "turn one" /logs/agent/trajectory.json && ! grep -q "turn two" /logs/agent/trajectory.json \\
  && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
TEST_TWO = f"""#!/bin/bash
[ "$(cat {GREETING})" = "$(printf 'hello\\nagain')" ] || {{ echo 0 > /logs/verifier/reward.txt; exit 0; }}
grep -q "turn two" /logs/agent/trajectory.json \\
  && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""


def task_files(toml: str = TASK_TOML) -> dict[str, str]:
    return {
        "task.toml": toml,
        "steps/one/instruction.md": TURN_ONE + "\n",
        "steps/two/instruction.md": TURN_TWO + "\n",
        "steps/one/tests/test.sh": TEST_ONE,
        "steps/two/tests/test.sh": TEST_TWO,
    }


def agent(model: ScriptedModel, harness: str, **extra: Any) -> dict[str, Any]:
    api = PRESETS[harness].entry.apis[0]
    endpoint = {"name": MODEL, "baseURL": f"{model.base_url}/v1", "api": api, "apiKeySecretRef": {"name": "model-key"}}
    return {"kind": "harness", "harness": {"name": harness}, "model": endpoint, **extra}


def spec(agent_spec: dict[str, Any], files: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "task": {"inline": {"files": files or task_files()}},
        "agent": agent_spec,
        "image": "episode-operator.local/sandbox:bookworm",
        **extra,
    }


@pytest.fixture
def scripted(api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, sandbox_image: str) -> ScriptedModel:
    # This checkout's CRDs (spec.agent.kind: harness): other sessions sharing the cluster may have
    # installed theirs since this session started.
    install_crd(api_client)
    return deploy_scripted_model(core, namespace, SCRIPT, sandbox_image)


@pytest.fixture
def model(core: client.CoreV1Api, namespace: str, scripted: ScriptedModel) -> Iterator[ScriptedModel]:
    """The scripted model, and its key in the Secret ``model-key``."""
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="model-key"), string_data={"api-key": KEY})
    )
    yield scripted


def turn_of(record: dict[str, Any]) -> str:
    """Which instruction a recorded request answers (the newest user message names it)."""
    text = json.dumps(record["body"])
    return "two" if TURN_TWO in text else "one" if TURN_ONE in text else "?"


def kept(operator: OperatorProcess, namespace: str, name: str, uid: str) -> Path:
    return operator.data_dir / namespace / name / uid


def stored_calls(root: Path, attempt: int, turn: str) -> list[dict[str, Any]]:
    path = root / f"attempt-{attempt}" / turn / "model-calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line and not line.startswith('{"begun"')]


# The Episode's sampling, and what every call upstream must carry of it, by the preset's API.
PARAMS = {"temperature": 0.25, "top_p": 0.5, "max_tokens": 3000}
CAP_NAME = {"chat-completions": "max_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}


# Every preset in a fresh session per turn, and each that can continue one also with turnSessions: continue.
SESSIONS = [(name, "fresh") for name in PRESETS] + [
    (name, "continue") for name, preset in PRESETS.items() if preset.entry.continues
]


@pytest.mark.parametrize(("harness", "sessions"), SESSIONS, ids=[f"{name}-{mode}" for name, mode in SESSIONS])
def test_a_harness_solves_two_turns_with_every_call_captured(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    model: ScriptedModel,
    harness: str,
    sessions: str,
) -> None:
    """Each preset, as a whole Episode: both turns solved, every call captured and attributed to its
    turn, each sent with the Episode's sampling (spec.agent.model.params) whatever the harness asked;
    turn two's conversation carries turn one exactly when the session is continued."""
    if PRESETS[harness].entry.acts == "edits":
        model.set_script(EDITS_SCRIPT)
    endpoint = agent(model, harness, turnSessions=sessions)
    endpoint["model"]["params"] = PARAMS
    status = run_episode(api_client, namespace, "solve", spec(endpoint), operator, timeout=1500)
    assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), json.dumps(status, indent=1)
    episode = read_episode(api_client, namespace, "solve")
    root = kept(operator, namespace, "solve", episode["metadata"]["uid"])
    served = [record for record in model.model_requests() if record.get("rule")]
    assert served and all(record["api_key"] == KEY for record in served)  # the proxy put the real key in
    turn_two = [record for record in served if record["rule"] == "turn-2"]
    assert (TURN_ONE in json.dumps(turn_two[0]["body"])) == (sessions == "continue"), sessions
    cap = CAP_NAME[endpoint["model"]["api"]]
    sampled = [(r["body"].get("temperature"), r["body"].get("top_p"), r["body"].get(cap)) for r in served]
    assert set(sampled) == {(PARAMS["temperature"], PARAMS["top_p"], PARAMS["max_tokens"])}, sampled
    for turn in ("one", "two"):
        calls = stored_calls(root, 1, turn)
        answered = [record for record in served if turn_of(record) == turn]
        # Every call of the turn the model saw is captured and attributed to the turn, none other. (A call of
        # no dialect -- a route the proxy refused, as Hermes's LM Studio probe -- is stored without the key.)
        assert len([call for call in calls if call.get("dialect")]) >= len(answered) > 0, turn
        assert all(call["turn"] == turn and call["attempt"] == 1 for call in calls)
        trajectory = json.loads((root / "attempt-1" / turn / "trajectory.json").read_text())
        assert trajectory["schema_version"].startswith("ATIF")
        harbor_trajectory().model_validate(trajectory)  # as Harbor's own models read an agent's ATIF
    # The key is the proxy's alone: not in the status, the Events, the store or the agent's pod spec.
    assert_key_nowhere(core, api_client, namespace, "solve", root)


def assert_key_nowhere(core: client.CoreV1Api, api: client.ApiClient, namespace: str, name: str, root: Path) -> None:
    assert KEY not in json.dumps(read_episode(api, namespace, name))
    events = core.list_namespaced_event(namespace)
    assert KEY not in json.dumps(api.sanitize_for_serialization(events))
    for path in root.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


FAILURES = {
    "unauthorized": ({"status": 401}, "Ungraded", "agent:model_auth"),
    "rate-limited": ({"status": 429}, "Ungraded", "outage:model_rate_limit"),
    "broken": ({"status": 500}, "Ungraded", "outage:model_unavailable"),
    "garbage": ({"kind": "garbage"}, "Ungraded", "outage:model_unavailable"),
    "silent": ({"kind": "hang"}, "Ungraded", "outage:model_unavailable"),
}


def test_a_failing_endpoint_ends_each_episode_in_its_class_and_every_one_exports_as_a_gym_row(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, model: ScriptedModel, tmp_path: Path
) -> None:
    """Five opencodes, each failed by the endpoint in one way, and beside them one the endpoint serves well
    (the two-turn task): each ends in its class, and ``kubectl episode export`` writes the graded one as a
    rollout row and the five as failure rows, each validating against Gym's own models."""
    rules = [
        {"name": name, "when": {"prompt": f"failure case {name}"}, "fail": fail}
        for name, (fail, _, _) in FAILURES.items()
    ]
    model.set_script({"rules": [*SCRIPT["rules"], *rules]})
    create_episode(api_client, namespace, "graded", spec(agent(model, "opencode")))
    # Five opencodes start at once, each migrating its own database: on a 2-core machine the unauthorized
    # one ran 88 s from its start to its exit on the 401 (a CI run's was still starting when a 30 s budget
    # ended it, and graded it).
    budget = 150
    # "silent" hangs until a bound ends it: ending within this wait in its class, not harbor:task_deadline
    # (the Episode's deadline, the sum of its budgets), is the turn's budget ending it. How long after the
    # budget the ending comes (the kill, the harvest, the status) is the machine's, not asserted: 109 s with
    # the cluster tier's workers and others' jobs beside it, where a 60 s allowance failed the test.
    wait = 900
    toml = f"[agent]\ntimeout_sec = {budget}\n"
    for name in FAILURES:
        files = {
            "task.toml": toml,
            "instruction.md": f"failure case {name}: do nothing.\n",
            "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        }
        create_episode(api_client, namespace, name, spec(agent(model, "opencode"), files, retries={"outages": 0}))
    for name, (_, outcome, failure_kind) in FAILURES.items():
        status = wait_for_episode(api_client, namespace, name, operator, timeout=wait)
        evidence = failure_evidence(operator, namespace, name, status)
        assert (status.get("outcome"), status.get("failureKind")) == (outcome, failure_kind), evidence
        if name == "silent":  # the harness waits for ever on its call: only the time limit ended it (SIGTERM)
            assert status["turns"][0].get("agentExitCode") == 143, evidence
    status = wait_for_episode(api_client, namespace, "graded", operator, timeout=wait)
    evidence = failure_evidence(operator, namespace, "graded", status)
    assert (status["phase"], status["reward"]) == ("Succeeded", 1.0), evidence

    rows = export(namespace, operator, tmp_path)
    [graded] = rows["rollouts.jsonl"]
    check_rollout_row(graded)
    assert graded["reward"] == 1.0 and len(graded["turns"]) == 2
    assert graded["ng_model_call_capture"]["metrics"]["num_calls"] >= 2
    for failure in rows["rollouts_failures.jsonl"]:
        check_failure_row(failure)
    exported = sorted(row["failure_kind"] for row in rows["rollouts_failures.jsonl"])
    assert exported == sorted(kind for _, _, kind in FAILURES.values()), exported


def failure_evidence(operator: OperatorProcess, namespace: str, name: str, status: dict[str, Any]) -> str:
    """What a failed expectation about an Episode shows: its status and the tail of every file kept for it."""
    shown = [name, json.dumps(status, indent=1)]
    folder = operator.data_dir / namespace / name
    for path in sorted(folder.rglob("*")) if folder.exists() else []:
        if path.is_file():
            shown.append(f"--- {path.relative_to(folder)}\n{path.read_bytes()[-1500:].decode(errors='replace')}")
    return "\n".join(shown)


# Specs the operator refuses, each with what its message must name. No model answers: the endpoint is an
# address nothing serves, the refusals come before any pod.
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-harness": ({"harness": {"name": "no-such"}}, "spec.agent.harness.name: unknown harness 'no-such'"),
    "wrong-api": ({"harness": {"name": "codex"}}, "spec.agent.model.api: codex speaks responses, not chat-completions"),
    "mini-continues": (
        {"turnSessions": "continue", "harness": {"name": "mini-swe-agent"}},
        "mini-swe-agent cannot continue",
    ),
    "terminus-continues": (
        {"turnSessions": "continue", "harness": {"name": "terminus-2"}},
        "terminus-2 cannot continue",
    ),
    "no-secret": ({"secret": "no-such-key"}, "spec.agent.model.apiKeySecretRef: secret"),
}


def test_bad_agent_specs_are_refused_before_any_pod_starts(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="model-key"), string_data={"api-key": KEY})
    )
    nowhere = cast(ScriptedModel, SimpleNamespace(base_url="http://198.18.0.1:9"))
    for name, (agent_change, _) in REFUSED.items():
        agent_spec = agent(nowhere, "opencode")
        change = dict(agent_change)
        if "secret" in change:
            agent_spec["model"]["apiKeySecretRef"] = {"name": change.pop("secret")}
        agent_spec.update(change)
        create_episode(api_client, namespace, name, spec(agent_spec))
    for name, (_, fragment) in REFUSED.items():
        status = wait_for_episode(api_client, namespace, name, operator)
        assert (status["phase"], status["outcome"]) == ("Failed", "TerminalFailure"), (name, status)
        assert fragment in status["message"], (name, status["message"])
        assert pods_of(core, namespace, name) == [], name


# A real call through the proxy with the placeholder key it was given.
CLIENT = """
import json, os, urllib.request
instruction = open(os.environ["EPISODE_INSTRUCTION_FILE"]).read()
body = {"model": os.environ["EPISODE_MODEL"], "messages": [{"role": "user", "content": instruction}]}
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["EPISODE_MODEL_API_KEY"]}
url = os.environ["EPISODE_MODEL_BASE_URL"] + "/chat/completions"
request = urllib.request.Request(url, json.dumps(body).encode(), headers)
print(urllib.request.urlopen(request, timeout=30).read()[:200])
"""
# Then attempts on what the operator keeps: the capture store (not mounted here), and the trajectory
# file, rewritten for ever by a process left behind.
FORGE = "while :; do echo FORGED > /logs/agent/trajectory.json; sleep 0.2; done"
HOSTILE = f"""set -u
python3 -c {shlex.quote(CLIENT)}
mkdir -p /capture/calls/attempt-1 && echo '{{"forged": true}}' > /capture/calls/attempt-1/task.jsonl || true
nohup sh -c {shlex.quote(FORGE)} >/dev/null 2>&1 &
"""


def test_an_agent_cannot_change_what_is_captured_or_exported(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, model: ScriptedModel, tmp_path: Path
) -> None:
    model.set_script({"rules": [{"name": "any", "when": {"prompt": "hostile"}, "steps": [{"say": "fine"}]}]})
    endpoint = agent(model, "opencode")["model"]
    files = {
        "task.toml": "[agent]\ntimeout_sec = 60\n",
        "instruction.md": "hostile agent: say hello.\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    }
    hostile = {"kind": "command", "command": HOSTILE, "model": endpoint}
    status = run_episode(api_client, namespace, "hostile", spec(hostile, files), operator, timeout=300)
    assert status["reward"] == 1.0, json.dumps(status, indent=1)
    episode = read_episode(api_client, namespace, "hostile")
    root = kept(operator, namespace, "hostile", episode["metadata"]["uid"])
    calls = stored_calls(root, 1, "task")
    assert [call["turn"] for call in calls if call["dialect"]] == ["task"]
    assert "forged" not in json.dumps(calls)
    kept_trajectory = (root / "attempt-1" / "task" / "trajectory.json").read_text()
    assert "FORGED" not in kept_trajectory and "hostile agent" in kept_trajectory
    rows = export(namespace, operator, tmp_path)
    assert "FORGED" not in json.dumps(rows) and "forged" not in json.dumps(rows)
    [row] = rows["rollouts.jsonl"]
    check_rollout_row(row)
    assert row["ng_model_call_capture"]["metrics"]["num_calls"] == 1


def export(namespace: str, operator: OperatorProcess, tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """``kubectl episode export`` as a user runs it, against this session's operator's data directory."""
    plugin = str(Path(sys.executable).parent / "kubectl-episode")
    subprocess.run(
        [
            plugin,
            "export",
            "-n",
            namespace,
            "--kubeconfig",
            str(operator.kubeconfig),
            "--data-dir",
            str(operator.data_dir),
            "--output-dir",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return {
        name: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        for name in ("rollouts.jsonl", "rollouts_failures.jsonl")
    }


README = Path(__file__).resolve().parents[2] / "README.md"
HELLO = {
    "rules": [
        {
            "name": "hello",
            "when": {"prompt": "Hello, world!", "tools": True},
            "steps": [{"run": "printf 'Hello, world!\\n' > /app/hello.txt"}, {"finish": "Done."}],
        }
    ]
}


def test_the_readme_runs_a_real_agent_as_printed(
    kubeconfig: Path, namespace: str, operator: OperatorProcess, scripted: ScriptedModel, tmp_path: Path
) -> None:
    """README's "Run a real agent" block, run by bash as printed (its Secret included), against the scripted model."""
    block = README.read_text().split("<!-- BEGIN run-a-real-agent -->\n```sh\n")[1].split("```\n<!-- END")[0]
    model = scripted
    model.set_script(HELLO)
    shell = Shell(context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace}), tmp_path / "repo")
    shell.environ |= {
        "MODEL_URL": f"{model.base_url}/v1",
        "MODEL_NAME": MODEL,
        "MODEL_API_KEY": KEY,
        # This session's operator runs here, not in the cluster: its data directory is where logs are kept.
        "EPISODE_OPERATOR_DATA_DIR": str(operator.data_dir),
    }
    transcript = shell(block, timeout=900)
    assert "Hello, world!" in transcript  # the trajectory shows the model's command
    [row] = [json.loads(line) for line in (tmp_path / "repo" / "rollouts" / "rollouts.jsonl").read_text().splitlines()]
    check_rollout_row(row)
    assert row["reward"] == 1.0 and row["ng_model_call_capture"]["metrics"]["num_calls"] >= 1
