"""``kubectl episode eval NAME@VERSION --registry …``: a dataset by name, from a Harbor ``registry.json``.

The catalogue comes from a path (``registry.json`` or the folder holding it: a Git checkout or any
folder) or from a ConfigMap (``configmap/NAME``, key ``registry.json``). Its tasks' folders are on
this machine: a task without ``git_url`` in the registry's folder (for a ConfigMap's catalogue, the
current directory, where Harbor looks for a local task), a task with ``git_url`` in a checkout given
with ``--checkout`` (or the registry's own, when it is a clone of that URL) — nothing is fetched.
What git says of a checkout (its top folder, remotes and HEAD) is asked here; the rules are
``taskfolder/registry.py``'s.
"""

from __future__ import annotations

import base64
import binascii
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from episode_operator.api.episodeset_resource import DATASET_ANNOTATION, REGISTRY_ANNOTATION
from episode_operator.cli.cluster import Cluster
from episode_operator.cli.episodes import PackedTask, pack_folder, pack_tasks
from episode_operator.kube.client import KubeClient, NotFound
from episode_operator.taskfolder.dataset import DatasetTask
from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.oci_artifact import TaskRepository
from episode_operator.taskfolder.registry import (
    REGISTRY_FILE,
    Checkout,
    Registry,
    RegistryRefused,
    RegistryRoot,
    parse_registry,
    resolve_tasks,
    select_dataset,
)

CONFIG_MAP_PREFIX = "configmap/"
GIT_TIMEOUT_SEC = 30.0


@dataclass(frozen=True)
class RegistryDatasetTasks:
    """The dataset a registry names: what it is called, where the catalogue was read, its task folders."""

    reference: str  # name@version, as resolved
    source: str  # the registry as given (a path, configmap/NAME)
    tasks: list[DatasetTask]


