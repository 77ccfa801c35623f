"""Each preset's own command line and environment (docs/harnesses.md, "The harnesses"): its model
API wired to the capture proxy, its offline switches, where its state lands, how it continues.

The cluster and offline tests run these commands for real; here each is pinned so that a
dropped switch or a moved state directory fails before any toolchain is built.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from episode_operator.api.models import ModelEndpoint
from episode_operator.runtime.agents.harnesses import INSTRUCTION, PRESETS, HarnessRun, harness_run
from episode_operator.runtime.agents.model import PLACEHOLDER_KEY, Toolchain
from tests.unit.test_release import load_script

QWEN = Toolchain("qwen-code", PRESETS["qwen-code"].version)
PROXY = "http://127.0.0.1:47311/v1"


def qwen_run(continue_session: bool) -> HarnessRun:
    model = ModelEndpoint.model_validate({"name": "qwen3-coder", "baseURL": "http://model:8000/v1"})
    return harness_run(QWEN, model, continue_session=continue_session)


# --- qwen-code ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("continuing", [False, True], ids=["fresh", "continue"])
def test_qwen_code_runs_headless_at_the_proxy_with_the_instruction_as_its_prompt(continuing: bool) -> None:
    """`--prompt=` keeps the instruction one element whatever it starts with (qwen reads no positional
    prompt after `--`: it waits for stdin instead); `--continue` resumes the working directory's
    latest chat."""
    argv = PRESETS["qwen-code"].argv(qwen_run(continuing))
    assert argv == [
        f"{QWEN.path}/bin/qwen",
        "--auth-type=openai",
        "--model=qwen3-coder",
        "--output-format=stream-json",
        "--yolo",
        "--chat-recording",
        *(["--continue"] if continuing else []),
        f"--prompt={INSTRUCTION}",
    ]


def test_qwen_code_keeps_its_state_under_logs_agent_and_reads_the_trees_settings() -> None:
    env = PRESETS["qwen-code"].env(qwen_run(False))
    assert env == {
        "OPENAI_API_KEY": PLACEHOLDER_KEY,
        "OPENAI_BASE_URL": PROXY,
        "QWEN_HOME": "/logs/agent/qwen-code",
        "QWEN_CODE_SYSTEM_SETTINGS_PATH": f"{QWEN.path}/share/qwen-code/system-settings.json",
        "QWEN_CODE_DISABLE_PRECONNECT": "1",
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    }
    # Its chats land where the registry says its native logs are, in the state kept across turns.
    assert PRESETS["qwen-code"].state == ("/logs/agent/qwen-code/",)
    assert PRESETS["qwen-code"].entry.native_logs == ("qwen-code/projects/*/chats/*.jsonl",)


def test_qwen_codes_settings_file_is_the_one_the_tree_holds_and_switches_off_all_but_the_model() -> None:
    toolchain = load_script("toolchain")
    env = PRESETS["qwen-code"].env(qwen_run(False))
    assert env["QWEN_CODE_SYSTEM_SETTINGS_PATH"] == f"{QWEN.path}/{toolchain.QWEN_CODE_SETTINGS_FILE}"
    settings = toolchain.QWEN_CODE_SETTINGS
    assert settings["privacy"]["usageStatisticsEnabled"] is False  # else it resolves its collector's host
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["memory"] == {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}


@pytest.mark.parametrize("has_bash", [True, False], ids=["task-bash", "no-bash"])
def test_qwen_codes_launcher_gives_its_shell_tool_the_trees_bash_only_where_the_image_has_none(
    tmp_path: Path, has_bash: bool
) -> None:
    """qwen-code's shell tool runs `bash -c` from PATH. The tree's bash comes last on PATH, and only
    when the task image has no bash: a task's own bash is never shadowed."""
    root = tmp_path / "qwen-code"
    (root / "libexec" / "shell").mkdir(parents=True)
    node = root / "libexec" / "node"
    node.write_text('#!/bin/sh\nprintf "%s\\n" "$PATH" "$@"\n')  # stands in for Node: prints PATH and argv
    node.chmod(0o755)
    launcher = tmp_path / "qwen"
    launcher.write_text(load_script("toolchain").qwen_code_launcher(str(root)))
    launcher.chmod(0o755)
    image_bin = tmp_path / "image-bin"
    image_bin.mkdir()
    if has_bash:
        (image_bin / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    shell = shutil.which("sh") or "/bin/sh"
    result = subprocess.run(
        [shell, str(launcher), "--prompt=a b"], env={"PATH": str(image_bin)}, capture_output=True, text=True, check=True
    )
    path, *arguments = result.stdout.splitlines()
    assert path == (str(image_bin) if has_bash else f"{image_bin}:{root}/libexec/shell")
    assert arguments == [f"{root}/libexec/qwen-code/cli-entry.js", "--prompt=a b"]


def test_qwen_code_speaks_chat_completions_only() -> None:
    assert PRESETS["qwen-code"].apis == {"chat-completions"}
    assert json.dumps(PRESETS["qwen-code"].env(qwen_run(False))).count(PROXY) == 1
