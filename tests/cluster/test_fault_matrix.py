"""A fault in every stage of a turn ends with the fault-free reward or a recorded outage (issue 23).

Never a different graded reward: a sandbox lost and silently replaced mid-episode, or an
operator that resumed somewhere else, shows as a turn graded on a sandbox that did not see the
earlier turns. The task makes that visible: three steps, each agent appending its step's name
to a ledger, each test.sh scoring 1 only when the ledger holds exactly the steps so far. The
fault-free reward is 1; an episode that went on in a fresh pod scores less.

For each stage of turn 2 (of 3, so that a separate turn's verifier runs beside the agent pod)
and each fault:

- **operator killed** (SIGKILL, started again): the fault-free reward in attempt 1;
- **agent pod deleted** while the operator runs: an outage, and attempt 2 scores 1;
- **verifier pod deleted** (separate turns): an outage, and attempt 2 scores 1;
- **operator down while a pod is deleted** (killed, the pod deleted, started again): an outage
  recorded by the restarted operator (the pod's uid is in the status), and attempt 2 scores 1.

and, once, the agent pod deleted in the agent stage and the operator killed in the outage's
back-off that follows: attempt 2, written before the back-off, is the one the restarted
operator runs (an outage, then reward 1 in attempt 2).

The stages that run a job (setup, healthcheck, agent, collect, verify) are held there: that
job waits for a file the test writes once the fault is in place (``/tmp/held`` then
``/tmp/release``, in the pod the job runs in), so the fault strikes inside the stage. The stages
with no job that the status records before they run (cleanup; for a separate turn
verify-prepare and done) are struck as soon as the status shows them. workdir and trajectory run
no job and are not written: a fault there is one in the stage the status shows, and the unit
tier kills the runner inside each of them (test_turn_machine.py).

The module runs an operator of its own, in namespaces outside the session operator's prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from tests.cluster.conftest import REPO_ROOT, delete_namespace_while_watched, wait_for_default_service_account
from tests.cluster.harness import (
    GROUP,
    PLURAL,
    TERMINAL,
    VERSION,
    OperatorProcess,
    create_episode,
    episode_spec,
    install_crd,
    read_episode,
)

# Tries at stopping the operator inside a stage only the status shows (see freeze_at).
FREEZE_TRIES = 4

STEPS = ("a", "b", "c")
FAULTED = "b"  # the middle turn: a separate verifier of it runs beside the agent pod
HELD = "/tmp/held"
RELEASE = "/tmp/release"
GATE = f"touch {HELD}; until [ -e {RELEASE} ]; do sleep 0.1; done"
JOB_STAGES = ("setup", "healthcheck", "agent", "collect", "verify")
# Stages without a job that the status records before they run, by verifier mode.
STATUS_STAGES = {"shared": ("cleanup",), "separate": ("cleanup", "verify-prepare", "done")}
EPISODE_TIMEOUT_SEC = 600


def ledger_check(upto: str) -> str:
    expected = "".join(f"{step}\\n" for step in STEPS[: STEPS.index(upto) + 1])
    return (
        f'if [ "$(cat /app/runs.txt 2>/dev/null)" = "$(printf "{expected}")" ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )


def gated_task(mode: str, held: str | None) -> dict[str, str]:
    """The ledger task whose turn 2 holds in stage ``held`` (None: nowhere, the fault-free control)."""

    def gate(stage: str, otherwise: str = "true") -> str:
        return GATE if held == stage else otherwise

    toml = ['schema_version = "1.4"\n[task]\nname = "fault-matrix/ledger"\n']
    toml.append("[agent]\ntimeout_sec = 900.0\n[verifier]\ntimeout_sec = 900.0\n")
    toml.append('[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\nworkdir = "/app"\n')
    files: dict[str, str] = {}
    for step in STEPS:
        faulted = step == FAULTED
        table = f'\n[[steps]]\nname = "{step}"\n'
        if mode == "separate":
            table += 'artifacts = ["/app/runs.txt"]\n'
        table += "[steps.agent]\ntimeout_sec = 900.0\n"
        if faulted:
            table += f'[steps.healthcheck]\ncommand = "{gate("healthcheck")}"\ntimeout_sec = 900.0\nretries = 1\n'
        table += "[steps.verifier]\ntimeout_sec = 900.0\n"
        if mode == "separate":
            table += 'environment_mode = "separate"\n'
        if faulted:
            table += f'[[steps.verifier.collect]]\ncommand = "{gate("collect")}"\ntimeout_sec = 900.0\n'
        toml.append(table)
        files[f"steps/{step}/instruction.md"] = f"Append {step} to /app/runs.txt.\n"
        files[f"steps/{step}/workdir/setup.sh"] = (gate("setup") if faulted else "true") + "\n"
        files[f"steps/{step}/tests/test.sh"] = (gate("verify") + "\n" if faulted else "") + ledger_check(step)
    files["task.toml"] = "".join(toml)
    return files


def agent_command(held: str | None) -> str:
    gate = GATE if held == "agent" else "true"
    return f'echo "$EPISODE_TURN_NAME" >> /app/runs.txt\nif [ "$EPISODE_TURN_NAME" = {FAULTED} ]; then {gate}; fi'


@dataclass(frozen=True)
class Case:
    mode: str  # shared | separate
    stage: str
    fault: str  # operator-killed | agent-pod-deleted | verifier-pod-deleted | operator-down-pod-deleted

    @property
    def name(self) -> str:
        digest = hashlib.sha256(f"{self.mode}{self.stage}{self.fault}".encode()).hexdigest()[:6]
        return f"fm-{self.mode[:3]}-{self.stage}-{digest}"

    @property
    def held(self) -> bool:
        return self.stage in JOB_STAGES

    @property
    def victim(self) -> str:
        """Whose pod the fault deletes: the agent's or the faulted turn's verifier's."""
        return (
            "verifier"
            if self.fault == "verifier-pod-deleted"
            or (self.fault == "operator-down-pod-deleted" and self.mode == "separate" and self.stage == "verify")
            else "agent"
        )

    @property
    def outage(self) -> bool:
        """Whether the fault loses what the attempt needs: a pod it uses again. A separate turn's
        verifier deleted once its reward is recorded (``done``) is one the turn was letting go."""
        if self.fault == "operator-killed":
            return False
        return not (self.fault == "verifier-pod-deleted" and self.stage == "done")


