"""A dataset folder: which of its folders are task folders (docs/task-format.md §1.1).

A folder holding ``task.toml`` is a task folder and its name is the task ID. A dataset's
task folders are its children, or nested deeper (up to six levels, as Gym's current docs
allow); hidden folders are skipped, a task folder must not be a symlink, and task IDs are
unique across the dataset. A folder that itself holds ``task.toml`` is a dataset of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from episode_operator.taskfolder.errors import Problem

MAX_DEPTH = 6
TASK_TOML = "task.toml"


@dataclass(frozen=True)
class DatasetTask:
    """A task folder found in a dataset: its ID (the folder's name) and where it is."""

    name: str
    path: Path


@dataclass(frozen=True)
class Dataset:
    tasks: list[DatasetTask]
    problems: list[Problem]


def discover_dataset(root: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH) -> Dataset:
    """The task folders under ``root``, by relative path order, and every rule they break."""
    base = Path(root)
    if not base.is_dir():
        return Dataset([], [Problem(str(base), None, "not a directory")])
    if (base / TASK_TOML).is_file():
        return Dataset([DatasetTask(base.resolve().name, base)], [])
    tasks: list[DatasetTask] = []
    problems: list[Problem] = []
    seen: dict[str, Path] = {}

    def visit(folder: Path, depth: int) -> None:
        for child in sorted(folder.iterdir(), key=lambda path: path.name):
            if child.name.startswith(".") or not child.is_dir():
                continue
            is_task = (child / TASK_TOML).exists()
            if child.is_symlink():
                if is_task:
                    problems.append(Problem(str(child), None, "a task folder must not be a symlink"))
                continue
            if is_task:
                if child.name in seen:
                    problems.append(
                        Problem(str(child), None, f"task ID {child.name!r} is also the folder {seen[child.name]}")
                    )
                    continue
                seen[child.name] = child
                tasks.append(DatasetTask(child.name, child))
            elif depth < max_depth:
                visit(child, depth + 1)

    visit(base, 1)
    return Dataset(tasks, problems)
