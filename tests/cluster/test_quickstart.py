"""The README's one-command quickstart works: chart install, an Episode, its reward."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.exclusive(
    "runs hack/venv (reinstalls the package the other workers' operators run from) and installs the chart "
    "as a user would: into episode-operator-system, watching default, with the one data API of the cluster"
)
def test_quickstart_runs_an_episode_to_its_reward(kubeconfig: Path) -> None:
    environment = {**os.environ, "EPISODE_VENV": str(Path(sys.executable).parent.parent)}
    try:
        result = subprocess.run(
            [str(REPO / "hack" / "quickstart"), "examples/tasks/hello"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1200,
            env=environment,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "release episode-operator" in result.stdout
        assert "Succeeded (Graded): reward 1" in result.stdout
    finally:
        subprocess.run(
            [sys.executable, str(REPO / "hack" / "chart"), "uninstall"],
            cwd=REPO,
            timeout=300,
            env={**environment, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
        )
