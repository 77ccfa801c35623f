"""Every module the code imports comes from a dependency pyproject.toml declares, and no more.

The package's modules (``operator/``) may import the standard library, the package itself and the
runtime ``dependencies`` only; the tests, ``bench/`` and the ``hack/`` scripts may also import the
``test`` extra. A package that is merely installed (a dependency of a dependency, or a test tool
present in the venv) is not enough: an image built from the wheel installs the declared ones only.
Which distribution provides a module is read from the installed distributions' metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "operator" / "episode_operator"
SCRIPTS = (REPO / "hack" / "chart", REPO / "hack" / "cluster")
OWN = {"episode_operator", "tests", "bench", "__future__"}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(requirements: Iterable[str]) -> set[str]:
    """The distribution names of PEP 508 requirement strings."""
    names = set()
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert match, requirement
        names.add(normalized(match[1]))
    return names


PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
RUNTIME = declared(PROJECT["dependencies"])
TEST = declared(PROJECT["optional-dependencies"]["test"])


def imported_modules(paths: Iterable[Path]) -> Iterator[tuple[Path, int, str]]:
    """(file, line, top-level module) of every absolute import in these files."""
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.lineno, node.module.split(".")[0]


def third_party(paths: Iterable[Path]) -> dict[str, list[str]]:
    """Top-level third-party module -> where it is imported ("file:line")."""
    found: dict[str, list[str]] = {}
    for path, line, module in imported_modules(paths):
        if module in sys.stdlib_module_names or module in OWN:
            continue
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        found.setdefault(module, []).append(f"{shown}:{line}")
    return found


def providers(module: str) -> set[str]:
    """The installed distributions that provide a top-level module."""
    return {normalized(name) for name in importlib.metadata.packages_distributions().get(module, [])}


def undeclared(paths: Iterable[Path], allowed: set[str]) -> list[str]:
    problems = []
    for module, places in sorted(third_party(paths).items()):
        sources = providers(module)
        if not sources:
            problems.append(f"{module}: no installed distribution provides it ({places[0]})")
        elif not sources & allowed:
            problems.append(f"{module} (from {', '.join(sorted(sources))}): not declared ({', '.join(places[:3])})")
    return problems


def test_the_package_imports_only_its_runtime_dependencies() -> None:
    assert undeclared(PACKAGE.rglob("*.py"), RUNTIME) == []


def test_tests_bench_and_scripts_import_only_runtime_and_test_dependencies() -> None:
    paths = [*(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py"), *SCRIPTS]
    assert undeclared(paths, RUNTIME | TEST) == []


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    """A runtime dependency nothing imports (as tomli was) only costs the image."""
    used = {source for module in third_party(PACKAGE.rglob("*.py")) for source in providers(module)}
    assert sorted(RUNTIME - used) == []


def test_the_synchronous_kubernetes_client_is_a_test_dependency_only() -> None:
    assert "kubernetes" not in RUNTIME and "kubernetes" in TEST
    assert "kubernetes" not in third_party(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import yaml\nimport os.path\n", ["yaml"]),
        ("from kubernetes_asyncio.client import CoreV1Api\nfrom . import sibling\n", ["kubernetes_asyncio"]),
        ("from __future__ import annotations\nimport episode_operator.api\n", []),
    ],
)
def test_imports_are_read_from_the_syntax_tree(tmp_path: Path, source: str, expected: list[str]) -> None:
    module = tmp_path / "module.py"
    module.write_text(source)
    assert sorted(third_party([module])) == expected
