"""What a harness toolchain costs at pod start: pod created → harness runnable, against a plain sandbox pod.

Each case creates a pod in a fresh namespace on the project's cluster and waits until a command
succeeds in its main container:

- ``baseline``: the plain sandbox pod (the task image and an emptyDir, no init container); the
  command is ``true`` -- the earliest moment any agent could start;
- one case per toolchain: the same pod plus the init container that copies the toolchain tree
  into an emptyDir mounted read-only at the tree's path; the command is the harness's own
  ``--help`` (the tree loaded for real: its loader, libraries, and for Python its modules;
  mini-swe-agent has no ``--version``).

Figures per case (median of ``--repeats``): wall time from the create call to the command's
success (this process's monotonic clock), the copy alone (the init container's own
``/proc/uptime`` before and after ``cp``, reported through its termination message), and the
harness's first ``--help`` in the pod. The ratio is a case's wall time over the baseline's,
measured in the same run. Usage (cluster up, images loaded):
``.venv/bin/python bench/toolchain_start.py [--repeats 3] [--toolchains opencode,codex]``;
writes ``bench/out/toolchain_start.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the cluster-test helpers

from kubernetes import client, config
from tests.cluster.toolchains import HARNESSES, exec_argv, toolchain_pod

KUBECONFIG = Path("/var/lib/episode-operator/cluster/kubeconfig")
OUT = Path(__file__).resolve().parent / "out"
IMAGE = "episode-operator.local/sandbox:bookworm"
TIMED_COPY = (
    'read before _ < /proc/uptime; cp -a "$0/." /toolchain/ || exit 1; '
    'read after _ < /proc/uptime; echo "$before $after" > /dev/termination-log'
)
TIMED = 'read before _ < /proc/uptime; "$@" > /dev/null || exit 1; read after _ < /proc/uptime; echo "$before $after"'


def pod_manifest(name: str, toolchain: str | None) -> dict[str, Any]:
    """The benchmarked pod: a toolchain pod with a timed copy, or the same pod without the toolchain."""
    if toolchain is None:
        manifest = toolchain_pod(name, HARNESSES["codex"], IMAGE)
        manifest["spec"]["initContainers"] = []
        manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "logs", "mountPath": "/logs"}]
        return manifest
    harness = HARNESSES[toolchain]
    manifest = toolchain_pod(name, harness, IMAGE)
    manifest["spec"]["initContainers"][0]["command"] = ["/bin/sh", "-c", TIMED_COPY, harness.root]
    return manifest


def measure(core: client.CoreV1Api, namespace: str, toolchain: str | None, index: int) -> dict[str, float]:
    name = f"{toolchain or 'baseline'}-{index}"
    command = ["true"] if toolchain is None else [HARNESSES[toolchain].entry, "--help"]
    started = time.monotonic()
    core.create_namespaced_pod(namespace, pod_manifest(name, toolchain))
    while core.read_namespaced_pod(name, namespace).status.phase != "Running":
        time.sleep(0.05)
    while True:  # the exec API answers only once the container runs; retry until the command succeeds
        try:
            result = exec_argv(core, namespace, name, ["sh", "-c", TIMED, "timed", *command], timeout=300)
        except client.exceptions.ApiException:
            time.sleep(0.05)
            continue
        if result.exit_code == 0:
            break
        raise RuntimeError(f"{name}: {command} exited {result.exit_code}: {result.stderr[-500:]}")
    wall = time.monotonic() - started
    before, after = (float(value) for value in result.stdout.split())
    figures = {"wall_seconds": wall, "command_seconds": after - before}
    if toolchain is not None:
        status = core.read_namespaced_pod(name, namespace).status.init_container_statuses[0]
        copy_before, copy_after = (float(value) for value in status.state.terminated.message.split())
        figures["copy_seconds"] = copy_after - copy_before
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--toolchains", default=",".join(sorted(HARNESSES)))
    args = parser.parse_args()
    config.load_kube_config(str(KUBECONFIG))
    core = client.CoreV1Api()
    namespace = f"bench-toolchain-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    while not core.list_namespaced_service_account(namespace).items:
        time.sleep(0.2)
    cases: list[str | None] = [None, *args.toolchains.split(",")]
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for index in range(args.repeats):
            for toolchain in cases:  # interleaved, so drift in the machine's load hits every case alike
                results.setdefault(toolchain or "baseline", []).append(measure(core, namespace, toolchain, index))
    finally:
        core.delete_namespace(namespace)
    baseline = statistics.median(r["wall_seconds"] for r in results["baseline"])
    print(f"{'case':<16}{'created→runnable':>18}{'ratio':>8}{'copy':>8}{'--help':>11}   (medians of {args.repeats}, s)")
    summary = {}
    for case, runs in results.items():
        wall = statistics.median(r["wall_seconds"] for r in runs)
        copy = statistics.median(r["copy_seconds"] for r in runs) if case != "baseline" else 0.0
        command = statistics.median(r["command_seconds"] for r in runs)
        summary[case] = {
            "wall_seconds": wall,
            "ratio": wall / baseline,
            "copy_seconds": copy,
            "command_seconds": command,
        }
        print(f"{case:<16}{wall:>18.2f}{wall / baseline:>8.2f}{copy:>8.2f}{command:>11.2f}")
    OUT.mkdir(exist_ok=True)
    (OUT / "toolchain_start.json").write_text(json.dumps({"summary": summary, "runs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
