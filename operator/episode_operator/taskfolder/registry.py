"""A dataset catalogue in Harbor's registry format: ``registry.json``, name@version → task folders.

Harbor's ``registry.json`` is a JSON list of datasets (``harbor/models/registry.py`` ``DatasetSpec``):
each a ``name``, a ``version``, a ``description``, its ``tasks`` (``RegistryTaskId``: a ``name``, a
``path``, and for a task in a Git repository its ``git_url`` and ``git_commit_id``) and ``metrics``.
The models below read it as Harbor's do (the unit tier checks them against Harbor's own, loaded from
its wheel), and every problem is refused naming the file and the key.

Where a task's folder is: a task without ``git_url`` is a folder relative to the registry's own
folder (its checkout), and must stay inside it; a task with ``git_url`` is a folder of a Git checkout
the user gives (this layer fetches nothing: no network is assumed), whose remote is that URL and, when
the registry pins ``git_commit_id``, whose ``HEAD`` is that commit. A task folder holds ``task.toml``.
Reading the folders' existence is the only I/O here; what a checkout is (its remotes, its ``HEAD``)
is asked of git by the caller and handed in as :class:`Checkout`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError

from episode_operator.taskfolder.dataset import TASK_TOML
from episode_operator.taskfolder.errors import Problem

REGISTRY_FILE = "registry.json"
# A registry file bigger than this is no catalogue (Harbor's own, of every public dataset, is ~2 MiB).
REGISTRY_LIMIT = 16 * 1024 * 1024
# Without @VERSION Harbor takes "head" when there is one (registry/client/base.py resolve_version).
HEAD_VERSION = "head"


# --- Harbor's models, as it reads them --------------------------------------------------------------
class MetricType(StrEnum):
    """Harbor's ``MetricType`` (harbor/models/metric/type.py)."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"
    UV_SCRIPT = "uv-script"


class MetricConfig(BaseModel):  # type: ignore[no-redef]  # pydantic's mypy plugin: a field named kwargs
    """Harbor's ``MetricConfig``: read so that a registry Harbor takes is taken; not applied (the set
    reports its mean reward and pass@k)."""

    type: MetricType = Field(default=MetricType.MEAN)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class RegistryTask(BaseModel):
    """Harbor's ``RegistryTaskId``: a task of a dataset."""

    name: str
    git_url: str | None = None
    git_commit_id: str | None = None
    path: Path


