"""Stage ``agent``: the agent acts, under the turn's budget (TASK-FORMAT.md §3.4.4).

The job and its inputs come from the agent kind's registry entry. Harbor's rule, which Gym
keeps: the agent's non-zero exit or timeout is recorded and the verifier still decides.
"""

from __future__ import annotations

from dataclasses import replace

from episode_operator.runtime.agents import agent_kind
from episode_operator.runtime.turn.context import TurnRun
from episode_operator.runtime.turn.failures import check_started, sandbox_call
from episode_operator.runtime.turn.prepare import carried_cleanup


async def run_agent(turn: TurnRun) -> None:
    job = agent_kind(turn.services.agent_spec).turn_job(turn)
    if job is None:
        return
    sandbox = await turn.services.agent_sandbox()
    inputs = job.inputs
    cleanup = carried_cleanup(turn, "agent")
    if cleanup:
        inputs = replace(inputs, clear=(*inputs.clear, *cleanup))
    with sandbox_call(job.placing):
        state = await turn.services.run_job(sandbox, job.spec, upload=inputs)
    await turn.services.save_job_log(sandbox, turn.name, "agent", state)
    check_started(job.placing, state)
    record = turn.record
    record.agent_exit_code = state.exit_code
    if state.timed_out:
        record.message = f"the agent ran out of its {turn.plan.agent.timeout_sec:.0f} s budget"
