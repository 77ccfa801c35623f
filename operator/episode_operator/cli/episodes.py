"""The commands of ``kubectl-episode`` that talk to a cluster: pack, run, get, describe, logs, artifacts."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import click
import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from episode_operator.api.episode_resource import (
    AgentSpec,
    EpisodeSpec,
    EpisodeStatus,
    TaskSource,
    TurnStatus,
    episode_manifest,
)
from episode_operator.api.export import (
    CALLS_RECORD,
    ENVIRONMENT_SERVER,
    FAILURES,
    NO_EVIDENCE,
    ROLLOUTS,
    TRAJECTORY_RECORD,
    EpisodeEvidence,
    evidence_of,
    split_rows,
)
from episode_operator.api.naming import content_name, document_digest
from episode_operator.api.vocabulary import DATASET_LABEL, TASK_LABEL, TASK_NAME_ANNOTATION, is_terminal
from episode_operator.capture.records import parse_journal
from episode_operator.cli import printing
from episode_operator.cli.agents import agent_options
from episode_operator.cli.cluster import Cluster, cluster_options
from episode_operator.kube.client import Gone, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.children import set_results_selector
from episode_operator.kube.objects.tasks import TaskTooLarge, task_config_map
from episode_operator.runtime.archive import RefusedMember, extract_files
from episode_operator.runtime.data_api_server import API_SERVICE
from episode_operator.runtime.episode_store import (
    SEED_LOGS,
    BlobStore,
    EpisodeBlobs,
    Exported,
    export_artifacts,
    kept_logs,
    render_logs,
    turn_records,
    unprinted,
)
from episode_operator.runtime.limits import Spool
from episode_operator.runtime.oci_tasks import push_task
from episode_operator.runtime.sandbox_protocol import MAIN_CONTAINER
from episode_operator.runtime.supervisor import FOLLOW_ENDED, FOLLOW_NO_RECORDS, FOLLOW_SCRIPT, JOBS_DIR
from episode_operator.runtime.turn.context import AGENT_LOG, RunningAgent, running_agent_job
from episode_operator.taskfolder import TaskFiles, validate_task
from episode_operator.taskfolder.dataset import DatasetTask, discover_dataset
from episode_operator.taskfolder.oci_artifact import ArtifactError, TaskReference, TaskRepository
from episode_operator.taskfolder.sources import pack_tar

# Where a watch starts over after the API server ended it (its timeout) or the list went stale.
WATCH_RESTARTS = 1000


def _load_folder(directory: str) -> TaskFiles:
    files = TaskFiles.from_path(directory)
    result = validate_task(files)
    if not result.valid:
        for problem in result.problems:
            click.echo(f"  {problem.render()}", err=True)
        raise click.ClickException(
            f"{directory}: refused ({len(result.problems)} error(s)); see `kubectl-episode validate`"
        )
    return files


def _task_repository(_context: click.Context, parameter: click.Parameter, value: str | None) -> TaskRepository | None:
    try:
        return None if not value else TaskRepository.parse(value)
    except ArtifactError as error:
        raise click.BadParameter(str(error), param=parameter) from error


task_repository_option = click.option(
    "--task-repository",
    envvar="EPISODE_TASK_REPOSITORY",
    default=None,
    callback=_task_repository,
    metavar="[http://]HOST[:PORT]/REPOSITORY",
    help="A folder too big for a ConfigMap is pushed here as an OCI artifact (REPOSITORY/<folder>, named by its "
    "digest; pushed once: the same folder is the same artifact) and the Episode names it (spec.task.oci). "
    "https unless http:// says plain HTTP; the operator fetches only from its --task-registry registries. "
    "Default: $EPISODE_TASK_REPOSITORY.",
)


REPOSITORY_HINT = (
    "give --task-repository [http://]HOST[:PORT]/REPOSITORY (or $EPISODE_TASK_REPOSITORY) to push it to a "
    "registry as an OCI artifact"
)


@dataclass(frozen=True)
class PackedTask:
    """A task folder ready for a spec: its ID, the ConfigMap to create (None: the folder is too big for one
    and goes to a registry as an OCI artifact, ``files``), and the task source that names it."""

    name: str
    where: Path
    config_map: dict[str, Any] | None
    files: TaskFiles

    def source(self, reference: str | None = None) -> dict[str, Any]:
        """spec.task (or a dataset entry's source): the ConfigMap, else the pushed artifact's ``reference``."""
        if self.config_map is not None:
            return {"configMap": {"name": self.config_map["metadata"]["name"]}}
        assert reference is not None, f"{self.where}: pushed before it is named"
        return {"oci": {"reference": reference}}


def _packed(name: str, where: Path, files: TaskFiles, repository: TaskRepository | None) -> PackedTask:
    """The folder in a content-addressed ConfigMap when it fits one; else marked for ``repository``.
    Raises :class:`TaskTooLarge` when it fits none and there is no repository."""
    try:
        return PackedTask(name, where, task_config_map(files, task=name, namespace=None), files)
    except TaskTooLarge:
        if repository is None:
            raise
        return PackedTask(name, where, None, files)


def _push(task: PackedTask, repository: TaskRepository) -> TaskReference:
    """Push a folder too big for a ConfigMap to ``repository``/<its folder's name> (once: the same folder is
    the same artifact) and return its reference, by digest."""
    try:
        pushed = asyncio.run(push_task(repository.child(task.where.resolve().name), pack_tar(task.files)))
    except ArtifactError as error:
        raise click.ClickException(f"{task.where}: {error}") from error
    said = "pushed" if pushed.uploaded else "already in the registry (nothing uploaded):"
    click.echo(f"{task.where}: over a ConfigMap's size; {said} {pushed.reference}", err=True)
    return pushed.reference


def _pack_source(
    directory: str, repository: TaskRepository | None
) -> tuple[dict[str, Any] | None, dict[str, Any], str]:
    """(the ConfigMap to create or None, spec.task, the task's stem) of a folder: a content-addressed
    ConfigMap when the folder fits one, else an OCI artifact pushed to ``repository`` (unless there already)."""
    where = Path(directory)
    try:
        task = _packed(where.resolve().name, where, _load_folder(directory), repository)
    except TaskTooLarge as error:
        raise click.ClickException(f"{directory}: {error}; {REPOSITORY_HINT}") from error
    if task.config_map is None:
        assert repository is not None, "_packed marks a folder for a registry only with one"
        reference = _push(task, repository)
        return None, task.source(str(reference)), reference.repository.rsplit("/", 1)[-1]
    return task.config_map, task.source(), task.config_map["metadata"]["labels"][TASK_LABEL]


CATALOGUE_HINT = "the Gym server's catalogue holds ConfigMaps only: run such a task with `run` or `eval`"


def pack_folder(
    directory: str, repository: TaskRepository | None, too_big_hint: str = REPOSITORY_HINT
) -> list[PackedTask]:
    """Every task folder under ``directory``, packed (:func:`pack_tasks`); every refusal reported at once."""
    dataset = discover_dataset(directory)
    return pack_tasks(
        dataset.tasks, [problem.render() for problem in dataset.problems], directory, repository, too_big_hint
    )


def pack_dataset(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """(task ID, ConfigMap) of every task folder under ``directory``, for the Gym server's catalogue."""
    packed = pack_folder(directory, None, CATALOGUE_HINT)
    return [(task.name, cast(dict[str, Any], task.config_map)) for task in packed]


def pack_tasks(
    tasks: Sequence[DatasetTask],
    problems: list[str],
    where: str,
    repository: TaskRepository | None,
    too_big_hint: str = REPOSITORY_HINT,
) -> list[PackedTask]:
    """Each task folder, validated, in a ConfigMap or (too big for one, with ``repository``) marked for the
    registry; with ``problems`` already found, every refusal reported at once, naming ``where`` the tasks
    came from, and nothing packed."""
    problems = list(problems)
    packed: list[PackedTask] = []
    for task in tasks:
        files = TaskFiles.from_path(task.path)
        validation = validate_task(files)
        if not validation.valid:
            problems += [f"{task.path}: {problem.render()}" for problem in validation.problems]
            continue
        try:
            packed.append(_packed(task.name, task.path, files, repository))
        except TaskTooLarge as error:
            problems.append(f"{task.path}: {error}; {too_big_hint}")
    if problems:
        for problem in problems:
            click.echo(f"  {problem}", err=True)
        raise click.ClickException(f"{where}: refused ({len(problems)} error(s)); nothing was created")
    if not packed:
        raise click.ClickException(
            f"{where}: no task folders (a task folder holds task.toml; hidden folders are skipped)"
        )
    return packed


def dataset_sources(packed: Sequence[PackedTask], repository: TaskRepository | None) -> list[dict[str, Any]]:
    """The dataset's entries (ID and source), pushing each folder too big for a ConfigMap to ``repository``
    once every folder has passed."""
    sources = []
    for task in packed:
        if task.config_map is None:
            assert repository is not None, f"{task.where}: marked for a registry without one"
            sources.append({"name": task.name, **task.source(str(_push(task, repository)))})
        else:
            sources.append({"name": task.name, **task.source()})
    return sources


def _dataset_name(_context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A dataset name is a label value (the catalogue is found by label)."""
    if value is not None and not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", value):
        raise click.BadParameter(
            f"{value!r}: letters, digits, '-', '_' and '.', up to 63, starting and ending with a letter or digit",
            param=parameter,
        )
    return value


def catalogued(config_map: dict[str, Any], dataset: str, task: str) -> dict[str, Any]:
    """A task ConfigMap entered in a dataset of the catalogue (the Gym server's, kube/gym_catalogue.py)."""
    metadata = config_map["metadata"]
    metadata["labels"][DATASET_LABEL] = dataset
    metadata.setdefault("annotations", {})[TASK_NAME_ANNOTATION] = task
    # Another dataset may hold the same folder: its ConfigMap is its own.
    metadata["name"] = f"{metadata['name']}-{document_digest(dataset).removeprefix('sha256:')[:6]}"
    return config_map


def placed(manifest: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """The manifest in ``namespace`` unless it names its own; None leaves it where it will be applied."""
    metadata = manifest.setdefault("metadata", {})
    if namespace and "namespace" not in metadata:
        name = {"name": metadata.pop("name")} if "name" in metadata else {}
        manifest["metadata"] = {**name, "namespace": namespace, **metadata}
    return manifest


def output_namespace(cluster: Cluster, output: str) -> str | None:
    """Where created objects go; printed manifests (``-o yaml``) name a namespace only when -n does.

    Read after the input is checked: a bad folder is reported even without a kubeconfig."""
    return cluster.namespace_flag if output == "yaml" else cluster.namespace


def dump_manifests(manifests: Sequence[dict[str, Any]]) -> str:
    """Manifests as one multi-document YAML stream, what ``kubectl apply -f`` and kustomize read."""
    return str(yaml.safe_dump_all(manifests, sort_keys=False, allow_unicode=True))


def print_or_create(
    cluster: Cluster, output: str, config_map: dict[str, Any] | None, episode: dict[str, Any]
) -> dict[str, Any] | None:
    """``-o yaml``: print the Episode and its task's ConfigMap (if any), None; else create them, the Episode
    as created."""
    manifests = [placed(m, output_namespace(cluster, output)) for m in (config_map, episode) if m is not None]
    if output == "yaml":
        click.echo(dump_manifests(manifests), nl=False)
        return None

    async def create(client: KubeClient) -> dict[str, Any]:
        if config_map is not None:
            await client.apply_config_map(config_map)
        return await client.create_episode(episode)

    return cluster.run(create)


def manifest_output(create_help: str) -> Callable[..., Any]:
    """``-o name|yaml`` of the commands that create objects: yaml prints them and creates nothing."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["name", "yaml"]),
        default="name",
        show_default=True,
        help=f"name: {create_help}; yaml: only print the manifests (no namespace unless -n), create nothing.",
    )


def turn_name(status: EpisodeStatus, given: str) -> str:
    """The turn ``given`` names: a turn's name, else its 1-based index (``--turn 2``), or the seed's logs."""
    turns: list[TurnStatus] = status.turns
    if given == SEED_LOGS or any(turn.name == given for turn in turns):
        return given
    if given.isdigit() and 1 <= int(given) <= len(turns):
        return turns[int(given) - 1].name
    known = ", ".join([SEED_LOGS, *(f"{number} {turn.name}" for number, turn in enumerate(turns, start=1))])
    raise click.BadParameter(f"no turn {given!r} (turns: {known})", param_hint="--turn")


def register(cli: click.Group) -> None:
    """Add the cluster commands to the ``kubectl-episode`` group."""
    register_export(cli)

    @cli.command()
    @click.argument("directory", type=click.Path(exists=True, file_okay=False))
    @click.option(
        "--dataset",
        default=None,
        callback=_dataset_name,
        help="Catalogue every task folder under DIRECTORY as this dataset (its tasks named by their folders' "
        "paths): the Gym server runs them by name (docs/gym.md).",
    )
    @cluster_options
    @task_repository_option
    @manifest_output("create the ConfigMap(s) and print their names")
    def pack(
        directory: str, dataset: str | None, cluster: Cluster, task_repository: TaskRepository | None, output: str
    ) -> None:
        """Pack a task folder into a content-addressed ConfigMap (with --dataset, every task folder under it).

        A folder over a ConfigMap's size is pushed to --task-repository as an OCI artifact instead, and its
        spec.task printed (the artifact is pushed with -o yaml too: it is no object of the cluster)."""
        if dataset is None:
            config_map, task, _ = _pack_source(directory, task_repository)
            if config_map is None:
                click.echo(yaml.safe_dump(task, default_flow_style=False, width=1000), nl=False)
                return
            manifests = [config_map]
        else:
            manifests = [catalogued(config_map, dataset, task) for task, config_map in pack_dataset(directory)]
        manifests = [placed(manifest, output_namespace(cluster, output)) for manifest in manifests]
        if output == "yaml":
            click.echo(dump_manifests(manifests), nl=False)
            return

        async def apply(client: KubeClient) -> None:
            for manifest in manifests:
                await client.apply_config_map(manifest)

        cluster.run(apply)
        for manifest in manifests:
            click.echo(f"configmap/{manifest['metadata']['name']}")

    @cli.command()
    @click.argument("source", type=click.Path(exists=True))
    @cluster_options
    @task_repository_option
    @agent_options
    @click.option(
        "--image",
        default=None,
        help="A prebuilt image of the task: overrides docker_image, and environment/Dockerfile is then not applied.",
    )
    @click.option(
        "--name",
        default=None,
        help="Episode name (default: the folder's name; a random suffix, or with -o yaml a digest of the spec).",
    )
    @click.option("--timeout-multiplier", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
    @manifest_output("create the Episode and print its name")
    @click.option("--wait/--no-wait", default=False, help="Follow the episode to its end, turn by turn.")
    @click.option(
        "--timeout",
        "wait_timeout",
        type=float,
        default=3600.0,
        show_default=True,
        help="With --wait: give up after this many seconds.",
    )
    def run(
        source: str,
        cluster: Cluster,
        task_repository: TaskRepository | None,
        agent: AgentSpec,
        image: str | None,
        name: str | None,
        timeout_multiplier: float,
        output: str,
        wait: bool,
        wait_timeout: float,
    ) -> None:
        """Run SOURCE (a task folder, or an Episode YAML) as an Episode.

        Every run is a new Episode (a random name suffix). With -o yaml the Episode is named after the
        folder and a digest of its spec instead: a manifest for Git, which applies as one object however
        often it is applied.
        """
        config_map: dict[str, Any] | None = None
        if Path(source).is_dir():
            config_map, task, stem = _pack_source(source, task_repository)
            try:
                spec = EpisodeSpec(
                    task=TaskSource.model_validate(task),
                    agent=agent,
                    image=image,
                    timeout_multiplier=timeout_multiplier,
                )
            except ValueError as error:
                raise click.ClickException(str(error)) from error
            if name or output == "yaml":
                manifest = episode_manifest(None, spec, name=name or content_name(stem, spec.to_api()))
            else:
                manifest = episode_manifest(None, spec, generate_name=f"{stem[:40]}-")
        else:
            manifest = yaml.safe_load(Path(source).read_text())
            if not isinstance(manifest, dict) or manifest.get("kind") != "Episode":
                raise click.ClickException(f"{source}: not an Episode manifest")
        created = print_or_create(cluster, output, config_map, manifest)
        if created is None:
            return
        episode_name = created["metadata"]["name"]
        episode_namespace = created["metadata"]["namespace"]
        click.echo(f"episode/{episode_name} created in {episode_namespace}")
        if wait:
            status = follow(cluster, episode_namespace, episode_name, wait_timeout)
            sys.exit(0 if status.phase == "Succeeded" else 1)

    @cli.command()
    @click.argument("name", required=False)
    @cluster_options
    @click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
    @click.option("-l", "--selector", default=None, help="Label selector, e.g. episode-operator.dev/set=NAME.")
    @click.option(
        "-o",
        "--output",
        type=click.Choice(["json", "yaml", "wide", "name"]),
        default=None,
        help="json, yaml, name, or wide (a table with more columns); default: a table.",
    )
    @click.option("-w", "--watch", is_flag=True, help="After listing, print every change.")
    def get(
        name: str | None, cluster: Cluster, all_namespaces: bool, selector: str | None, output: str | None, watch: bool
    ) -> None:
        """List Episodes (or show one) as kubectl does: phase, reward, turns, outcome, age."""
        if name and selector:
            raise click.UsageError("a name cannot be given with a selector (-l)")
        if name and all_namespaces:
            raise click.UsageError("an Episode cannot be named across all namespaces (-A)")
        namespace = None if all_namespaces else cluster.namespace
        view = GetView(cast(printing.OutputFormat, output or "table"), all_namespaces, one_by_one=bool(name) or watch)

        async def show(client: KubeClient) -> None:
            for restart in range(WATCH_RESTARTS):
                if name:
                    assert namespace is not None
                    item = await client.get_episode(namespace, name)
                    items, version = [item], str(item["metadata"].get("resourceVersion", ""))
                else:
                    items, version = await client.list_episodes_at(namespace, selector)
                if restart == 0:
                    view.show(items)
                    if not items and not watch:
                        where = "" if namespace is None else f" in {namespace} namespace"
                        click.echo(f"No resources found{where}.", err=True)
                if not watch:
                    return
                try:
                    async for _kind, item in client.watch_episodes(namespace, selector, version):
                        if not name or item["metadata"]["name"] == name:
                            view.show([item])
                except Gone:
                    continue  # too old to watch from: list again (nothing already shown is shown again)

        cluster.run(show)

    @cli.command()
    @click.argument("name")
    @cluster_options
    def describe(name: str, cluster: Cluster) -> None:
        """An Episode's outcome and every turn."""
        namespace = cluster.namespace

        async def fetch(client: KubeClient) -> dict[str, Any]:
            return await client.get_episode(namespace, name)

        item = cluster.run(fetch)
        status = EpisodeStatus.model_validate(item.get("status") or {})
        console = Console()
        console.print(
            f"[bold]{namespace}/{name}[/bold]: {status.phase or 'Pending'}"
            + (f" ({status.outcome})" if status.outcome else "")
        )
        console.print(f"reward: {_reward(status.reward)}   verifier rewards: {status.verifier_rewards or '-'}")
        for label, value in (
            ("verifier mode", status.verifier_mode),
            ("stopped after", status.stopped_after_turn),
            ("failure", status.failure_kind),
            ("message", status.message),
            ("attempt", status.attempt),
            ("task digest", status.task.digest if status.task else None),
        ):
            if value is not None:
                console.print(f"{label}: {value}")
        console.print(_turn_table(status))
        for attempt in status.attempts:
            if attempt.reason:
                console.print(f"attempt {attempt.number} ended: {attempt.reason}")

    @cli.command()
    @click.argument("name")
    @cluster_options
    @click.option(
        "--turn",
        default=None,
        help="Only this turn: its name, or its number (1 is the first); seed: the seed's (replay, builds, setup).",
    )
    @click.option("--attempt", type=int, default=None, help="Only this attempt (default: all).")
    @click.option(
        "-f",
        "--follow",
        is_flag=True,
        help="Follow the agent of the turn running now as it writes, until the turn's agent ends "
        "(it waits for one to start); an Episode that has finished prints its kept logs.",
    )
    @operator_options
    def logs(
        name: str,
        cluster: Cluster,
        turn: str | None,
        attempt: int | None,
        follow: bool,
        data_dir: str | None,
    ) -> None:
        """Print the logs an Episode's seed and turns left (replay, builds, agent, setup, verifier, hooks)."""
        if follow and (turn is not None or attempt is not None):
            raise click.UsageError("--follow follows the turn running now: it takes no --turn or --attempt")
        if follow:
            followed = cluster.run(lambda client: _follow_agent(client, cluster.namespace, name))
            if isinstance(followed, FollowLost):
                _print_the_rest(cluster, name, data_dir, followed)
            if followed:
                return
        episode = _episode(cluster, name)
        if turn is not None:
            turn = turn_name(EpisodeStatus.model_validate(episode.get("status") or {}), turn)
        source = kept_data(cluster, episode, data_dir)
        text = source.logs(turn=turn, attempt=attempt)
        if not text:
            raise click.ClickException(
                f"no logs kept for {cluster.namespace}/{name}" + (f" turn {turn}" if turn else "")
            )
        click.echo(text, nl=False)

    @cli.command()
    @click.argument("name")
    @cluster_options
    @click.option("--turn", default=None, help="Only this turn: its name, or its number (1 is the first).")
    @click.option(
        "-o", "--output", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True
    )
    @operator_options
    def trajectory(
        name: str,
        cluster: Cluster,
        turn: str | None,
        output_format: str,
        data_dir: str | None,
    ) -> None:
        """Print each turn's trajectory (ATIF) and recorded model calls (latest attempt)."""
        episode = _episode(cluster, name)
        status = EpisodeStatus.model_validate(episode.get("status") or {})
        wanted = turn_name(status, turn) if turn is not None else None
        records = kept_data(cluster, episode, data_dir).turns()
        order = [record.name for record in status.turns]
        turns = {
            turn_: kept
            for turn_, kept in sorted(records["turns"].items(), key=lambda item: _position(order, item[0]))
            if wanted is None or turn_ == wanted
        }
        documents = {turn_: _turn_document(kept) for turn_, kept in turns.items()}
        if not any(document["trajectory"] or document["modelCalls"] for document in documents.values()):
            raise click.ClickException(
                f"no trajectory kept for {cluster.namespace}/{name}"
                + (f" turn {wanted}" if wanted else "")
                + " (only agents with a model endpoint have one)"
            )
        if output_format == "json":
            click.echo(json.dumps({"attempt": records["attempt"], "turns": documents}, indent=2))
            return
        console = Console()
        for turn_, document in documents.items():
            console.rule(f"turn {turn_} (attempt {records['attempt']})")
            trajectory: dict[str, Any] = document["trajectory"] or {}
            for step in trajectory.get("steps", []):
                console.print(f"[bold]{step.get('source')}[/bold]: {printing.one_line(step.get('message'))}")
                for call in step.get("tool_calls") or []:
                    console.print(f"  → {call.get('function_name')} {printing.one_line(call.get('arguments'))}")
            calls: list[dict[str, Any]] = document["modelCalls"]
            failed = sum(1 for call in calls if call.get("error_category"))
            console.print(f"{len(calls)} model call(s), {failed} failed")

    @cli.command()
    @click.argument("name")
    @click.argument("destination", type=click.Path(file_okay=False, path_type=Path))
    @cluster_options
    @operator_options
    def artifacts(
        name: str,
        destination: Path,
        cluster: Cluster,
        data_dir: str | None,
    ) -> None:
        """Copy an Episode's artifacts (latest attempt) into DESTINATION/<turn>/."""
        exported = kept_data(cluster, _episode(cluster, name), data_dir).artifacts(destination)
        _say_refused(exported.refused)
        if not exported.written:
            raise click.ClickException(f"no artifacts kept for {cluster.namespace}/{name}")
        click.echo(f"{len(exported.written)} file(s) under {destination}")


class GetView:
    """How ``get`` prints what it lists and then every change it watches, in kubectl's formats: a
    ``List`` for ``-o json|yaml`` of a listing; one document per object for one Episode or a watch."""

    def __init__(self, output: printing.OutputFormat, all_namespaces: bool, *, one_by_one: bool) -> None:
        self.output, self.all_namespaces, self.one_by_one = output, all_namespaces, one_by_one
        self.widths: list[int] | None = None
        self.documents = 0

    def show(self, items: Sequence[dict[str, Any]]) -> None:
        if self.output == "name":
            for item in items:
                click.echo(printing.resource_name(item))
        elif self.output in ("json", "yaml"):
            documents = [[item] for item in items] if self.one_by_one else [items]
            for document in documents:
                if self.documents and self.output == "yaml":
                    click.echo("---")
                rendered = printing.as_document(document, single=self.one_by_one)
                click.echo(printing.render_document(rendered, self.output), nl=False)
                self.documents += 1
        else:
            self._table(items)

    def _table(self, items: Sequence[dict[str, Any]]) -> None:
        wide, now = self.output == "wide", time.time()
        rows = [printing.table_row(item, wide=wide, all_namespaces=self.all_namespaces, now=now) for item in items]
        if self.widths is None:
            if not rows:
                return
            header = printing.table_header(wide=wide, all_namespaces=self.all_namespaces)
            # A watch prints later rows in these widths, as kubectl does.
            self.widths = printing.column_widths([header, *rows])
            click.echo(printing.render_row(header, self.widths))
        for row in rows:
            click.echo(printing.render_row(row, self.widths))


FOLLOW_POLL_SEC = 0.5
FOLLOW_READ_BYTES = 1024 * 1024  # per read: an agent writing without end is shown, a chunk at a time
# How long the followed pod may go unanswered before ``logs -f`` gives up on it. The exec has
# retried for a second or two by then; an API server or kubelet under load can refuse execs
# (500 at the handshake) for longer while the agent works on, and its output is still there.
FOLLOW_OUTAGE_SEC = 60.0
# How much of the start and the end of what was printed must match the kept log for its rest to be printed.
FOLLOW_MATCH_BYTES = 4096


async def _read_output(client: KubeClient, namespace: str, pod: str, job_id: str, start: int) -> tuple[bytes, bool]:
    """The agent job's own output from byte ``start`` (a bounded chunk), and whether the job had
    ended before it was read; nothing yet before the job has records."""
    stdout = Spool(FOLLOW_READ_BYTES + 1, "the followed output", f"{FOLLOW_READ_BYTES} bytes a read")
    stderr = Spool(64 * 1024, "the follow read's errors", "64 KiB")
    argv = ["sh", "-c", FOLLOW_SCRIPT, "sh", f"{JOBS_DIR}/{job_id}", str(start), str(FOLLOW_READ_BYTES)]
    try:
        code = await client.exec(namespace, pod, MAIN_CONTAINER, argv, stdout=stdout, stderr=stderr, timeout_sec=30)
        if code == FOLLOW_NO_RECORDS:
            return b"", False
        return stdout.getvalue(), code == FOLLOW_ENDED
    finally:
        stdout.close()
        stderr.close()


@dataclass
class Followed:
    """What ``logs -f`` printed of one agent job: how many bytes, the first and the last of them."""

    agent: RunningAgent
    printed: int = 0
    head: bytes = b""
    tail: bytes = b""

    def add(self, chunk: bytes) -> None:
        self.printed += len(chunk)
        if len(self.head) < FOLLOW_MATCH_BYTES:
            self.head += chunk[: FOLLOW_MATCH_BYTES - len(self.head)]
        self.tail = (self.tail + chunk)[-FOLLOW_MATCH_BYTES:]


@dataclass(frozen=True)
class FollowLost:
    """The followed agent's pod went (or stopped answering) before the job's end was read."""

    followed: Followed
    why: str


async def _follow_agent(client: KubeClient, namespace: str, name: str) -> bool | FollowLost:
    """Print the running turn's agent output as it is written, until that agent ends (True); False when
    the Episode had finished before any agent was followed (its kept logs are printed instead); the
    pod's loss before the job's end was read (the rest is in what the operator kept)."""
    agent: RunningAgent | None = None
    waiting_said = False
    while agent is None:
        status = EpisodeStatus.model_validate((await client.get_episode(namespace, name)).get("status") or {})
        agent = running_agent_job(status)
        if agent is None:
            if is_terminal(status.phase):
                return False
            if not waiting_said:
                click.echo(f"waiting for a turn of {namespace}/{name} to run its agent…", err=True)
                waiting_said = True
            await asyncio.sleep(FOLLOW_POLL_SEC)
    followed = Followed(agent)
    unanswered_since: float | None = None
    while True:
        try:
            chunk, ended = await _read_output(client, namespace, agent.pod, agent.job_id, followed.printed)
        except NotFound:
            return FollowLost(followed, "is gone")
        except KubeError as error:
            status = EpisodeStatus.model_validate((await client.get_episode(namespace, name)).get("status") or {})
            if running_agent_job(status) != agent:  # the agent has ended: its pod is going, its output kept
                return FollowLost(followed, f"no longer answers ({error})")
            now = time.monotonic()
            if unanswered_since is None:
                unanswered_since = now
                click.echo(
                    f"the agent pod {namespace}/{agent.pod} does not answer ({error}); "
                    f"trying again for up to {FOLLOW_OUTAGE_SEC:.0f} s",
                    err=True,
                )
            if now - unanswered_since >= FOLLOW_OUTAGE_SEC:
                return FollowLost(followed, f"no longer answers ({error})")
            await asyncio.sleep(FOLLOW_POLL_SEC)
            continue
        unanswered_since = None
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        followed.add(chunk)
        if ended and len(chunk) < FOLLOW_READ_BYTES:
            return True
        if not chunk:
            await asyncio.sleep(FOLLOW_POLL_SEC)


def _print_the_rest(cluster: Cluster, name: str, data_dir: str | None, lost: FollowLost) -> None:
    """After the followed pod went: the rest of the agent's output from what the operator kept of it,
    when that is the same output (it begins and runs on as printed); else where to read it."""
    followed, agent = lost.followed, lost.followed.agent
    where = f"the agent pod {cluster.namespace}/{agent.pod} {lost.why} after {followed.printed} bytes of its output"
    kept = kept_data(cluster, _episode(cluster, name), data_dir).log(
        turn=agent.turn, attempt=agent.attempt, name=AGENT_LOG
    )
    rest = None if kept is None else unprinted(kept, followed.printed, followed.head, followed.tail)
    if rest is None:
        raise click.ClickException(
            f"{where}: kubectl episode logs {name} --turn {agent.turn_number} prints what the operator kept"
        )
    sys.stdout.buffer.write(rest)
    sys.stdout.buffer.flush()
    click.echo(f"({where}; the rest is what the operator kept)", err=True)


def _episode(cluster: Cluster, name: str) -> dict[str, Any]:
    async def fetch(client: KubeClient) -> dict[str, Any]:
        return await client.get_episode(cluster.namespace, name)

    return cluster.run(fetch)


def register_export(cli: click.Group) -> None:
    @cli.command()
    @click.argument("names", nargs=-1)
    @cluster_options
    @click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
    @click.option("-l", "--selector", default=None, help="Label selector, e.g. episode-operator.dev/set=NAME.")
    @click.option(
        "--set",
        "episode_set",
        default=None,
        help="The children of this EpisodeSet, none a rerun replaced (with -l: both).",
    )
    @click.option(
        "-o",
        "--output",
        "output_format",
        type=click.Choice(["gym-jsonl"]),
        default="gym-jsonl",
        show_default=True,
        help="The rows' format.",
    )
    @click.option(
        "--output-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Folder for rollouts.jsonl and rollouts_failures.jsonl.",
    )
    @click.option(
        "--captures/--no-captures",
        default=True,
        show_default=True,
        help="Read each Episode's recorded model calls and trajectories from the operator (Episodes with a "
        "model endpoint); --no-captures writes rows without them.",
    )
    @click.option(
        "--environment-server",
        default=ENVIRONMENT_SERVER,
        show_default=True,
        help="The name every row gives the server that ran it (_ng_environment_server): the environment "
        "server's name in your Gym config, so that Gym groups and resumes the rows under it.",
    )
    @operator_options
    def export(
        names: tuple[str, ...],
        cluster: Cluster,
        all_namespaces: bool,
        selector: str | None,
        episode_set: str | None,
        output_format: str,
        output_dir: Path,
        captures: bool,
        environment_server: str,
        data_dir: str | None,
    ) -> None:
        """Write finished Episodes as Gym rows: graded and masked to rollouts.jsonl, failed attempts to the failures."""
        if episode_set:
            selector = ",".join(part for part in (set_results_selector(episode_set), selector) if part)
        if names and all_namespaces:
            raise click.UsageError("Episodes cannot be named across all namespaces (-A)")

        async def fetch(client: KubeClient) -> list[dict[str, Any]]:
            if names:
                return [await client.get_episode(cluster.namespace, name) for name in names]
            return await client.list_episodes(None if all_namespaces else cluster.namespace, selector)

        def evidence(episode: Mapping[str, Any]) -> EpisodeEvidence:
            spec = EpisodeSpec.model_validate(episode["spec"])
            if not captures or spec.agent.model is None or not is_terminal((episode.get("status") or {}).get("phase")):
                return NO_EVIDENCE
            kept = kept_data(cluster, dict(episode), data_dir)
            return evidence_of(spec, kept.turns())

        episodes = cluster.run(fetch)
        # A regrade's verdict is on another Episode's rollout (runtime/regrade.py): no rollout of its own.
        regrades = [episode for episode in episodes if (episode.get("spec") or {}).get("regrade")]
        if regrades:
            click.echo(
                f"skipped {len(regrades)} regrade(s): a regrade's verdict is on its original's rollout", err=True
            )
        episodes = [episode for episode in episodes if not (episode.get("spec") or {}).get("regrade")]
        rollouts, failures = split_rows(episodes, evidence, environment_server)
        output_dir.mkdir(parents=True, exist_ok=True)
        for filename, rows in ((ROLLOUTS, rollouts), (FAILURES, failures)):
            with (output_dir / filename).open("w") as stream:
                for row in rows:
                    stream.write(json.dumps(row, sort_keys=True) + "\n")
        click.echo(
            f"{len(rollouts)} rollout(s) to {output_dir / ROLLOUTS}, "
            f"{len(failures)} failure(s) to {output_dir / FAILURES}"
        )


def operator_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where the operator keeps logs and artifacts: its data directory here, or the data API."""
    return click.option(
        "--data-dir",
        default=lambda: os.environ.get("EPISODE_OPERATOR_DATA_DIR"),
        show_default="$EPISODE_OPERATOR_DATA_DIR",
        help="The data directory of an operator running on this machine; without it the in-cluster "
        f"operator's data API ({API_SERVICE}) is asked through the API server.",
    )(command)


class KeptData(Protocol):
    """What the operator kept of one Episode, wherever it is read from."""

    def logs(self, *, turn: str | None, attempt: int | None) -> str: ...

    def log(self, *, turn: str, attempt: int, name: str) -> bytes | None:
        """One log's own bytes (no header), None when it is not kept."""
        ...

    def turns(self) -> dict[str, Any]: ...

    def artifacts(self, destination: Path) -> Exported: ...


class _LocalStore:
    def __init__(self, blobs: EpisodeBlobs) -> None:
        self.blobs = blobs

    def logs(self, *, turn: str | None, attempt: int | None) -> str:
        logs = asyncio.run(kept_logs(self.blobs, turn=turn, attempt=attempt))
        return render_logs(logs).decode("utf-8", "replace")

    def log(self, *, turn: str, attempt: int, name: str) -> bytes | None:
        logs = asyncio.run(kept_logs(self.blobs, turn=turn, attempt=attempt, name=name))
        return logs[-1].data if logs else None

    def artifacts(self, destination: Path) -> Exported:
        return asyncio.run(export_artifacts(self.blobs, destination))

    def turns(self) -> dict[str, Any]:
        return asyncio.run(turn_records(self.blobs))


class _RemoteStore:
    """The in-cluster operator's data API, through the API server: it authenticates the user and
    authorizes ``get`` on ``episodes/log``, ``episodes/artifacts`` or ``episodes/turns`` (group
    data.episode-operator.dev)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str, uid: str) -> None:
        self.cluster, self.namespace, self.name, self.uid = cluster, namespace, name, uid

    def _get(self, subresource: str, query: dict[str, str]) -> bytes | None:
        async def fetch(client: KubeClient) -> bytes | None:
            try:
                return await client.get_episode_data(self.namespace, self.name, subresource, query | {"uid": self.uid})
            except KubeError as error:
                if error.status == 404 and "could not find the requested resource" not in str(error):
                    return None  # the operator has nothing kept
                if error.status in (404, 503):
                    raise click.ClickException(
                        f"the operator's data API (apiservice {API_SERVICE}) is not available: {error}; is the "
                        "operator installed with its Helm chart? (--data-dir reads an operator running here)"
                    ) from error
                raise

        return self.cluster.run(fetch)

    def logs(self, *, turn: str | None, attempt: int | None) -> str:
        query = {key: str(value) for key, value in (("turn", turn), ("attempt", attempt)) if value is not None}
        body = self._get("log", query)
        return "" if body is None else body.decode("utf-8", "replace")

    def log(self, *, turn: str, attempt: int, name: str) -> bytes | None:
        return self._get("log", {"turn": turn, "attempt": str(attempt), "log": name})

    def turns(self) -> dict[str, Any]:
        body = self._get("turns", {})
        return {"attempt": None, "turns": {}} if body is None else dict(json.loads(body))

    def artifacts(self, destination: Path) -> Exported:
        body = self._get("artifacts", {})
        if body is None:
            return Exported([], [])
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(body), mode="r|gz") as archive:
            written, refused = extract_files(archive, destination)
        return Exported(written, refused)


def _say_refused(refused: list[RefusedMember]) -> None:
    """What was not unpacked (a link, a name leaving the folder…), one line each on stderr."""
    for member in refused:
        click.echo(f"skipped {member.name or 'an archive'}: {member.reason}", err=True)


def kept_data(cluster: Cluster, episode: Mapping[str, Any], data_dir: str | None) -> KeptData:
    """What the operator kept of ``episode``: from its data directory here (``--data-dir``), else from
    the in-cluster operator's data API; a data directory without the Episode is a usage error."""
    namespace, name, uid = (episode["metadata"][key] for key in ("namespace", "name", "uid"))
    if data_dir:
        if not Path(data_dir).is_dir():
            raise click.ClickException(f"{data_dir}: not found; is --data-dir the operator's data directory?")
        blobs = BlobStore.local(Path(data_dir)).episode(namespace, name, uid)
        if not asyncio.run(blobs.kept()):
            raise click.ClickException(
                f"nothing kept for {namespace}/{name} in {data_dir}; is --data-dir the operator's data directory?"
            )
        return _LocalStore(blobs)
    return _RemoteStore(cluster, namespace, name, uid)


def _turn_document(kept: Mapping[str, str]) -> dict[str, Any]:
    """A turn's trajectory and model calls as ``kubectl episode trajectory -o json`` prints them."""
    trajectory = kept.get(TRAJECTORY_RECORD)
    return {
        "trajectory": json.loads(trajectory) if trajectory else None,
        "modelCalls": [
            call.model_dump(mode="json") for call in parse_journal(kept.get(CALLS_RECORD, "").encode()).calls
        ],
    }


def _position(order: list[str], turn: str) -> int:
    return order.index(turn) if turn in order else len(order)


def _reward(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _turn_table(status: EpisodeStatus) -> Table:
    table = Table("#", "TURN", "PHASE", "STAGE", "REWARD", "AGENT EXIT", "FAILURE", "MESSAGE", box=None)
    for number, turn in enumerate(status.turns, start=1):
        table.add_row(
            str(number),
            turn.name,
            turn.phase,
            turn.stage or "",
            _reward(turn.reward),
            "" if turn.agent_exit_code is None else str(turn.agent_exit_code),
            turn.failure_kind or "",
            (turn.message or "")[:80],
        )
    return table


def follow(cluster: Cluster, namespace: str, name: str, timeout: float) -> EpisodeStatus:
    """Show the Episode's turns live until it ends; print the outcome."""
    console = Console()

    async def watch(client: KubeClient) -> EpisodeStatus:
        deadline = time.monotonic() + timeout
        status = EpisodeStatus()
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while True:
                item = await client.get_episode(namespace, name)
                status = EpisodeStatus.model_validate(item.get("status") or {})
                header = f"{name}: {status.phase or 'Pending'} {status.progress or ''}"
                table = _turn_table(status)
                table.title = header
                live.update(table)
                if is_terminal(status.phase) or time.monotonic() > deadline:
                    return status
                await asyncio.sleep(1.0)

    status = cluster.run(watch)
    console.print()
    if not is_terminal(status.phase):
        raise click.ClickException(f"episode {namespace}/{name} still {status.phase} after {timeout:.0f} s")
    console.print(
        f"{status.phase} ({status.outcome}): reward {_reward(status.reward)}"
        + (f", failure {status.failure_kind}" if status.failure_kind else "")
        + (f"\n{status.message}" if status.phase == "Failed" and status.message else "")
    )
    return status
