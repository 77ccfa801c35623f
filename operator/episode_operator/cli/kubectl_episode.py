"""``kubectl-episode`` (``kubectl episode …``): the project's command line.

Every command answers bad input with a message naming the file and key, and an exit code
(0 valid, 1 refused, 2 usage); never with a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from episode_operator.cli.episodes import register
from episode_operator.cli.episodesets import register_sets
from episode_operator.cli.regrades import register_regrades
from episode_operator.cli.reruns import register_reruns
from episode_operator.cli.view import register_view
from episode_operator.taskfolder import Problem, TaskFiles, resolve_plan, seed_refusals, validate_task
from episode_operator.taskfolder.loader import Validation

EXIT_REFUSED = 1


def _read(path: str) -> Validation:
    """The folder's validation, with what the operator would refuse at seed for any agent as warnings
    (a valid folder that no Episode here can run, e.g. an allowlist naming a hostname)."""
    if not Path(path).exists():
        raise click.BadParameter(f"{path}: no such file or directory", param_hint="PATH")
    result = validate_task(TaskFiles.from_path(path))
    if result.task is None:
        return result
    refused = seed_refusals(resolve_plan(result.task), accepts_prior_trajectory=True)
    seed = [dataclasses.replace(problem, message=f"refused at seed: {problem.message}") for problem in refused]
    return dataclasses.replace(result, warnings=(*result.warnings, *seed))


def _emit_problems(title: str, problems: Sequence[Problem], *, err: bool) -> None:
    if problems:
        click.echo(f"{title}:", err=err)
        for problem in problems:
            click.echo(f"  {problem.render()}", err=err)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="episode-operator")
def cli() -> None:
    """Run Harbor task folders as Kubernetes Episodes."""


@cli.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print {valid, errors, warnings} as JSON.")
def validate(path: str, as_json: bool) -> None:
    """Check the task folder (or tar) at PATH; exit 0 if valid, 1 if refused."""
    result = _read(path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "valid": result.valid,
                    "errors": [problem.as_json() for problem in result.problems],
                    "warnings": [warning.as_json() for warning in result.warnings],
                },
                indent=2,
            )
        )
    else:
        _emit_problems("errors", result.problems, err=False)
        _emit_problems("warnings", result.warnings, err=False)
        if result.valid:
            click.echo(f"{path}: valid")
        else:
            click.echo(f"{path}: refused ({len(result.problems)} error(s))")
    sys.exit(0 if result.valid else EXIT_REFUSED)


@cli.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the resolved plan as JSON.")
@click.option(
    "--timeout-multiplier",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Scale agent and verifier budgets (Gym's dataset timeout_multiplier).",
)
def plan(path: str, as_json: bool, timeout_multiplier: float) -> None:
    """Resolve the task folder at PATH into turns; exit 1 if it is refused."""
    result = _read(path)
    if result.task is None:
        _emit_problems("errors", result.problems, err=True)
        click.echo(f"{path}: refused ({len(result.problems)} error(s))", err=True)
        sys.exit(EXIT_REFUSED)
    resolved = resolve_plan(result.task, timeout_multiplier=timeout_multiplier)
    if as_json:
        click.echo(json.dumps(resolved.model_dump(mode="json", by_alias=True), indent=2))
        return
    kind = f"multi-step, {resolved.reward_strategy}" if resolved.multi_step else "single-step"
    click.echo(f"{path}: {len(resolved.turns)} turn(s), {kind}, deadline {resolved.deadline_sec:.0f} s")
    for number, turn in enumerate(resolved.turns, start=1):
        details: list[Any] = [
            f"agent {turn.agent.timeout_sec:.0f} s as {turn.agent.user or 'default user'}",
            f"verifier {turn.verifier.mode} {turn.verifier.timeout_sec:.0f} s",
            f"{len(turn.tests)} test file(s)",
        ]
        if turn.setup:
            details.append("setup.sh")
        if turn.min_reward is not None:
            details.append(f"min_reward {turn.min_reward}")
        click.echo(f"  {number}. {turn.name}: " + ", ".join(str(item) for item in details))
    for warning in resolved.warnings:
        click.echo(f"  warning: {warning}")


register(cli)
register_sets(cli)
register_view(cli)
register_reruns(cli)
register_regrades(cli)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``kubectl-episode``; turns unexpected errors into one line and exit 3."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="kubectl-episode", standalone_mode=True)
    except SystemExit:
        raise
    except Exception as error:  # the contract: a message, never a traceback
        click.echo(f"kubectl-episode: internal error: {type(error).__name__}: {error}", err=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
