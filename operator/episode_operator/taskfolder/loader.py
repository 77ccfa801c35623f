"""Load and validate a task folder: every refusal of docs/task-format.md §4 decidable at load.

``validate_task`` never raises: it returns every problem and warning found, so
``kubectl-episode validate`` and the operator's status can show them all. ``load_task``
raises :class:`TaskRefused` with that list when there is any problem.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from episode_operator.taskfolder.compose import ComposeSpec, parse_compose
from episode_operator.taskfolder.dockerfiles import ENVIRONMENT_DOCKERFILE, replay_warnings
from episode_operator.taskfolder.errors import Problem, TaskRefused
from episode_operator.taskfolder.sources import TASK_CONFIG, TaskFiles
from episode_operator.taskfolder.task_toml import (
    MAIN_SERVICE,
    EnvironmentConfig,
    StepConfig,
    TaskConfig,
    unknown_keys,
)

INSTRUCTION = "instruction.md"
TESTS = "tests"
LEGACY_KEYS = {
    "version": "read as schema_version",
    "multi_step_reward_mode": "dropped; set multi_step_reward_strategy",
    "environment.memory": "read as environment.memory_mb",
    "environment.storage": "read as environment.storage_mb",
    "environment.allow_internet": "read as environment.network_mode",
    "environment.image": "read as environment.docker_image",
}


@dataclass(frozen=True)
class LoadedTask:
    """A task folder that passed validation, with its parsed settings."""

    files: TaskFiles
    config: TaskConfig
    compose: ComposeSpec
    warnings: tuple[Problem, ...]

    @property
    def digest(self) -> str:
        return self.files.digest()


@dataclass(frozen=True)
class Validation:
    """Everything ``validate`` found; ``task`` is set only when there is no problem."""

    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...]
    task: LoadedTask | None

    @property
    def valid(self) -> bool:
        return not self.problems


def load_task(files: TaskFiles) -> LoadedTask:
    """The validated task, or :class:`TaskRefused` listing every problem."""
    result = validate_task(files)
    if result.task is None:
        raise TaskRefused(list(result.problems), list(result.warnings))
    return result.task


def validate_task(files: TaskFiles) -> Validation:
    """Check a task folder against every load-time refusal, collecting all of them."""
    checker = _Checker(files)
    checker.run()
    problems = tuple(sorted(set(checker.problems), key=_order))
    warnings = tuple(sorted(set(checker.warnings), key=_order))
    task = None
    if not problems and checker.config is not None:
        task = LoadedTask(files, checker.config, checker.compose, warnings)
    return Validation(problems, warnings, task)


def _order(problem: Problem) -> tuple[int, str, str, str]:
    # task.toml first, then the folder's files in path order.
    return (problem.file != TASK_CONFIG, problem.file, problem.key or "", problem.message)


class _Checker:
    def __init__(self, files: TaskFiles) -> None:
        self.files = files
        self.problems: list[Problem] = list(files.problems)
        self.warnings: list[Problem] = []
        self.config: TaskConfig | None = None
        self.compose = ComposeSpec()

    def refuse(self, file: str, key: str | None, message: str) -> None:
        self.problems.append(Problem(file, key, message))

    def warn(self, file: str, key: str | None, message: str) -> None:
        self.warnings.append(Problem(file, key, message))

    def run(self) -> None:
        data = self.read_toml()
        if data is None:
            return
        for key in unknown_keys(TaskConfig, data):
            self.warn(TASK_CONFIG, key, "unknown key, ignored")
        for key, note in _legacy_keys_used(data):
            self.warn(TASK_CONFIG, key, f"legacy key, {note}")
        try:
            self.config = TaskConfig.model_validate(data)
        except ValidationError as error:
            self.problems += _schema_problems(error, data)
        if self.config is None:
            self.check_steps_by_name(_raw_step_names(data))
            return
        self.compose = self.read_compose(self.config.environment)
        if self.config.is_multi_step:
            self.check_multi_step(self.config)
        else:
            self.check_single_step(self.config)
        self.check_services(self.config)
        self.check_environment(self.config.environment)
        self.warnings += replay_warnings(self.files, self.config, self.compose)

    def read_toml(self) -> dict[str, Any] | None:
        if not self.files.has_file(TASK_CONFIG):
            self.refuse(TASK_CONFIG, None, "missing: a task folder needs task.toml")
            return None
        try:
            text = self.files[TASK_CONFIG].data.decode("utf-8")
        except UnicodeDecodeError as error:
            self.refuse(TASK_CONFIG, None, f"not valid UTF-8 ({error.reason} at byte {error.start})")
            return None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            self.refuse(TASK_CONFIG, None, f"TOML syntax error: {error}")
            return None

    def read_compose(self, environment: EnvironmentConfig) -> ComposeSpec:
        spec, problems, warnings = parse_compose(self.files, environment)
        self.problems += problems
        self.warnings += warnings
        return spec

    def read_text(self, path: str) -> str | None:
        try:
            return self.files[path].data.decode("utf-8")
        except UnicodeDecodeError:
            self.refuse(path, None, "not valid UTF-8")
            return None

    # Single-step -----------------------------------------------------------------------
    def check_single_step(self, config: TaskConfig) -> None:
        if not self.files.has_file(INSTRUCTION):
            self.refuse(INSTRUCTION, None, "missing: a single-step task needs instruction.md")
        else:
            self.read_text(INSTRUCTION)
        script = test_script(config)
        mode = config.task_verifier_mode()
        if not self.files.has_dir(TESTS):
            self.refuse(f"{TESTS}/", None, f"missing: a single-step task needs a tests/ folder with {script}")
        elif not self.files.has_file(f"{TESTS}/{script}"):
            if self.files.has_file(f"{TESTS}/verifier.py"):
                self.refuse(
                    f"{TESTS}/verifier.py",
                    None,
                    f"Python verifiers are not supported by episode-operator; add tests/{script}",
                )
            elif mode == "shared":
                self.refuse(f"{TESTS}/{script}", None, "missing: the verifier runs tests/" + script)
            else:
                self.warn(f"{TESTS}/{script}", None, f"missing: the verifier image must provide /tests/{script}")
        if mode == "separate":
            self.check_separate_image("[verifier.environment]", config.verifier.environment, TESTS)

    # Multi-step ------------------------------------------------------------------------
    def check_steps_by_name(self, names: Iterable[str]) -> None:
        """Folder checks that need only a step's name: run even when task.toml is invalid."""
        for name in names:
            folder = f"steps/{name}"
            if not self.files.has_dir(folder):
                self.refuse(f"{folder}/", None, f"missing: step {name!r} needs its folder")
                continue
            if not self.files.has_file(f"{folder}/{INSTRUCTION}"):
                self.refuse(f"{folder}/{INSTRUCTION}", None, f"missing: step {name!r} needs its instruction")
            else:
                self.read_text(f"{folder}/{INSTRUCTION}")

    def check_multi_step(self, config: TaskConfig) -> None:
        steps = config.steps or []
        self.check_steps_by_name(step.name for step in steps)
        script = test_script(config)
        for index, step in enumerate(steps):
            folder = f"steps/{step.name}"
            if not (self.files.has_file(f"{folder}/{TESTS}/{script}") or self.files.has_file(f"{TESTS}/{script}")):
                self.refuse(
                    f"{folder}/{TESTS}/{script}",
                    None,
                    f"missing: step {step.name!r} needs {script} in {folder}/{TESTS}/ or {TESTS}/",
                )
            solution = f"{folder}/solution"
            if self.files.has_dir(solution) and not self.files.has_file(f"{solution}/solve.sh"):
                self.warn(
                    f"{solution}/",
                    None,
                    "has no solve.sh: the oracle cannot validate this step (nor the task)",
                )
            for misplaced in (f"{folder}/setup.sh",):
                if self.files.has_file(misplaced):
                    self.warn(misplaced, None, "not run: only workdir/setup.sh runs before the agent")
            if config.step_verifier_mode(step) == "separate":
                self.check_separate_step(config, index, step)
        if self.files.has_file(f"{TESTS}/verifier.py"):
            self.warn(f"{TESTS}/verifier.py", None, "Python verifiers are single-step only; ignored")

    def check_separate_step(self, config: TaskConfig, index: int, step: StepConfig) -> None:
        folder = f"steps/{step.name}"
        table = f"steps[{index}].verifier.environment"
        environment = step.verifier.environment or config.verifier.environment
        effective_image = (environment or config.environment).docker_image
        if self.files.has_dir(f"{folder}/{TESTS}") and not effective_image:
            self.refuse(
                TASK_CONFIG,
                table,
                f"step {step.name!r} verifies separately and has a {folder}/{TESTS}/ folder, so its "
                "verifier environment must declare docker_image",
            )
            return
        context = f"{folder}/{TESTS}" if self.files.has_dir(f"{folder}/{TESTS}") else TESTS
        if step.verifier.environment is not None:
            self.check_separate_image(table, step.verifier.environment, context)
        elif config.verifier.environment is not None:
            self.check_separate_image("[verifier.environment]", config.verifier.environment, context)

    def check_separate_image(self, table: str, environment: EnvironmentConfig | None, context: str) -> None:
        """A separate verifier needs an image: its own, its tests folder's Dockerfile (replayed or built,
        runtime/sandbox_images.py), or (as a copy of [environment]) the task's."""
        if environment is None or environment.docker_image or self.files.has_file(f"{context}/Dockerfile"):
            return
        self.refuse(
            TASK_CONFIG,
            table,
            f"the separate verifier has no image and no definition: set docker_image in {table}",
        )

    # Both ------------------------------------------------------------------------------
    def check_services(self, config: TaskConfig) -> None:
        """Artifacts and collect hooks may only name services the compose file declares."""
        services = self.compose.service_names
        declared: list[tuple[str, str]] = [
            (f"artifacts[{i}].service", a.effective_service) for i, a in enumerate(config.artifacts)
        ]
        declared += [(f"verifier.collect[{i}].service", h.service) for i, h in enumerate(config.verifier.collect)]
        for s, step in enumerate(config.steps or []):
            declared += [
                (f"steps[{s}].artifacts[{i}].service", a.effective_service) for i, a in enumerate(step.artifacts)
            ]
            declared += [
                (f"steps[{s}].verifier.collect[{i}].service", h.service) for i, h in enumerate(step.verifier.collect)
            ]
        for key, service in declared:
            if service != MAIN_SERVICE and service not in services:
                where = self.compose.file or "environment/docker-compose.yaml (absent)"
                self.refuse(TASK_CONFIG, key, f"service {service!r} is not a service of {where}")

    def check_environment(self, environment: EnvironmentConfig) -> None:
        if environment.os == "windows":
            self.warn(
                TASK_CONFIG,
                "environment.os",
                "a Windows task is valid, but the operator runs Linux pods only",
            )
        if not environment.docker_image and not self.files.has_file(ENVIRONMENT_DOCKERFILE):
            self.warn(
                TASK_CONFIG,
                "environment.docker_image",
                f"not set, and no {ENVIRONMENT_DOCKERFILE} to make the image from: an Episode for this task "
                "must give an image (spec.image)",
            )
        if environment.workdir is not None and not environment.workdir.startswith("/"):
            self.warn(TASK_CONFIG, "environment.workdir", f"{environment.workdir!r} is not an absolute path")


