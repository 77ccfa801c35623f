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


def test_no_two_modules_share_a_name() -> None:
    """A newcomer who opens ``store.py`` should find the one store: a module's file name is unique in
    the package, whatever its layer (``__init__.py`` aside)."""
    by_name: dict[str, list[str]] = {}
    package = REPO / "operator" / "episode_operator"
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(package)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
