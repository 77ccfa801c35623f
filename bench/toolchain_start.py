"""What each harness preset costs at pod start: pod created → harness runnable, and → its first model call.

Each case creates pods in a fresh namespace on the project's cluster, one after another, and times
two things from the create call:

- **created → runnable**: until a command succeeds in the main container. ``baseline``: the plain
  sandbox pod (the task image and an emptyDir, no init container) running ``true`` -- the earliest
  moment any agent could start. One case per preset: the same pod plus the init container that
  copies the toolchain tree into an emptyDir mounted read-only at the tree's path, running the
  harness's own ``--help`` (the tree loaded for real: its loader, libraries, and for Python its
  modules; mini-swe-agent has no ``--version``).
- **created → first model call**: a second pod of the same case, in which the harness is run with
  its preset's own command line and environment (``tests/cluster/toolchains.py``: the operator's
  presets pointed straight at the model, as the cluster tests run them) against the scripted model
  server (``tests/scripted_model``, one pod and Service in the namespace, a script that finishes at
  once), until the server records the first model request. ``baseline``: the most direct way to
  make one model request from the plain sandbox pod -- bash's ``/dev/tcp`` writing a
  chat-completions POST (the image has no curl, and python3 would add its own start).

The clock: the instant of the first request is the server's ``received_monotonic``
(``time.monotonic()`` in its pod). The node is this machine and containers get no time
namespace, so that is this process's CLOCK_MONOTONIC, the one the create call is timed on; each
run checks that the instant falls between the create call and the end of the exec. The harness's
own start → first call is the same instant less the exec's start, read from ``/proc/uptime``
in the pod (CLOCK_BOOTTIME, 10 ms steps, moved to the monotonic clock by this process's offset
between the two).

Figures per case (median of ``--repeats``, cases interleaved): both wall times, the copy alone
(the init container's own ``/proc/uptime`` before and after ``cp``, through its termination
message; median over both pods of each repeat), the first ``--help`` in the pod, and the harness's
start → first call. Ratios are a case's wall time over the baseline's in the same run. A preset
whose toolchain image is not on the node (the pod reports ``ErrImageNeverPull``) or whose harness
makes no model call is reported by name and skipped. Usage (cluster up, images loaded):
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

from bench.suite.run_record import RunRecord
from kubernetes import client, config
from tests.cluster.toolchains import HARNESSES, ExecResult, exec_argv, toolchain_pod
from tests.scripted_model.deploy import PORT, ScriptedModel, deploy_scripted_model

KUBECONFIG = Path("/var/lib/episode-operator/cluster/kubeconfig")
OUT = Path(__file__).resolve().parent / "out"
IMAGE = "episode-operator.local/sandbox:bookworm"
TIMED_COPY = (
    'read before _ < /proc/uptime; cp -a "$0/." /toolchain/ || exit 1; '
    'read after _ < /proc/uptime; echo "$before $after" > /dev/termination-log'
)
TIMED = 'read before _ < /proc/uptime; "$@" > /dev/null || exit 1; read after _ < /proc/uptime; echo "$before $after"'
# Runs the harness (or the direct request) after writing its start instant to stderr's first line.
STARTED = 'read started _ < /proc/uptime; echo "started $started" >&2; exec "$@"'
# The baseline's model call: one chat-completions request on a bash socket, the answer read to its end.
DIRECT_CALL = (
    'exec 3<>"/dev/tcp/$0/$1" && printf %s "$2" >&3 && read -r status <&3 && cat <&3 > /dev/null '
    '&& case "$status" in *" 200 "*) ;; *) echo "$status" >&2; exit 1 ;; esac'
)
MODEL = "scripted-m1"
TASK = "Episode pod-start benchmark: there is nothing to do, reply that you are done."
SCRIPT = {"rules": [{"name": "bench", "steps": [{"finish": "Done."}]}]}  # every request: finish at once
NOT_LOADED = {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff"}
POD_TIMEOUT = 300.0
HARNESS_TIMEOUT = 240.0


class ImageNotLoaded(Exception):
    """The node lacks the pod's image (``imagePullPolicy: Never``)."""


class CaseFailed(Exception):
    """The case cannot be measured (its harness made no model call, or failed to run)."""


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


def direct_request(model: ScriptedModel) -> str:
    """The bytes of one chat-completions request to the scripted server, as the baseline sends them."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": TASK}]})
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {model.cluster_ip}:{PORT}\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    )


def boottime_offset() -> float:
    """CLOCK_BOOTTIME less CLOCK_MONOTONIC (the time suspended; /proc/uptime is the former)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()