def cases() -> list[Case]:
    found = []
    for mode in ("shared", "separate"):
        for stage in (*STATUS_STAGES[mode][:1], *JOB_STAGES, *STATUS_STAGES[mode][1:]):
            for fault in ("operator-killed", "agent-pod-deleted", "operator-down-pod-deleted"):
                found.append(Case(mode, stage, fault))
            # (In verify-prepare the verifier pod may not be made yet when the status shows the stage.)
            if mode == "separate" and stage in ("verify", "done"):
                found.append(Case(mode, stage, "verifier-pod-deleted"))
    return found


# --- the cluster side -----------------------------------------------------------------------------
def pod_names(core: client.CoreV1Api, namespace: str, episode: str) -> list[str]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"episode-operator.dev/episode={episode}")
    return [pod.metadata.name for pod in pods.items if not pod.metadata.deletion_timestamp]


_EXEC_CLIENTS = threading.local()


def exec_api(core: client.CoreV1Api) -> client.CoreV1Api:
    """This thread's own client for execs: ``stream`` swaps the request method of the client it
    is given while the exec runs, so a client shared with another thread turns that thread's
    GETs into websocket handshakes (which the API server answers 200, an ApiException)."""
    own = getattr(_EXEC_CLIENTS, "core", None)
    if own is None:
        own = _EXEC_CLIENTS.core = client.CoreV1Api(client.ApiClient(core.api_client.configuration))
    return own


def in_pod(core: client.CoreV1Api, namespace: str, pod: str, command: str) -> str | None:
    """``command``'s output in the pod's main container; None when the pod cannot be reached."""
    try:
        return str(
            stream(
                exec_api(core).connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container="main",
                command=["sh", "-c", command],
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
            )
        )
    except (ApiException, Exception):  # a pod going away answers in many ways; the caller asks again
        return None


def held_pod(core: client.CoreV1Api, namespace: str, episode: str) -> str | None:
    for pod in pod_names(core, namespace, episode):
        if (in_pod(core, namespace, pod, f"[ -e {HELD} ] && echo held") or "").strip() == "held":
            return pod
    return None


def stage_of(api: client.ApiClient, namespace: str, episode: str) -> tuple[int | None, str | None]:
    return turn_stage(read_episode(api, namespace, episode).get("status") or {})


def wait_until(condition: Callable[[], Any], what: str, timeout: float, log: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} not after {timeout:.0f} s\n{log()}")


