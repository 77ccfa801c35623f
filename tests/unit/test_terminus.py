"""Terminus-2, Harbor's own agent, as the terminus-2 preset runs it (docs/harnesses.md, "terminus-2").

Harbor needs Python >= 3.12 and the unit tier runs 3.11, so what can be checked here is checked with
Harbor's own code read from the pinned wheel (tests/reference.py): the scripted model's answers go
through Terminus-2's own JSON parser, its first prompt is its own template, the capture's trajectory
of such a turn validates against Harbor's ATIF models, and the runner (hack/toolchains/terminus-2/
episode_terminus.py) attaches a later turn to the tmux session with Harbor's own ``TmuxSession``. The
whole harness runs from its toolchain in the cluster tier (tests/cluster/test_harness_toolchains.py,
tests/cluster/offline/, tests/cluster/test_agents.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from episode_operator.api.episode_resource import ModelEndpoint
from episode_operator.capture.atif import trajectory_from_calls, trajectory_to_responses
from episode_operator.runtime.agents.harnesses import PRESETS, harness_run
from episode_operator.runtime.agents.model import PLACEHOLDER_KEY, Toolchain
from tests.conftest import REPO
from tests.reference import (
    TERMINUS_2,
    gym,
    harbor_terminus_parser,
    harbor_terminus_prompt,
    harbor_trajectory,
    select,
    source,
)
from tests.scripted_model.server import KEYSTROKE_DURATION_SEC, chat_json, decide, parse_script, render_step
from tests.scripted_model.server import conversation as scripted_conversation
from tests.scripted_model.server import request_tools as scripted_tools
from tests.unit.conversations import captured
from tests.unit.test_release import load_script

INSTRUCTION = "Terminus turn: create the greeting file."
COMMAND = "echo hello > /app/greeting.txt"
STEPS = [{"run": COMMAND}, {"finish": "Done."}]
SCRIPT = {"rules": [{"name": "turn", "when": {"prompt": INSTRUCTION, "tools": True}, "steps": STEPS}]}
RUNNER = REPO / "hack" / "toolchains" / "terminus-2" / "episode_terminus.py"


def terminus_turn() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """A turn of Terminus-2 against the scripted model, each answer read by Terminus-2's own parser:
    its requests (chat completions, as litellm sends them) and the scripted answers, in order.

    The loop is Terminus-2's (terminus_2.py, _run_agent_loop): type the commands and send back what
    the terminal shows; a first ``task_complete`` is answered with a question, a second one ends it.
    """
    script = parse_script(SCRIPT)
    parser = harbor_terminus_parser()
    messages = [{"role": "user", "content": harbor_terminus_prompt(INSTRUCTION, "Current Terminal Screen:\n$")}]
    exchanges, pending_completion = [], False
    for _ in range(5):
        body = {"model": "openai/scripted", "messages": list(messages)}
        items = scripted_conversation("chat", body)
        reply = render_step(decide(script, "chat", body).action, items, scripted_tools("chat", body, items))
        answer = chat_json("scripted", reply, (10, 5), body)
        exchanges.append((body, answer))
        parsed = parser.parse_response(answer["choices"][0]["message"]["content"])
        assert (parsed.error, parsed.warning) == ("", ""), parsed
        if parsed.is_task_complete and pending_completion:
            return exchanges
        pending_completion = parsed.is_task_complete
        typed = "".join(command.keystrokes for command in parsed.commands)
        observation = f"New Terminal Output:\n$ {typed}$ " if typed else "Are you sure? Current terminal state: $"
        messages += [answer["choices"][0]["message"], {"role": "user", "content": observation}]
    raise AssertionError(f"Terminus-2 did not finish: {exchanges[-1][1]}")


def test_the_scripted_model_types_the_command_then_completes_twice_as_terminus_2_parses_it() -> None:
    parser = harbor_terminus_parser()
    answers = [parser.parse_response(answer["choices"][0]["message"]["content"]) for _, answer in terminus_turn()]
    assert [(c.keystrokes, c.duration) for c in answers[0].commands] == [(COMMAND + "\n", KEYSTROKE_DURATION_SEC)]
    assert [(a.is_task_complete, a.commands) for a in answers] == [(False, answers[0].commands), (True, []), (True, [])]


def test_the_captured_turn_is_atif_that_harbor_and_gym_accept() -> None:
    calls = [
        captured(f"t-{index}", "chat", body, answer, index) for index, (body, answer) in enumerate(terminus_turn())
    ]
    trajectory = trajectory_from_calls(calls, agent_name="terminus-2", agent_version="0.25.0", session_id="s")
    assert trajectory is not None
    document = trajectory.to_json_dict()
    harbor_trajectory().model_validate(document)
    gym()["nemo_gym.atif_v1_7"].AtifTrajectoryV1_7.model_validate(json.loads(json.dumps(document)))
    agents = [step for step in trajectory.steps if step.source == "agent"]
    assert len(agents) == 3 and INSTRUCTION in (trajectory.steps[0].message or "")
    # Gym reads Terminus-2's JSON answers as its bash_command calls (raw_content), keystrokes and all.
    calls_made = [item for item in trajectory_to_responses(document) if item["type"] == "function_call"]
    assert [json.loads(call["arguments"])["keystrokes"] for call in calls_made] == [COMMAND + "\n"]


def test_the_preset_points_litellms_openai_provider_at_the_proxy_and_keeps_its_logs_apart() -> None:
    """litellm needs its provider in the model name; /logs/agent/trajectory.json is the capture's, not Terminus-2's."""
    preset = PRESETS["terminus-2"]
    model = ModelEndpoint.model_validate({"name": "m1", "baseURL": "http://model:8000/v1", "api": "chat-completions"})
    run = harness_run(Toolchain(preset.name, preset.version), model, continue_session=False)
    argv, env = preset.argv(run), preset.env(run)
    assert argv[:4] == [
        "/opt/episode-operator/toolchains/terminus-2/bin/terminus-2",
        "--model=openai/m1",
        f"--api-base={run.base_url}",
        "--logs-dir=/logs/agent/terminus-2",
    ]
    assert env == {"OPENAI_API_KEY": PLACEHOLDER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "true"}  # offline: no cost map
    assert not preset.continues and "terminus-2/" in preset.entry.state


# --- the runner, with Harbor's own TmuxSession and ExecResult -------------------------------------------------
class FakeTerminus2:
    """What the runner uses of Terminus2: its name, options, extra env, setup and session."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.options = types.SimpleNamespace(tmux_pane_width=160, tmux_pane_height=40)
        self._extra_env: dict[str, str] = {}
        self._session: Any = None
        self.set_up = 0

    @staticmethod
    def name() -> str:
        return "terminus-2"

    async def setup(self, environment: Any) -> None:
        self.set_up += 1

    async def run(self, instruction: str, environment: Any, context: Any) -> None:
        """Runs past its budget (the supervisor's SIGTERM comes as it starts); its cleanup writes the
        trajectory, as Terminus-2's run() does."""
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(60)
        finally:
            (self.kwargs["logs_dir"] / "trajectory.json").write_text(json.dumps({"instruction": instruction}))


