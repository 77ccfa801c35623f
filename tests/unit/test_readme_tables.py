"""The README's and the docs' tables say what the code has: the rendered blocks are the code's own
rendering (``tests/doc_tables.py``, rewritten by ``hack/generate``), and the hand-written tables
name exactly the verbs, commands, options and values the code defines — a verb, command or value
added, renamed or removed without its row fails here."""

from __future__ import annotations

import re
from typing import Any

import click
import pytest
import yaml

from episode_operator.cli.kubectl_episode import cli
from tests.chart import CHART
from tests.conftest import REPO
from tests.doc_tables import BLOCKS, Block
from tests.unit.test_release import load_script

README = (REPO / "README.md").read_text()


def table_after(heading_row: str, text: str = README) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table whose header row starts with ``heading_row``."""
    lines = text[text.index(heading_row) :].splitlines()
    rows = []
    for line in lines[2:]:  # the header and its rule
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: f"{block.path}:{block.name}")
def test_every_rendered_block_is_what_the_code_renders(block: Block) -> None:
    assert block.current() == block.render(), f"{block.path} ({block.name}) differs from the code: run hack/generate"


def test_the_cluster_verb_table_has_a_row_for_each_verb_of_hack_cluster() -> None:
    verbs = load_script("cluster").VERBS
    rows = [code_spans(row[0])[0] for row in table_after("| verb | what it does |")]
    assert rows == list(verbs)
    assert f"Usage: hack/cluster {' | '.join(verbs)}" in (REPO / "hack" / "cluster").read_text()


def test_the_cli_table_has_a_row_for_each_command_and_only_options_it_takes() -> None:
    context = click.Context(cli)
    commands = {name: cli.get_command(context, name) for name in cli.list_commands(context)}
    rows = table_after("| command | |")
    named_commands = [[span.split()[0] for span in code_spans(row[0])] for row in rows]
    assert sorted(name for names in named_commands for name in names) == sorted(commands)
    for row, names in zip(rows, named_commands, strict=True):
        taken = {
            option
            for name in names
            for param in commands[name].params
            for option in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
        }
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", " ".join(code_spans(" ".join(row)))))
        assert named <= taken, f"{names}: the README names {sorted(named - taken)}, which they do not take"


def leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key of the chart's values whose value is not a mapping with keys (an empty map is a leaf)."""
    keys = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys |= leaf_keys(value, f"{path}.")
        else:
            keys.add(path)
    return keys


def documented_values() -> set[str]:
    """The keys the README's values table names: ``a.b``, then ``.c`` for ``a.c``."""
    names: set[str] = set()
    for row in table_after("| value | default | |"):
        parent = ""
        for span in code_spans(row[0]):
            if span.startswith("."):
                names.add(parent + span[1:])
            else:
                names.add(span)
                parent = span.rsplit(".", 1)[0] + "." if "." in span else ""
    for row in table_after("| flag | Helm value | default | what it bounds |"):
        names.update(code_spans(row[1]))
    names.update(harbor_rows())
    return names


def harbor_rows() -> list[str]:
    """The Helm values the table of Gym's harbor server settings has a row for."""
    return [code_spans(row[0])[0] for row in table_after("| Helm value | Episode field | default | meaning |")]


def test_the_values_table_names_every_value_of_the_chart_and_no_other() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = leaf_keys(values)
    documented = documented_values()
    # A row may name a mapping whole (`resources`: its requests and limits together).
    covered = {leaf for leaf in leaves if leaf in documented or any(leaf.startswith(f"{name}.") for name in documented)}
    assert leaves - covered == set(), "values.yaml keys without a README row"
    assert {
        name for name in documented if name not in leaves and not any(leaf.startswith(f"{name}.") for leaf in leaves)
    } == set()


def test_each_harbor_setting_of_the_chart_has_a_row_of_its_own() -> None:
    """The values table's `gym.settings` row covers the settings as a whole; each of Gym's harbor
    server settings the chart holds has its own row besides, with its Episode field."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert harbor_rows() == [f"gym.settings.harbor.{key}" for key in values["gym"]["settings"]["harbor"]]
