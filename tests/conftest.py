"""Shared test configuration: where the repository's example task folders live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_TASKS = REPO / "examples" / "tasks"


def pytest_configure(config: pytest.Config) -> None:
    """Under tests/mutations.py, the package must be the mutated copy, or a mutation looks missed."""
    mutated = os.environ.get("EPISODE_MUTATION_PACKAGE")
    if mutated:
        import episode_operator

        if not Path(episode_operator.__file__).resolve().is_relative_to(Path(mutated).resolve()):
            raise pytest.UsageError(f"imported {episode_operator.__file__}, not the mutated copy in {mutated}")