class RegistryDataset(BaseModel):
    """Harbor's ``DatasetSpec``: one name@version of the catalogue."""

    name: str
    version: str
    description: str
    tasks: list[RegistryTask]
    metrics: list[MetricConfig] = Field(default_factory=list)

    @property
    def reference(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Registry:
    """A parsed catalogue: its datasets in file order (``[i]`` is the i-th entry of the file)."""

    file: str
    datasets: list[RegistryDataset]


class RegistryRefused(Exception):
    """The catalogue, the dataset asked for or one of its tasks cannot be used; every problem listed."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(problem.render() for problem in self.problems))


# --- reading registry.json --------------------------------------------------------------------------
def _location(loc: Sequence[int | str]) -> str:
    """A pydantic location as a JSON path below a dataset: ``tasks[2].path``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


def parse_registry(text: str | bytes, file: str = REGISTRY_FILE) -> Registry:
    """The datasets of a ``registry.json``; :class:`RegistryRefused` naming the file and each bad key."""
    if len(text) > REGISTRY_LIMIT:
        raise RegistryRefused(
            [Problem(file, None, f"{len(text)} bytes, more than a catalogue holds ({REGISTRY_LIMIT})")]
        )
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        message = f"not JSON: line {error.lineno} column {error.colno}: {error.msg}"
        raise RegistryRefused([Problem(file, None, message)]) from None
    except UnicodeDecodeError as error:
        raise RegistryRefused([Problem(file, None, f"not UTF-8 text: {error.reason}")]) from None
    if not isinstance(document, list):
        kind = type(document).__name__.replace("dict", "an object").replace("str", "a string")
        raise RegistryRefused(
            [Problem(file, None, f"the top level is {kind}; Harbor's registry.json is a list of datasets")]
        )
    datasets: list[RegistryDataset] = []
    problems: list[Problem] = []
    for position, row in enumerate(document):
        try:
            datasets.append(RegistryDataset.model_validate(row))
        except ValidationError as error:
            named = f" ({row.get('name')}@{row.get('version')})" if isinstance(row, dict) else ""
            for detail in error.errors(include_url=False):
                key = f"[{position}]{named}" + (f".{_location(detail['loc'])}" if detail["loc"] else "")
                problems.append(Problem(file, key, str(detail["msg"]).removeprefix("Value error, ")))
    if problems:
        raise RegistryRefused(problems)
    return Registry(file, datasets)


def select_dataset(registry: Registry, wanted: str) -> tuple[int, RegistryDataset]:
    """The dataset ``NAME@VERSION`` names (``NAME`` alone: its ``head``, or its only version), with its position."""
    name, _, version = wanted.partition("@")
    file = registry.file
    if not name or "@" in version or (not version and wanted.endswith("@")):
        raise RegistryRefused([Problem(file, None, f"{wanted!r}: name a dataset as NAME@VERSION")])
    entries = [(position, dataset) for position, dataset in enumerate(registry.datasets) if dataset.name == name]
    if not entries:
        known = ", ".join(sorted({dataset.name for dataset in registry.datasets})) or "none"
        raise RegistryRefused([Problem(file, f"dataset {name!r}", f"not in the registry (its datasets: {known})")])
    versions = sorted({dataset.version for _, dataset in entries})
    if not version:
        if HEAD_VERSION in versions:
            version = HEAD_VERSION
        elif len(versions) == 1:
            version = versions[0]
        else:
            raise RegistryRefused(
                [Problem(file, f"dataset {name!r}", f"has versions {', '.join(versions)}: name one, {name}@VERSION")]
            )
    chosen = [(position, dataset) for position, dataset in entries if dataset.version == version]
    if not chosen:
        raise RegistryRefused(
            [
                Problem(
                    file,
                    f"dataset {name!r} version {version!r}",
                    f"not in the registry (its versions: {', '.join(versions)})",
                )
            ]
        )
    if len(chosen) > 1:
        positions = " and ".join(f"[{position}]" for position, _ in chosen)
        raise RegistryRefused([Problem(file, positions, f"{name}@{version} is listed more than once; which is it?")])
    return chosen[0]


# --- where each task's folder is ---------------------------------------------------------------------
def normalized_git_url(url: str) -> str:
    """A Git remote as ``host/path`` in lower case, without ``.git``: https, ssh and scp forms compare equal."""
    text = url.strip()
    if text.startswith("git@") or ("@" in text and "://" not in text and ":" in text):
        host, _, path = text.split("@", 1)[1].partition(":")
    else:
        parsed = urlsplit(text)
        host, path = parsed.hostname or "", parsed.path
    return f"{host.lower()}/{path.strip('/').removesuffix('.git').lower()}".lstrip("/")


@dataclass(frozen=True)
class Checkout:
    """A Git checkout on this machine: its top folder, its remotes' URLs and the commit it is at."""

    path: Path
    remotes: tuple[str, ...] = ()
    head: str | None = None

    def serves(self, git_url: str) -> bool:
        return normalized_git_url(git_url) in {normalized_git_url(remote) for remote in self.remotes}


@dataclass(frozen=True)
class ResolvedTask:
    """A task of the dataset: its ID (the registry's task name) and its folder on this machine."""

    name: str
    path: Path


@dataclass(frozen=True)
class RegistryRoot:
    """Where a registry's tasks are found: its own folder (tasks without git_url) and the checkouts given."""

    folder: Path
    checkouts: tuple[Checkout, ...] = field(default_factory=tuple)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def resolve_tasks(
    registry: Registry, position: int, dataset: RegistryDataset, root: RegistryRoot
) -> list[ResolvedTask]:
    """The folder of every task of ``dataset`` (entry ``position``), in order; every problem refused at once."""
    file = registry.file
    problems: list[Problem] = []
    resolved: list[ResolvedTask] = []
    seen: dict[str, str] = {}
    for index, task in enumerate(dataset.tasks):
        key = f"[{position}] ({dataset.reference}).tasks[{index}]"
        if task.name in seen:
            problems.append(
                Problem(file, f"{key}.name", f"task {task.name!r} is also {seen[task.name]}: task IDs are unique")
            )
            continue
        seen[task.name] = f"tasks[{index}]"
        base = root.folder
        if task.git_url is not None:
            checkout = next((each for each in root.checkouts if each.serves(task.git_url)), None)
            if checkout is None:
                given = ", ".join(str(each.path) for each in root.checkouts) or "none"
                problems.append(
                    Problem(
                        file,
                        f"{key}.git_url",
                        f"{task.git_url}: no checkout of it was given (--checkout DIR, a clone whose remote is "
                        f"that URL: nothing is fetched); checkouts given: {given}",
                    )
                )
                continue
            commit = task.git_commit_id
            if commit and checkout.head != commit:
                problems.append(
                    Problem(
                        file,
                        f"{key}.git_commit_id",
                        f"{commit}: the checkout {checkout.path} is at {checkout.head or 'no commit'}; "
                        f"git -C {checkout.path} checkout {commit}",
                    )
                )
                continue
            base = checkout.path
        relative = PurePosixPath(task.path.as_posix())
        if relative.is_absolute():
            problems.append(Problem(file, f"{key}.path", f"{task.path}: an absolute path; a task's path is relative"))
            continue
        folder = (base / relative).resolve()
        if not _inside(folder, base.resolve()):
            where = "the checkout" if task.git_url else "the registry's folder"
            problems.append(Problem(file, f"{key}.path", f"{task.path}: outside {where} {base}"))
            continue
        if not (folder / TASK_TOML).is_file():
            problems.append(
                Problem(file, f"{key}.path", f"{task.path}: no task folder there ({folder} holds no {TASK_TOML})")
            )
            continue
        resolved.append(ResolvedTask(task.name, folder))
    if not dataset.tasks:
        problems.append(Problem(file, f"[{position}] ({dataset.reference}).tasks", "the dataset has no tasks"))
    if problems:
        raise RegistryRefused(problems)
    return resolved
