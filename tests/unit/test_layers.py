"""The import direction of docs/architecture.md, checked by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO


def test_import_contracts_hold() -> None:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert command, "import-linter is a test dependency: pip install -e '.[test]'"
    result = subprocess.run([command], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout
