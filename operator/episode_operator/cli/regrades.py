"""``kubectl episode regrade EPISODE [--tests DIR|configmap/NAME]``: verify a finished Episode's kept artifacts again.

It creates a regrade Episode (``spec.regrade``, runtime/regrade.py): the original's spec, its task with the
new tests (the original's as it is without ``--tests``), and no agent run. What cannot be regraded — an
unfinished or ungraded original, a turn verified in the agent's own sandbox, tests of another task — is
refused here, before anything is created, by the rule the operator applies; the operator also checks
that it kept the artifacts.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from pathlib import Path
from typing import Any

import click

from episode_operator.api.episode_resource import (
    DEFAULT_TASK_ARCHIVE_KEY,
    EpisodeSpec,
    EpisodeStatus,
    RegradeSpec,
    TaskSource,
    episode_manifest,
)
from episode_operator.api.naming import content_name
from episode_operator.api.vocabulary import GROUP
from episode_operator.cli.cluster import Cluster, cluster_options
from episode_operator.cli.episodes import follow, manifest_output, print_or_create
from episode_operator.kube.client import KubeClient, NotFound
from episode_operator.kube.objects.tasks import TaskTooLarge, task_config_map
from episode_operator.runtime.regrade import RegradeRefused, plan_regrade
from episode_operator.taskfolder import TaskFiles, resolve_plan, validate_task
from episode_operator.taskfolder.retest import with_tests

CONFIG_MAP_PREFIX = "configmap/"
# On a regrade Episode: the Episode it regrades (the uid is in its spec).
REGRADE_OF_LABEL = f"{GROUP}/regrade-of"


def _task_files(config_map: Any, name: str, key: str = DEFAULT_TASK_ARCHIVE_KEY) -> TaskFiles:
    archive = (config_map.binary_data or {}).get(key)
    if archive is None:
        raise click.ClickException(f"configmap {name} has no binaryData key {key!r}: not a packed task")
    return TaskFiles.from_tar(base64.b64decode(archive))


def register_regrades(cli: click.Group) -> None:
    """Add ``regrade`` to the ``kubectl-episode`` group."""

    @cli.command("regrade")
    @click.argument("episode")
    @cluster_options
    @click.option(
        "--tests",
        default=None,
        help="The new tests: a task folder (its tests/ and steps/*/tests/ are taken), a folder holding test.sh "
        "(the new tests/), or configmap/NAME (a packed task). Default: the original task's own.",
    )
    @click.option("--name", default=None, help="The regrade's name (default: EPISODE-regrade- and a random suffix).")
    @manifest_output("create the regrade Episode and print its name")
    @click.option("--wait/--no-wait", default=False, help="Follow the regrade to its end, turn by turn.")
    @click.option(
        "--timeout", "wait_timeout", type=float, default=3600.0, show_default=True, help="With --wait: give up after."
    )
    def regrade(
        episode: str,
        cluster: Cluster,
        tests: str | None,
        name: str | None,
        output: str,
        wait: bool,
        wait_timeout: float,
    ) -> None:
        """Verify what EPISODE's agent left again, with new tests, in fresh verifier pods; the agent does not run.

        Every turn EPISODE verified in a separate sandbox is verified again from the artifacts the operator kept;
        a turn verified in the agent's own sandbox cannot be (that sandbox is gone) and is refused. The result is
        a new Episode (its status.regrade names the original); EPISODE's own record is left as it is.
        """
        namespace = cluster.namespace
        local = None if tests is None or tests.startswith(CONFIG_MAP_PREFIX) else Path(tests)
        if local is not None and not local.is_dir():
            raise click.BadParameter(f"{tests}: no such directory", param_hint="--tests")

        async def read(client: KubeClient) -> tuple[dict[str, Any], TaskFiles, TaskFiles | None]:
            try:
                original = await client.get_episode(namespace, episode)
            except NotFound:
                raise click.ClickException(f"episode {namespace}/{episode} not found") from None
            source = EpisodeSpec.model_validate(original["spec"]).task
            if source.inline is not None:
                files = await asyncio.to_thread(TaskFiles.from_mapping, source.inline.files)
            elif source.oci is not None:
                raise click.ClickException(
                    f"episode {namespace}/{episode}: its task is an OCI artifact (spec.task.oci "
                    f"{source.oci.reference}); regrade reads inline and ConfigMap tasks only"
                )
            else:
                assert source.config_map is not None
                reference = source.config_map
                try:
                    config_map = await client.get_config_map(namespace, reference.name)
                except NotFound:
                    raise click.ClickException(
                        f"configmap {namespace}/{reference.name} (episode {episode}'s task) not found"
                    ) from None
                files = _task_files(config_map, reference.name, reference.key)
            new: TaskFiles | None = None
            if tests is not None and local is None:
                packed = tests.removeprefix(CONFIG_MAP_PREFIX)
                try:
                    new = _task_files(await client.get_config_map(namespace, packed), packed)
                except NotFound:
                    raise click.ClickException(f"configmap {namespace}/{packed} not found") from None
            return original, files, new

        original, files, packed_tests = cluster.run(read)
        status = EpisodeStatus.model_validate(original.get("status") or {})
        spec = EpisodeSpec.model_validate(original["spec"])
        config_map: dict[str, Any] | None = None
        task = spec.task
        if tests is not None:
            new_tests = packed_tests if packed_tests is not None else TaskFiles.from_path(str(local))
            files = with_tests(files, new_tests, tests)
            validation = validate_task(files)
            if not validation.valid:
                for problem in validation.problems:
                    click.echo(f"  {problem.render()}", err=True)
                raise click.ClickException(f"{tests}: the task with these tests is refused; nothing was created")
            try:
                config_map = task_config_map(files, task=f"{episode}-regrade", namespace=None)
            except TaskTooLarge as error:
                raise click.ClickException(f"{tests}: {error}") from error
            task = TaskSource.model_validate({"configMap": {"name": config_map["metadata"]["name"]}})
        asked = RegradeSpec(episode=episode, uid=original["metadata"]["uid"])
        regraded = spec.model_copy(update={"task": task, "regrade": asked, "suspend": False})
        loaded = validate_task(files).task
        if loaded is None:
            raise click.ClickException(f"episode {episode}'s task is refused by the loader; nothing was created")
        # The turns and their verifiers as the operator will plan them (its images it decides itself).
        plan = resolve_plan(loaded, timeout_multiplier=spec.timeout_multiplier, settings=spec.harbor.server_settings())
        try:
            decided = plan_regrade(episode, original["metadata"]["uid"], status, plan)
        except RegradeRefused as error:
            raise click.ClickException(f"{error}; nothing was created") from None
        labels = {REGRADE_OF_LABEL: episode}
        if name or output == "yaml":
            manifest = episode_manifest(
                None, regraded, name=name or content_name(f"{episode}-regrade", regraded.to_api()), labels=labels
            )
        else:
            manifest = episode_manifest(None, regraded, generate_name=f"{episode[:40]}-regrade-", labels=labels)
        made = print_or_create(cluster, output, config_map, manifest)
        if made is None:
            return
        created = made["metadata"]["name"]
        verified = [turn.name for turn in decided.turns if turn.action == "verify"]
        click.echo(
            f"episode/{created} created in {namespace}: regrades {episode} (attempt {decided.attempt}, reward "
            f"{decided.original_reward}), turns {', '.join(verified)}, with "
            + (f"the tests of {tests}" if tests else "its own tests")
        )
        if wait:
            result = follow(cluster, namespace, created, wait_timeout)
            click.echo(f"regraded {episode}: reward {result.reward} (it had {decided.original_reward})")
            sys.exit(0 if result.phase == "Succeeded" else 1)
