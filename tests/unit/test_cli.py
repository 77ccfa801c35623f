"""``kubectl-episode validate`` and ``plan``: exit codes, JSON shapes, messages, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from episode_operator.cli.kubectl_episode import cli
from tests.conftest import EXAMPLE_TASKS
from tests.unit.folders import IMAGE, multi_step, single_step, steps_toml

EXAMPLES = sorted(path for path in EXAMPLE_TASKS.iterdir() if path.is_dir())


def write(folder: dict[str, str], root: Path) -> Path:
    for path, content in folder.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(content)
    return root


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_examples_validate_and_plan(example: Path) -> None:
    code, output = run("validate", str(example))
    assert code == 0 and output.endswith(f"{example}: valid\n")
    code, output = run("plan", str(example), "--json")
    assert code == 0
    plan = json.loads(output)
    assert set(plan) >= {"multiStep", "rewardStrategy", "deadlineSec", "environment", "sidecars", "turns"}
    for turn in plan["turns"]:
        assert set(turn) >= {
            "name",
            "instruction",
            "agent",
            "verifier",
            "tests",
            "solution",
            "artifacts",
            "healthcheck",
            "minReward",
            "setup",
        }
        assert set(turn["agent"]) >= {"user", "timeoutSec"}
        assert set(turn["verifier"]) >= {"mode", "timeoutSec", "user", "env", "image"}
        assert all(set(a) >= {"source", "destination", "origin", "service"} for a in turn["artifacts"])


MALFORMED = {
    "broken-toml": (single_step(files={"task.toml": "[environment\n"}), "task.toml: TOML syntax error"),
    "missing-step-folder": (
        multi_step(steps_toml("a", "b"), ["a"]),
        "steps/b/: missing: step 'b' needs its folder",
    ),
    "shared-with-verifier-environment": (
        single_step(f'[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "{IMAGE}"\n'),
        'task.toml: verifier: environment_mode = "shared" conflicts with a verifier environment table',
    ),
    "bad-step-name": (
        multi_step(steps_toml("no spaces"), ["ok"]),
        "task.toml: steps[0].name: step name 'no spaces'",
    ),
    "duplicate-step-names": (multi_step(steps_toml("a", "a"), ["a"]), "task.toml: duplicate step names: a"),
    "dotdot-artifact": (
        single_step('artifacts = ["/app/../secret"]\n'),
        "task.toml: artifacts[0].source: artifact source '/app/../secret' must not contain '..'",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_folders(case: str, tmp_path: Path) -> None:
    folder, expected = MALFORMED[case]
    path = str(write(folder, tmp_path))
    code, output = run("validate", path)
    assert code == 1
    assert expected in output and "refused" in output and "Traceback" not in output
    code, output = run("validate", path, "--json")
    assert code == 1
    report = json.loads(output)
    assert report["valid"] is False
    assert all(set(error) == {"file", "key", "message"} for error in report["errors"])
    assert any(expected.startswith(f"{e['file']}: ") for e in report["errors"])
    code, output = run("plan", path, "--json")
    assert code == 1 and expected in output


def test_validate_json_of_a_valid_folder_lists_warnings(tmp_path: Path) -> None:
    path = str(write(single_step("[agent]\nmystery = 1\n"), tmp_path))
    code, output = run("validate", path, "--json")
    assert code == 0
    assert json.loads(output) == {
        "valid": True,
        "errors": [],
        "warnings": [{"file": "task.toml", "key": "agent.mystery", "message": "unknown key, ignored"}],
    }


def test_validate_warns_of_what_the_operator_refuses_at_seed(tmp_path: Path) -> None:
    """A valid folder no Episode here can run (an allowlist naming a hostname): valid, with the
    seed's refusal as a warning naming the key; the same folder with an address has none."""
    named = '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
    code, output = run("validate", str(write(single_step(named), tmp_path / "named")), "--json")
    assert code == 0
    [warning] = json.loads(output)["warnings"]
    assert (warning["file"], warning["key"]) == ("task.toml", "agent.allowed_hosts")
    assert warning["message"].startswith("refused at seed: 'pypi.org' is a hostname")
    address = named.replace("pypi.org", "10.0.0.1")
    code, output = run("validate", str(write(single_step(address), tmp_path / "address")), "--json")
    assert (code, json.loads(output)["warnings"]) == (0, [])


def test_plan_applies_the_timeout_multiplier() -> None:
    code, output = run("plan", str(EXAMPLE_TASKS / "hello"), "--json", "--timeout-multiplier", "2")
    assert code == 0
    turn = json.loads(output)["turns"][0]
    assert (turn["agent"]["timeoutSec"], turn["verifier"]["timeoutSec"]) == (240.0, 120.0)
    code, output = run("plan", str(EXAMPLE_TASKS / "hello"), "--timeout-multiplier", "0")
    assert code == 2 and "Traceback" not in output


def test_tar_input(tmp_path: Path) -> None:
    archive = tmp_path / "hello.tgz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(EXAMPLE_TASKS), "hello"], check=True)
    assert run("validate", str(archive))[0] == 0
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    code, output = run("validate", str(tmp_path / "junk.tar"))
    assert code == 1 and "<tar>: not a readable tar archive" in output


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    code, output = run("validate", str(tmp_path / "nowhere"))
    assert code == 2 and "no such file or directory" in output


def test_console_script_runs_without_traceback(tmp_path: Path) -> None:
    """The installed entry point, as users run it."""
    script = Path(sys.executable).parent / "kubectl-episode"
    result = subprocess.run([str(script), "validate", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "task.toml: missing: a task folder needs task.toml" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
