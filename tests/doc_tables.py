"""The docs' tables that are rendered from the code, between ``<!-- BEGIN name -->`` and
``<!-- END name -->`` markers: each block is exactly what its renderer prints, so a table cannot
drift from the code it shows. ``hack/generate`` rewrites them (``python -m tests.doc_tables --write``);
``tests/unit/test_readme_tables.py`` fails while one differs.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from episode_operator.kube.objects.pods import AgentImages
from episode_operator.runtime import gym_server, limits, sandbox_images, seed
from episode_operator.runtime.agents import harnesses
from episode_operator.runtime.turn import table

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Block:
    path: str  # from the repository's root
    name: str  # the markers' name
    render: Callable[[], str]

    def pattern(self) -> re.Pattern[str]:
        return re.compile(rf"(<!-- BEGIN {re.escape(self.name)} -->\n)(.*?)(<!-- END {re.escape(self.name)} -->)", re.S)

    def current(self) -> str | None:
        found = self.pattern().search((REPO / self.path).read_text())
        return found.group(2) if found else None

    def write(self) -> bool:
        """Rewrite the block from its renderer; whether the file changed."""
        file = REPO / self.path
        text = file.read_text()
        if self.pattern().search(text) is None:
            raise SystemExit(f"{self.path}: no <!-- BEGIN {self.name} --> … <!-- END {self.name} --> markers")
        updated = self.pattern().sub(lambda found: found.group(1) + self.render() + found.group(3), text)
        file.write_text(updated)
        return updated != text


BLOCKS = (
    Block("docs/runtime.md", "seed table", seed.render_table),
    Block("docs/runtime.md", "stage table", table.render_table),
    Block("docs/runtime.md", "dockerfile making table", sandbox_images.render_making_table),
    Block("README.md", "output limits", limits.render_table),
    Block("README.md", "harbor settings", gym_server.render_harbor_table),
    # One row per entry of the harness registry (runtime/agents/harness_registry.py).
    Block("README.md", "harness table", lambda: harnesses.render_table(AgentImages().toolchain)),
    Block("docs/harnesses.md", "harness table", lambda: harnesses.render_table(AgentImages().toolchain)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="Rewrite every block from the code.")
    options = parser.parse_args()
    for block in BLOCKS:
        if options.write:
            print(f"{block.path} ({block.name}): {'rewritten' if block.write() else 'unchanged'}")
        else:
            print(f"{block.path} ({block.name}): {'up to date' if block.current() == block.render() else 'differs'}")


if __name__ == "__main__":
    main()