def _git(folder: Path, *arguments: str) -> str | None:
    """git's answer in ``folder`` (stripped), None when git fails there (not a checkout) or is missing."""
    try:
        result = subprocess.run(
            ["git", "-C", str(folder), *arguments],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SEC,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def git_checkout(folder: Path) -> Checkout | None:
    """The Git checkout ``folder`` is in (its top folder, remote URLs, HEAD), None when it is in none."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    remotes = _git(folder, "config", "--get-regexp", r"^remote\..*\.url$") or ""
    urls = tuple(line.split(maxsplit=1)[1] for line in remotes.splitlines() if len(line.split(maxsplit=1)) == 2)
    return Checkout(Path(top), urls, _git(folder, "rev-parse", "HEAD"))


def _read_config_map_registry(cluster: Cluster, name: str) -> bytes:
    async def fetch(client: KubeClient) -> bytes:
        try:
            config_map = await client.get_config_map(cluster.namespace, name)
        except NotFound:
            raise click.ClickException(f"configmap {cluster.namespace}/{name} not found") from None
        if REGISTRY_FILE in (config_map.data or {}):
            return str(config_map.data[REGISTRY_FILE]).encode()
        if REGISTRY_FILE in (config_map.binary_data or {}):
            try:
                return base64.b64decode(config_map.binary_data[REGISTRY_FILE], validate=True)
            except binascii.Error as error:
                raise click.ClickException(
                    f"configmap {cluster.namespace}/{name}: {REGISTRY_FILE} is not base64"
                ) from error
        keys = ", ".join(sorted({*(config_map.data or {}), *(config_map.binary_data or {})})) or "none"
        raise click.ClickException(f"configmap {cluster.namespace}/{name} has no key {REGISTRY_FILE} (keys: {keys})")

    return cluster.run(fetch)


def open_registry(source: str, cluster: Cluster) -> tuple[Registry, Path]:
    """The catalogue ``source`` names, and the folder its local tasks are relative to."""
    if source.startswith(CONFIG_MAP_PREFIX):
        name = source.removeprefix(CONFIG_MAP_PREFIX)
        text = _read_config_map_registry(cluster, name)
        return parse_registry(text, f"{source} ({REGISTRY_FILE})"), Path.cwd()
    path = Path(source)
    file = path / REGISTRY_FILE if path.is_dir() else path
    if not file.is_file():
        raise click.BadParameter(f"{source}: no {REGISTRY_FILE} there", param_hint="--registry")
    return parse_registry(file.read_bytes(), str(file)), file.parent


def registry_dataset(source: str, wanted: str, checkouts: Sequence[str], cluster: Cluster) -> RegistryDatasetTasks:
    """The task folders of dataset ``wanted`` (NAME@VERSION) of the registry ``source``; every problem with
    the file and key named, before anything is packed or created."""
    given: list[Checkout] = []
    problems: list[Problem] = []
    for directory in checkouts:
        checkout = git_checkout(Path(directory))
        if checkout is None:
            problems.append(Problem(directory, None, "--checkout: not a Git checkout (git rev-parse finds none)"))
        else:
            given.append(checkout)
    try:
        registry, folder = open_registry(source, cluster)
        own = git_checkout(folder) if not source.startswith(CONFIG_MAP_PREFIX) else None
        root = RegistryRoot(folder, (*given, *([own] if own is not None else [])))
        position, dataset = select_dataset(registry, wanted)
        resolved = [] if problems else resolve_tasks(registry, position, dataset, root)
    except RegistryRefused as refused:
        problems += refused.problems
    if problems:
        for problem in problems:
            click.echo(f"  {problem.render()}", err=True)
        raise click.ClickException(f"{source}: {wanted}: refused ({len(problems)} error(s)); nothing was created")
    if dataset.metrics and any(metric.type.value != "mean" for metric in dataset.metrics):
        click.echo(
            f"note: {dataset.reference}'s metrics ({', '.join(m.type.value for m in dataset.metrics)}) are Harbor's; "
            "the set reports its mean reward and pass@k",
            err=True,
        )
    return RegistryDatasetTasks(dataset.reference, source, [DatasetTask(task.name, task.path) for task in resolved])


@dataclass(frozen=True)
class DatasetOrigin:
    """What ``eval`` evaluates: the packed tasks, the stem of the set's name, and the set's annotations."""

    packed: list[PackedTask]
    stem: str
    annotations: Mapping[str, str]


def registry_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--registry SOURCE`` and ``--checkout DIR…`` of ``eval``."""
    command = click.option(
        "--checkout",
        "checkouts",
        multiple=True,
        type=click.Path(exists=True, file_okay=False),
        help="With --registry: a Git checkout holding tasks the registry names by git_url (its remote is that "
        "URL; at the registry's git_commit_id when it pins one). Repeatable; nothing is fetched.",
    )(command)
    return click.option(
        "--registry",
        default=None,
        help="A Harbor registry.json (the file, the folder holding it, or configmap/NAME): DATASET is then "
        "NAME@VERSION of its datasets.",
    )(command)


def dataset_origin(
    dataset: str,
    registry: str | None,
    checkouts: Sequence[str],
    cluster: Cluster,
    repository: TaskRepository | None = None,
) -> DatasetOrigin:
    """The tasks ``eval`` packs: every task folder under the folder DATASET, or the registry's NAME@VERSION;
    a folder too big for a ConfigMap marked for ``repository``."""
    if registry is None:
        if checkouts:
            raise click.UsageError("--checkout goes with --registry")
        if not Path(dataset).is_dir():
            raise click.BadParameter(f"{dataset!r}: no such directory (a dataset by name needs --registry)")
        return DatasetOrigin(pack_folder(dataset, repository), Path(dataset).resolve().name, {})
    found = registry_dataset(registry, dataset, checkouts, cluster)
    packed = pack_tasks(found.tasks, [], f"{registry}: {found.reference}", repository)
    stem = re.sub(r"[^a-z0-9-]+", "-", found.reference.lower()).strip("-")
    return DatasetOrigin(packed, stem, {DATASET_ANNOTATION: found.reference, REGISTRY_ANNOTATION: registry})
