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

from episode_operator.api.episode_resource import ModelEndpoint
from episode_operator.runtime.agents.agent_failures import classify
from episode_operator.runtime.agents.harnesses import INSTRUCTION, PRESETS, HarnessRun, harness_run
from episode_operator.runtime.agents.model import PLACEHOLDER_KEY, Toolchain
from episode_operator.runtime.sandbox_protocol import JobState
from tests.unit.test_release import load_script
from tests.unit.tools import tool

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


# --- pi -----------------------------------------------------------------------------------------------------
PI = Toolchain("pi", PRESETS["pi"].version)


def pi_run(api: str, continue_session: bool = False) -> HarnessRun:
    model = ModelEndpoint.model_validate({"name": "org/model:8b", "baseURL": "http://model:8000/v1", "api": api})
    return harness_run(PI, model, continue_session=continue_session)


@pytest.mark.parametrize("continuing", [False, True], ids=["fresh", "continue"])
def test_pi_prints_json_events_for_the_instruction_after_its_options(continuing: bool) -> None:
    """pi takes option values as the next argument (it refuses `--model=M`); the instruction is the last
    argument, after `--`, which the launcher hands to pi's stdin."""
    assert PRESETS["pi"].argv(pi_run("chat-completions", continuing)) == [
        f"{PI.path}/bin/pi",
        "--provider",
        "episode",
        "--model",
        "org/model:8b",
        "--mode",
        "json",
        *(["--continue"] if continuing else []),
        "--print",
        "--",
        INSTRUCTION,
    ]


@pytest.mark.parametrize(
    ("api", "pi_api", "base_url"),
    [
        ("chat-completions", "openai-completions", PROXY),
        ("responses", "openai-responses", PROXY),
        # Anthropic's client appends /v1/messages itself.
        ("messages", "anthropic-messages", PROXY.removesuffix("/v1")),
    ],
)
def test_pis_provider_is_the_proxy_speaking_the_runs_api(api: str, pi_api: str, base_url: str) -> None:
    env = PRESETS["pi"].env(pi_run(api))
    assert json.loads(env.pop("EPISODE_PI_MODELS")) == {
        "providers": {
            "episode": {
                "baseUrl": base_url,
                "apiKey": "$EPISODE_MODEL_API_KEY",  # pi reads the key from this variable
                "api": pi_api,
                "models": [{"id": "org/model:8b"}],
            }
        }
    }
    assert env == {
        "EPISODE_MODEL_API_KEY": PLACEHOLDER_KEY,
        "PI_CODING_AGENT_DIR": "/logs/agent/pi",
        "PI_OFFLINE": "1",
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
    }
    assert PRESETS["pi"].state == ("/logs/agent/pi/",)
    assert PRESETS["pi"].entry.native_logs == ("pi/sessions/*/*.jsonl",)


def test_pi_speaks_every_api_the_spec_knows_chat_completions_first() -> None:
    assert PRESETS["pi"].entry.apis == ("chat-completions", "responses", "messages")


def fake_pi(tmp_path: Path) -> tuple[Path, Path]:
    """pi's launcher over a stand-in for Node that prints its argv and its stdin as JSON."""
    root = tmp_path / "pi"
    (root / "libexec").mkdir(parents=True)
    node = root / "libexec" / "node"
    node.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps([sys.argv[1:], sys.stdin.read()]))\n")
    node.chmod(0o755)
    launcher = tmp_path / "bin-pi"
    launcher.write_text(load_script("toolchain").pi_launcher(str(root)))
    launcher.chmod(0o755)
    return root, launcher


TRICKY_PROMPT = '@README.md -x "it\'s" $HOME `id`\n  second line\n'


