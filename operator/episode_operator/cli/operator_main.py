"""``episode-operator``: runs the operator (filled in by the runtime issue)."""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of the ``episode-operator`` console script."""
    sys.stderr.write("episode-operator: the operator runtime is not part of this build yet\n")
    sys.exit(2)
