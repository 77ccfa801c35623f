"""What Gym's ``/run`` adds to a try: its round trip through the operator's Gym server, against creating
the same Episode directly and watching it end.

One operator (``episode-operator run`` with ``--gym-port``, through ``tests/cluster/harness.py``, pid
recorded) drives one fresh namespace, where the examples are packed as a dataset. Each repeat runs
two tries of ``examples::hello`` with a ``command`` agent, alternately:

- ``gym``: ``POST /run`` (a flat row, Basic credentials as Gym's collector sends them) until its answer
  is read -- the server creates the Episode, follows it with a watch and builds the answer from the
  Episode and the operator's store;
- ``direct`` (the baseline: the best direct way): the same Episode spec, under another name, created
  with the Kubernetes client, followed with a watch of its name until it is terminal, then read.

Both use the same sandboxes and the same operator, so the difference is the server's own cost: parsing,
the catalogue lookup, its create and watch, and the answer. Figures: median and mean wall time of each,
their difference and ratio, measured in the same run. Usage (cluster up, images loaded):
``.venv/bin/python bench/gym_run.py [--repeats 8]``; writes ``bench/out/gym_run.json``.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the cluster-test helpers

from kubernetes import client, config, watch
from tests.cluster.harness import GROUP, PLURAL, gym_operator

KUBECONFIG = Path("/var/lib/episode-operator/cluster/kubeconfig")
OUT = Path(__file__).resolve().parent / "out"
VERSION = "v1alpha1"
TOKEN = "bench-gym-token"


def post_run(port: int, index: int) -> dict[str, Any]:
    row = {
        "instance_id": "examples::hello",
        "responses_create_params": {"input": []},
        "_ng_task_index": 0,
        "_ng_rollout_index": index,
        "agent_ref": {"name": "episode_agent"},
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/run",
        data=json.dumps(row).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(f"bench:{TOKEN}".encode()).decode(),
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


def direct(custom: client.CustomObjectsApi, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    name = f"direct-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": name}, "spec": spec}
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        field_selector=f"metadata.name={name}",
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=600,
    )
    for event in stream:
        if (event["object"].get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            episode: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return episode
    raise TimeoutError(f"{name} did not end in 600 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    config.load_kube_config(str(KUBECONFIG))
    api = client.ApiClient()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"bench-gym-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    work = OUT / namespace
    work.mkdir(parents=True, exist_ok=True)
    agent = {"kind": "command", "command": "echo 'Hello, world!' > /app/hello.txt"}
    try:
        with gym_operator(KUBECONFIG, api, namespace, work, agent, TOKEN) as (_, port):
            return measure(custom, namespace, port, args.repeats)
    finally:
        core.delete_namespace(namespace)


def measure(custom: client.CustomObjectsApi, namespace: str, port: int, repeats: int) -> int:
    post_run(port, 999)  # warm: the image on the node, the server's first connection
    spec = next(
        e["spec"]
        for e in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        if e["metadata"]["name"].startswith("gym-0-999-")
    )
    direct(custom, namespace, spec)
    figures: dict[str, list[float]] = {"gym": [], "direct": []}
    for index in range(repeats):
        for case in ("gym", "direct") if index % 2 == 0 else ("direct", "gym"):
            started = time.monotonic()
            if case == "gym":
                answer = post_run(port, index)
                assert answer.get("reward") == 1.0, answer
            else:
                episode = direct(custom, namespace, spec)
                assert episode["status"].get("reward") == 1.0, episode["status"]
            figures[case].append(time.monotonic() - started)
        gym, plain = figures["gym"][-1], figures["direct"][-1]
        print(f"repeat {index + 1}/{repeats}: gym {gym:.3f} s, direct {plain:.3f} s")
    summary = {
        case: {"median_s": statistics.median(values), "mean_s": statistics.fmean(values), "runs": values}
        for case, values in figures.items()
    }
    difference = summary["gym"]["median_s"] - summary["direct"]["median_s"]
    ratio = summary["gym"]["median_s"] / summary["direct"]["median_s"]
    print(f"{'case':8} {'median s':>9} {'mean s':>8}")
    for case in ("direct", "gym"):
        print(f"{case:8} {summary[case]['median_s']:9.3f} {summary[case]['mean_s']:8.3f}")
    print(f"/run over direct: {difference * 1000:+.0f} ms median, ratio {ratio:.3f}")
    OUT.mkdir(exist_ok=True)
    result = {"repeats": repeats, "cases": summary, "difference_s": difference, "ratio": ratio}
    (OUT / "gym_run.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
