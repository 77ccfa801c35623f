"""``kubectl episode rerun SET``: re-run, in place, the children of an EpisodeSet that failed so.

It sets the set's ``spec.rerun`` (the next generation, the outcomes and failure kinds given): the
declaration a Git repository could hold as well. The operator applies each generation once
(runtime/rerun_plan.py); this command says which finished children match now, and with ``--wait``
follows the set until it has applied the generation and finished again.
"""

from __future__ import annotations

import sys
from typing import Any, get_args

import click
from pydantic import ValidationError

from episode_operator.api.episodeset_resource import EpisodeSetStatus, RerunOutcome, RerunSpec
from episode_operator.cli.cluster import Cluster, cluster_options
from episode_operator.cli.episodesets import follow_set
from episode_operator.kube.client import Conflict, KubeClient
from episode_operator.runtime.rerun_plan import RERUNNABLE, selection

SHOWN_NAMES = 10


def register_reruns(cli: click.Group) -> None:
    """Add ``rerun`` to the ``kubectl-episode`` group."""

    @cli.command("rerun")
    @click.argument("name")
    @cluster_options
    @click.option(
        "--outcome",
        "outcomes",
        multiple=True,
        type=click.Choice(get_args(RerunOutcome)),
        help="Re-run the children that ended so (repeatable). "
        + " ".join(f"{outcome}: {why}." for outcome, why in RERUNNABLE.items()),
    )
    @click.option(
        "--failure-kind",
        "failure_kinds",
        multiple=True,
        help="Re-run the children whose failureKind is this (repeatable; outage:* for a family). With --outcome, "
        "a child must match both.",
    )
    @click.option("--wait/--no-wait", default=False, help="Follow the set until it has re-run them and finished.")
    @click.option(
        "--timeout", "wait_timeout", type=float, default=86400.0, show_default=True, help="With --wait: give up after."
    )
    def rerun(
        name: str,
        cluster: Cluster,
        outcomes: tuple[str, ...],
        failure_kinds: tuple[str, ...],
        wait: bool,
        wait_timeout: float,
    ) -> None:
        """Re-run, in place, the finished children of the EpisodeSet NAME that failed so; keep the others.

        A Graded child is never re-run. The set records what each re-run child replaced
        (status.tasks[].replaced) and its counts, mean and pass@k are the re-run children's.
        """
        if not outcomes and not failure_kinds:
            raise click.UsageError("name what to re-run: --outcome, --failure-kind, or both")
        try:
            wanted = RerunSpec.model_validate({"generation": 1, "outcomes": outcomes, "failureKinds": failure_kinds})
        except ValidationError as error:
            messages = "; ".join(str(detail["msg"]).removeprefix("Value error, ") for detail in error.errors())
            raise click.BadParameter(messages, param_hint="--failure-kind") from error
        namespace = cluster.namespace

        async def request(client: KubeClient) -> tuple[int, list[str]]:
            item = await client.get_episodeset(namespace, name)
            status = EpisodeSetStatus.model_validate(item.get("status") or {})
            asked: Any = (item.get("spec") or {}).get("rerun") or {}
            generation = max(int(asked.get("generation") or 0), status.rerun_generation) + 1
            rerun = wanted.model_copy(update={"generation": generation})
            chosen = [record.name for _, record in selection(status.tasks, rerun)]
            if not chosen:
                return generation, chosen
            # The version read: a rerun someone else asked for meanwhile is not overwritten (409).
            patch = {
                "metadata": {"resourceVersion": item["metadata"]["resourceVersion"]},
                "spec": {"rerun": rerun.to_api()},
            }
            try:
                await client.patch_episodeset(namespace, name, patch)
            except Conflict:
                raise click.ClickException(
                    f"episodeset {namespace}/{name} changed meanwhile; run the command again"
                ) from None
            return generation, chosen

        generation, chosen = cluster.run(request)
        if not chosen:
            raise click.ClickException(f"episodeset {namespace}/{name}: no finished child matches; nothing to re-run")
        shown = ", ".join(chosen[:SHOWN_NAMES]) + (
            f" and {len(chosen) - SHOWN_NAMES} more" if len(chosen) > SHOWN_NAMES else ""
        )
        click.echo(f"episodeset/{name} rerun generation {generation}: re-running {len(chosen)} child(ren): {shown}")
        if wait:
            status = follow_set(cluster, namespace, name, wait_timeout, rerun_generation=generation)
            sys.exit(0 if status.phase == "Succeeded" else 1)
