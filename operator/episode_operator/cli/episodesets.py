"""``kubectl-episode eval``: pack a dataset folder, create an EpisodeSet, follow it live."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from episode_operator.api.episode_resource import AgentSpec
from episode_operator.api.episodeset_resource import SET_KIND, EpisodeSetSpec, EpisodeSetStatus, SetTaskStatus
from episode_operator.api.naming import content_name
from episode_operator.api.vocabulary import API_VERSION, is_terminal
from episode_operator.cli.agents import agent_options
from episode_operator.cli.cluster import Cluster, cluster_options
from episode_operator.cli.episodes import (
    dataset_sources,
    dump_manifests,
    manifest_output,
    output_namespace,
    placed,
    task_repository_option,
)
from episode_operator.cli.registries import dataset_origin, registry_options
from episode_operator.kube.client import KubeClient
from episode_operator.taskfolder.oci_artifact import TaskRepository

SHOWN_TASKS = 30
OUTCOME_CELLS = {"Ungraded": "infra", "Masked": "masked", "TerminalFailure": "term"}


def register_sets(cli: click.Group) -> None:
    """Add ``eval`` to the ``kubectl-episode`` group."""

    @cli.command("eval")
    @click.argument("dataset")
    @registry_options
    @cluster_options
    @task_repository_option
    @agent_options
    @click.option("--image", default=None, help="Image for tasks without docker_image.")
    @click.option("--attempts", type=click.IntRange(1, 100), default=1, show_default=True, help="Per task (pass@k).")
    @click.option(
        "--parallelism", type=click.IntRange(1, 10000), default=4, show_default=True, help="Children active at once."
    )
    @click.option(
        "--name",
        default=None,
        help="EpisodeSet name (default: the folder's name; a random suffix, or with -o yaml a digest of the spec).",
    )
    @click.option("--queue-name", default=None, help="Kueue LocalQueue for the children (kueue.x-k8s.io/queue-name).")
    @click.option("--timeout-multiplier", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
    @click.option(
        "--success-threshold", type=float, default=1.0, show_default=True, help="Reward counted a success (pass@k)."
    )
    @click.option(
        "--outage-retries", type=click.IntRange(0, 20), default=None, help="Fresh attempts of a child after an outage."
    )
    @click.option("--max-outages", type=click.IntRange(min=0), default=None, help="Stop after more outages.")
    @click.option("--max-terminal-failures", type=click.IntRange(min=0), default=None, help="Stop after more.")
    @manifest_output("create the set and print its name")
    @click.option("--wait/--no-wait", default=False, help="Show live progress until the set finishes.")
    @click.option(
        "--timeout", "wait_timeout", type=float, default=86400.0, show_default=True, help="With --wait: give up after."
    )
    def evaluate(
        dataset: str,
        registry: str | None,
        checkouts: tuple[str, ...],
        cluster: Cluster,
        task_repository: TaskRepository | None,
        agent: AgentSpec,
        image: str | None,
        attempts: int,
        parallelism: int,
        name: str | None,
        queue_name: str | None,
        timeout_multiplier: float,
        success_threshold: float,
        outage_retries: int | None,
        max_outages: int | None,
        max_terminal_failures: int | None,
        output: str,
        wait: bool,
        wait_timeout: float,
    ) -> None:
        """Evaluate every task folder under DATASET (or, with --registry, the dataset NAME@VERSION of a
        Harbor registry.json): pack them, create an EpisodeSet, follow it.

        Every evaluation is a new set (a random name suffix). With -o yaml the set is named after the
        folder (or NAME-VERSION) and a digest of its spec instead: a manifest for Git, one object however
        often applied.
        """
        origin = dataset_origin(dataset, registry, checkouts, cluster, task_repository)
        packed = origin.packed
        config_maps = [task.config_map for task in packed if task.config_map is not None]
        template: dict[str, Any] = {"timeoutMultiplier": timeout_multiplier}
        if image:
            template["image"] = image
        if outage_retries is not None:
            template["retries"] = {"outages": outage_retries}
        try:
            spec = EpisodeSetSpec.model_validate(
                {
                    "dataset": {"tasks": dataset_sources(packed, task_repository)},
                    "agent": agent.to_api(),
                    "attempts": attempts,
                    "parallelism": parallelism,
                    "template": template,
                    "successThreshold": success_threshold,
                    "queueName": queue_name,
                    "failurePolicy": {"maxOutages": max_outages, "maxTerminalFailures": max_terminal_failures},
                }
            )
        except ValidationError as error:
            messages = "; ".join(str(detail["msg"]).removeprefix("Value error, ") for detail in error.errors())
            raise click.ClickException(messages) from error
        given = spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
        stem = origin.stem
        metadata: dict[str, Any] = (
            {"name": name or content_name(stem, given, fallback="eval")}
            if name or output == "yaml"
            else {"generateName": (stem.lower()[:40].strip("-.") or "eval") + "-"}
        )
        if origin.annotations:
            metadata["annotations"] = dict(origin.annotations)
        manifest = {"apiVersion": API_VERSION, "kind": SET_KIND, "metadata": metadata, "spec": given}
        namespace = output_namespace(cluster, output)
        manifests = [placed(m, namespace) for m in [*config_maps, manifest]]
        if output == "yaml":
            click.echo(dump_manifests(manifests), nl=False)
            return

        async def create(client: KubeClient) -> dict[str, Any]:
            await asyncio.gather(*(client.apply_config_map(config_map) for config_map in config_maps))
            return await client.create_episodeset(manifest)

        set_name = cluster.run(create)["metadata"]["name"]
        click.echo(
            f"episodeset/{set_name} created in {cluster.namespace}: {len(packed)} task(s) × {attempts} attempt(s), "
            f"parallelism {parallelism}"
        )
        if wait:
            status = follow_set(cluster, cluster.namespace, set_name, wait_timeout)
            sys.exit(0 if status.phase == "Succeeded" else 1)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _attempt_cell(task: SetTaskStatus, attempts: int) -> str:
    cells = []
    records = {record.attempt: record for record in task.children}
    for attempt in range(1, attempts + 1):
        record = records.get(attempt)
        if record is None:
            cells.append("·")
        elif not is_terminal(record.phase):
            cells.append("…")
        elif record.outcome == "Graded":
            cells.append(_number(record.reward))
        else:
            cells.append(OUTCOME_CELLS.get(record.outcome or "", "?"))
    return " ".join(cells)


def _misses(ungraded: int, separator: str = " ") -> str:
    """How many Ungraded attempts a pass@k counts as misses, when any."""
    return f"{separator}{ungraded} ungraded as misses" if ungraded else ""


def set_view(name: str, status: EpisodeSetStatus, attempts: int) -> Group:
    """The live view of a set: one summary line and a table of its tasks."""
    passes = "  ".join(f"pass@{row.k} {_number(row.value)}{_misses(row.ungraded)}" for row in status.pass_at_k)
    header = (
        f"[bold]{name}[/bold]: {status.phase or 'Pending'}  {status.progress or '-'} finished, "
        f"{status.active} active  mean {_number(status.mean_reward)}  {passes}  "
        f"infra {status.outcomes.ungraded}  masked {status.outcomes.masked}  "
        f"terminal {status.outcomes.terminal_failure}"
    )
    table = Table("#", "TASK", "ATTEMPTS", "MEAN", *(f"PASS@{k}" for k in range(1, attempts + 1)), box=None)
    shown = sorted(status.tasks, key=lambda task: (task.finished == attempts, task.index))[:SHOWN_TASKS]
    for task in sorted(shown, key=lambda task: task.index):
        table.add_row(
            str(task.index),
            task.name,
            _attempt_cell(task, attempts),
            _number(task.mean_reward),
            *(_number(task.pass_at_k[k - 1]) if len(task.pass_at_k) >= k else "-" for k in range(1, attempts + 1)),
        )
    parts: list[Any] = [header, table]
    if len(status.tasks) > SHOWN_TASKS:
        parts.append(f"… {len(status.tasks) - SHOWN_TASKS} more task(s); unfinished ones are shown first")
    if status.message and status.phase != "Succeeded":
        parts.append(status.message)
    return Group(*parts)


def follow_set(
    cluster: Cluster, namespace: str, name: str, timeout: float, *, rerun_generation: int = 0
) -> EpisodeSetStatus:
    """Show a set's progress live until it completes (having seen ``rerun_generation``); print the result."""
    console = Console()

    async def watch(client: KubeClient) -> EpisodeSetStatus:
        deadline = time.monotonic() + timeout
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while True:
                item = await client.get_episodeset(namespace, name)
                status = EpisodeSetStatus.model_validate(item.get("status") or {})
                attempts = int((item.get("spec") or {}).get("attempts") or 1)
                live.update(set_view(name, status, attempts))
                done = status.completion_time and status.rerun_generation >= rerun_generation
                if done or time.monotonic() > deadline:
                    return status
                await asyncio.sleep(1.0)

    status = cluster.run(watch)
    console.print()
    if not status.completion_time or status.rerun_generation < rerun_generation:
        raise click.ClickException(f"episodeset {namespace}/{name} still {status.phase} after {timeout:.0f} s")
    refused = next((record for record in status.reruns if record.generation == rerun_generation), None)
    if refused is not None and refused.message:
        raise click.ClickException(
            f"episodeset {namespace}/{name}: rerun generation {rerun_generation} refused: {refused.message}"
        )
    console.print(
        f"{status.phase}: {status.progress} finished, mean reward {_number(status.mean_reward)} "
        f"over {status.outcomes.graded} graded; "
        + ", ".join(
            f"pass@{row.k} {_number(row.value)} ({row.tasks} tasks{_misses(row.ungraded, ', ')})"
            for row in status.pass_at_k
        )
        + (f"\n{status.message}" if status.phase == "Failed" and status.message else "")
    )
    return status
