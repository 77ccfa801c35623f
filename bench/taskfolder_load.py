"""How long does loading, validating and planning a 200-step task folder take?

Baseline, measured in the same run: reading the same files from disk and parsing
task.toml with tomllib, the least any loader must do. Prints a table and writes
``bench/out/taskfolder_load.json``. Usage: ``python bench/taskfolder_load.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan

OUT = Path(__file__).resolve().parent / "out"


def write_folder(root: Path, steps: int) -> None:
    lines = ['multi_step_reward_strategy = "mean"', "[environment]", 'docker_image = "img:1"', 'workdir = "/app"']
    for index in range(steps):
        name = f"{index:03d}-step"
        lines += ["[[steps]]", f'name = "{name}"', f"min_reward = {index % 3 / 2}", "[steps.agent]", "timeout_sec = 60"]
        folder = root / "steps" / name
        (folder / "workdir").mkdir(parents=True)
        (folder / "tests").mkdir()
        (folder / "solution").mkdir()
        (folder / "instruction.md").write_text(f"<!-- canary GUID x -->\n\nDo step {index}.\n")
        (folder / "workdir" / "setup.sh").write_text("true\n")
        (folder / "workdir" / "data.txt").write_text("x" * 200)
        (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        (folder / "solution" / "solve.sh").write_text("true\n")
    (root / "tests").mkdir()
    (root / "tests" / "helpers.sh").write_text("true\n")
    (root / "task.toml").write_text("\n".join(lines) + "\n")


def best_of(runs: int, action: Callable[[], object]) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def baseline(root: Path) -> None:
    for directory, _, names in os.walk(root):
        for name in names:
            Path(directory, name).read_bytes()
    tomllib.loads((root / "task.toml").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=15)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary) / "task"
        root.mkdir()
        write_folder(root, options.steps)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            archive.add(root, arcname=".")
        tar_bytes = buffer.getvalue()
        mapping = {path: entry.data for path, entry in TaskFiles.from_directory(root).items()}
        turns = len(resolve_plan(load_task(TaskFiles.from_directory(root))).turns)
        assert turns == options.steps
        cases = {
            "baseline: read files + tomllib": lambda: baseline(root),
            "directory: load + validate + plan": lambda: resolve_plan(load_task(TaskFiles.from_directory(root))),
            "tar.gz: load + validate + plan": lambda: resolve_plan(load_task(TaskFiles.from_tar(tar_bytes))),
            "mapping: load + validate + plan": lambda: resolve_plan(load_task(TaskFiles.from_mapping(mapping))),
        }
        results = {name: best_of(options.runs, action) for name, action in cases.items()}
    base = results["baseline: read files + tomllib"][0]
    print(f"task folder of {options.steps} steps, {len(mapping)} files; best and median of {options.runs} runs")
    print(f"{'case':40} {'best ms':>9} {'median ms':>10} {'× baseline':>11}")
    for name, (best, median) in results.items():
        print(f"{name:40} {best * 1000:9.1f} {median * 1000:10.1f} {best / base:11.1f}")
    OUT.mkdir(exist_ok=True)
    report = {
        "steps": options.steps,
        "files": len(mapping),
        "runs": options.runs,
        "cases": {
            name: {"best_s": best, "median_s": median, "ratio_to_baseline": best / base}
            for name, (best, median) in results.items()
        },
    }
    (OUT / "taskfolder_load.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
