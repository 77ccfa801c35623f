"""Stages ``agent`` and ``trajectory``: the agent acts (docs/task-format.md §3.4.4), then its turn is recorded.

The job and its inputs come from the agent kind's registry entry. Harbor's rule, which Gym
keeps: the agent's non-zero exit or timeout is recorded and the verifier still decides —
unless the turn's model calls show the model endpoint failed the agent (``agents/agent_failures.py``).

With a model endpoint, the pod's capture proxy records every call: before the agent starts the
runner tells the proxy which attempt and turn is current, and after it ends the runner takes the
turn's records (by exec into the capture container, which the agent cannot reach) into the
store. Stage ``trajectory`` then writes the turn's ATIF trajectory, built from those records, to
``/logs/agent/trajectory.json`` for the verifier (as Gym does) and keeps it in the store.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import PurePosixPath

from episode_operator.api.vocabulary import FAILURE_CAPTURE_LIMIT
from episode_operator.capture.atif import trajectory_from_calls
from episode_operator.capture.capture_store import calls_file
from episode_operator.capture.records import CAPTURE_LIMIT, CapturedCall, parse_journal
from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.agents.agent_failures import classify, consequence
from episode_operator.runtime.agents.base import with_agent_env
from episode_operator.runtime.agents.model import CAPTURE_CONTAINER, CAPTURE_STORE
from episode_operator.runtime.archive import read_member, text_tar
from episode_operator.runtime.episode_store import CALLS_FILE, INSTRUCTION_FILE, TRAJECTORY_FILE
from episode_operator.runtime.sandbox_protocol import JobSpec, JobState, Sandbox, SandboxError
from episode_operator.runtime.turn.collect import carried_artifact
from episode_operator.runtime.turn.context import AGENT_LOG, TRAJECTORY, TurnRun
from episode_operator.runtime.turn.prepare import carried_cleanup
from episode_operator.runtime.turn.turn_failures import (
    EpisodeEnds,
    Outage,
    TurnFailed,
    check_started,
    sandbox_call,
    sandbox_lost,
)

# How long the runner waits, after the agent ended, for calls still being recorded.
SETTLE_SEC = 5


async def run_agent(turn: TurnRun) -> None:
    """Stage ``agent``: the agent's job (capture marked around it); its failure classified."""
    kind = agent_kind(turn.services.agent_spec)
    job = kind.turn_job(turn)
    if job is None:
        return
    sandbox = await turn.services.agent_sandbox()
    services = turn.services
    await services.store.save_file(services.attempt_number, turn.name, INSTRUCTION_FILE, turn.plan.instruction.encode())
    capture = kind.sandbox_needs(services.agent_spec).capture is not None
    if capture:
        await _capture_job(turn, sandbox, "capture-on", f"--turn {turn.name}")
    inputs = job.inputs
    cleanup = carried_cleanup(turn, "agent")
    if cleanup:
        inputs = replace(inputs, clear=(*inputs.clear, *cleanup))
    spec = with_agent_env(job.spec, services.agent_env)
    artifact = carried_artifact(turn)
    if artifact is not None and artifact.service == spec.container:
        spec = replace(spec, download_after=artifact.source, download_exclude=tuple(artifact.exclude))
    with sandbox_call(job.placing):
        state = await turn.services.run_job(sandbox, spec, upload=inputs)
    turn.agent_archive = state.archive
    await turn.services.save_job_log(sandbox, turn.name, AGENT_LOG, state)
    check_started(job.placing, state)
    record = turn.record
    record.agent_exit_code = state.exit_code
    if state.timed_out:
        record.message = f"the agent ran out of its {job.spec.timeout_sec:.0f} s budget"
    calls: list[CapturedCall] = []
    if capture:
        await _capture_job(turn, sandbox, "capture-off", "")
        calls = await _harvest(turn, sandbox)
        if any(call.local_response_reason == CAPTURE_LIMIT for call in calls):
            # The agent's calls outgrew the attempt's journal: the proxy stopped forwarding them, so what the
            # turn did is no longer all recorded. The agent's doing: a measured 0, never an outage.
            raise TurnFailed(
                FAILURE_CAPTURE_LIMIT,
                f"turn {turn.name}: the agent's model calls passed the capture journal's bound; "
                "the capture proxy answered the rest itself",
            )
    failure = classify(state, calls, state.output or b"", job.failure_patterns)
    record.agent_failure = failure
    if failure is None:
        return
    what = consequence(failure, services.agent_outcomes)
    reason = _reason(failure, state, calls)
    if what.outage is not None:
        raise Outage(what.outage, f"turn {turn.name}: {reason}")
    if what.ungraded is not None:
        record.phase = "Failed"
        record.failure_kind = what.ungraded
        record.message = reason
        raise EpisodeEnds("Ungraded", what.ungraded, f"turn {turn.name}: {reason}")


