"""What a bench program keeps beside its figures: how it was run, from which commit, when, for how long,
under what load and on what machine (the JSON document it writes to bench/out/)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunRecord:
    """Taken when the measuring starts; written with the figures when it ends."""

    began: float
    load_before: float

    @classmethod
    def start(cls) -> RunRecord:
        return cls(time.time(), os.getloadavg()[0])

    def write(self, path: Path, **figures: Any) -> None:
        """``path``: this run's facts, then ``figures`` (in their order)."""
        path.parent.mkdir(exist_ok=True)
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=path.parent, capture_output=True, text=True, check=False
        )
        document = {
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "commit": commit.stdout.strip(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.began)),
            "seconds": round(time.time() - self.began, 1),
            "load_average_1m": {"before": self.load_before, "after": os.getloadavg()[0]},
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
            **figures,
        }
        path.write_text(json.dumps(document, indent=2) + "\n")
