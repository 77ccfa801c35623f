"""Citations of documents: every one names a file of this repository, and a section that file has.

Code and docs cite the project's docs by path and section (``docs/task-format.md §3.4.3``,
``docs/task-format.md "Gym image rule"``). Someone who clones the repository must be able to
read what is cited, so this fails on a cited path the repository lacks, on a section number
or quoted heading the cited doc lacks, on a bare ``§N`` whose doc is ambiguous, and on the
names of documents that lived outside the repository.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# Documents that were never in the repository, and paths outside it (written so that this file does not match).
OUTSIDE = re.compile(
    r"\b(?:TASK-FORMAT|ARCHITECTURE|LOCAL-CLUSTER|AGENTS)\.md\b|\.\./(?:shared|seed)/|/work/" + "shared"
)
SECTION = r"\d+(?:\.\d+)*"
# After a cited path: `§3.4`, `§3.6–3.8`, `"Gym image rule"`, joined by commas or "and".
REFERENCE = re.compile(rf'(?:\s*,\s*|\s+and\s+|\s+)(?:§({SECTION})(?:\s*[–-]\s*§?({SECTION}))?|"([^"\n]+)")')
BARE = re.compile(rf"§({SECTION})(?:\s*[–-]\s*§?({SECTION}))?")
NOT_OURS = re.compile(r"RFC\s*\d+\s*$")  # "RFC 9110 §7.6.1" cites an RFC
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)")


def repo_paths(root: Path) -> list[str]:
    """Path prefixes a citation of a repository file starts with: the repository's top-level folders."""
    return sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))


def doc_path_pattern(prefixes: list[str]) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w./-])((?:{'|'.join(map(re.escape, prefixes))})/[\w./-]*?\.md)\b(?!x)")


@dataclass(frozen=True)
class Doc:
    sections: frozenset[str]
    headings: tuple[str, ...]


def read_doc(path: Path) -> Doc:
    text = path.read_text(encoding="utf-8")
    headings = tuple(match.group(1) for match in HEADING.finditer(text))
    numbers = {match.group(1) for heading in headings if (match := re.match(rf"({SECTION})\.?\s", heading))}
    return Doc(frozenset(numbers), headings)


def citation_problems(text: str, where: str, root: Path) -> list[str]:
    """Every broken citation in ``text`` (the contents of ``where``, a path relative to ``root``)."""
    problems = [f"{where}: cites {found[0]!r}, which is not in the repository" for found in OUTSIDE.finditer(text)]
    docs: dict[str, Doc | None] = {}

    def doc(path: str) -> Doc | None:
        if path not in docs:
            file = root / path
            docs[path] = read_doc(file) if file.is_file() else None
        return docs[path]

    def check_section(path: str, number: str | None, heading: str | None) -> None:
        cited = doc(path)
        if cited is None:
            return
        if number is not None and number not in cited.sections:
            problems.append(f"{where}: cites {path} §{number}, which {path} has no section of")
        if heading is not None and not any(heading in text for text in cited.headings):
            problems.append(f"{where}: cites {path} {heading!r}, which {path} has no heading of")

    cited_paths: set[str] = set()
    with_sections: set[str] = set()
    spans: list[tuple[int, int]] = []
    for match in doc_path_pattern(repo_paths(root)).finditer(text):
        path = match.group(1)
        cited_paths.add(path)
        if doc(path) is None:
            problems.append(f"{where}: cites {path}, which does not exist")
            continue
        end = match.end()
        while reference := REFERENCE.match(text, end):
            first, last, heading = reference.groups()
            for number in (first, last):
                if number is not None:
                    with_sections.add(path)
                    check_section(path, number, None)
            if heading is not None:
                check_section(path, None, heading)
            end = reference.end()
        spans.append((match.start(), end))
    if where.endswith(".md"):
        for link in LINK.finditer(text):
            target = link.group(1)
            if "://" not in target and not ((root / where).parent / target).is_file():
                problems.append(f"{where}: links {target}, which does not exist")

    # A bare §N: in a doc, the doc itself; elsewhere the one doc the file cites (with sections, if several).
    own = where if where.startswith("docs/") and where.endswith(".md") else None
    candidates = {own} if own else {p for p in cited_paths if p.startswith("docs/") and doc(p) is not None}
    if len(candidates) > 1:
        candidates &= with_sections
    for bare in BARE.finditer(text):
        if any(start <= bare.start() < end for start, end in spans) or NOT_OURS.search(text[: bare.start()][-16:]):
            continue
        if len(candidates) != 1:
            line = text.count("\n", 0, bare.start()) + 1
            problems.append(f"{where}:{line}: §{bare.group(1)} does not say which doc it cites")
            continue
        (path,) = candidates
        for number in bare.groups():
            if number is not None:
                check_section(path, number, None)
    return problems


def repository_texts(root: Path) -> Iterator[tuple[str, str]]:
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        parts = relative.parts
        if any(part in SKIPPED_DIRS or part.startswith(".venv") or part.endswith(".egg-info") for part in parts):
            continue
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield relative.as_posix(), text


def test_every_citation_names_a_repository_file_and_its_section() -> None:
    this_file = Path(__file__).resolve().relative_to(REPO).as_posix()  # its own cases below are broken on purpose
    problems = [
        problem
        for where, text in repository_texts(REPO)
        if where != this_file
        for problem in citation_problems(text, where, REPO)
    ]
    assert not problems, "\n".join(problems)


# The checker itself, on made-up files: each broken citation is found.
DOC = "docs/" + "spec.md"
SPEC = "# Spec\n\n## 1. One\n\n### 1.2 Sub\n\n#### Named rule\n\n## 3. Three\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / DOC).write_text(SPEC)
    (tmp_path / "code").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'see {DOC} §1.2, §3 and {DOC} "Named rule"; then §1', None),
        (f"a range: {DOC} §1–1.2", None),
        ("RFC 9110 §7.6.1", None),
        (f"see {DOC} §2", "has no section of"),
        (f"see {DOC} §1.2–§4", "has no section of"),
        (f'see {DOC} "Other rule"', "has no heading of"),
        (f"see {DOC} §1, later §9", "has no section of"),
        ("see docs/" + "missing.md §1", "does not exist"),
        ("see §1", "does not say which doc"),
        ("see TASK-FORMAT" + ".md §1", "not in the repository"),
        ("see ../" + "shared/docs/x", "not in the repository"),
    ],
)
def test_the_checker_finds_broken_citations(root: Path, text: str, expected: str | None) -> None:
    problems = citation_problems(text, "code/module.py", root)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in problem for problem in problems), problems


def test_a_doc_cites_its_own_sections_bare(root: Path) -> None:
    assert citation_problems("as §1.2 says", DOC, root) == []
    assert citation_problems("as §7 says", DOC, root) != []
    assert citation_problems("[the spec](spec.md) and [gone](gone.md)", "docs/other.md", root) == [
        "docs/other.md: links gone.md, which does not exist"
    ]
