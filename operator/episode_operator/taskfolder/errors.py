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

    def render(self) -> str:
        """``file: key: message`` — the one-line form used by the CLI and in status."""
        if self.key:
            return f"{self.file}: {self.key}: {self.message}"
        return f"{self.file}: {self.message}"

    def as_json(self) -> dict[str, str | None]:
        """The shape of ``kubectl-episode validate --json``."""
        return {"file": self.file, "key": self.key, "message": self.message}


class TaskRefused(Exception):
    """The task folder cannot run; ``problems`` lists every reason found."""

    def __init__(self, problems: list[Problem], warnings: list[Problem] | None = None) -> None:
        self.problems = list(problems)
        self.warnings = list(warnings or [])
        super().__init__("; ".join(problem.render() for problem in self.problems))