def test_script(config: TaskConfig) -> str:
    """``test.sh``, or ``test.bat`` for a Windows task."""
    return "test.bat" if config.environment.os == "windows" else "test.sh"


def _legacy_keys_used(data: dict[str, Any]) -> list[tuple[str, str]]:
    used = [(key, note) for key, note in LEGACY_KEYS.items() if "." not in key and key in data]
    tables: list[tuple[str, Any]] = [("environment", data.get("environment"))]
    verifier = data.get("verifier")
    if isinstance(verifier, dict):
        tables.append(("verifier.environment", verifier.get("environment")))
    steps = data.get("steps")
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        if isinstance(step, dict) and isinstance(step.get("verifier"), dict):
            tables.append((f"steps[{index}].verifier.environment", step["verifier"].get("environment")))
    for prefix, table in tables:
        if isinstance(table, dict):
            for legacy in ("memory", "storage", "allow_internet", "image"):
                if legacy in table:
                    used.append((f"{prefix}.{legacy}", LEGACY_KEYS[f"environment.{legacy}"]))
    return used


def _raw_step_names(data: dict[str, Any]) -> list[str]:
    steps = data.get("steps")
    if not isinstance(steps, list):
        return []
    names = [step.get("name") for step in steps if isinstance(step, dict)]
    return [name for name in names if isinstance(name, str) and name and "/" not in name and ".." not in name]


def _schema_problems(error: ValidationError, data: dict[str, Any]) -> list[Problem]:
    problems = []
    for detail in error.errors(include_url=False):
        location = detail["loc"]
        key = _key(location)
        message = str(detail["msg"]).removeprefix("Value error, ")
        if detail["type"] == "missing":
            message = "required key is missing"
        elif detail["type"] not in ("value_error", "assertion_error") and "input" in detail:
            message = f"{message} (got {_shown(detail['input'])})"
        step_name = _step_name(location, data)
        if step_name is not None and f"step {step_name!r}" not in message:
            message = f"{message} (step {step_name!r})"
        problems.append(Problem(TASK_CONFIG, key, message))
    return problems


def _key(location: tuple[int | str, ...]) -> str | None:
    key = ""
    for part in location:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or None


def _step_name(location: tuple[int | str, ...], data: dict[str, Any]) -> str | None:
    if len(location) < 2 or location[0] != "steps" or not isinstance(location[1], int):
        return None
    steps = data.get("steps")
    if isinstance(steps, list) and location[1] < len(steps) and isinstance(steps[location[1]], dict):
        name = steps[location[1]].get("name")
        return name if isinstance(name, str) else None
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
