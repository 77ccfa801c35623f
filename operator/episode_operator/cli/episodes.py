"""The commands of ``kubectl-episode`` that talk to a cluster: pack, run, get, describe, logs, artifacts."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from episode_operator.api.export import FAILURES, ROLLOUTS, split_rows
from episode_operator.api.models import AgentSpec, EpisodeSpec, EpisodeStatus, TaskSource, episode_manifest
from episode_operator.kube.client import KubeClient, KubeError
from episode_operator.kube.episodeset import set_selector
from episode_operator.kube.tasks import TaskTooLarge, task_config_map
from episode_operator.runtime.archive import extract_safely
from episode_operator.runtime.dataapi import API_SERVICE
from episode_operator.runtime.store import episode_store_root, export_artifacts, stored_logs
from episode_operator.taskfolder import TaskFiles, validate_task

T = TypeVar("T")
TERMINAL = ("Succeeded", "Failed")


def with_client(kubeconfig: str | None, action: Callable[[KubeClient], Awaitable[T]]) -> T:
    """Run ``action`` with a connected client; API errors become one line and exit 1."""

    async def main() -> T:
        client = await KubeClient.connect(kubeconfig)
        try:
            return await action(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except KubeError as error:
        raise click.ClickException(str(error)) from error


def cluster_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("-n", "--namespace", default="default", show_default=True, help="Namespace.")(command)
    command = click.option("--kubeconfig", default=None, help="Kubeconfig (default: $KUBECONFIG).")(command)
    return command


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


def _pack_manifest(directory: str, namespace: str) -> dict[str, Any]:
    try:
        return task_config_map(_load_folder(directory), task=Path(directory).resolve().name, namespace=namespace)
    except TaskTooLarge as error:
        raise click.ClickException(f"{directory}: {error}") from error


def register(cli: click.Group) -> None:
    """Add the cluster commands to the ``kubectl-episode`` group."""
    register_export(cli)

    @cli.command()
    @click.argument("directory", type=click.Path(exists=True, file_okay=False))
    @cluster_options
    @click.option(
        "-o",
        "--output",
        type=click.Choice(["name", "yaml"]),
        default="name",
        show_default=True,
        help="name: create the ConfigMap and print its name; yaml: only print it.",
    )
    def pack(directory: str, namespace: str, kubeconfig: str | None, output: str) -> None:
        """Pack a task folder into a content-addressed ConfigMap."""
        manifest = _pack_manifest(directory, namespace)
        if output == "yaml":
            click.echo(yaml.safe_dump(manifest, sort_keys=False))
            return

        async def apply(client: KubeClient) -> None:
            await client.apply_config_map(manifest)

        with_client(kubeconfig, apply)
        click.echo(f"configmap/{manifest['metadata']['name']}")

    @cli.command()
    @click.argument("source", type=click.Path(exists=True))
    @cluster_options
    @click.option("--agent", type=click.Choice(["oracle", "nop", "command"]), default="oracle", show_default=True)
    @click.option("--command", "agent_command", default=None, help="For --agent command: the shell command.")
    @click.option("--image", default=None, help="Image for a task without docker_image.")
    @click.option("--name", default=None, help="Episode name (default: generated from the folder's name).")
    @click.option("--timeout-multiplier", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
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
        namespace: str,
        kubeconfig: str | None,
        agent: str,
        agent_command: str | None,
        image: str | None,
        name: str | None,
        timeout_multiplier: float,
        wait: bool,
        wait_timeout: float,
    ) -> None:
        """Run SOURCE (a task folder, or an Episode YAML) as an Episode."""
        config_map: dict[str, Any] | None = None
        if Path(source).is_dir():
            config_map = _pack_manifest(source, namespace)
            try:
                spec = EpisodeSpec(
                    task=TaskSource.model_validate({"configMap": {"name": config_map["metadata"]["name"]}}),
                    agent=AgentSpec.model_validate({"kind": agent, "command": agent_command}),
                    image=image,
                    timeout_multiplier=timeout_multiplier,
                )
            except ValueError as error:
                raise click.ClickException(str(error)) from error
            stem = config_map["metadata"]["labels"]["episode-operator.dev/task"][:40]
            manifest = episode_manifest(namespace, spec, name=name, generate_name=f"{stem}-")
        else:
            manifest = yaml.safe_load(Path(source).read_text())
            if not isinstance(manifest, dict) or manifest.get("kind") != "Episode":
                raise click.ClickException(f"{source}: not an Episode manifest")
            manifest.setdefault("metadata", {}).setdefault("namespace", namespace)

        async def create(client: KubeClient) -> dict[str, Any]:
            if config_map is not None:
                await client.apply_config_map(config_map)
            return await client.create_episode(manifest)

        created = with_client(kubeconfig, create)
        episode_name = created["metadata"]["name"]
        episode_namespace = created["metadata"]["namespace"]
        click.echo(f"episode/{episode_name} created in {episode_namespace}")
        if wait:
            status = follow(kubeconfig, episode_namespace, episode_name, wait_timeout)
            sys.exit(0 if status.phase == "Succeeded" else 1)

    @cli.command()
    @click.argument("name", required=False)
    @cluster_options
    @click.option("-A", "--all-namespaces", is_flag=True)
    def get(name: str | None, namespace: str, kubeconfig: str | None, all_namespaces: bool) -> None:
        """List Episodes with phase, reward and turns."""

        async def fetch(client: KubeClient) -> list[dict[str, Any]]:
            if name:
                return [await client.get_episode(namespace, name)]
            return await client.list_episodes(None if all_namespaces else namespace)

        table = Table("NAMESPACE", "NAME", "PHASE", "OUTCOME", "REWARD", "TURNS", "FAILURE", box=None)
        for item in with_client(kubeconfig, fetch):
            status = item.get("status") or {}
            table.add_row(
                item["metadata"]["namespace"],
                item["metadata"]["name"],
                status.get("phase", ""),
                status.get("outcome", ""),
                _reward(status.get("reward")),
                status.get("progress", ""),
                status.get("failureKind") or "",
            )
        Console().print(table)

    @cli.command()
    @click.argument("name")
    @cluster_options
    def describe(name: str, namespace: str, kubeconfig: str | None) -> None:
        """An Episode's outcome and every turn."""

        async def fetch(client: KubeClient) -> dict[str, Any]:
            return await client.get_episode(namespace, name)

        item = with_client(kubeconfig, fetch)
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
    @click.option("--turn", default=None, help="Only this turn.")
    @click.option("--attempt", type=int, default=None, help="Only this attempt (default: all).")
    @operator_options
    def logs(
        name: str,
        namespace: str,
        kubeconfig: str | None,
        turn: str | None,
        attempt: int | None,
        data_dir: str | None,
    ) -> None:
        """Print the logs an Episode's turns left (agent, setup, verifier, hooks)."""
        source = _kept(kubeconfig, namespace, name, data_dir)
        text = source.logs(turn=turn, attempt=attempt)
        if not text:
            raise click.ClickException(f"no logs kept for {namespace}/{name}" + (f" turn {turn}" if turn else ""))
        click.echo(text, nl=False)

    @cli.command()
    @click.argument("name")
    @click.argument("destination", type=click.Path(file_okay=False, path_type=Path))
    @cluster_options
    @operator_options
    def artifacts(
        name: str,
        destination: Path,
        namespace: str,
        kubeconfig: str | None,
        data_dir: str | None,
    ) -> None:
        """Copy an Episode's artifacts (latest attempt) into DESTINATION/<turn>/."""
        source = _kept(kubeconfig, namespace, name, data_dir)
        written = source.artifacts(destination)
        if not written:
            raise click.ClickException(f"no artifacts kept for {namespace}/{name}")
        click.echo(f"{written} file(s) under {destination}")


