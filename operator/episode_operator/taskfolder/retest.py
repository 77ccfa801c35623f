"""A task folder with other tests: what a regrade verifies with (``kubectl episode regrade --tests``).

A task's tests are its tests folders — ``tests/`` (the task's, layered under each step's) and
``steps/<name>/tests/`` — and nothing else: the instruction, the environment, the solutions and
``task.toml`` (the verifier's budget, user and environment among them) stay the original's, as the
agent saw them. New tests come from a task folder (its tests folders are taken, the rest ignored) or
from a folder holding ``test.sh`` (it is the new ``tests/``).
"""

from __future__ import annotations

from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.sources import TASK_CONFIG, TaskFiles

TEST_SCRIPT = "test.sh"


def is_tests_path(path: str) -> bool:
    """Whether ``path`` (a file, or a folder with a trailing '/') is in one of a task's tests folders."""
    parts = path.split("/")
    return (len(parts) > 1 and parts[0] == "tests") or (len(parts) > 3 and parts[0] == "steps" and parts[2] == "tests")


def tests_of(source: TaskFiles) -> TaskFiles:
    """The tests folders ``source`` holds: a task folder's, or the folder itself as ``tests/`` when it holds
    ``test.sh`` and no ``task.toml``."""
    if not source.has_file(TASK_CONFIG) and source.has_file(TEST_SCRIPT):
        return TaskFiles(
            {f"tests/{path}": entry for path, entry in source.items()},
            [f"tests/{directory}" for directory in source.directories],
            source.problems,
        )
    return TaskFiles(
        {path: entry for path, entry in source.items() if is_tests_path(path)},
        [directory for directory in source.directories if is_tests_path(f"{directory}/")],
        source.problems,
    )


def with_tests(task: TaskFiles, tests: TaskFiles, origin: str) -> TaskFiles:
    """``task`` with its tests folders replaced by those of ``tests`` (see :func:`tests_of`); a ``tests`` that
    holds none is a problem of the result, naming ``origin``."""
    new = tests_of(tests)
    problems = list(new.problems)
    if not len(new):
        problems.append(Problem(origin, None, "holds no tests: a task folder's tests/ or steps/*/tests/, or test.sh"))
    steps = {path.split("/")[1] for path in task if path.startswith("steps/") and not is_tests_path(path)}
    for step in sorted({path.split("/")[1] for path in new if path.startswith("steps/")} - steps):
        problems.append(Problem(origin, f"steps/{step}/tests", f"the task has no step {step}: tests of another task?"))
    files = {path: entry for path, entry in task.items() if not is_tests_path(path)} | dict(new.items())
    directories = [directory for directory in task.directories if not is_tests_path(f"{directory}/")]
    return TaskFiles(files, [*directories, *new.directories], [*task.problems, *problems])