def wait_running(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Wait until the pod runs; raise ImageNotLoaded when the node lacks an image, CaseFailed if it fails."""
    deadline = time.monotonic() + POD_TIMEOUT
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Running":
            return
        for status in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
            if status.state.waiting is not None and status.state.waiting.reason in NOT_LOADED:
                raise ImageNotLoaded(status.image)
            if status.state.terminated is not None and status.state.terminated.exit_code != 0:
                raise CaseFailed(f"{name}: container {status.name} exited {status.state.terminated.exit_code}")
        if pod.status.phase in ("Failed", "Succeeded"):
            raise CaseFailed(f"{name}: pod {pod.status.phase} before running")
        time.sleep(0.05)
    raise CaseFailed(f"{name}: not running after {POD_TIMEOUT} s")


def exec_when_accepted(
    core: client.CoreV1Api, namespace: str, name: str, argv: list[str], env: dict[str, str] | None, timeout: float
) -> ExecResult:
    """Exec argv as soon as the exec API takes it (it answers only once the container runs)."""
    deadline = time.monotonic() + POD_TIMEOUT
    while True:
        try:
            return exec_argv(core, namespace, name, argv, env, timeout=timeout)
        except client.exceptions.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def copy_seconds(core: client.CoreV1Api, namespace: str, name: str) -> float:
    status = core.read_namespaced_pod(name, namespace).status.init_container_statuses[0]
    before, after = (float(value) for value in status.state.terminated.message.split())
    return after - before


def measure_runnable(core: client.CoreV1Api, namespace: str, toolchain: str | None, index: int) -> dict[str, float]:
    """Created → the harness's --help (baseline: true) succeeds in the main container."""
    name = f"{toolchain or 'baseline'}-{index}"
    command = ["true"] if toolchain is None else [HARNESSES[toolchain].entry, "--help"]
    started = time.monotonic()
    try:
        core.create_namespaced_pod(namespace, pod_manifest(name, toolchain))
        wait_running(core, namespace, name)
        result = exec_when_accepted(core, namespace, name, ["sh", "-c", TIMED, "timed", *command], None, 300)
        if result.exit_code != 0:
            raise CaseFailed(f"{name}: {command} exited {result.exit_code}: {result.stderr[-500:]}")
        wall = time.monotonic() - started
        before, after = (float(value) for value in result.stdout.split())
        figures = {"wall_seconds": wall, "command_seconds": after - before}
        if toolchain is not None:
            figures["copy_seconds"] = copy_seconds(core, namespace, name)
        return figures
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def measure_first_call(
    core: client.CoreV1Api, namespace: str, toolchain: str | None, index: int, model: ScriptedModel
) -> dict[str, Any]:
    """Created → the scripted server receives the harness's (baseline: the direct request's) first model call."""
    name = f"{toolchain or 'baseline'}-call-{index}"
    if toolchain is None:
        argv, env = ["bash", "-c", DIRECT_CALL, model.cluster_ip, str(PORT), direct_request(model)], None
    else:
        harness = HARNESSES[toolchain]
        argv, env = harness.command(TASK, MODEL, model.base_url, False), harness.environment(MODEL, model.base_url)
    model.clear()
    offset = boottime_offset()
    started = time.monotonic()
    try:
        core.create_namespaced_pod(namespace, pod_manifest(name, toolchain))
        wait_running(core, namespace, name)
        try:
            result = exec_when_accepted(core, namespace, name, ["sh", "-c", STARTED, "started", *argv], env, 240)
            exit_code, stderr = result.exit_code, result.stderr
        except TimeoutError as error:  # a harness that never ends may still have made its first call
            exit_code, stderr = None, str(error)
        ended = time.monotonic()
        requests = model.model_requests()
        if not requests:
            raise CaseFailed(f"{name}: no model request (exit {exit_code}): {stderr[-800:]}")
        first_request = min(requests, key=lambda r: r["received_monotonic"])
        first = first_request["received_monotonic"]
        if not started < first < ended:
            raise RuntimeError(f"{name}: first call at {first}, not within {started}..{ended}: not one clock")
        figures: dict[str, Any] = {
            "wall_seconds": first - started,
            "exit_code": exit_code,
            "model_requests": len(requests),
            # Whether the first call was the agent's loop (it offered the model tools or an answer format) or,
            # say, a title request made alongside it.
            "first_offered": first_request.get("offered"),
            "run_seconds": ended - started,
        }
        head = stderr.split("\n", 1)[0].split()
        if len(head) == 2 and head[0] == "started":
            figures["harness_seconds"] = first - (float(head[1]) - offset)
        if toolchain is not None:
            figures["copy_seconds"] = copy_seconds(core, namespace, name)
        return figures
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, float | None]]:
    """Per case: medians of both walls, the copy, --help and the harness's start → first call, ratios to baseline."""
    base = results["baseline"]
    base_runnable, base_call = median(base["runnable"], "wall_seconds"), median(base["first_call"], "wall_seconds")
    summary = {}
    for case, runs in results.items():
        runnable, call = median(runs["runnable"], "wall_seconds"), median(runs["first_call"], "wall_seconds")
        summary[case] = {
            "copy_seconds": median(runs["runnable"] + runs["first_call"], "copy_seconds"),
            "runnable_seconds": runnable,
            "runnable_ratio": runnable / base_runnable if runnable is not None and base_runnable else None,
            "first_call_seconds": call,
            "first_call_ratio": call / base_call if call is not None and base_call else None,
            "help_seconds": median(runs["runnable"], "command_seconds"),
            "harness_to_first_call_seconds": median(runs["first_call"], "harness_seconds"),
        }
    return summary


