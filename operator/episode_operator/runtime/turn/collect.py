"""Stage ``collect``: collect hooks, then artifacts — ``main`` first, then the sidecars (docs/task-format.md §3.4.5).

Best effort, as in Harbor and Gym: a failing hook or a missing artifact source is recorded
(``failed`` in the manifest) and the turn goes on; only a lost sandbox stops it. Each
downloaded tar is re-packed by the operator (``runtime/archive.py``: only the regular files
and directories of the artifact's source; what was refused, and why, is in the manifest) and
the clean tar is kept in the store, which is also what a separate verifier receives: nothing
the agent's pod sent reaches it as sent. An artifact past the artifact bound, or a turn's past
the turn's (``runtime/limits.py``), fails the turn (``agent:output_limit``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final, Literal

from episode_operator.api.episode_resource import ArtifactSummary
from episode_operator.runtime.archive import RefusedMember, repack_artifact
from episode_operator.runtime.sandbox_protocol import CommandFailed, JobSpec, Sandbox, SandboxError
from episode_operator.runtime.turn.context import TurnRun
from episode_operator.runtime.turn.turn_failures import sandbox_lost
from episode_operator.taskfolder.plan import ArtifactPlan
from episode_operator.taskfolder.task_toml import MAIN_SERVICE

ArtifactStatus = Literal["ok", "failed", "skipped", "empty"]
_SUMMARY_FIELD: Final[dict[ArtifactStatus, str]] = {
    "ok": "collected",
    "failed": "failed",
    "skipped": "skipped",
    "empty": "empty",
}


def carried_artifact(turn: TurnRun) -> ArtifactPlan | None:
    """The artifact source the agent job's final answer can bring along, saving collect an exec.

    The first one collected from ``main``, when no collect hook runs before it (hooks on
    ``main`` run first and may write there): nothing acts in the sandbox between the agent's
    end and its download but this runner's own trajectory, which goes to /logs/agent.
    """
    plan = turn.plan
    if any(hook.service == MAIN_SERVICE for hook in plan.collect):
        return None
    return next((entry for entry in plan.artifacts if entry.service == MAIN_SERVICE), None)


async def collect(turn: TurnRun) -> None:
    plan = turn.plan
    services = turn.services
    sandbox = await services.agent_sandbox()
    manifest: list[dict[str, Any]] = []
    claimed: list[str] = []
    counts = ArtifactSummary()
    left = services.limits.turn_artifact_bytes  # what the turn's artifacts bound leaves
    services_named = {hook.service for hook in plan.collect} | {artifact.service for artifact in plan.artifacts}
    for service in [MAIN_SERVICE, *sorted(services_named - {MAIN_SERVICE})]:
        for number, hook in enumerate(plan.collect):
            if hook.service != service:
                continue
            state = await services.run_job(
                sandbox,
                JobSpec(
                    id=f"{service}.{turn.job_id('collect')}.{number}",
                    command=hook.command,
                    timeout_sec=hook.timeout_sec,
                    user=hook.user,
                    shell="bash" if service == MAIN_SERVICE else "sh",
                    container=service,
                ),
            )
            await services.save_job_log(sandbox, turn.name, f"collect-{number}", state, container=service)
        for entry in plan.artifacts:
            if entry.service != service:
                continue
            collected = await _collect_artifact(turn, sandbox, len(manifest), entry, claimed, left)
            left -= collected.size
            status = collected.status
            manifest.append(
                {
                    "source": entry.source,
                    "destination": entry.destination,
                    "type": collected.kind,
                    "status": status,
                    "service": entry.service,
                    "origin": entry.origin,
                    **(
                        {"refused": [{"name": item.name, "reason": item.reason} for item in collected.refused]}
                        if collected.refused
                        else {}
                    ),
                }
            )
            field = _SUMMARY_FIELD[status]
            setattr(counts, field, getattr(counts, field) + 1)
    await services.store.save_manifest(services.attempt_number, turn.name, manifest)
    turn.record.artifacts = counts


@dataclass(frozen=True)
class _Collected:
    status: ArtifactStatus
    kind: str
    size: int = 0
    refused: tuple[RefusedMember, ...] = ()


async def _collect_artifact(
    turn: TurnRun, sandbox: Sandbox, position: int, entry: ArtifactPlan, claimed: list[str], left: int
) -> _Collected:
    if any(_overlaps(entry.destination, earlier) for earlier in claimed):
        return _Collected("skipped", "directory")
    carried = turn.agent_archive if entry is carried_artifact(turn) else None
    try:
        raw = (
            carried
            if carried is not None
            else await sandbox.download([entry.source], container=entry.service, exclude=entry.exclude)
        )
    except CommandFailed:
        return _Collected("failed", "directory")
    except SandboxError as error:
        raise sandbox_lost(error) from error
    limits = turn.services.limits
    try:
        repacked = await asyncio.to_thread(repack_artifact, raw, entry.source, limits, turn_left=left)
    finally:
        raw.discard()
        if carried is not None:
            turn.agent_archive = None
    try:
        if not repacked.present:
            return _Collected("failed", repacked.kind, refused=repacked.refused)
        claimed.append(entry.destination)
        await turn.services.store.save_artifact(turn.services.attempt_number, turn.name, position, repacked.archive)
    finally:
        repacked.archive.discard()
    return _Collected("ok" if repacked.files else "empty", repacked.kind, repacked.size, repacked.refused)


def _overlaps(first: str, second: str) -> bool:
    """Two artifact destinations claim the same place (equal, or one inside the other)."""
    a = PurePosixPath(first.rstrip("/") or ".")
    b = PurePosixPath(second.rstrip("/") or ".")
    return a == b or a in b.parents or b in a.parents
