"""The PyPI presets of Harbor's list (kimi-cli, aider, hermes): their commands, environments and failure records.

What each preset's command and environment must hold for its harness to run offline against the
pod's capture proxy (docs/harnesses.md, each harness's section) -- checked here on the argv and
environment the operator builds; tests/cluster/offline/ runs them from their toolchains. The
failure patterns are checked against the records the harnesses printed in the offline trials.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from episode_operator.api.episode_resource import ModelEndpoint
from episode_operator.runtime.agents.agent_failures import classify
from episode_operator.runtime.agents.harnesses import INSTRUCTION, LOGS, PRESETS, HarnessRun, harness_run
from episode_operator.runtime.agents.model import PLACEHOLDER_KEY, Toolchain
from episode_operator.runtime.sandbox_protocol import JobState
from tests.unit.test_release import load_script

PROXY = "http://127.0.0.1:47311/v1"


def wiring(name: str, continuing: bool = False) -> tuple[list[str], dict[str, str], HarnessRun]:
    preset = PRESETS[name]
    model = ModelEndpoint.model_validate(
        {"name": "scripted-m1", "baseURL": "http://198.19.0.9:8000/v1", "api": preset.entry.apis[0]}
    )
    run = harness_run(Toolchain(name, preset.version), model, continue_session=continuing)
    return preset.argv(run), preset.env(run), run


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_key_reaches_every_harness_by_its_environment_never_its_argv(name: str) -> None:
    """The agent's commands can read any process's argv (ps); the key goes in the environment only."""
    argv, env, _ = wiring(name)
    assert PLACEHOLDER_KEY not in json.dumps(argv)
    assert PLACEHOLDER_KEY in env.values()


# --- kimi-cli ------------------------------------------------------------------------------------------------
def kimi_config(argv: list[str]) -> dict[str, Any]:
    [config] = [part.removeprefix("--config=") for part in argv if part.startswith("--config=")]
    document: dict[str, Any] = json.loads(config)
    return document


def test_kimi_cli_runs_one_prompt_in_print_mode_against_the_proxy_as_an_openai_provider() -> None:
    argv, env, run = wiring("kimi-cli")
    assert argv[0] == f"{run.toolchain.path}/bin/kimi"
    assert argv[1:3] == ["--print", "--output-format=stream-json"]
    assert argv[-1] == f"--prompt={INSTRUCTION}"
    config = kimi_config(argv)
    model = config["models"][config["default_model"]]
    assert model["model"] == "scripted-m1" and model["max_context_size"] > 0
    provider = config["providers"][model["provider"]]
    assert (provider["type"], provider["base_url"], provider["api_key"]) == ("openai_legacy", PROXY, "")
    # kimi-cli lets OPENAI_* override an openai_legacy provider: the preset's own win over the task's.
    assert (env["OPENAI_API_KEY"], env["OPENAI_BASE_URL"]) == (PLACEHOLDER_KEY, PROXY)


def test_kimi_cli_is_offline_and_keeps_its_sessions_under_the_agent_logs() -> None:
    argv, env, _ = wiring("kimi-cli")
    assert kimi_config(argv)["telemetry"] is False
    assert env["KIMI_DISABLE_TELEMETRY"] == "1" and env["KIMI_CLI_NO_AUTO_UPDATE"] == "1"
    assert env["KIMI_SHARE_DIR"] == f"{LOGS}/kimi"
    assert PRESETS["kimi-cli"].state == (f"{LOGS}/kimi/",)


def test_kimi_cli_continues_the_working_directorys_last_session_only_when_asked() -> None:
    fresh, _, _ = wiring("kimi-cli")
    continued, _, _ = wiring("kimi-cli", continuing=True)
    assert "--continue" not in fresh
    assert [part for part in continued if part not in fresh] == ["--continue"]


# --- aider ---------------------------------------------------------------------------------------------------
OFFLINE_SWITCHES = (
    "--no-check-update",
    "--no-show-release-notes",
    "--no-analytics",
    "--no-detect-urls",
    "--no-show-model-warnings",
)


def test_aider_sends_one_message_to_the_proxy_and_says_yes_to_everything_but_commands() -> None:
    argv, env, run = wiring("aider")
    assert argv[0] == f"{run.toolchain.path}/bin/aider"
    assert "--model=openai/scripted-m1" in argv and "--yes-always" in argv
    assert argv[-1] == f"--message={INSTRUCTION}"
    assert (env["OPENAI_API_KEY"], env["OPENAI_API_BASE"]) == (PLACEHOLDER_KEY, PROXY)


def test_aider_is_offline_and_keeps_its_histories_under_the_agent_logs() -> None:
    argv, env, _ = wiring("aider")
    assert set(OFFLINE_SWITCHES) <= set(argv)
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "true"
    assert {
        f"--chat-history-file={LOGS}/aider/chat.history.md",
        f"--input-history-file={LOGS}/aider/input.history",
        f"--llm-history-file={LOGS}/aider/llm.history",
    } <= set(argv)
    assert PRESETS["aider"].state == (f"{LOGS}/aider/",)


def test_aider_restores_its_chat_history_only_when_asked() -> None:
    fresh, _, _ = wiring("aider")
    continued, _, _ = wiring("aider", continuing=True)
    assert [part for part in continued if part not in fresh] == ["--restore-chat-history"]


# --- failure records ------------------------------------------------------------------------------------------
# kimi-cli's stdout when the scripted server failed it (tests/cluster/offline, docs/harnesses.md), as printed:
# rich wraps it at 80 columns.
KIMI_RECORDS = {
    "auth": (
        "Error code: 401 - {'error': {'message': 'Incorrect API key provided', 'type': 'a\n"
        "uthentication_error', 'param': None, 'code': 'authentication_error'}}\n",
        "model_auth",
    ),
    "rate-limit": (
        "Error code: 429 - {'error': {'message': 'Rate limit exceeded: too many requests,\n"
        "please retry later', 'type': 'rate_limit_error', 'param': None, 'code': 'rate_li\nmit_error'}}\n",
        "model_rate_limit",
    ),
    "server": (
        "Error code: 500 - {'error': {'message': 'Internal server error', 'type': 'api_er\n"
        "ror', 'param': None, 'code': 'api_error'}}\n",
        "model_unavailable",
    ),
    "context-window": (
        "Error code: 400 - {'error': {'message': \"This model's maximum context length is \n"
        "8192 tokens. However, your messages resulted in 9000 tokens.\", 'code':\n'context_length_exceeded'}}\n",
        "context_window",
    ),
    "refused": ("Connection error.\n", "model_unavailable"),
    # The model's own command printed it: a tool result is a JSON line, never a line of kimi-cli's own.
    "tool-output": ('{"role":"tool","content":"Error code: 401 - no","tool_call_id":"call_1"}\n', "exited"),
}


@pytest.mark.parametrize(("output", "failure"), KIMI_RECORDS.values(), ids=list(KIMI_RECORDS))
def test_kimi_clis_own_failure_records_tell_its_failures_apart(output: str, failure: str) -> None:
    """When the capture recorded no failed call (say, the calls never reached the proxy), the output decides."""
    state = JobState(id="a1.t1.agent", phase="exited", exit_code=1)
    assert classify(state, [], output.encode(), PRESETS["kimi-cli"].failure_patterns) == failure


# aider's stdout when the scripted server failed it, as printed; it retries 429 and 5xx for about a minute
# (a turn's budget may end it there) and exits 0 after a 401.
AIDER_RECORDS = {
    "auth": (
        "litellm.AuthenticationError: AuthenticationError: OpenAIException - Incorrect \nAPI key provided\n"
        "The API provider is not able to authenticate you. Check your API key.\n",
        "model_auth",
    ),
    "rate-limit": (
        "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit exceeded: \n"
        "too many requests, please retry later\n"
        "The API provider has rate limited you. Try again later or check your quotas.\nRetrying in 0.2 seconds...\n",
        "model_rate_limit",
    ),
    "server": (
        "litellm.InternalServerError: InternalServerError: OpenAIException - Internal \nserver error\n"
        "Retrying in 0.2 seconds...\n",
        "model_unavailable",
    ),
    # An edit that mentions the exception is no record of aider's own.
    "edit": ("/app/x.py\n```\nraise litellm.RateLimitError: x\n```\n", "timeout"),
}


@pytest.mark.parametrize(("output", "failure"), AIDER_RECORDS.values(), ids=list(AIDER_RECORDS))
def test_aiders_own_failure_records_tell_its_failures_apart_when_its_budget_ended_it(output: str, failure: str) -> None:
    state = JobState(id="a1.t1.agent", phase="exited", exit_code=143, timed_out=True)
    assert classify(state, [], output.encode(), PRESETS["aider"].failure_patterns) == failure


# --- hermes --------------------------------------------------------------------------------------------------
def hermes_wiring(api: str, continuing: bool = False) -> tuple[list[str], dict[str, str], HarnessRun]:
    model = ModelEndpoint.model_validate({"name": "scripted-m1", "baseURL": "http://198.19.0.9:8000/v1", "api": api})
    run = harness_run(Toolchain("hermes", PRESETS["hermes"].version), model, continue_session=continuing)
    return PRESETS["hermes"].argv(run), PRESETS["hermes"].env(run), run


@pytest.mark.parametrize(
    ("api", "provider", "key", "base_url_variable", "base_url"),
    [
        ("chat-completions", "openai-api", "OPENAI_API_KEY", "OPENAI_BASE_URL", PROXY),
        # Anthropic's client adds /v1 itself.
        ("messages", "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", PROXY.removesuffix("/v1")),
    ],
)
def test_hermes_runs_one_query_quietly_against_the_proxy_with_its_own_provider_of_the_runs_api(
    api: str, provider: str, key: str, base_url_variable: str, base_url: str
) -> None:
    argv, env, run = hermes_wiring(api)
    assert argv == [
        f"{run.toolchain.path}/bin/hermes",
        "--yolo",
        "chat",
        "--quiet",
        "--model",
        "scripted-m1",
        "--provider",
        provider,
        f"--query={INSTRUCTION}",
    ]
    assert (env[key], env[base_url_variable]) == (PLACEHOLDER_KEY, base_url)


def test_hermes_speaks_chat_completions_first_and_anthropic_messages() -> None:
    assert PRESETS["hermes"].entry.apis == ("chat-completions", "messages")
    # Hermes speaks Messages through the anthropic package only: its extra is in the tree's lock.
    assert PRESETS["hermes"].entry.toolchain.pypi["harness"] == "hermes-agent[anthropic]=={version}"


def test_hermes_is_offline_and_keeps_its_sessions_under_the_agent_logs() -> None:
    _, env, run = hermes_wiring("chat-completions")
    assert env["HERMES_HOME"] == f"{LOGS}/hermes"
    assert env["HERMES_MANAGED_DIR"] == f"{run.toolchain.path}/share/hermes"
    assert PRESETS["hermes"].state == (f"{LOGS}/hermes/",)
    assert PRESETS["hermes"].entry.native_logs == ("hermes/state.db", "hermes/logs/agent.log")


def test_hermes_managed_scope_is_the_trees_and_turns_off_all_but_the_agents_calls() -> None:
    """The settings hack/toolchain writes where HERMES_MANAGED_DIR points (they win over a task's config.yaml)."""
    toolchain = load_script("toolchain")
    assert toolchain.HERMES_MANAGED_FILE == "share/hermes/config.yaml"
    managed = yaml.safe_load(toolchain.HERMES_MANAGED)
    assert managed["security"]["tirith_enabled"] is False  # a download from GitHub at start
    assert managed["model_catalog"]["enabled"] is False
    assert managed["lsp"]["enabled"] is False  # language servers it would install
    assert managed["memory"] == {"memory_enabled": False, "user_profile_enabled": False, "nudge_interval": 0}
    assert managed["skills"]["creation_nudge_interval"] == 0
    assert managed["curator"]["enabled"] is False
    assert managed["auxiliary"]["title_generation"]["enabled"] is False
    # No probing of the "local" proxy for a context window at Ollama's, LM Studio's and the models routes.
    assert managed["model"] == {"context_length": 131072, "ollama_num_ctx": 0}


def test_hermes_continues_its_last_session_only_when_asked() -> None:
    fresh, _, _ = hermes_wiring("chat-completions")
    continued, _, _ = hermes_wiring("chat-completions", continuing=True)
    assert [part for part in continued if part not in fresh] == ["--continue"]
    assert continued.index("--continue") == continued.index("chat") + 1  # an option of its chat command


# Hermes's stdout when the scripted server failed it (docs/harnesses.md), as printed: its answer, if any,
# comes before; a command's output never reaches it.
HERMES_RECORDS = {
    "auth": ("HTTP 401: Incorrect API key provided\n", "model_auth"),
    "rate-limit": (
        "API call failed after 3 retries: HTTP 429: Rate limit exceeded: too many requests, please retry later\n",
        "model_rate_limit",
    ),
    "server": ("API call failed after 3 retries: HTTP 500: Internal server error\n", "model_unavailable"),
    "context-window": ("Context length exceeded (18 tokens). Cannot compress further.\n", "context_window"),
    "garbage": (
        "API call failed after 3 retries: Expecting property name enclosed in double quotes: line 1 column 2\n",
        "model_unavailable",
    ),
    "refused": ("API call failed after 3 retries: Connection error.\n", "model_unavailable"),
    # An answer that mentions a status mid-line is no record of Hermes's own.
    "answer": ("The server said HTTP 401: go away, so I stopped.\n", "exited"),
}


@pytest.mark.parametrize(("output", "failure"), HERMES_RECORDS.values(), ids=list(HERMES_RECORDS))
def test_hermes_own_failure_records_tell_its_failures_apart(output: str, failure: str) -> None:
    state = JobState(id="a1.t1.agent", phase="exited", exit_code=1)
    assert classify(state, [], output.encode(), PRESETS["hermes"].failure_patterns) == failure