COLUMNS = (
    ("copy", "copy_seconds", "{:.2f}"),
    ("pod→runnable", "runnable_seconds", "{:.2f}"),
    ("ratio", "runnable_ratio", "{:.2f}"),
    ("pod→first call", "first_call_seconds", "{:.2f}"),
    ("ratio", "first_call_ratio", "{:.2f}"),
    ("--help", "help_seconds", "{:.2f}"),
    ("start→first call", "harness_to_first_call_seconds", "{:.2f}"),
)


def table(summary: dict[str, dict[str, float | None]], repeats: int) -> str:
    """The printed table (also a Markdown table): one row per case, baseline first."""
    header = ["case", *(title for title, _, _ in COLUMNS)]
    rows = [
        [case, *("--" if figures[key] is None else fmt.format(figures[key]) for _, key, fmt in COLUMNS)]
        for case, figures in summary.items()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join("-" * (w - 1) + (":" if i else "-") for i, w in enumerate(widths)) + " |"
    return "\n".join([line(header), rule, *(line(row) for row in rows)]) + f"\n(seconds, medians of {repeats})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--toolchains", default=",".join(sorted(HARNESSES)))
    args = parser.parse_args()
    unknown = set(args.toolchains.split(",")) - set(HARNESSES)
    if unknown:
        parser.error(f"no such preset: {', '.join(sorted(unknown))} (presets: {', '.join(sorted(HARNESSES))})")
    config.load_kube_config(str(KUBECONFIG))
    core = client.CoreV1Api()
    namespace = f"bench-toolchain-{uuid.uuid4().hex[:6]}"
    record = RunRecord.start()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    cases: list[str | None] = [None, *args.toolchains.split(",")]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    skipped: dict[str, str] = {}  # preset → why it has no figures
    try:
        while not core.list_namespaced_service_account(namespace).items:
            time.sleep(0.2)
        model = deploy_scripted_model(core, namespace, SCRIPT, IMAGE)
        for index in range(args.repeats):
            for toolchain in cases:  # interleaved, so drift in the machine's load hits every case alike
                case = toolchain or "baseline"
                if case in skipped:
                    continue
                runs = results.setdefault(case, {"runnable": [], "first_call": []})
                try:
                    runs["runnable"].append(measure_runnable(core, namespace, toolchain, index))
                    runs["first_call"].append(measure_first_call(core, namespace, toolchain, index, model))
                except ImageNotLoaded as missing:
                    if toolchain is None:
                        raise
                    skipped[case] = f"toolchain image not loaded on the node: {missing}"
                except CaseFailed as failure:
                    if toolchain is None:
                        raise
                    skipped[case] = str(failure)
                if case in skipped:  # no more runs of it; its figures so far stay, if it has both
                    print(f"{case}: skipped, {skipped[case]}", file=sys.stderr)
                    if not (runs["runnable"] and runs["first_call"]):
                        del results[case]
    finally:
        core.delete_namespace(namespace)
    summary = summarise(results)
    printed = table(summary, args.repeats)
    print(printed)
    for case, why in skipped.items():
        print(f"{case}: {'figures of the runs before: ' if case in results else 'no figures: '}{why}")
    record.write(
        OUT / "toolchain_start.json",
        repeats=args.repeats,
        clock="time.monotonic() of this process and of the scripted server's pod (one kernel, no time namespace)",
        summary=summary,
        skipped=skipped,
        runs=results,
        table=printed,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
