"""tests/mutations.py, as docs/testing.md prints it: every declared mutation still applies to
the code (a snippet the code no longer holds fails here, so the table moves with the code),
and a mutation run reports which test caught it."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def mutations(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "tests/mutations.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_every_mutation_applies() -> None:
    listed = mutations("--list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "applies: test.sh runs as root, not as [verifier].user" in listed.stdout


def test_a_mutation_run_names_the_test_that_caught_it() -> None:
    run = mutations("-k", "reward-txt-unicode-digits", "tests/unit/test_rewards.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_rewards.py::test_reward_file_parsing[txt-arabic-indic-digit]" in run.stdout
    assert run.stdout.rstrip().endswith("1 of 1 mutations caught")


def test_docs_testing_shows_every_mutation_caught() -> None:
    """docs/testing.md has a row for each declared mutation, and each says caught: a mutation
    added without its run in the docs (or shown missed) fails here."""
    listed = mutations("--list")
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    rows = dict(
        re.findall(r"^\| `([a-z0-9-]+)` \|.*\| (caught|MISSED[^|]*) \|", (REPO / "docs/testing.md").read_text(), re.M)
    )
    assert sorted(names - rows.keys()) == []
    assert sorted(name for name in names if rows[name] != "caught") == []
