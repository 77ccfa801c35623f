"""A harness's terminal outlives its turn: Terminus-2's tmux session, straight from its toolchain in a sandbox pod.

Real parts only, but for the model: the toolchain image `hack/cluster images` built, an init container
copying the tree into an emptyDir, the sandbox image as the task image, no DNS, the scripted model
server as a pod reached by its Service IP; the harness run with the exact command line and environment
of docs/harnesses.md (tests/cluster/toolchains.py), two turns in one pod as two execs.

Where the other harness proofs are: every harness with every model API it speaks, in the toolchain's
own root with only the model reachable (tests/cluster/offline/test_toolchains_offline.py: its loop, its
dialect, its key, its native logs); every preset as a whole two-turn Episode, fresh and continued
(tests/cluster/test_agents.py). Those proofs once also ran here, in a pod per harness and API and per
continuing harness and mode: 30 pods whose every assertion one of the two others makes.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.toolchains import (
    HARNESS_APIS,
    LOGS,
    Harness,
    conversation_text,
    exec_argv,
    toolchain_pod,
    wait_for_running,
)
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
) -> None:
    argv = harness.command(instruction, MODEL, model.base_url, False)
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
