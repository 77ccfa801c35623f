"""Domain errors of the task-folder layer.

A task folder is refused with *every* problem found, not the first one: an author fixing a
folder wants the whole list at once, and the operator writes the list into the Episode's
status. Each problem names the file inside the task folder and, where there is one, the
TOML key, so a message can be acted on without reading this code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Problem:
    """One reason to refuse (or, as a warning, to doubt) a task folder."""

    file: str
    key: str | None
    message: str
    # A line of ``file`` (Dockerfiles); rendered ``file:line:`` as compilers do.
    line: int | None = None

    def render(self) -> str:
        """``file: key: message`` (``file:line: message`` with a line) — the form used by the CLI and in status."""
        if self.line is not None:
            return f"{self.file}:{self.line}: {self.message}"
        if self.key:
            return f"{self.file}: {self.key}: {self.message}"
        return f"{self.file}: {self.message}"

    def as_json(self) -> dict[str, str | int | None]:
        """The shape of ``kubectl-episode validate --json``."""
        shape: dict[str, str | int | None] = {"file": self.file, "key": self.key, "message": self.message}
        if self.line is not None:
            shape["line"] = self.line
        return shape


class TaskRefused(Exception):
    """The task folder cannot run; ``problems`` lists every reason found."""

    def __init__(self, problems: list[Problem], warnings: list[Problem] | None = None) -> None:
        self.problems = list(problems)
        self.warnings = list(warnings or [])
        super().__init__("; ".join(problem.render() for problem in self.problems))