class FakeContext:
    def model_dump_json(self, indent: int) -> str:
        return "{}"


def harbor_modules() -> dict[str, types.ModuleType]:
    """Harbor's modules the runner imports: TmuxSession and ExecResult from the wheel, the rest stand-ins."""
    modules: dict[str, types.ModuleType] = {}

    def module(name: str, code: str = "", **names: Any) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__dict__.update(names)
        modules[name] = made
        sys.modules[name] = made
        exec(compile(code, f"<harbor {name}>", "exec"), made.__dict__)
        return made

    for package in ("harbor", "harbor.agents", "harbor.agents.terminus_2", "harbor.environments", "harbor.utils"):
        module(package).__path__ = []
    base = select(source("harbor", "harbor/environments/base.py"), {"ExecResult"})
    module("harbor.environments.base", base, BaseEnvironment=object)
    module("harbor.utils.logger", logger=logging.getLogger("harbor"))
    module("harbor.agents.terminus_2.asciinema_handler", source("harbor", f"{TERMINUS_2}/asciinema_handler.py"))
    tmux_session = f"{TERMINUS_2}/tmux_session.py"
    module("harbor.agents.terminus_2.tmux_session", source("harbor", tmux_session), __file__=tmux_session)
    module("harbor.agents.terminus_2.terminus_2", Terminus2=FakeTerminus2)
    module("harbor.models.agent.context", AgentContext=FakeContext)
    paths = types.SimpleNamespace(agent_dir=Path("/logs/agent"))
    module("harbor.models.trial.paths", EnvironmentPaths=paths)
    return modules


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, module in harbor_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("episode_terminus", RUNNER)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


