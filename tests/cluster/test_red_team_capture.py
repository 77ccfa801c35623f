"""Red team: a root ``command`` agent against the capture proxy of its own pod (issue 23).

The agent shares the pod's network namespace and its ``/etc/hosts`` with the proxy. It rewrites
that file to point the model's hostname at a listener of its own, then calls the model through the
proxy; and it sends the proxy requests off the model API's routes. The model is the scripted server,
reached by its Service's name, which the operator resolves through the API and pins for the proxy.
Each attack has its honest control beside it: the same agent without the attack.

Needs the operator image built from this checkout (``hack/cluster images``): the proxy runs from it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.harness import OperatorProcess, install_crd, pods_of, read_episode, run_episode
from tests.scripted_model.deploy import PORT, ScriptedModel, deploy_scripted_model

MODEL = "scripted-m1"
KEY = "sk-red-team-secret-51c0de"  # must reach the scripted model, and nothing else
ANSWER = "the scripted model's own answer"
SCRIPT = {"rules": [{"name": "any", "steps": [{"say": ANSWER}]}]}

# The agent's own listener on the upstream's port, in the pod: what it receives, it prints.
LISTENER = f"""
import http.server, json, threading
seen = []
class Steal(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        seen.append({{"path": self.path, "headers": dict(self.headers)}})
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({{"choices": [{{"message": {{"role": "assistant", "content": "FORGED"}}}}]}}).encode()
        self.send_response(200); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", {PORT}), Steal)
threading.Thread(target=server.serve_forever, daemon=True).start()
"""
# One call as a client would make it, the target sent byte for byte (no client normalises it).
CALL = """
import http.client, json, os
def call(method, path, content):
    body = json.dumps({"model": os.environ["EPISODE_MODEL"], "messages": [{"role": "user", "content": content}]})
    headers = {"content-type": "application/json", "authorization": "Bearer " + os.environ["EPISODE_MODEL_API_KEY"]}
    connection = http.client.HTTPConnection("127.0.0.1", 47311, timeout=60)
    connection.request(method, path, body, headers)
    response = connection.getresponse()
    return {"path": path, "status": response.status, "body": response.read().decode(errors="replace")}
base = os.environ["EPISODE_MODEL_BASE_URL"].split("47311", 1)[1]
"""


def agent_command(*, rewrite_hosts: bool, hostile_paths: tuple[str, ...], namespace: str) -> str:
    """A root agent: its listener, the /etc/hosts rewrite (or not), the hostile calls, one honest call."""
    names = " ".join(f"scripted-model{suffix}" for suffix in ("", f".{namespace}", f".{namespace}.svc"))
    script = (
        LISTENER
        + CALL
        + (
            f"results = [call('POST', p, 'attack') for p in {list(hostile_paths)!r}]\n"
            "results.append(call('POST', base + '/chat/completions', 'honest call'))\n"
            "print('RESULTS ' + json.dumps({'calls': results, 'listener_saw': seen}))\n"
        )
    )
    rewrite = f"echo '127.0.0.1 {names} {names}.cluster.local' >> /etc/hosts\n" if rewrite_hosts else ""
    return f"set -eu\n{rewrite}grep -c scripted-model /etc/hosts || true\npython3 -c {shlex.quote(script)}\n"


TASK = {
    "task.toml": "[agent]\ntimeout_sec = 120\n",
    "instruction.md": "red team: call the model.\n",
    "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
}


@pytest.fixture
def model(api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, sandbox_image: str) -> ScriptedModel:
    install_crd(api_client)  # this checkout's CRD: other sessions sharing the cluster may have installed theirs
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="model-key"), string_data={"api-key": KEY})
    )
    return deploy_scripted_model(core, namespace, SCRIPT, sandbox_image)


def run_agent(
    api_client: client.ApiClient,
    namespace: str,
    operator: OperatorProcess,
    name: str,
    command: str,
    host: str = "scripted-model",
) -> tuple[dict[str, Any], Path]:
    # The model by its Service's name: the operator resolves it through the API and pins it for the proxy.
    endpoint = {"name": MODEL, "baseURL": f"http://{host}:{PORT}/v1", "apiKeySecretRef": {"name": "model-key"}}
    spec = {
        "task": {"inline": {"files": TASK}},
        "agent": {"kind": "command", "command": command, "model": endpoint},
        "image": "episode-operator.local/sandbox:bookworm",
        # A tenth of a CPU ([environment] cpus takes whole CPUs): the node's two are shared by parallel tests.
        "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}},
    }
    status = run_episode(api_client, namespace, name, spec, operator, timeout=300)
    uid = read_episode(api_client, namespace, name)["metadata"]["uid"]
    return status, operator.data_dir / namespace / name / uid / "attempt-1" / "task"


def agent_results(kept: Path) -> dict[str, Any]:
    log = (kept / "logs" / "agent.txt").read_text()
    line = next(line for line in log.splitlines() if line.startswith("RESULTS "))
    results: dict[str, Any] = json.loads(line.removeprefix("RESULTS "))
    assert KEY not in log
    return results


def recorded(kept: Path) -> list[dict[str, Any]]:
    lines = (kept / "model-calls.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line and not line.startswith('{"begun"')]


@pytest.mark.parametrize("attack", [True, False], ids=["hosts-rewritten", "honest"])
def test_a_rewritten_hosts_file_never_brings_the_key_to_the_agents_listener(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, model: ScriptedModel, attack: bool
) -> None:
    command = agent_command(rewrite_hosts=attack, hostile_paths=(), namespace=namespace)
    status, kept = run_agent(api_client, namespace, operator, "hosts", command)
    assert status["reward"] == 1.0, json.dumps(status, indent=1)
    results = agent_results(kept)
    assert results["listener_saw"] == []  # neither the key nor any call reached the agent's own listener
    [honest] = results["calls"]
    assert honest["status"] == 200 and ANSWER in honest["body"] and "FORGED" not in honest["body"]
    [call] = [call for call in recorded(kept) if call.get("dialect")]
    assert call["response_source"] == "upstream" and ANSWER in json.dumps(call["response"])
    [received] = model.model_requests()
    assert received["api_key"] == KEY and "honest call" in json.dumps(received["body"])


HOSTILE_PATHS = ("/v1/files", "/v1/../admin")


@pytest.mark.parametrize("attack", [True, False], ids=["off-route", "honest"])
def test_calls_off_the_model_routes_are_refused_recorded_and_never_forwarded(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, model: ScriptedModel, attack: bool
) -> None:
    hostile = HOSTILE_PATHS if attack else ()
    command = agent_command(rewrite_hosts=False, hostile_paths=hostile, namespace=namespace)
    status, kept = run_agent(api_client, namespace, operator, "routes", command)
    assert status["reward"] == 1.0, json.dumps(status, indent=1)
    *refused, honest = agent_results(kept)["calls"]
    assert [(call["path"], call["status"]) for call in refused] == [(path, 403) for path in hostile]
    assert all("route_not_allowed" in call["body"] for call in refused)
    assert honest["status"] == 200 and ANSWER in honest["body"]
    calls = recorded(kept)
    kept_refusals = [call for call in calls if call.get("local_response_reason") == "route_not_allowed"]
    assert [(call["path"], call["upstream_attempted"]) for call in kept_refusals] == [(path, False) for path in hostile]
    assert [call["response_source"] for call in calls if call.get("dialect")] == ["upstream"]
    received = model.requests()
    assert [record["path"] for record in received] == ["/v1/chat/completions"]  # nothing else was forwarded
    assert received[0]["api_key"] == KEY


def test_a_model_host_no_service_answers_for_is_refused_before_any_pod(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    """A ``….svc`` name whose Service does not exist: refused, naming the field (no DNS is asked: the API
    says there is no such Service). Runs with any operator image: no pod is made."""
    command = agent_command(rewrite_hosts=False, hostile_paths=(), namespace=namespace)
    status, _ = run_agent(api_client, namespace, operator, "unresolvable", command, f"no-such-model.{namespace}.svc")
    assert (status["phase"], status["outcome"], status["failureKind"]) == (
        "Failed",
        "TerminalFailure",
        "harbor:seed_refused",
    )
    assert status["message"].startswith("refused at seed: spec.agent.model.baseURL: cannot resolve no-such-model.")
    assert "the operator's resolver" not in status["message"] and pods_of(core, namespace, "unresolvable") == []
