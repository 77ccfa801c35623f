"""``kubectl episode`` against the real API server, as a kubectl user runs it: no ``-n``.

The kubeconfig is the cluster's admin one with two contexts: ``work`` (current) whose namespace is
the test's, and ``elsewhere`` with another. Every command is the console script, run as a process
with ``$KUBECONFIG`` pointing at that file, so the namespace can only come from the context.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.harness import (
    EXAMPLES,
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    context_kubeconfig,
    create_episode,
    episode_spec,
    read_episode,
    wait_for_episode,
)
from tests.cluster.toolchains import exec_argv

KUBECTL_EPISODE = str(Path(sys.executable).parent / "kubectl-episode")


class Lines(queue.Queue[str]):
    """The lines a command in the background prints (stdout and stderr), and the command."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        super().__init__()
        self.process = process


class Plugin:
    """Runs ``kubectl-episode`` with ``$KUBECONFIG`` set, as a user's shell would."""

    def __init__(self, kubeconfig: Path) -> None:
        self.environ = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [KUBECTL_EPISODE, *args], capture_output=True, text=True, env=self.environ, timeout=600, check=False
        )
        assert result.returncode == code, f"kubectl-episode {' '.join(args)}: {result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
        return result

    @contextlib.contextmanager
    def watching(self, *args: str) -> Iterator[Lines]:
        """``kubectl-episode ARGS`` running in the background; its stdout lines arrive on the queue."""
        process = subprocess.Popen(
            [KUBECTL_EPISODE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.environ
        )
        lines = Lines(process)

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.put(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            yield lines
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
            reader.join(timeout=30)


# After the command has exited, how long its last lines may take to come through the pipe's reader.
EXITED_DRAIN_SEC = 5.0


def read_until(lines: Lines, done: Callable[[str], bool], what: str, timeout: float = 240) -> list[str]:
    """Lines read up to the first for which ``done`` is true; a command that exits without printing it
    fails the test then (its last lines read), not at the timeout."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    exited_at: float | None = None
    while not seen or not done(seen[-1]):
        now = time.monotonic()
        assert now < deadline, f"no line {what} in {timeout} s:\n" + "\n".join(seen)
        if exited_at is None and lines.process.poll() is not None:
            exited_at = now
        assert exited_at is None or now - exited_at < EXITED_DRAIN_SEC or not lines.empty(), (
            f"no line {what}: the command exited ({lines.process.returncode}) after:\n" + "\n".join(seen)
        )
        with contextlib.suppress(queue.Empty):
            seen.append(lines.get(timeout=min(deadline - now, 1.0)))
    return seen


def until(predicate: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.5)


def pod_gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def held_episode(api: client.ApiClient, namespace: str) -> str:
    """A suspended Episode (never runs): what a watch lists first, so the test knows the watch is on."""
    create_episode(api, namespace, "held", episode_spec(EXAMPLES / "hello", suspend=True))
    return "held"


@pytest.fixture
def plugin(kubeconfig: Path, namespace: str, tmp_path: Path) -> Plugin:
    path = context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace, "elsewhere": f"{namespace}-x"})
    return Plugin(path)


def test_the_plugin_works_in_the_contexts_namespace(
    plugin: Plugin,
    namespace: str,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    hello = str(EXAMPLES / "hello")
    held = held_episode(api_client, namespace)
    with plugin.watching("get", "-w") as table:
        # The listing first: the header and the held Episode; then every change.
        listed = read_until(table, lambda line: line.startswith(held), "listing the held Episode")
        assert listed[0].split() == ["NAME", "PHASE", "REWARD", "TURNS", "OUTCOME", "AGE"], listed
        created = plugin("run", hello, "--wait")
        assert f" created in {namespace}\n" in created.stdout
        name = created.stdout.split()[0].removeprefix("episode/")
        assert "Succeeded (Graded): reward 1" in created.stdout
        rows = read_until(table, lambda line: line.startswith(name) and " Succeeded " in line, "Succeeded")
        assert next(row.split()[1] for row in rows if row.startswith(name)) != "Succeeded", rows
        assert rows[-1].split()[:5] == [name, "Succeeded", "1", "1/1", "Graded"], rows

    # get in every format, in the context's namespace.
    assert [name, "Succeeded"] in [line.split()[:2] for line in plugin("get").stdout.splitlines()]
    assert plugin("get", "-o", "name").stdout == "".join(
        f"episode.episode-operator.dev/{episode}\n" for episode in sorted([held, name])
    )
    one = json.loads(plugin("get", name, "-o", "json").stdout)
    assert (one["kind"], one["metadata"]["namespace"], one["status"]["reward"]) == ("Episode", namespace, 1.0)
    listing = yaml.safe_load(plugin("get", "-o", "yaml").stdout)
    assert (listing["kind"], sorted(item["metadata"]["name"] for item in listing["items"])) == (
        "List",
        sorted([held, name]),
    )
    assert "FAILURE" in plugin("get", "-o", "wide").stdout.splitlines()[0]
    everywhere = plugin("get", "-A").stdout.splitlines()
    assert everywhere[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert [namespace, name] in [line.split()[:2] for line in everywhere]

    # -l selects by label, as kubectl's does.
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"labels": {"team": "a"}}}
    )
    assert plugin("get", "-l", "team=a", "-o", "name").stdout.strip().endswith(f"/{name}")
    nothing = plugin("get", "-l", "team=b")
    assert (nothing.stdout, nothing.stderr) == ("", f"No resources found in {namespace} namespace.\n")

    # --context: the other context's namespace.
    elsewhere = plugin("get", "--context", "elsewhere")
    assert elsewhere.stderr == f"No resources found in {namespace}-x namespace.\n"
    missing = plugin("get", "--context", "nowhere", code=1)
    assert missing.stderr.strip().endswith("no context 'nowhere' (contexts: elsewhere, work)")

    # describe, logs by turn number or name, export to a folder: all without -n.
    described = " ".join(plugin("describe", name).stdout.split())  # rich wraps at 80 columns off a terminal
    assert f"{namespace}/{name}: Succeeded (Graded)" in described
    turn = read_episode(api_client, namespace, name)["status"]["turns"][0]["name"]
    data = ("--data-dir", str(operator.data_dir))
    by_number = plugin("logs", name, "--turn", "1", *data).stdout
    assert by_number and by_number == plugin("logs", name, "--turn", turn, *data).stdout
    assert f"turn {turn}" in by_number
    unknown = plugin("logs", name, "--turn", "2", *data, code=2)
    assert f"no turn '2' (turns: seed, 1 {turn})" in unknown.stderr
    out = tmp_path / "rows"
    exported = plugin("export", "--output-dir", str(out))
    assert exported.stdout.startswith("1 rollout(s) to ")
    (row,) = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert row["episode"] == f"{namespace}/{name}"

    # pack without -n: the context's namespace too.
    packed = plugin("pack", hello).stdout.strip().removeprefix("configmap/")
    assert core.read_namespaced_config_map(packed, namespace).metadata.name == packed


def test_get_watch_prints_each_change_as_json(
    plugin: Plugin, namespace: str, api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    """``-w -o json`` prints one object per change (as kubectl does), the first being the one created."""
    held = held_episode(api_client, namespace)
    with plugin.watching("get", "-w", "-o", "json") as stream:
        first = read_until(stream, lambda line: line == "}", "ending the held Episode's object")
        assert json.loads("\n".join(first))["metadata"]["name"] == held
        name = plugin("run", str(EXAMPLES / "hello")).stdout.split()[0].removeprefix("episode/")
        # Object by object until the new Episode's own phase is Succeeded: its status says "Succeeded"
        # elsewhere first (the ending, outcome and all, is written before the phase).
        objects: list[dict[str, Any]] = []
        while not any(
            obj["metadata"]["name"] == name and (obj.get("status") or {}).get("phase") == "Succeeded" for obj in objects
        ):
            objects.append(json.loads("\n".join(read_until(stream, lambda line: line == "}", "ending an object"))))
    phases = [(obj.get("status") or {}).get("phase") for obj in objects if obj["metadata"]["name"] == name]
    assert phases[0] is None and "Running" in phases and phases[-1] == "Succeeded", phases


@pytest.mark.parametrize("pod_gone_first", [False, True], ids=["live", "pod-gone-before-the-end-was-read"])
def test_logs_follow_prints_the_running_agent_as_it_writes_and_ends_with_it(
    plugin: Plugin,
    namespace: str,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    operator: OperatorProcess,
    pod_gone_first: bool,
) -> None:
    """``logs -f`` as a user runs it while the agent works: its first line arrives while the agent
    still waits (the test holds it), the rest once the test lets it go, and the command ends with the
    agent, exit 0. Before the agent starts it waits and says so.

    ``pod-gone-before-the-end-was-read``: what CI met twice — the agent, let go, ended and its Episode
    finished and deleted the pod before the command's next read. Here the command is stopped (SIGSTOP)
    until the pod is gone: it must print the rest from what the operator kept, each line once."""
    command = "echo first-line; while [ ! -f /tmp/release ]; do sleep 0.2; done; echo second-line"
    # Suspended until the command has said it waits: a command slower to start than the Episode's seed
    # would otherwise meet the agent already running, and rightly not wait.
    spec = episode_spec(EXAMPLES / "hello", agent={"kind": "command", "command": command}, suspend=True)
    with plugin.watching("logs", "followed", "-f", "--data-dir", str(operator.data_dir)) as stream:
        create_episode(api_client, namespace, "followed", spec)
        read_until(stream, lambda line: line.startswith("waiting for a turn of"), "saying it waits")
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "followed", {"spec": {"suspend": False}}
        )
        read_until(stream, lambda line: line == "first-line", "of the agent's first line")
        status = read_episode(api_client, namespace, "followed")["status"]
        assert (status["phase"], status["turns"][0]["stage"]) == ("Running", "agent"), status  # live, not kept
        pod = next(p["name"] for p in status["attempts"][-1]["pods"] if p["role"] == "agent")
        if pod_gone_first:
            os.kill(stream.process.pid, signal.SIGSTOP)
        try:
            released = exec_argv(core, namespace, pod, ["touch", "/tmp/release"], timeout=60)
            assert released.exit_code == 0, released.stderr
            if pod_gone_first:
                wait_for_episode(api_client, namespace, "followed", operator)
                until(lambda: pod_gone(core, namespace, pod), f"pod {pod} deleted once its Episode finished")
        finally:
            if pod_gone_first:
                os.kill(stream.process.pid, signal.SIGCONT)
        seen = read_until(stream, lambda line: line == "second-line", "of the agent's second line")
        assert "first-line" not in seen, "each line once"
        assert stream.process.wait(timeout=120) == 0  # it ends with the agent, not by the test's SIGTERM
        rest = [line for line in stream.queue if "the rest is what the operator kept" in line]
        if pod_gone_first:  # gone, or going: "is gone", or "no longer answers" from an exec the pod's end cut
            assert rest and f"{pod} " in rest[0] and "after 11 bytes of its output" in rest[0], list(stream.queue)
        assert not [line for line in stream.queue if "Traceback" in line]