@pytest.mark.parametrize("shell", ["sh", "busybox"], ids=["dash", "busybox-ash"])
def test_pis_launcher_writes_its_models_file_and_hands_the_instruction_to_stdin(tmp_path: Path, shell: str) -> None:
    """An instruction starting with `@` would be a file to pi, even after `--`: pi gets it on stdin, as
    written, and the options before `--` as they were."""
    root, launcher = fake_pi(tmp_path)
    argv = [tool("sh")] if shell == "sh" else [tool("busybox"), "sh"]
    argv.append(str(launcher))
    agent_dir = tmp_path / "logs" / "pi"
    env = {"PATH": "/usr/bin:/bin", "EPISODE_PI_MODELS": '{"providers": {}}', "PI_CODING_AGENT_DIR": str(agent_dir)}
    result = subprocess.run(
        [*argv, "--model", "m", "--print", "--", TRICKY_PROMPT], env=env, capture_output=True, text=True, check=True
    )
    cli = f"{root}/libexec/pi/node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js"
    assert json.loads(result.stdout) == [[cli, "--model", "m", "--print"], TRICKY_PROMPT]
    assert json.loads((agent_dir / "models.json").read_text()) == {"providers": {}}
    # Without an instruction after `--` (pi --help, say) the arguments pass as they are.
    result = subprocess.run([*argv, "--help"], env=env, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [[cli, "--help"], ""]


# --- cline --------------------------------------------------------------------------------------------------
CLINE = Toolchain("cline", PRESETS["cline"].version)


def cline_run(api: str, continue_session: bool = False) -> HarnessRun:
    model = ModelEndpoint.model_validate({"name": "org/model:8b", "baseURL": "http://model:8000/v1", "api": api})
    return harness_run(CLINE, model, continue_session=continue_session)


def test_cline_prints_json_events_approving_every_tool_call_for_the_instruction_after_its_options() -> None:
    assert PRESETS["cline"].argv(cline_run("chat-completions")) == [
        f"{CLINE.path}/bin/cline",
        "--provider",
        "openai-compatible",
        "--model",
        "org/model:8b",
        "--json",
        "--yolo",
        "--",
        INSTRUCTION,
    ]


@pytest.mark.parametrize(
    ("api", "provider", "key"),
    [
        ("chat-completions", "openai-compatible", "OPENAI_API_KEY"),
        ("responses", "openai-native", "OPENAI_API_KEY"),
        ("messages", "anthropic", "ANTHROPIC_API_KEY"),
    ],
)
def test_clines_provider_is_the_proxy_speaking_the_runs_api_its_key_in_the_environment(
    api: str, provider: str, key: str
) -> None:
    """cline reads a base URL only from its providers.json (the launcher writes it), the key from its
    provider's variable; the base URL keeps /v1 for every API (its Anthropic client appends /messages)."""
    run = cline_run(api)
    argv, env = PRESETS["cline"].argv(run), PRESETS["cline"].env(run)
    assert argv[argv.index("--provider") + 1] == provider
    providers = json.loads(env.pop("EPISODE_CLINE_PROVIDERS"))
    assert providers["lastUsedProvider"] == provider
    assert providers["providers"] == {
        provider: {
            "settings": {"provider": provider, "model": "org/model:8b", "baseUrl": PROXY},
            "updatedAt": "1970-01-01T00:00:00.000Z",
            "tokenSource": "manual",
        }
    }
    assert env.pop(key) == PLACEHOLDER_KEY
    assert PLACEHOLDER_KEY not in json.dumps([argv, providers])


def test_cline_is_offline_and_keeps_its_sessions_under_the_agent_logs() -> None:
    env = PRESETS["cline"].env(cline_run("chat-completions"))
    assert {name: value for name, value in env.items() if name.startswith(("CLINE_", "E2E_"))} == {
        "CLINE_DIR": "/logs/agent/cline",
        "CLINE_DATA_DIR": "/logs/agent/cline/data",
        # No telemetry, no self-update (the tree's settings), no update check, no feature flags from PostHog.
        "CLINE_GLOBAL_SETTINGS_PATH": f"{CLINE.path}/share/cline/global-settings.json",
        "CLINE_NO_AUTO_UPDATE": "1",
        "E2E_TEST": "true",
    }
    assert load_script("toolchain").CLINE_SETTINGS == {"telemetryOptOut": True, "autoUpdateEnabled": False}
    assert PRESETS["cline"].state == ("/logs/agent/cline/",)
    assert PRESETS["cline"].entry.native_logs == ("cline/data/sessions/*/*.messages.json", "cline/data/logs/cline.log")


def test_cline_cannot_continue_a_session_headless() -> None:
    """Its --id resumes a session only in its TUI: with --json cline refuses to run."""
    assert not PRESETS["cline"].continues
    assert PRESETS["cline"].argv(cline_run("chat-completions", True)) == PRESETS["cline"].argv(
        cline_run("chat-completions")
    )


def fake_cline(tmp_path: Path) -> Path:
    """cline's launcher over a stand-in for its binary that prints its argv as JSON."""
    root = tmp_path / "cline"
    binary = root / "libexec" / "cline" / "bin" / "cline"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    binary.chmod(0o755)
    launcher = tmp_path / "bin-cline"
    launcher.write_text(load_script("toolchain").cline_launcher(str(root)))
    launcher.chmod(0o755)
    return launcher


@pytest.mark.parametrize("shell", ["sh", "busybox"], ids=["dash", "busybox-ash"])
def test_clines_launcher_writes_its_providers_file_then_runs_cline(tmp_path: Path, shell: str) -> None:
    launcher = fake_cline(tmp_path)
    argv = [tool("sh")] if shell == "sh" else [tool("busybox"), "sh"]
    data = tmp_path / "logs" / "cline" / "data"
    providers = '{"version": 1, "providers": {"p": {"settings": {"baseUrl": "http://127.0.0.1:1/v1"}}}}'
    env = {"PATH": "/usr/bin:/bin", "EPISODE_CLINE_PROVIDERS": providers, "CLINE_DATA_DIR": str(data)}
    result = subprocess.run(
        [*argv, str(launcher), "--json", "--", TRICKY_PROMPT], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == ["--json", "--", TRICKY_PROMPT]
    assert (data / "settings" / "providers.json").read_text() == providers + "\n"
    # Without a data directory there is nowhere cline would read the provider from: the launcher refuses.
    del env["CLINE_DATA_DIR"]
    refused = subprocess.run([*argv, str(launcher), "--json"], env=env, capture_output=True, text=True, check=False)
    assert refused.returncode != 0 and "providers.json" in refused.stderr
    assert not refused.stdout


# cline's stdout when the scripted server failed it (docs/harnesses.md, "When the model endpoint fails"), as printed.
CLINE_AUTH = (
    '{"ts":"2026-12-06T21:24:27.991Z","type":"agent_event","event":{"type":"iteration_start","iteration":1}}\n'
    '{"ts":"2026-12-06T21:24:28.439Z","type":"agent_event","event":{"type":"error","error":{"name":"Error",'
    '"message":"Incorrect API key provided","stack":"Error: Incorrect API key provided\\n    at execute '
    '(/$bunfs/root/chunk-tacx2shb.js:389:6881)"},"errorClass":"auth","recoverable":false,"iteration":1}}\n'
    '{"ts":"2026-12-06T21:24:28.633Z","type":"error","message":"Incorrect API key provided"}\n'
)
CLINE_RECORDS = {
    "auth": (CLINE_AUTH, "model_auth"),
    "context-window": (
        '{"ts":"2026-12-06T21:26:12.668Z","type":"agent_event","event":{"type":"error","error":{"name":'
        '"ContextWindowOverflowError","message":"The request exceeds the model\'s context window and there is no '
        "conversation history to compact (provider reported: This model's maximum context length is 8192 "
        'tokens.)"},"errorClass":"context_window_exceeded","recoverable":false,"iteration":1}}\n',
        "context_window",
    ),
    "garbage": (
        '{"ts":"2026-12-06T21:26:27.159Z","type":"agent_event","event":{"type":"error","error":{"name":"Error",'
        '"message":"JSON parsing failed: Text: {not json."},"errorClass":"unknown","recoverable":false}}\n',
        "exited",
    ),
    # A command's output quoting cline's record is a JSON string inside a line of cline's, never a line of its own.
    "tool-output": (
        '{"ts":"2026-12-06T21:24:28.439Z","type":"agent_event","event":{"type":"content_end","contentType":"tool",'
        '"toolName":"run_commands","output":"{\\"ts\\":\\"x\\",\\"type\\":\\"agent_event\\",\\"event\\":{\\"type\\":'
        '\\"error\\",\\"errorClass\\":\\"auth\\"}}"}}\n',
        "exited",
    ),
}


@pytest.mark.parametrize(("output", "failure"), CLINE_RECORDS.values(), ids=list(CLINE_RECORDS))
def test_clines_own_failure_records_tell_its_failures_apart(output: str, failure: str) -> None:
    """When the capture recorded no failed call, cline's error event decides (exit 1)."""
    state = JobState(id="a1.t1.agent", phase="exited", exit_code=1)
    assert classify(state, [], output.encode(), PRESETS["cline"].failure_patterns) == failure