class Commands:
    """A sandbox whose `tmux has-session` answers as told; it records the commands."""

    def __init__(self, exec_result: Any, session_alive: bool) -> None:
        self.exec_result, self.alive, self.commands = exec_result, session_alive, []
        self.default_user = None

    async def exec(self, command: str, **_: Any) -> Any:
        self.commands.append(command)
        return self.exec_result(return_code=0 if self.alive else 1, stdout="", stderr="")


@pytest.mark.parametrize("alive", [False, True], ids=["first-turn", "later-turn"])
def test_a_later_turn_attaches_to_the_session_with_what_the_last_turn_saw(
    runner: Any, tmp_path: Path, alive: bool
) -> None:
    state = tmp_path / runner.SESSION_STATE
    state.write_text(json.dumps({"previous_buffer": "$ echo hello\n$"}))
    agent, sandbox = FakeTerminus2(), Commands(sys.modules["harbor.environments.base"].ExecResult, alive)
    asyncio.run(runner.attach_or_set_up(agent, sandbox, state))
    assert sandbox.commands == ["tmux has-session -t terminus-2"]
    if not alive:  # no session yet: Harbor's setup starts one
        assert agent.set_up == 1 and agent._session is None
        return
    session = agent._session
    assert agent.set_up == 0 and type(session).__name__ == "TmuxSession"
    assert (session._session_name, session._previous_buffer) == ("terminus-2", "$ echo hello\n$")
    assert str(session._logging_path) == "/logs/agent/terminus_2.pane"  # where Harbor's setup points the pane


def test_commands_run_by_bash_with_the_trees_tmux_and_bash_last_on_the_path(
    runner: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    sandbox = runner.Sandbox()
    result = asyncio.run(sandbox.exec('echo "$PATH"; echo "$0" >&2; exit 3', cwd=str(tmp_path)))
    assert result.stdout == f"/usr/bin:/bin:{runner.SANDBOX_BIN}\n" and result.return_code == 3
    assert result.stderr.strip().endswith("bash")  # as Harbor's Docker environment runs it: bash -c
    assert runner.SANDBOX_BIN.parts[-1] == "sandbox-bin" and runner.SANDBOX_BIN.parent.name != "dist-packages"
    with pytest.raises(RuntimeError, match="timed out"):
        asyncio.run(sandbox.exec("sleep 5", timeout_sec=0.2))


def test_the_turns_budget_ending_it_lets_terminus_2_write_its_trajectory(
    runner: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The supervisor ends a turn past its budget with SIGTERM: the runner cancels the run, as Harbor's
    asyncio.wait_for does, so that Terminus-2's cleanup still writes its trajectory."""
    monkeypatch.setattr(runner, "attach_or_set_up", lambda agent, sandbox, state: asyncio.sleep(0))
    code = runner.main(["--model=openai/m", "--api-base=http://p/v1", f"--logs-dir={tmp_path}", "--", "do it"])
    assert code == 143
    assert json.loads((tmp_path / "trajectory.json").read_text()) == {"instruction": "do it"}
    assert (tmp_path / "agent-result.json").exists()


# --- its toolchain --------------------------------------------------------------------------------------------
def test_the_tree_takes_python_and_wheels_of_its_own_debian_release() -> None:
    """Harbor needs Python >= 3.12: trixie's 3.13 and wheels for trixie's glibc; mini-swe-agent keeps bookworm's."""
    toolchain = load_script("toolchain")
    every = toolchain.toolchains()
    terminus, mini = every["terminus-2"], every["mini-swe-agent"]
    args = toolchain.pip_target_args(terminus)
    assert {"--python-version=3.13", "--abi=cp313", "--platform=manylinux_2_41_x86_64"} <= set(args)
    assert "--platform=manylinux_2_42_x86_64" not in args and "--platform=manylinux2014_x86_64" in args
    assert {"--python-version=3.11", "--platform=manylinux_2_36_x86_64"} <= set(toolchain.pip_target_args(mini))
    assert "--platform=manylinux_2_37_x86_64" not in toolchain.pip_target_args(mini)
    assert (terminus.suite, mini.suite) == ("trixie", "bookworm")


def test_the_runner_is_in_its_images_key() -> None:
    """hack/cluster rebuilds a toolchain image when its recipe changes: the runner's content is in it."""
    toolchain = load_script("toolchain")
    recipe = toolchain.toolchains()["terminus-2"].recipe()
    assert set(recipe["files"]) == {RUNNER.name}
    assert "files" not in toolchain.toolchains()["codex"].recipe()
