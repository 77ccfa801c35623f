"""Run an Episode through the runner's public interface against the in-memory sandbox."""

from __future__ import annotations

import asyncio
from typing import Any

from episode_operator.api.episode_resource import AgentOutages, AgentSpec, EpisodeStatus, HarborSettings, RetryPolicy
from episode_operator.api.vocabulary import AgentFailure, AgentOutcome
from episode_operator.runtime.episode import EpisodeConfig, EpisodeRunner
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from tests.unit.fake_sandbox import FakeProvider, FakeSink, MemoryStore, World
from tests.unit.folders import multi_step, steps_toml


def run(
    folder: dict[str, str],
    *,
    agent: dict[str, Any] | None = None,
    world: World | None = None,
    status: EpisodeStatus | None = None,
    sink: FakeSink | None = None,
    store: MemoryStore | None = None,
    retries: int = 2,
    keep_pods: bool = False,
    plan_update: dict[str, Any] | None = None,
    observer: Any = None,
    agent_env: dict[str, str] | None = None,
    agent_outages: AgentOutages = "retry",
    agent_outcomes: dict[AgentFailure, AgentOutcome] | None = None,
) -> tuple[EpisodeStatus, World, FakeSink, MemoryStore]:
    world = world or World()
    sink = sink or FakeSink()
    store = store or MemoryStore()
    files = TaskFiles.from_mapping(folder)
    plan = resolve_plan(load_task(files))
    if plan_update:
        plan = plan.model_copy(update=plan_update)
    config = EpisodeConfig(
        plan=plan,
        files=files,
        agent=AgentSpec.model_validate(agent or {"kind": "oracle"}),
        digest=files.digest(),
        retries=RetryPolicy(outages=retries, agentOutages=agent_outages),
        keep_pods_on_failure=keep_pods,
        agent_env=agent_env or {},
        agent_outcomes=HarborSettings.model_validate({"agentOutcomePolicy": agent_outcomes or {}}).agent_outcome_policy,
        limits=world.limits,
    )
    runner = EpisodeRunner(
        config,
        FakeProvider(world),
        sink,
        store,
        clock=world.clock.time,
        monotonic=world.clock.monotonic,
        sleep=world.clock.sleep,
        observer=observer,
    )
    result = asyncio.run(runner.run(status))
    return result, world, sink, store


def three_steps(
    extra: dict[str, str] | None = None,
    toml: str = "",
    files: dict[str, str | None] | None = None,
    rewards: tuple[str, str, str] = ("1", "1", "1"),
) -> dict[str, str]:
    base: dict[str, str | None] = {}
    for name, reward in zip(("a", "b", "c"), rewards, strict=True):
        base[f"steps/{name}/solution/solve.sh"] = f"write {name}.txt done-{name}"
        base[f"steps/{name}/tests/test.sh"] = f"reward {reward}"
    base.update(files or {})
    return multi_step(toml + steps_toml("a", "b", "c", extra=extra), ["a", "b", "c"], base)
