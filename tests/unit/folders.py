"""Builders of small task folders for table-driven tests.

A test states only what differs from a valid folder: ``single_step(toml, files)`` and
``multi_step(toml, steps, files)`` return mappings of path → content, where ``files``
adds or replaces files and a None content removes one.
"""

from __future__ import annotations

from collections.abc import Mapping

from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan, validate_task
from episode_operator.taskfolder.loader import Validation
from episode_operator.taskfolder.plan import SEED_SETTINGS, EpisodePlan, ServerSettings

IMAGE = "episode-operator.local/sandbox:bookworm"
ENVIRONMENT = f'[environment]\ndocker_image = "{IMAGE}"\n'
TEST_SH = "echo 1 > /logs/verifier/reward.txt\n"


def single_step(toml: str = "", files: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """A valid single-step folder; ``toml`` is appended to task.toml, ``files`` override (None removes)."""
    folder: dict[str, str] = {
        "task.toml": task_toml(toml),
        "instruction.md": "Do the thing.\n",
        "tests/test.sh": TEST_SH,
        "solution/solve.sh": "true\n",
    }
    return _apply(folder, files or {})


def multi_step(toml: str, steps: list[str], files: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """A valid multi-step folder with the given step names; ``toml`` holds the [[steps]] tables."""
    folder: dict[str, str] = {"task.toml": task_toml(toml), "tests/test.sh": TEST_SH}
    for step in steps:
        folder[f"steps/{step}/instruction.md"] = f"Instruction of {step}.\n"
    return _apply(folder, files or {})


def task_toml(toml: str) -> str:
    """``toml`` with the default [environment] table after it, unless it declares its own."""
    return toml if "[environment]" in toml else f"{toml}\n{ENVIRONMENT}"


def steps_toml(*names: str, extra: Mapping[str, str] | None = None) -> str:
    """``[[steps]]`` tables for ``names``; ``extra[name]`` is appended inside that step's table."""
    extra = extra or {}
    return "".join(f'\n[[steps]]\nname = "{name}"\n{extra.get(name, "")}\n' for name in names)


def _apply(folder: dict[str, str], files: Mapping[str, str | None]) -> dict[str, str]:
    for path, content in files.items():
        if content is None:
            folder.pop(path, None)
        else:
            folder[path] = content
    return folder


def check(folder: Mapping[str, str | bytes]) -> Validation:
    return validate_task(TaskFiles.from_mapping(folder))


def plan_of(
    folder: Mapping[str, str | bytes], multiplier: float = 1.0, settings: ServerSettings = SEED_SETTINGS
) -> EpisodePlan:
    return resolve_plan(load_task(TaskFiles.from_mapping(folder)), timeout_multiplier=multiplier, settings=settings)


def rendered(validation: Validation) -> list[str]:
    return [problem.render() for problem in validation.problems]