def register_export(cli: click.Group) -> None:
    @cli.command()
    @click.argument("names", nargs=-1)
    @cluster_options
    @click.option("-A", "--all-namespaces", is_flag=True)
    @click.option("-l", "--selector", default=None, help="Label selector, e.g. episode-operator.dev/set=NAME.")
    @click.option("--set", "episode_set", default=None, help="The children of this EpisodeSet (with -l: both).")
    @click.option("--format", "output_format", type=click.Choice(["gym-jsonl"]), default="gym-jsonl", show_default=True)
    @click.option(
        "-o",
        "--output",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Folder for rollouts.jsonl and rollouts_failures.jsonl.",
    )
    def export(
        names: tuple[str, ...],
        namespace: str,
        kubeconfig: str | None,
        all_namespaces: bool,
        selector: str | None,
        episode_set: str | None,
        output_format: str,
        output: Path,
    ) -> None:
        """Write finished Episodes as Gym rows: graded to rollouts.jsonl, the rest to rollouts_failures.jsonl."""
        if episode_set:
            selector = ",".join(part for part in (set_selector(episode_set), selector) if part)

        async def fetch(client: KubeClient) -> list[dict[str, Any]]:
            if names:
                return [await client.get_episode(namespace, name) for name in names]
            return await client.list_episodes(None if all_namespaces else namespace, selector)

        rollouts, failures = split_rows(with_client(kubeconfig, fetch))
        output.mkdir(parents=True, exist_ok=True)
        for filename, rows in ((ROLLOUTS, rollouts), (FAILURES, failures)):
            with (output / filename).open("w") as stream:
                for row in rows:
                    stream.write(json.dumps(row, sort_keys=True) + "\n")
        click.echo(
            f"{len(rollouts)} rollout(s) to {output / ROLLOUTS}, {len(failures)} failure(s) to {output / FAILURES}"
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


class _LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def logs(self, *, turn: str | None, attempt: int | None) -> str:
        parts = []
        for log in stored_logs(self.root, turn=turn, attempt=attempt):
            text = log.path.read_bytes().decode("utf-8", "replace")
            parts.append(f"==> attempt {log.attempt} turn {log.turn}: {log.name} <==\n{text}\n")
        return "".join(parts)

    def artifacts(self, destination: Path) -> int:
        return len(export_artifacts(self.root, destination))


class _RemoteStore:
    """The in-cluster operator's data API, through the API server: it authenticates the user and
    authorizes ``get`` on ``episodes/log`` or ``episodes/artifacts`` (group data.episode-operator.dev)."""

    def __init__(self, kubeconfig: str | None, namespace: str, name: str, uid: str) -> None:
        self.kubeconfig, self.namespace, self.name, self.uid = kubeconfig, namespace, name, uid

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

        return with_client(self.kubeconfig, fetch)

    def logs(self, *, turn: str | None, attempt: int | None) -> str:
        query = {key: str(value) for key, value in (("turn", turn), ("attempt", attempt)) if value is not None}
        body = self._get("log", query)
        return "" if body is None else body.decode("utf-8", "replace")

    def artifacts(self, destination: Path) -> int:
        body = self._get("artifacts", {})
        if body is None:
            return 0
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
            members = archive.getmembers()
            extract_safely(archive, destination)
        return sum(1 for member in members if member.isfile())


def _kept(kubeconfig: str | None, namespace: str, name: str, data_dir: str | None) -> _LocalStore | _RemoteStore:
    async def fetch(client: KubeClient) -> dict[str, Any]:
        return await client.get_episode(namespace, name)

    uid = with_client(kubeconfig, fetch)["metadata"]["uid"]
    if data_dir:
        root = episode_store_root(Path(data_dir), namespace, name, uid)
        if not root.is_dir():
            raise click.ClickException(f"{root}: not found; is --data-dir the operator's data directory?")
        return _LocalStore(root)
    return _RemoteStore(kubeconfig, namespace, name, uid)


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


def follow(kubeconfig: str | None, namespace: str, name: str, timeout: float) -> EpisodeStatus:
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
                if status.phase in TERMINAL or time.monotonic() > deadline:
                    return status
                await asyncio.sleep(1.0)

    status = with_client(kubeconfig, watch)
    console.print()
    if status.phase not in TERMINAL:
        raise click.ClickException(f"episode {namespace}/{name} still {status.phase} after {timeout:.0f} s")
    console.print(
        f"{status.phase} ({status.outcome}): reward {_reward(status.reward)}"
        + (f", failure {status.failure_kind}" if status.failure_kind else "")
        + (f"\n{status.message}" if status.phase == "Failed" and status.message else "")
    )
    return status
