"""The cluster tier's ``xdist_group`` marks hold: ``--dist loadgroup`` keeps a group on one worker.

The cluster tier runs on pytest-xdist workers, and a module whose tests share one Helm release,
one operator of its own or one module fixture is an ``xdist_group`` (docs/testing.md, "Workers").
If the group is not honoured, two workers each make the module's fixture: two operators drive the
same Episodes and two Helm releases fight over one name — failures that look like the operator's.
pytest 9.2 stopped honouring the mark under pytest-xdist 3.8 (the worker renames an item's node id
through an attribute pytest 9.2 no longer reads), which is why pyproject.toml pins pytest below 9.2.
This runs the pinned pytest and xdist on a module grouped as the cluster tier's are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = """
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("shared-release")


@pytest.mark.parametrize("case", range(4))
def test_grouped(case):
    (Path(os.environ["GROUP_OUT"]) / str(case)).write_text(os.environ["PYTEST_XDIST_WORKER"])
"""

UNGROUPED = """
import pytest


@pytest.mark.parametrize("case", range(6))
def test_free(case):
    pass
"""


def test_a_modules_group_runs_on_one_worker(tmp_path: Path) -> None:
    tests, out = tmp_path / "tests", tmp_path / "out"
    tests.mkdir()
    out.mkdir()
    (tests / "test_grouped.py").write_text(GROUPED)
    (tests / "test_free.py").write_text(UNGROUPED)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup", "-q"],
        cwd=tests,
        env={**os.environ, "GROUP_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers = {case.name: case.read_text() for case in out.iterdir()}
    assert len(workers) == 4 and len(set(workers.values())) == 1, workers
