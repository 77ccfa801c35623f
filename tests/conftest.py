"""Shared test configuration: where the repository's example task folders live."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_TASKS = REPO / "examples" / "tasks"
