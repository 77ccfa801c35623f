"""The benchmarks' fake sandboxes (bench/fake_sandbox_operator.py) still speak the sandbox protocol.

That provider stands in for ``kube.running.KubeProvider`` in the operator the scale benchmarks run
(bench/replicas.py, bench/operator_scale.py). It is not the runtime's test double, so nothing else
exercises it: when the protocol changed (keyed job ids, the recorded ``uid`` of a sandbox) it broke
silently — every agent job ended at once and the benchmark measured no turns. Here an Episode runs
through the real runner with it, as the operator's driver runs one, and its methods are compared
with the protocol's.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from bench import fake_sandbox_operator as fake
from bench.replicas import task

from episode_operator.api.episode_resource import AgentSpec, RetryPolicy
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.runtime.episode import EpisodeConfig, EpisodeRunner
from episode_operator.runtime.sandbox_protocol import Sandbox, SandboxError, SandboxProvider
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from tests.unit.fake_sandbox import FakeSink, MemoryStore

TURN_SEC = 0.2


def methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if inspect.iscoroutinefunction(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(("double", "protocol"), [(fake.FakeSandbox, Sandbox), (fake.FakeProvider, SandboxProvider)])
def test_the_fakes_have_the_protocols_methods(double: type, protocol: type) -> None:
    """Same coroutine methods, same parameter names and kinds: a new keyword the runtime passes fails here."""

    def shape(signature: inspect.Signature) -> list[tuple[str, Any]]:
        return [(parameter.name, parameter.kind) for parameter in signature.parameters.values()]

    theirs, ours = methods(protocol), methods(double)
    assert sorted(ours) == sorted(theirs)
    for name, signature in theirs.items():
        assert shape(ours[name]) == shape(signature), name


def run_episode(turns: int, monkeypatch: pytest.MonkeyPatch, timeline: Path) -> Any:
    monkeypatch.setattr(fake, "TURN_SEC", TURN_SEC)
    monkeypatch.setattr(fake, "TIMELINE", timeline)
    files = TaskFiles.from_mapping(task(turns))
    config = EpisodeConfig(
        plan=resolve_plan(load_task(files)),
        files=files,
        agent=AgentSpec.model_validate({"kind": "command", "command": "sleep"}),
        digest=files.digest(),
        retries=RetryPolicy(outages=0),
    )
    episode = OwnerRef("e0", "bench", "uid-e0")
    runner = EpisodeRunner(config, fake.FakeProvider(None, episode), FakeSink(), MemoryStore())
    return asyncio.run(runner.run(None))


def test_an_episode_runs_its_turns_through_the_fake_provider(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each turn's agent job lasts the turn (it is recognised under its keyed id), every step's reward is
    the fake verifier's 1, and the pods are gone at the end."""
    timeline = tmp_path / "timeline.jsonl"
    status = run_episode(3, monkeypatch, timeline)
    assert status.phase == "Succeeded", status.model_dump_json(indent=1)
    assert [turn.reward for turn in status.turns] == [1.0, 1.0, 1.0]
    jobs = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert [job["uid"] for job in jobs] == ["uid-e0"] * 3  # the timeline's key is the Episode
    assert all(fake.AGENT_JOB.fullmatch(job["job"]) and job["job"].count(".") == 3 for job in jobs)  # keyed
    assert all(job["ends"] - job["started"] == pytest.approx(TURN_SEC) for job in jobs)
    assert not [name for name in fake.PODS if name.startswith("bench/e0-")]


def test_a_recorded_sandbox_that_is_gone_is_lost_not_made_again() -> None:
    """As KubeProvider: the ``uid`` an attempt recorded names that pod; a new one would hide the loss."""
    provider = fake.FakeProvider(None, OwnerRef("e1", "bench", "uid-e1"))

    async def scenario() -> None:
        sandbox = await provider.agent(1)
        assert await provider.agent(1, uid=sandbox.uid) is sandbox
        await provider.release_all(keep=False)
        with pytest.raises(SandboxError) as lost:
            await provider.agent(1, uid=sandbox.uid)
        assert lost.value.kind == "pod_lost"

    asyncio.run(scenario())
