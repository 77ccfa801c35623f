"""Every shipped harness runs from its toolchain in the plain sandbox image, offline, and does what the model says.

Real parts only, but for the model: the toolchain images `hack/cluster images` built, an init
container copying the tree into an emptyDir, the sandbox image as the task image (no Node, and a
Python the harness must not use), no DNS, the scripted model server as a pod reached by its
Service IP. Each harness is run with the exact command line and environment of
docs/harnesses.md (tests/cluster/toolchains.py), the instruction one argv element.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.toolchains import (
    API_KEY,
    HARNESS_APIS,
    HARNESSES,
    LOGS,
    Harness,
    exec_argv,
    toolchain_pod,
    wait_for_running,
)
from tests.reference import harbor_trajectory
from tests.scripted_model.deploy import ScriptedModel, deploy_scripted_model

MODEL = "scripted-m1"
TURN_ONE = "Episode toolchain check, turn one: create the greeting file."
TURN_TWO = "Episode toolchain check, turn two: append to the greeting file."
GREETING = "/root/greeting.txt"
SCRIPT = {
    "rules": [
        {
            "name": "turn-1",
            "when": {"prompt": TURN_ONE, "tools": True},
            # Writes, which every harness can make: a command through a shell tool, or an edit (aider).
            "steps": [{"write": GREETING, "content": "hello from turn 1\n"}, {"finish": "Created the greeting file."}],
        },
        {
            "name": "turn-2",
            "when": {"prompt": TURN_TWO, "tools": True},
            "steps": [
                {"write": GREETING, "content": "hello from turn 1\nand from turn 2\n"},
                {"finish": "Appended to it."},
            ],
        },
    ]
}


# Harnesses that write an ATIF trajectory of their own, and where under LOGS.
NATIVE_ATIF = {"terminus-2": "terminus-2/trajectory.json"}


@pytest.fixture
def model(core: client.CoreV1Api, namespace: str, sandbox_image: str) -> ScriptedModel:
    return deploy_scripted_model(core, namespace, SCRIPT, sandbox_image)


@pytest.fixture
def sandbox(
    core: client.CoreV1Api, namespace: str, sandbox_image: str, request: pytest.FixtureRequest
) -> Iterator[tuple[str, Harness]]:
    """A sandbox pod with the toolchain of HARNESS_APIS[param], and that harness (with its API)."""
    harness = HARNESS_APIS[request.param]
    name = f"sandbox-{harness.name}"
    core.create_namespaced_pod(namespace, toolchain_pod(name, harness, sandbox_image))
    wait_for_running(core, namespace, name)
    yield name, harness


def run_turn(
    core: client.CoreV1Api,
    namespace: str,
    pod: str,
    harness: Harness,
    model: ScriptedModel,
    instruction: str,
    continue_session: bool = False,
) -> None:
    argv = harness.command(instruction, MODEL, model.base_url, continue_session)
    try:
        result = exec_argv(core, namespace, pod, argv, harness.environment(MODEL, model.base_url))
    except TimeoutError as error:
        # A harness that never ends: what it asked the model, and what runs in its pod, say where it waits.
        asked = [{k: v for k, v in r.items() if k not in ("body", "headers", "api_key")} for r in model.requests()]
        processes = exec_argv(core, namespace, pod, ["ps", "-eo", "pid,etime,stat,args"], timeout=30).stdout
        raise TimeoutError(f"{error}\nthe model was asked: {asked}\nthe pod runs:\n{processes}") from error
    assert result.exit_code == 0, (
        f"{harness.name} exited {result.exit_code}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


def tool_requests(model: ScriptedModel) -> list[dict[str, Any]]:
    """The requests of the agent's loop: those that let the model act, by tools or an answer format its prompt
    asks for (Terminus-2's keystrokes, aider's file listing); title and summary requests offer neither."""
    return [r for r in model.model_requests() if r.get("action") is not None and r.get("offered")]


def conversation_text(record: dict[str, Any]) -> str:
    return json.dumps(record["body"].get("messages") or record["body"].get("input") or [])


@pytest.mark.parametrize("sandbox", sorted(HARNESS_APIS), indirect=True)
def test_harness_runs_the_scripted_commands_offline(
    core: client.CoreV1Api, namespace: str, sandbox: tuple[str, Harness], model: ScriptedModel
) -> None:
    """Each harness with each model API it speaks."""
    sandbox, harness = sandbox
    run_turn(core, namespace, sandbox, harness, model, TURN_ONE)

    greeting = exec_argv(core, namespace, sandbox, ["cat", GREETING])
    assert greeting.stdout == "hello from turn 1\n"
    requests = model.model_requests()
    assert {r["dialect"] for r in requests} == {harness.dialect}
    assert all(r["api_key"] == API_KEY for r in requests)
    loop = tool_requests(model)
    steps = harness.loop_steps(2)
    assert [r["rule"] for r in loop] == ["turn-1"] * len(steps), "every loop request is scripted"
    assert [r["step"] for r in loop] == steps
    assert "hello from turn 1" not in conversation_text(loop[0])
    assert all("greeting" in conversation_text(r) for r in loop[1:])

    logs = exec_argv(
        core, namespace, sandbox, ["sh", "-c", " && ".join(f"ls {LOGS}/{pattern}" for pattern in harness.native_logs)]
    )
    assert logs.exit_code == 0, f"no native log {harness.native_logs} under {LOGS}: {logs.stderr}"
    if harness.name in NATIVE_ATIF:  # a harness that writes ATIF itself: Harbor's models accept it
        native = exec_argv(core, namespace, sandbox, ["cat", f"{LOGS}/{NATIVE_ATIF[harness.name]}"])
        trajectory = harbor_trajectory().model_validate(json.loads(native.stdout))
        assert TURN_ONE in trajectory.steps[0].message and trajectory.agent.name == "terminus-2"


CONTINUING = sorted(name for name, harness in HARNESSES.items() if harness.preset.continues)


@pytest.mark.parametrize("sandbox", CONTINUING, indirect=True)
@pytest.mark.parametrize("continue_session", [True, False], ids=["continue", "fresh"])
def test_second_turn_continues_the_session_only_when_asked(
    core: client.CoreV1Api, namespace: str, sandbox: tuple[str, Harness], model: ScriptedModel, continue_session: bool
) -> None:
    """Under continue, turn 2's first request carries turn 1's conversation; a fresh turn 2 does not."""
    sandbox, harness = sandbox
    run_turn(core, namespace, sandbox, harness, model, TURN_ONE)
    model.clear()
    run_turn(core, namespace, sandbox, harness, model, TURN_TWO, continue_session=continue_session)

    assert exec_argv(core, namespace, sandbox, ["cat", GREETING]).stdout == "hello from turn 1\nand from turn 2\n"
    first = tool_requests(model)[0]
    assert (first["rule"], first["step"]) == ("turn-2", 0)
    carried = conversation_text(first)
    assert (TURN_ONE in carried and "hello from turn 1" in carried) is continue_session, shlex.quote(carried[:2000])


# Harnesses whose terminal outlives a turn (Terminus-2's tmux session), and the file its pane is piped to.
TERMINALS = {"terminus-2": "terminus_2.pane"}


@pytest.mark.parametrize("sandbox", sorted(TERMINALS), indirect=True)
def test_a_later_turn_types_into_the_terminal_of_the_first(
    core: client.CoreV1Api, namespace: str, sandbox: tuple[str, Harness], model: ScriptedModel
) -> None:
    """As in Harbor's multi-step trial, where one Terminus-2 keeps its tmux session across steps: turn 2
    attaches to turn 1's session (a new one would start its pane log afresh) and sees its screen as new
    output, with a new conversation all the same (it cannot continue one)."""
    sandbox, harness = sandbox
    run_turn(core, namespace, sandbox, harness, model, TURN_ONE)
    model.clear()
    run_turn(core, namespace, sandbox, harness, model, TURN_TWO)

    assert exec_argv(core, namespace, sandbox, ["cat", GREETING]).stdout == "hello from turn 1\nand from turn 2\n"
    pane = exec_argv(core, namespace, sandbox, ["cat", f"{LOGS}/{TERMINALS[harness.name]}"]).stdout
    assert "hello from turn 1" in pane and "and from turn 2" in pane, pane
    first = conversation_text(tool_requests(model)[0])
    assert TURN_ONE not in first and "New Terminal Output" in first, shlex.quote(first[-2000:])
