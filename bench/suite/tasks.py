"""The task folders the benchmarks run, generated so every command does trivially little."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from episode_operator.runtime.archive import folder_tar, mapped_tar
from episode_operator.taskfolder import TaskFiles, resolve_plan, validate_task

IMAGE = "episode-operator.local/sandbox:bookworm"
WORKDIR = "/app"


@dataclass(frozen=True)
class StepScripts:
    """A step's setup.sh, solve.sh and test.sh, formatted with its number ``{index}``."""

    setup: str
    solve: str
    test: str


BASH = StepScripts(
    setup=f"echo {{index}} > {WORKDIR}/setup-{{index}}\n",
    solve=f"echo {{index}} > {WORKDIR}/answer\n",
    test=(
        f'if [ "$(cat {WORKDIR}/answer)" = {{index}} ]; then r=1; else r=0; fi\necho $r > /logs/verifier/reward.txt\n'
    ),
)
# The same steps in the line language of the in-memory sandbox (tests/unit/fake_sandbox.py),
# which bench/suite/fake_operator.py runs instead of pods.
FAKE = StepScripts(setup="write setup-{index} {index}\n", solve="write answer {index}\n", test="check answer {index}\n")


def trivial_task(
    steps: int, *, setup: bool = True, name: str = "bench/trivial", scripts: StepScripts = BASH
) -> dict[str, str]:
    """``steps`` steps; each: a one-line ``workdir/setup.sh``, oracle ``solve.sh`` and ``test.sh``."""
    lines = [
        'schema_version = "1.4"',
        'multi_step_reward_strategy = "mean"',
        "",
        "[task]",
        f'name = "{name}"',
        "",
        "[environment]",
        f'docker_image = "{IMAGE}"',
        f'workdir = "{WORKDIR}"',
    ]
    files = {"instruction.md": "A generated benchmark task: every step does trivially little.\n"}
    for index in range(1, steps + 1):
        step = f"s{index}"
        lines += ["", "[[steps]]", f'name = "{step}"']
        files[f"steps/{step}/instruction.md"] = f"Write {index} to {WORKDIR}/answer.\n"
        if setup:
            files[f"steps/{step}/workdir/setup.sh"] = scripts.setup.format(index=index)
        files[f"steps/{step}/solution/solve.sh"] = scripts.solve.format(index=index)
        files[f"steps/{step}/tests/test.sh"] = scripts.test.format(index=index)
    files["task.toml"] = "\n".join(lines) + "\n"
    return files


def invalid_task() -> dict[str, str]:
    """A folder the operator refuses at once (``harbor:invalid_task``) without creating a pod."""
    return {"task.toml": "[environment]\ndocker_image = 1\n", "instruction.md": "refused\n"}


def episode_spec(files: dict[str, str], agent: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"task": {"inline": {"files": files}}, "agent": agent or {"kind": "oracle"}}


@dataclass(frozen=True)
class DirectTurn:
    """One turn's bytes and commands as the baseline sends them (the operator's own archives)."""

    name: str
    workdir_tar: bytes | None
    setup: bool
    solution_tar: bytes
    tests_tar: bytes


def direct_turns(files: dict[str, str]) -> list[DirectTurn]:
    """The turns of a task, checked by the operator's own loader, with the exact tars it uploads."""
    task_files = TaskFiles.from_mapping(files)
    validation = validate_task(task_files)
    if validation.task is None:
        raise ValueError(f"the generated task is refused: {validation.problems}")
    plan = resolve_plan(validation.task)
    turns = []
    for turn in plan.turns:
        assert turn.solution is not None
        turns.append(
            DirectTurn(
                name=turn.name,
                workdir_tar=folder_tar(task_files, turn.workdir) if turn.workdir else None,
                setup=turn.setup,
                solution_tar=folder_tar(task_files, turn.solution),
                tests_tar=mapped_tar(task_files, turn.tests),
            )
        )
    return turns
