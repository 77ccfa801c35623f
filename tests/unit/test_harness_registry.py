"""One place names a harness: the registry (runtime/agents/harness_registry.py, docs/harnesses.md
"The registry"). Its entries pair with their code on both sides (the preset's command, the toolchain's
assembly), hack/toolchain reads them without the package's dependencies, and every table that lists
the harnesses is derived from them: shown by adding a harness to a copy of the checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from episode_operator.api.episode_resource import ModelEndpoint
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

REGISTRY = Path("operator/episode_operator/runtime/agents/harness_registry.py")
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


def test_docs_have_a_section_for_each_entry_at_its_version() -> None:
    """The commands and quirks of each harness are prose (docs/harnesses.md, "The harnesses"): one section each."""
    text = (REPO / "docs" / "harnesses.md").read_text()
    harnesses = text.split("\n## The harnesses\n")[1].split("\n## ")[0]
    sections = re.findall(r"^### (\S+) (\S+) \(", harnesses, re.M)
    assert sections == [(entry.name, entry.version) for entry in HARNESSES.values()]


def endpoint(api: str) -> ModelEndpoint:
    return ModelEndpoint.model_validate({"name": "m", "baseURL": "http://model/v1", "api": api})


# --- adding a harness ----------------------------------------------------------------------------------------
def fake_entry(name: str, api: str, continues: bool) -> str:
    return f"""        HarnessEntry(
            name="{name}",
            version="0.1.0",
            apis=("{api}",),
            continues={continues},
            state=("{name}/",),
            native_logs=("{name}/events.jsonl",),
            toolchain=ToolchainBuild(debian=("libc6",), entry="bin/fake", npm={{"binary": "{name}@{{version}}"}}),
            origin="npm `{name}`",
        ),
"""


def fake_command(name: str, resume: str) -> str:
    return f"""    "{name}": HarnessCommand(
        argv=lambda run: [f"{{run.toolchain.path}}/bin/fake", *([{resume!r}] * run.continue_session), INSTRUCTION],
        env=lambda run: {{"FAKE_AGENT_KEY": run.api_key}},
    ),
"""


def fake_assembly(name: str) -> str:
    return f"""    "{name}": Assembly(assemble_bun_binary("{name}@0.1.0", "bin/fake", "fake")),
"""


# Two harnesses, one that continues and one that does not: a table that names either kind by hand misses one.
FAKES = {"fake-agent": ("responses", True, "--resume"), "fake-oneshot": ("messages", False, "")}
# What adding them edits (docs/harnesses.md, "The registry"), each inserted after its anchor.
ADDITIONS = {
    REGISTRY: ("    for entry in (\n", "".join(fake_entry(name, api, on) for name, (api, on, _) in FAKES.items())),
    Path("operator/episode_operator/runtime/agents/harnesses.py"): (
        "COMMANDS: Final[Mapping[str, HarnessCommand]] = {\n",
        "".join(fake_command(name, resume) for name, (_, _, resume) in FAKES.items()),
    ),
    Path("hack/toolchain"): ("ASSEMBLERS: dict[str, Assembly] = {\n", "".join(fake_assembly(name) for name in FAKES)),
}
# Run in the copy: the tables the tests and the docs derive from the registry.
DERIVED = """
import json
from types import SimpleNamespace

import episode_operator
from episode_operator.runtime.agents.harnesses import PRESETS
from tests.cluster import test_agents, toolchains
from tests.doc_tables import BLOCKS
from tests.unit import test_harness

print(json.dumps({
    "package": episode_operator.__file__,
    "presets": list(PRESETS),
    "proofs": {name: harness.native_logs for name, harness in toolchains.HARNESSES.items()},
    "continuing": sorted(name for name, sessions in test_agents.SESSIONS if sessions == "continue"),
    "episode_apis": {
        name: test_agents.agent(SimpleNamespace(base_url="http://model"), name)["model"]["api"]
        for name in ("fake-agent", "fake-oneshot")
    },
    "unit_apis": test_harness.APIS,
    "written": {f"{block.path}:{block.name}": block.write() for block in BLOCKS},
}))
"""


def copy_checkout(destination: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".mypy_cache")
    for folder in ("operator/episode_operator", "tests", "hack", "docs"):
        shutil.copytree(REPO / folder, destination / folder, ignore=ignore)
    shutil.copy2(REPO / "README.md", destination / "README.md")
    return destination


def test_a_harness_added_to_the_registry_and_its_code_reaches_every_derived_table(tmp_path: Path) -> None:
    checkout = copy_checkout(tmp_path / "checkout")
    for path, (anchor, addition) in ADDITIONS.items():
        text = (checkout / path).read_text()
        assert text.count(anchor) == 1, f"{path}: the anchor {anchor!r} is not there once"
        (checkout / path).write_text(text.replace(anchor, anchor + addition))

    # The toolchain build list, and the images hack/cluster builds and keys.
    listing = subprocess.run(
        [sys.executable, str(checkout / "hack" / "toolchain"), "list"], capture_output=True, text=True, check=True
    ).stdout
    assert [line.split("\t")[0] for line in listing.splitlines()] == [*FAKES, *HARNESSES]
    cluster = load_script("cluster", root=checkout)
    images = [spec.name for spec in cluster.toolchain_image_specs()]
    assert images[: len(FAKES)] == [f"episode-operator.local/toolchain-{name}:0.1.0" for name in FAKES]
    assert len(images) == len(FAKES) + len(HARNESSES)

    # The tests' tables and the docs' tables, derived in the copy (its package first on the path).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout / "operator"), str(checkout)]))
    result = subprocess.run(
        [sys.executable, "-c", DERIVED], cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    derived = json.loads(result.stdout)
    assert Path(derived["package"]).is_relative_to(checkout)
    assert derived["presets"] == [*FAKES, *HARNESSES]
    assert {name: derived["proofs"][name] for name in FAKES} == {name: [f"{name}/events.jsonl"] for name in FAKES}
    continuing = [name for name, entry in HARNESSES.items() if entry.continues]
    assert derived["continuing"] == sorted(["fake-agent", *continuing])
    apis = {name: api for name, (api, _, _) in FAKES.items()}
    assert {name: derived["unit_apis"][name] for name in FAKES} == derived["episode_apis"] == apis
    rows = [
        "| fake-agent (npm `fake-agent`) | 0.1.0 | `episode-operator.local/toolchain-fake-agent:0.1.0` "
        "| Responses | `--resume` |",
        "| fake-oneshot (npm `fake-oneshot`) | 0.1.0 | `episode-operator.local/toolchain-fake-oneshot:0.1.0` "
        "| Anthropic Messages | no |",
    ]
    for document in ("README.md", "docs/harnesses.md"):
        assert derived["written"][f"{document}:harness table"], document
        assert "\n".join(rows) in (checkout / document).read_text(), document
        assert rows[0] not in (REPO / document).read_text()
