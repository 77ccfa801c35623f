"""``episode-operator`` with an in-memory sandbox: the operator's and the API server's own cost at scale.

Driving thousands of episodes through real pods is too slow on one machine. This runs the
real operator — kopf, the driver, the turn runner, its status writes, Events and data
directory, and kopf's own requests — against the real API server, with one change: every
sandbox operation is done in memory by the unit tests' fake (``tests/unit/fake_sandbox.py``),
so there are no pods and no execs. Its task folders are written in the fake's line language
(``tasks.FAKE``). Usage: ``python bench/suite/fake_operator.py run [episode-operator run options]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.unit.fake_sandbox import FakeProvider, World

from episode_operator.cli.operator_main import main
from episode_operator.kube import running


def fake_provider(*_: object, **__: object) -> FakeProvider:
    """Stands in for ``KubeProvider(client, episode, spec, plan, ...)``: a fresh in-memory world per episode."""
    return FakeProvider(World())


if __name__ == "__main__":
    running.KubeProvider = fake_provider  # type: ignore[assignment,misc]
    sys.exit(main())