async def write_trajectory(turn: TurnRun) -> None:
    """Stage ``trajectory``: the turn's ATIF trajectory from its recorded calls, for the verifier and the store."""
    services = turn.services
    spec = services.agent_spec
    if agent_kind(spec).sandbox_needs(spec).capture is None:
        return
    calls = await turn_calls(turn, turn.name)
    earlier: list[CapturedCall] = []
    if spec.turn_sessions == "continue":
        for previous in services.plan.turns[: turn.index]:
            earlier += await turn_calls(turn, previous.name)
    trajectory = trajectory_from_calls(
        calls,
        agent_name=spec.harness.name if spec.harness else spec.kind,
        agent_version=(spec.harness.version if spec.harness else None) or "",
        session_id=f"{services.status.task.digest if services.status.task else ''}-a{services.attempt_number}",
        earlier_calls=earlier,
    )
    if trajectory is None:
        return
    document = json.dumps(trajectory.to_json_dict(), indent=2).encode()
    await services.store.save_file(services.attempt_number, turn.name, TRAJECTORY_FILE, document)
    sandbox = await services.agent_sandbox()
    path = PurePosixPath(TRAJECTORY)
    try:
        await sandbox.upload(text_tar({path.name: document.decode()}), str(path.parent))
    except SandboxError as error:
        raise sandbox_lost(error) from error


async def turn_calls(turn: TurnRun, name: str) -> list[CapturedCall]:
    """A turn's recorded model calls, as the store keeps them."""
    data = await turn.services.store.read_file(turn.services.attempt_number, name, CALLS_FILE)
    return parse_journal(data or b"").calls


async def _capture_job(turn: TurnRun, sandbox: Sandbox, what: str, options: str) -> JobState:
    """A command of the capture container, as a supervised job (a restart re-attaches to it)."""
    attempt = turn.services.attempt_number
    state = await turn.services.run_job(
        sandbox,
        JobSpec(
            id=turn.job_id(what),
            command=f"exec episode-operator capture-turn --store {CAPTURE_STORE} --attempt {attempt} {options}".strip(),
            timeout_sec=60.0,
            shell="sh",
            container=CAPTURE_CONTAINER,
        ),
    )
    if not state.succeeded:
        raise Outage("capture", f"the capture container's {what} ended {state.phase} {state.exit_code}: {state.reason}")
    return state


async def _harvest(turn: TurnRun, sandbox: Sandbox) -> list[CapturedCall]:
    """The turn's calls, once those the agent left in flight are recorded (or a few seconds passed)."""
    attempt = turn.services.attempt_number
    path = PurePosixPath(CAPTURE_STORE) / calls_file(attempt, turn.name)
    await turn.services.run_job(
        sandbox,
        JobSpec(
            id=turn.job_id("capture-settle"),
            command=f"exec episode-operator capture-harvest --store {CAPTURE_STORE} --attempt {attempt} "
            f"--turn {turn.name} --settle {SETTLE_SEC} >/dev/null",
            timeout_sec=SETTLE_SEC + 60.0,
            shell="sh",
            container=CAPTURE_CONTAINER,
        ),
    )
    try:
        archive = await sandbox.download([str(path)], container=CAPTURE_CONTAINER)
    except SandboxError as error:
        raise sandbox_lost(error) from error
    try:
        found = await asyncio.to_thread(read_member, archive, str(path).lstrip("/"), turn.services.limits)
    finally:
        archive.discard()
    journal = found or b""
    await turn.services.store.save_file(attempt, turn.name, CALLS_FILE, journal)
    return parse_journal(journal).calls


def _reason(failure: str, state: JobState, calls: list[CapturedCall]) -> str:
    failed = [call for call in calls if call.error_category is not None]
    last = max(failed, key=lambda call: call.completed_at) if failed else None
    evidence = (
        f"the model endpoint answered {last.status_code or 'nothing'} ({last.error_category}) to its last call"
        if last is not None
        else f"the agent {'ran out of its budget' if state.timed_out else f'exited with {state.exit_code}'}"
    )
    return f"agent failure {failure}: {evidence}"
