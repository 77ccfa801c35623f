"""One place names a harness: the registry (runtime/agents/harness_registry.py). Its entries pair with
their code on both sides (the preset's command, the toolchain's assembly) and agree with it, and
hack/toolchain reads them without the package's dependencies."""

from __future__ import annotations

import subprocess
import sys
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
from tests.conftest import REPO
from tests.unit.test_release import load_script

FAKE = replace(HARNESSES["claude-code"], name="fake-agent", version="0.1.0")


# --- each entry with its code -----------------------------------------------------------------------------
def test_every_registry_entry_has_its_command_and_every_command_its_entry() -> None:
    assert list(PRESETS) == list(HARNESSES)
    assert COMMANDS.keys() == HARNESSES.keys()
    with pytest.raises(LookupError, match="fake-agent"):
        paired({**HARNESSES, FAKE.name: FAKE}, COMMANDS)
    with pytest.raises(LookupError, match="codex"):
        paired(HARNESSES, {name: command for name, command in COMMANDS.items() if name != "codex"})


def test_every_registry_entry_has_its_assembly_and_every_assembly_its_entry() -> None:
    toolchain = load_script("toolchain")
    assert toolchain.ASSEMBLERS.keys() == HARNESSES.keys()
    assert list(toolchain.toolchains()) == list(HARNESSES)
    with pytest.raises(toolchain.ToolchainError, match="fake-agent"):
        toolchain.toolchains({**HARNESSES, FAKE.name: FAKE})
    with pytest.raises(toolchain.ToolchainError, match="opencode"):
        toolchain.toolchains(assemblers={k: v for k, v in toolchain.ASSEMBLERS.items() if k != "opencode"})


def test_hack_toolchain_reads_the_registry_with_no_package_installed() -> None:
    """`-I -S`: no site-packages, so neither the operator's package nor its dependencies can be imported."""
    listing = subprocess.run(
        [sys.executable, "-I", "-S", str(REPO / "hack" / "toolchain"), "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("\t") for line in listing.splitlines()]
    assert [(name, version) for name, version, _, _ in rows] == [(e.name, e.version) for e in HARNESSES.values()]
    assert [entry for _, _, _, entry in rows] == [
        f"{Toolchain(e.name, e.version).path}/{e.toolchain.entry}" for e in HARNESSES.values()
    ]


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
