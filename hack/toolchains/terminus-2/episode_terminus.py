"""Harbor's Terminus-2, run inside the sandbox it acts on: one turn per run (docs/harnesses.md, "terminus-2").

Usage: terminus-2 --model=openai/M --api-base=URL --logs-dir=DIR -- INSTRUCTION

Harbor runs Terminus-2 outside its environment and reaches the environment through the
environment's ``exec``. Here it runs in the sandbox, and ``Sandbox`` is that interface for the
machine it runs on: every command Terminus-2 runs (``tmux send-keys``, ``tmux capture-pane``...)
runs as a local ``bash -c`` (as Harbor's Docker environment runs it), as the user the harness runs
as, in its working directory. Terminus-2 itself -- its prompts, its parser, its tmux session, its
LLM client (litellm), its ATIF trajectory -- is Harbor's, imported from the pinned wheel, not
copied. Built into the terminus-2 toolchain by hack/toolchain (Python 3.13, harbor's requirements);
never imported by the operator.

One Terminus2 serves every step of a Harbor trial: set up once (its tmux session started), run once
per step with a new chat. A turn here is one process, so a later turn finds the session the first
one started still running in the sandbox (tmux's server outlives the process that started it) and
attaches to it instead of starting a second one, with what the last turn saw of the pane, so the
terminal -- its shell, its working directory, what runs in it -- carries over as it does in Harbor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from harbor.agents.terminus_2.terminus_2 import Terminus2
from harbor.agents.terminus_2.tmux_session import TmuxSession
from harbor.environments.base import ExecResult
from harbor.models.agent.context import AgentContext
from harbor.models.trial.paths import EnvironmentPaths

# The tree's tmux and bash, alone in their directory (hack/toolchain): appended to the PATH of the
# commands Terminus-2 runs, so that a task image's own tmux and bash win, as under Harbor, which
# installs tmux only when the image has none.
SANDBOX_BIN = Path(__file__).resolve().parents[3] / "sandbox-bin"
# What a turn leaves for the next one: what the pane held when the turn ended.
SESSION_STATE = "session.json"
# Harbor records the pane with asciinema, which it installs from the network (apt-get, pip): the
# sandbox has none, and the harness must not install into the task's image.
OPTIONS: dict[str, Any] = {"record_terminal_session": False}


class Sandbox:
    """The parts of Harbor's ``BaseEnvironment`` that Terminus-2 uses, for the machine it runs on.

    ``user`` is ignored: the operator starts the harness as the turn's agent user, and every command
    runs as that user (Harbor asks for root only to install tmux or asciinema, neither done here).
    """

    session_id = "episode-operator"
    default_user: str | int | None = None

    def __init__(self) -> None:
        path = os.environ.get("PATH") or os.defpath
        self.env = {**os.environ, "PATH": f"{path}:{SANDBOX_BIN}"}
        # Harbor's Docker environment runs `bash -c`: the image's bash, else the tree's.
        self.shell = shutil.which("bash", path=self.env["PATH"]) or "/bin/sh"

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        process = await asyncio.create_subprocess_exec(
            self.shell,
            "-c",
            command,
            cwd=cwd,
            env={**self.env, **(env or {})},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_sec)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeError(f"command timed out after {timeout_sec} seconds: {command[:200]}") from None
        return ExecResult(
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            return_code=process.returncode if process.returncode is not None else -1,
        )

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        return Path(path).is_dir()

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        return Path(path).is_file()

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        shutil.copyfile(source_path, target_path)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        shutil.copyfile(source_path, target_path)


async def attach_or_set_up(agent: Terminus2, sandbox: Sandbox, state: Path) -> None:
    """Set Terminus-2 up as Harbor does on the first turn; on a later one, attach to the session it left."""
    alive = await sandbox.exec(f"tmux has-session -t {shlex.quote(agent.name())}")
    if alive.return_code != 0:
        await agent.setup(sandbox)
        return
    # The session Terminus2.setup() makes (recording off), without starting a second one of its name.
    session = TmuxSession(
        session_name=agent.name(),
        environment=sandbox,
        logging_path=EnvironmentPaths.agent_dir / "terminus_2.pane",
        local_asciinema_recording_path=None,
        remote_asciinema_recording_path=None,
        pane_width=agent.options.tmux_pane_width,
        pane_height=agent.options.tmux_pane_height,
        extra_env=agent._extra_env,
        user=sandbox.default_user,
    )
    if state.is_file():
        session._previous_buffer = json.loads(state.read_text()).get("previous_buffer")
    agent._session = session


async def run_turn(arguments: argparse.Namespace) -> int:
    logs = Path(arguments.logs_dir)
    logs.mkdir(parents=True, exist_ok=True)
    state = logs / SESSION_STATE
    sandbox = Sandbox()
    agent = Terminus2(logs_dir=logs, model_name=arguments.model, api_base=arguments.api_base, **OPTIONS)
    await attach_or_set_up(agent, sandbox, state)
    context = AgentContext()
    # Harbor bounds a run with asyncio.wait_for, which cancels it: run()'s cleanup writes the trajectory.
    # Here the operator bounds the turn with SIGTERM, which does the same.
    run = asyncio.ensure_future(agent.run(arguments.instruction, sandbox, context))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, run.cancel)
    code = 0
    try:
        await run
    except asyncio.CancelledError:
        print("terminus-2: stopped (SIGTERM)", file=sys.stderr)
        code = 143
    except Exception:
        # Harbor records the exception and grades the trial all the same: the exit status says it.
        traceback.print_exc()
        code = 1
    finally:
        session = agent._session
        if session is not None:
            state.write_text(json.dumps({"previous_buffer": session._previous_buffer}))
        (logs / "agent-result.json").write_text(context.model_dump_json(indent=2))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="terminus-2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="litellm's model name (openai/NAME: an OpenAI-compatible API)")
    parser.add_argument("--api-base", required=True, help="the endpoint's base URL, with its /v1")
    parser.add_argument("--logs-dir", required=True, help="where Terminus-2 writes its trajectory")
    parser.add_argument("instruction")
    return asyncio.run(run_turn(parser.parse_args(argv)))
