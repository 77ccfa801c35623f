"""One place names a harness: the registry (runtime/agents/harness_registry.py). Its entries pair with
their code (the preset's command), and agree with it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from episode_operator.api.models import ModelEndpoint
from episode_operator.runtime.agents.harness_registry import HARNESSES
from episode_operator.runtime.agents.harnesses import (
    COMMANDS,
    PRESETS,
    continue_arguments,
    harness_run,
    model_api,
    paired,
)
from episode_operator.runtime.agents.model import Toolchain

FAKE = replace(HARNESSES["claude-code"], name="fake-agent", version="0.1.0")


# --- each entry with its code -----------------------------------------------------------------------------
def test_every_registry_entry_has_its_command_and_every_command_its_entry() -> None:
    assert list(PRESETS) == list(HARNESSES)
    assert COMMANDS.keys() == HARNESSES.keys()
    with pytest.raises(LookupError, match="fake-agent"):
        paired({**HARNESSES, FAKE.name: FAKE}, COMMANDS)
    with pytest.raises(LookupError, match="codex"):
        paired(HARNESSES, {name: command for name, command in COMMANDS.items() if name != "codex"})


# --- the entries agree with the code keyed by them ----------------------------------------------------------
def test_every_entry_speaks_model_apis_the_spec_knows() -> None:
    for preset in PRESETS.values():
        assert preset.apis == set(preset.entry.apis), preset.name
    with pytest.raises(ValueError, match="openai-realtime"):
        model_api("openai-realtime")


@pytest.mark.parametrize("name", list(HARNESSES))
def test_a_preset_runs_its_entrys_toolchain_entry_and_continues_as_its_entry_says(name: str) -> None:
    preset = PRESETS[name]
    toolchain = Toolchain(name, preset.version)
    model = endpoint(preset.entry.apis[0])
    assert preset.argv(harness_run(toolchain, model, continue_session=False))[0] == (
        f"{toolchain.path}/{preset.entry.toolchain.entry}"
    )
    assert bool(continue_arguments(preset)) == preset.entry.continues


def endpoint(api: str) -> ModelEndpoint:
    return ModelEndpoint.model_validate({"name": "m", "baseURL": "http://model/v1", "api": api})
