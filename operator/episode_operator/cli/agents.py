"""The agent options ``kubectl episode run`` and ``eval`` share: one ``spec.agent`` from the command line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, get_args

import click

from episode_operator.api.episode_resource import AgentSpec, ModelApi, TurnSessions
from episode_operator.runtime.agents import AGENT_KINDS, spec_problems
from episode_operator.runtime.agents.harnesses import PRESETS

# (parameter, click option) of every agent flag; the command gets them as one AgentSpec, ``agent``.
_OPTIONS: list[tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
    (
        "agent_kind",
        click.option(
            "--agent",
            "agent_kind",
            type=click.Choice(AGENT_KINDS),
            default=None,
            help="The agent kind [default: harness with --harness, command with --command, else oracle].",
        ),
    ),
    ("agent_command", click.option("--command", "agent_command", default=None, help="--agent command: the command.")),
    ("agent_setup", click.option("--setup", "agent_setup", default=None, help="--agent command: once per sandbox.")),
    (
        "harness",
        click.option(
            "--harness", metavar="NAME[@VERSION]", default=None, help=f"A harness preset: {', '.join(PRESETS)}."
        ),
    ),
    ("model", click.option("--model", default=None, help="The model's name at its endpoint.")),
    ("model_url", click.option("--model-url", default=None, help="The endpoint's base URL, e.g. http://vllm:8000/v1.")),
    (
        "model_api",
        click.option(
            "--model-api",
            type=click.Choice(get_args(ModelApi)),
            default=None,
            help="The API the endpoint speaks [default: chat-completions, or the harness's own].",
        ),
    ),
    (
        "model_key_secret",
        click.option(
            "--model-key-secret", metavar="NAME[:KEY]", default=None, help="The Secret (and key) of the API key."
        ),
    ),
    (
        "turn_sessions",
        click.option(
            "--turn-sessions",
            type=click.Choice(get_args(TurnSessions)),
            default="fresh",
            show_default=True,
            help="One harness session per turn, or one continued across turns.",
        ),
    ),
    ("token_ids", click.option("--token-ids", is_flag=True, help="Keep the endpoint's token ids and logprobs.")),
    (
        "env",
        click.option("--env", "env", multiple=True, metavar="K=V", help="An environment variable for the agent."),
    ),
    (
        "env_from",
        click.option(
            "--env-from",
            multiple=True,
            metavar="secret/NAME|configmap/NAME",
            help="All keys of a Secret or ConfigMap as the agent's environment.",
        ),
    ),
]


def agent_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the agent flags to ``command``, which receives ``agent`` (an AgentSpec) instead of them."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name, _ in _OPTIONS}
        return command(*args, agent=agent_from_options(**values), **kwargs)

    for _, option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def agent_from_options(
    *,
    agent_kind: str | None,
    agent_command: str | None,
    agent_setup: str | None,
    harness: str | None,
    model: str | None,
    model_url: str | None,
    model_api: str | None,
    model_key_secret: str | None,
    turn_sessions: str,
    token_ids: bool,
    env: tuple[str, ...],
    env_from: tuple[str, ...],
) -> AgentSpec:
    """``spec.agent`` from the flags, checked by its kind's registry entry (a usage error names the flag)."""
    kind = agent_kind or ("harness" if harness else "command" if agent_command else "oracle")
    document: dict[str, Any] = {"kind": kind, "command": agent_command, "setup": agent_setup}
    if harness:
        name, _, version = harness.partition("@")
        document["harness"] = {"name": name, "version": version or None}
    if model or model_url or model_api or model_key_secret:
        if not (model and model_url):
            raise click.ClickException("a model endpoint needs --model and --model-url")
        endpoint: dict[str, Any] = {"name": model, "baseURL": model_url}
        preset = PRESETS.get(document.get("harness", {}).get("name", ""))
        api = model_api or (sorted(preset.apis)[0] if preset is not None and len(preset.apis) == 1 else None)
        if api:
            endpoint["api"] = api
        if model_key_secret:
            secret, _, key = model_key_secret.partition(":")
            endpoint["apiKeySecretRef"] = {"name": secret, **({"key": key} if key else {})}
        document["model"] = endpoint
    document["turnSessions"] = turn_sessions
    if token_ids:
        document["capture"] = {"tokenIds": True}
    document["env"] = [_env_var(item) for item in env]
    document["envFrom"] = [_env_source(item) for item in env_from]
    try:
        spec = AgentSpec.model_validate({key: value for key, value in document.items() if value is not None})
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    problems = spec_problems(spec)
    if problems:
        raise click.ClickException("; ".join(problems))
    return spec


def _env_var(item: str) -> dict[str, str]:
    name, equals, value = item.partition("=")
    if not equals or not name:
        raise click.BadParameter(f"expected K=V, got {item!r}", param_hint="--env")
    return {"name": name, "value": value}


def _env_source(item: str) -> dict[str, Any]:
    kind, _, name = item.partition("/")
    field = {"secret": "secretRef", "configmap": "configMapRef"}.get(kind.lower())
    if field is None or not name:
        raise click.BadParameter(f"expected secret/NAME or configmap/NAME, got {item!r}", param_hint="--env-from")
    return {field: {"name": name}}