@contextlib.contextmanager
def releasing(core: client.CoreV1Api, namespace: str, episodes: list[str]) -> Iterator[None]:
    """Every held job of these episodes is released as soon as it holds (attempt 2 holds again)."""
    stop = threading.Event()

    def release() -> None:
        while not stop.is_set():
            for episode in episodes:
                for pod in pod_names(core, namespace, episode):
                    in_pod(core, namespace, pod, f"[ -e {HELD} ] && touch {RELEASE}")
            stop.wait(0.5)

    worker = threading.Thread(target=release, daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(timeout=30)


def finished(api: client.ApiClient, namespace: str, episodes: list[str], log: Callable[[], str]) -> dict[str, Any]:
    statuses: dict[str, Any] = {}

    def all_done() -> bool:
        for episode in episodes:
            status = read_episode(api, namespace, episode).get("status") or {}
            if status.get("phase") in TERMINAL:
                statuses[episode] = status
        return len(statuses) == len(episodes)

    wait_until(all_done, f"episodes {sorted(set(episodes) - set(statuses))} finished", EPISODE_TIMEOUT_SEC, log)
    return statuses


def verdict(case: Case, status: dict[str, Any]) -> str | None:
    """What is wrong with how the case ended (None: the fault-free reward, or an outage recorded)."""
    attempts = status.get("attempts") or []
    got = (status.get("phase"), status.get("outcome"), status.get("reward"), len(attempts))
    if case.outage:
        lost = (attempts[0].get("reason") or "") if attempts else ""
        if got != ("Succeeded", "Graded", 1.0, 2) or lost.split(":")[0] not in ("pod_lost", "container_exited", "exec"):
            return f"{case}: want an outage then reward 1 in attempt 2, got {got}, attempt 1 ended {lost!r}"
        return None
    if got != ("Succeeded", "Graded", 1.0, 1):
        return f"{case}: want the fault-free reward 1 in attempt 1, got {got}: {status.get('message')}"
    return None


# --- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def matrix(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, str]]:
    """The test's own operator (it is killed), watching only the test's own namespace (outside the
    session operator's prefix): each fault runs on a worker of its own, beside the others."""
    install_crd(api_client)
    namespace = f"fm{hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:4]}-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for_default_service_account(core, namespace)
    operator = OperatorProcess(kubeconfig, tmp_path / "data", tmp_path / "operator.log", namespace)
    operator.start()
    try:
        yield operator, namespace
    finally:
        delete_namespace_while_watched(core, namespace)
        operator.stop()


def start(api: client.ApiClient, namespace: str, batch: list[Case], name: str | None = None) -> None:
    """Each case's Episode, named after the case (or ``name``, for a batch of one)."""
    for case in batch:
        held = case.stage if case.held else None
        spec = episode_spec(
            files=gated_task(case.mode, held), agent={"kind": "command", "command": agent_command(held)}
        )
        create_episode(api, namespace, name or case.name, spec)


def victim_pod(case: Case, episode: str) -> str:
    return f"{episode}-a1" if case.victim == "agent" else f"{episode}-a1-v{STEPS.index(FAULTED) + 1}"


def strike(core: client.CoreV1Api, namespace: str, case: Case, episode: str | None = None) -> None:
    with contextlib.suppress(ApiException):
        core.delete_namespaced_pod(victim_pod(case, episode or case.name), namespace, grace_period_seconds=0)


def turn_stage(status: dict[str, Any]) -> tuple[int | None, str | None]:
    turn = status.get("currentTurn")
    turns = status.get("turns") or []
    return turn, turns[turn].get("stage") if turn is not None and turn < len(turns) else None


def freeze_at(api: client.ApiClient, namespace: str, episode: str, stage: str, operator: OperatorProcess) -> bool:
    """Stop the operator (SIGSTOP) inside ``stage`` of turn 2, a stage no job holds: the status
    shows it for milliseconds, too short for polling. At the first watch event showing it the
    operator is stopped; True when the status, read once it is stopped, still shows the stage
    (the fault strikes inside it); False, the operator running again, when it had gone on."""
    assert operator.process is not None
    watcher = watch.Watch()
    try:
        for event in watcher.stream(
            client.CustomObjectsApi(api).list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            field_selector=f"metadata.name={episode}",
            timeout_seconds=300,
        ):
            status = event["object"].get("status") or {}
            if turn_stage(status) == (STEPS.index(FAULTED), stage):
                os.kill(operator.process.pid, signal.SIGSTOP)
                break
            if status.get("phase") in TERMINAL:
                return False
        else:
            raise AssertionError(f"{episode}: no event showed turn 2 in {stage} within 300 s\n{operator.log_tail()}")
    finally:
        watcher.stop()
    if stage_of(api, namespace, episode) == (STEPS.index(FAULTED), stage):
        return True
    os.kill(operator.process.pid, signal.SIGCONT)
    return False


def reached(api: client.ApiClient, core: client.CoreV1Api, namespace: str, case: Case) -> bool:
    """Turn 2 is inside the case's stage: its job holds there, or the status shows it."""
    if case.held:
        pod = held_pod(core, namespace, case.name)
        return pod is not None and (case.victim == "agent" or pod == victim_pod(case, case.name))
    return stage_of(api, namespace, case.name) == (STEPS.index(FAULTED), case.stage)


# A test per fault and verifier mode, each with its own operator: the stages only the status shows run
# one after another, so a test per fault alone was the tier's longest (CI's --durations: up to 230 s).
FAULT_MODES = sorted({(case.fault, case.mode) for case in cases()})


@pytest.mark.parametrize(("fault", "mode"), FAULT_MODES, ids=[f"{fault}-{mode}" for fault, mode in FAULT_MODES])
def test_a_fault_in_every_stage_ends_with_the_fault_free_reward_or_an_outage(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    matrix: tuple[OperatorProcess, str],
    fault: str,
    mode: str,
) -> None:
    operator, namespace = matrix
    batch = [case for case in cases() if (case.fault, case.mode) == (fault, mode)]
    log = operator.log_tail
    held = [case for case in batch if case.held]
    caught = [case for case in batch if not case.held]
    # The stages a job holds: all at once, each struck where it holds.
    start(api_client, namespace, held)
    for case in held:
        wait_until(lambda case=case: reached(api_client, core, namespace, case), f"{case} held", 300, log)
    if fault in ("operator-killed", "operator-down-pod-deleted"):
        operator.kill()
    if fault != "operator-killed":
        for case in held:
            strike(core, namespace, case)
    if not operator.process or operator.process.poll() is not None:
        operator.start()
    with releasing(core, namespace, [case.name for case in held]):
        statuses = finished(api_client, namespace, [case.name for case in held], log)
    # The stages the status shows: one at a time, the operator stopped inside each (freeze_at), then
    # struck. A try whose operator had gone on before it stopped runs to its end, uncounted.
    for case in caught:
        episode = None
        for attempt in range(FREEZE_TRIES):
            name = case.name if attempt == 0 else f"{case.name}-{attempt}"
            start(api_client, namespace, [case], name)
            if freeze_at(api_client, namespace, name, case.stage, operator):
                episode = name
                break
            finished(api_client, namespace, [name], log)
        assert episode is not None, f"{case}: the operator never stopped inside {case.stage} in {FREEZE_TRIES} tries"
        if fault in ("operator-killed", "operator-down-pod-deleted"):
            operator.kill()
        if fault != "operator-killed":
            strike(core, namespace, case, episode)
        assert operator.process is not None
        if operator.process.poll() is None:
            os.kill(operator.process.pid, signal.SIGCONT)  # it runs on, and meets the loss
        else:
            operator.start()
        statuses[case.name] = finished(api_client, namespace, [episode], log)[episode]
    wrong = [problem for case in batch if (problem := verdict(case, statuses[case.name])) is not None]
    assert not wrong, "\n".join(wrong) + f"\noperator log:\n{log()}"


def test_an_operator_killed_in_the_back_off_after_a_lost_pod_runs_the_next_attempt_once(
    api_client: client.ApiClient, core: client.CoreV1Api, matrix: tuple[OperatorProcess, str]
) -> None:
    """The issue's second case: the agent pod deleted in turn 2, then the operator killed within the
    outage's back-off. Attempt 2 is written before the back-off is waited, so the restarted operator
    resumes it: an outage, then reward 1 in attempt 2, and never a third attempt or a graded 0.25."""
    operator, namespace = matrix
    case = Case("shared", "agent", "agent-pod-deleted")
    start(api_client, namespace, [case])
    wait_until(lambda: reached(api_client, core, namespace, case), f"{case} held", 300, operator.log_tail)
    strike(core, namespace, case)
    assert operator.process is not None
    watcher = watch.Watch()
    try:
        for event in watcher.stream(
            client.CustomObjectsApi(api_client).list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            field_selector=f"metadata.name={case.name}",
            timeout_seconds=300,
        ):
            attempts = (event["object"].get("status") or {}).get("attempts") or []
            if len(attempts) == 2 and attempts[1].get("notBefore") and not attempts[1].get("readyAt"):
                operator.kill()  # inside the back-off: attempt 2 is written, not started
                break
        else:
            raise AssertionError(f"{case}: no event showed attempt 2 in its back-off\n{operator.log_tail()}")
    finally:
        watcher.stop()
    operator.start()
    with releasing(core, namespace, [case.name]):
        status = finished(api_client, namespace, [case.name], operator.log_tail)[case.name]
    assert verdict(case, status) is None, (verdict(case, status), operator.log_tail())
