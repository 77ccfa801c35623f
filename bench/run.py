"""Issue 7's benchmark suite: the operator's cost per turn, per episode and at scale.

Usage (the cluster up: ``sudo hack/cluster up``): ``.venv/bin/python bench/run.py [--quick]``.
Prints one table per group, each against a baseline measured in the same run, and writes
``bench/out/issue7-<date>.json`` (and ``issue7-latest.json``). See ``bench/RESULTS.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The suite uses the cluster-test harness (tests/cluster/harness.py): the checkout's root
# must be importable when this file is run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.suite.main import main

if __name__ == "__main__":
    sys.exit(main())
