"""Harness presets, model endpoints and model-call capture, in the unit tier.

The command lines are run by a real bash against stand-in executables that print their argv,
so quoting is tested by a shell, not by reading strings. The turn's flow (capture marks around
the agent, the harvest, the classification, the trajectory) runs the real runner against the
in-memory sandbox, whose capture container holds the journal a test plants as the proxy would.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from episode_operator.api.episode_resource import AgentSpec, EpisodeSpec
from episode_operator.api.vocabulary import Stage
from episode_operator.capture.records import CAPTURE_LIMIT, ROUTE_REFUSED, CapturedCall
from episode_operator.cli.capture import capture_proxy
from episode_operator.kube.objects.pods import AgentImages, OwnerRef, SandboxPod, sandbox_pod
from episode_operator.runtime.admission import Refusal, admit_spec, admit_task
from episode_operator.runtime.agents import agent_kind, spec_problems
from episode_operator.runtime.agents.harnesses import INSTRUCTION, PRESETS, continue_arguments, harness_run
from episode_operator.runtime.agents.model import CAPTURE_CONTAINER, PLACEHOLDER_KEY, CaptureBounds, Toolchain
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.task_toml import EnvironmentConfig
from tests.unit.fake_sandbox import World
from tests.unit.folders import multi_step, steps_toml
from tests.unit.test_runtime import run

MODEL = {"name": "scripted-m1", "baseURL": "http://198.19.0.9:8000/v1"}
APIS = {name: preset.entry.apis[0] for name, preset in PRESETS.items()}  # each harness's default API


def harness(name: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "harness", "harness": {"name": name}, "model": {**MODEL, "api": APIS[name]}, **extra}


# --- the spec ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("agent", "problem"),
    [
        (harness("opencode") | {"harness": {"name": "no-such"}}, "spec.agent.harness.name: unknown harness 'no-such'"),
        (harness("codex") | {"model": MODEL}, "spec.agent.model.api: codex speaks responses, not chat-completions"),
        (harness("claude-code") | {"model": MODEL}, "claude-code speaks messages, not chat-completions"),
        ({"kind": "harness", "model": MODEL}, "spec.agent.harness is required when spec.agent.kind is harness"),
        ({"kind": "harness", "harness": {"name": "opencode"}}, "spec.agent.model is required"),
        (harness("opencode") | {"harness": {"name": "opencode", "options": {"x": 1}}}, "options.x: unknown option"),
        (harness("opencode") | {"harness": {"name": "opencode", "options": {"timeoutSec": 0}}}, "positive number"),
        (harness("opencode") | {"command": "x"}, "spec.agent.command applies to kind command only, not harness"),
        ({"kind": "oracle", "model": MODEL}, "spec.agent.model applies to kind command or harness only, not oracle"),
        ({"kind": "oracle", "turnSessions": "continue"}, "spec.agent.turnSessions applies to kind harness only"),
    ],
)
def test_bad_agent_specs_are_refused_naming_the_field(agent: dict[str, Any], problem: str) -> None:
    problems = spec_problems(AgentSpec.model_validate(agent))
    assert any(problem in line for line in problems), problems


@pytest.mark.parametrize(
    ("name", "params", "problem"),
    [
        # A key its API does not define: an endpoint would refuse every call, or the key would override
        # the request itself.
        ("codex", {"top_k": 20}, "top_k: not a sampling parameter of the responses API"),
        ("claude-code", {"seed": 7}, "seed: not a sampling parameter of the messages API"),
        ("opencode", {"model": "other", "stream": False}, "model, stream: not a sampling parameter"),
        ("mini-swe-agent", {"messages": []}, "messages: not a sampling parameter of the chat-completions API"),
        ("opencode", {"max_tokens": 10, "max_completion_tokens": 20}, "one length cap, under one of its names"),
    ],
)
def test_sampling_params_its_api_cannot_take_are_refused_naming_the_key(
    name: str, params: dict[str, Any], problem: str
) -> None:
    agent = harness(name)
    refused = admit_spec(
        {"task": {"inline": {"files": {}}}, "agent": agent | {"model": agent["model"] | {"params": params}}}
    )
    assert isinstance(refused, Refusal), refused
    assert "spec.agent.model.params: " + problem in refused.message, refused.message


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("mini-swe-agent", {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512, "seed": 1, "top_k": 20}),
        ("opencode", {"temperature": 0.0, "min_p": 0.05, "repetition_penalty": 1.1}),
        ("codex", {"temperature": 1.0, "max_output_tokens": 4096, "reasoning": {"effort": "low"}}),
        ("claude-code", {"temperature": 0.5, "top_k": 40, "max_tokens": 2048}),
    ],
)
def test_every_presets_api_takes_its_sampling_params(name: str, params: dict[str, Any]) -> None:
    agent = harness(name)
    spec = admit_spec(
        {"task": {"inline": {"files": {}}}, "agent": agent | {"model": agent["model"] | {"params": params}}}
    )
    assert isinstance(spec, EpisodeSpec), spec


def test_every_preset_is_accepted_with_its_own_api() -> None:
    for name in PRESETS:
        assert spec_problems(AgentSpec.model_validate(harness(name))) == []


def seed_refusals(agent: dict[str, Any], toml: str) -> list[str]:
    spec = admit_spec({"task": {"inline": {"files": {}}}, "agent": agent, "image": "img:1"})
    assert isinstance(spec, EpisodeSpec), spec
    folder = multi_step(toml, ["a", "b"], {f"steps/{s}/tests/test.sh": "reward 1" for s in "ab"})
    admission = admit_task(spec, TaskFiles.from_mapping(folder))
    return admission.message.split("; ") if isinstance(admission, Refusal) else []


@pytest.mark.parametrize("name", ["mini-swe-agent", "cline"])
def test_continue_is_refused_at_seed_for_a_harness_that_cannot_continue(name: str) -> None:
    """cline's --id resumes a session only in its TUI (docs/harnesses.md, "cline")."""
    refused = seed_refusals(harness(name, turnSessions="continue"), steps_toml("a", "b"))
    assert refused == [f"refused at seed: spec.agent: turnSessions: {name} cannot continue a session"]
    assert seed_refusals(harness("opencode", turnSessions="continue"), steps_toml("a", "b")) == []
    assert seed_refusals(harness("hermes", turnSessions="continue"), steps_toml("a", "b")) == []


def test_continue_is_refused_at_seed_when_the_steps_switch_users() -> None:
    toml = steps_toml("a", "b", extra={"b": '[steps.agent]\nuser = "bob"\n'})
    refused = seed_refusals(harness("opencode", turnSessions="continue"), toml)
    assert refused == [
        "refused at seed: task.toml: steps.agent.user: turnSessions continue: the steps switch agent users"
    ]
    assert seed_refusals(harness("opencode"), toml) == []


# --- the command lines, run by bash ------------------------------------------------------------------------
TRICKY = 'Write "it\'s" to $HOME/`hostname`.txt;\n  then `rm -rf /` — not really! \\n %s {}\n\n'


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("continuing", [False, True], ids=["fresh", "continue"])
def test_the_instruction_reaches_the_harness_as_one_argv_element(tmp_path: Path, name: str, continuing: bool) -> None:
    """Whatever the instruction holds, the harness gets exactly the preset's argv with it in place."""
    preset = PRESETS[name]
    toolchain = Toolchain(name, preset.version)
    model = AgentSpec.model_validate(harness(name)).model
    assert model is not None
    run_ = harness_run(toolchain, model, continue_session=continuing)
    root = tmp_path / "toolchains" / name / "bin"
    root.mkdir(parents=True)
    entry = Path(preset.argv(run_)[0]).name
    (root / entry).write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (root / entry).chmod(0o755)
    instruction = tmp_path / "instruction.md"
    instruction.write_text(TRICKY)
    command = preset.command(run_, str(instruction)).replace(toolchain.path, str(tmp_path / "toolchains" / name))
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, cwd=tmp_path)
    expected = [part.replace(INSTRUCTION, TRICKY.rstrip("\n")) for part in preset.argv(run_)[1:]]
    assert json.loads(result.stdout) == expected
    assert bool(set(continue_arguments(preset)) & set(expected)) == (continuing and preset.continues)


def test_the_harness_is_pointed_at_the_proxy_with_a_placeholder_never_at_the_endpoint() -> None:
    for name, preset in PRESETS.items():
        model = {**MODEL, "api": APIS[name], "apiKeySecretRef": {"name": "k"}}
        spec = AgentSpec.model_validate(harness(name) | {"model": model})
        assert spec.model is not None
        run_ = harness_run(Toolchain(name, preset.version), spec.model, continue_session=False)
        wiring = json.dumps(preset.env(run_)) + json.dumps(preset.argv(run_))
        assert "127.0.0.1:47311" in wiring, name  # the agent calls the capture proxy
        assert "198.19.0.9" not in wiring, name  # never the endpoint itself
        assert PLACEHOLDER_KEY in wiring, name


# --- the agent pod ------------------------------------------------------------------------------------------
def test_the_agent_pod_gets_the_toolchain_and_the_capture_container_with_the_key_only_there() -> None:
    agent = AgentSpec.model_validate(
        harness("opencode") | {"model": {**MODEL, "apiKeySecretRef": {"name": "key", "key": "k"}}}
    )
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": {}}}, "agent": agent.to_api()})
    needs = agent_kind(agent).sandbox_needs(agent)
    pod = sandbox_pod(
        OwnerRef("ep", "ns", "uid"),
        spec,
        SandboxPod(role="agent", attempt=1, image="task:1", environment=EnvironmentConfig(), needs=needs),
        extra_labels={},
        images=AgentImages(capture="operator:9", toolchain_repository="registry.local/eo"),
    )["spec"]
    [init] = pod["initContainers"]
    assert init["image"] == "registry.local/eo/toolchain-opencode:1.17.11"
    main, capture = pod["containers"]
    assert {
        "name": init["volumeMounts"][0]["name"],
        "mountPath": "/opt/episode-operator/toolchains/opencode",
        "readOnly": True,
    } in main["volumeMounts"]
    assert capture["name"] == CAPTURE_CONTAINER and capture["image"] == "operator:9"
    assert capture["args"][:2] == ["capture-proxy", "--listen"] and "http://198.19.0.9:8000/v1" in capture["args"]
    assert capture["env"] == [
        {"name": "EPISODE_CAPTURE_API_KEY", "valueFrom": {"secretKeyRef": {"name": "key", "key": "k"}}}
    ]
    # Neither its store nor its supervisor's jobs are mounted where the agent runs.
    private = {mount["name"] for mount in capture["volumeMounts"]}
    assert len(private) == 2 and not private & {mount["name"] for mount in main["volumeMounts"]}
    assert "secretKeyRef" not in json.dumps(main)


def test_the_capture_container_gets_the_pinned_addresses_its_bounds_and_resources() -> None:
    """What the driver pinned and the operator's settings reach the proxy as options its CLI takes."""
    params = {"temperature": 0.2, "top_p": 0.95, "max_tokens": 512}
    model = {**MODEL, "baseURL": "https://model.test/v1", "params": params}
    agent = AgentSpec.model_validate(harness("codex") | {"model": model})
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": {}}}, "agent": agent.to_api()})
    needs = agent_kind(agent).sandbox_needs(agent)
    assert needs.capture is not None
    bounds = CaptureBounds({"cpu": "5m", "memory": "32Mi"}, {"memory": "256Mi"}, 4096, 65536)
    capture = replace(needs.capture, upstream_addresses=("198.19.0.9", "2001:db8::9"), bounds=bounds)
    pod = sandbox_pod(
        OwnerRef("ep", "ns", "uid"),
        spec,
        SandboxPod("agent", 1, "task:1", EnvironmentConfig(), needs=replace(needs, capture=capture)),
        extra_labels={},
        images=AgentImages(capture="operator:9"),
    )["spec"]
    container = next(c for c in pod["containers"] if c["name"] == CAPTURE_CONTAINER)
    assert container["resources"] == {"requests": {"cpu": "5m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}}
    options = capture_proxy.make_context("capture-proxy", container["args"][1:]).params
    assert options["upstream"] == "https://model.test/v1"
    assert options["upstream_addresses"] == ("198.19.0.9", "2001:db8::9")
    assert (options["max_record_bytes"], options["max_journal_bytes"]) == (4096, 65536)
    assert json.loads(options["params_json"]) == params  # set on every call by the proxy


def test_the_capture_containers_default_resources_are_small_requests_and_a_bounded_limit() -> None:
    assert CaptureBounds().requests == {"cpu": "10m", "memory": "64Mi"}
    assert CaptureBounds().limits == {"cpu": "1", "memory": "1Gi"}


# --- the turn: capture marks, harvest, classification, trajectory --------------------------------------------
def call(
    turn: str, *, status: int = 200, category: str | None = None, reply: str = "done", ended: float = 0.0, **extra: Any
) -> CapturedCall:
    now = time.time() + ended
    return CapturedCall(
        model_call_id=f"c{int(now * 1e6)}",
        dialect="chat",
        path="/v1/chat/completions",
        started_at=now,
        completed_at=now + 0.1,
        latency_ms=100.0,
        latency_ttft_ms=10.0,
        status_code=status,
        upstream_status_code=status,
        error_category=category,  # type: ignore[arg-type]
        request={"model": "scripted-m1", "messages": [{"role": "user", "content": f"instruction of {turn}"}]},
        response={
            "choices": [{"message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        },
        attempt=1,
        turn=turn,
        **extra,
    )


def plant(world: World, turn: str, calls: list[CapturedCall]) -> None:
    """As the proxy would: the agent's calls land in the capture container's journal while it runs."""

    def record(sandbox: Any, spec: Any) -> None:
        path = f"/capture/calls/attempt-{spec.id.split('.')[0][1:]}/{turn}.jsonl"
        files = sandbox.files.setdefault(CAPTURE_CONTAINER, {})
        files[path] = files.get(path, b"") + b"".join(c.model_dump_json().encode() + b"\n" for c in calls)

    world.hooks[f"t{'ab'.index(turn) + 1}.agent"] = record


def two_turns() -> dict[str, str]:
    return multi_step(steps_toml("a", "b"), ["a", "b"], {f"steps/{s}/tests/test.sh": "reward 1" for s in "ab"})


def test_a_harness_turn_is_marked_harvested_and_its_trajectory_written_then_cleared() -> None:
    world = World()
    plant(world, "a", [call("a", reply="first")])
    plant(world, "b", [call("b", reply="second")])
    status, world, _, store = run(two_turns(), agent=harness("opencode"), world=world)
    assert (status.outcome, status.reward) == ("Graded", 1.0)
    pod = world.sandboxes["pod-a1"]
    ran = pod.starts
    for turn in ("t1", "t2"):
        order = [
            job
            for job in ran
            if job.startswith(f"a1.{turn}.")
            and job.split(".")[-1] in ("capture-on", "agent", "capture-off", "capture-settle")
        ]
        assert [job.split(".")[-1] for job in order] == ["capture-on", "agent", "capture-off", "capture-settle"]
    records = json.loads(asyncio_run(store.read_file(1, "b", "trajectory.json")) or b"{}")
    assert records["schema_version"].startswith("ATIF") and "second" in json.dumps(records)
    # The verifier of turn 2 found turn 2's trajectory; turn 1's was removed by turn 2's cleanup.
    assert b"second" in pod.files["main"]["/logs/agent/trajectory.json"]
    assert [t.agent_failure for t in status.turns] == [None, None]


def asyncio_run(awaitable: Any) -> Any:
    import asyncio

    return asyncio.run(awaitable)


@pytest.mark.parametrize(
    ("status_code", "category", "outcome", "failure_kind", "attempts"),
    [
        (401, "auth", "Ungraded", "agent:model_auth", 1),
        (404, "not_found", "Ungraded", "agent:model_not_found", 1),
        (429, "rate_limit", "Ungraded", "outage:model_rate_limit", 3),
        (500, "upstream_error", "Ungraded", "outage:model_unavailable", 3),
        (502, "connection", "Ungraded", "outage:model_unavailable", 3),
    ],
)
def test_a_failing_model_endpoint_ends_in_the_class_the_seed_prescribes(
    status_code: int, category: str, outcome: str, failure_kind: str, attempts: int
) -> None:
    world = World()
    for attempt in range(1, 4):
        world.hooks[f"a{attempt}.t1.agent"] = _failing(status_code, category, attempt)
    folder = two_turns() | {"steps/a/solution/solve.sh": "exit 1"}
    status = run(folder, agent=harness("opencode"), world=world, retries=2)[0]
    assert (status.outcome, status.failure_kind, len(status.attempts)) == (outcome, failure_kind, attempts)
    assert status.reward is None


@pytest.mark.parametrize(
    ("status_code", "category", "policy", "outcome", "failure_kind", "attempts"),
    [
        # A refused key measured (the verifier decides: solve.sh wrote nothing, reward 0) or retried.
        (401, "auth", {"model_auth": "measure"}, "Graded", None, 1),
        (401, "auth", {"model_auth": "retry"}, "Ungraded", "outage:agent_model_auth", 3),
        # An endpoint failing ends the episode at once instead of buying retries.
        (500, "upstream_error", {"model_unavailable": "fail"}, "Ungraded", "agent:model_unavailable", 1),
        # A policy naming other failures leaves this one its default.
        (429, "rate_limit", {"timeout": "fail"}, "Ungraded", "outage:model_rate_limit", 3),
    ],
)
def test_the_agent_outcome_policy_decides_what_each_failure_does(
    status_code: int,
    category: str,
    policy: dict[str, str],
    outcome: str,
    failure_kind: str | None,
    attempts: int,
) -> None:
    """spec.harbor.agentOutcomePolicy (Gym's agent_outcome_policy) overrides the seed's row of a failure."""
    world = World()
    for attempt in range(1, 4):
        world.hooks[f"a{attempt}.t1.agent"] = _failing(status_code, category, attempt)
    folder = two_turns() | {"steps/a/solution/solve.sh": "exit 1"}
    status = run(folder, agent=harness("opencode"), world=world, retries=2, agent_outcomes=policy)[0]  # type: ignore[arg-type]
    assert (status.outcome, status.failure_kind, len(status.attempts)) == (outcome, failure_kind, attempts)


def test_an_agents_own_failure_can_be_retried_or_fail_the_episode() -> None:
    """The agent exiting non-zero with the model answering is measured by default; the policy can retry it
    (an outage per attempt) or end the episode ungraded under its own name."""
    exits = {"kind": "command", "command": "exit 3"}
    measured = run(two_turns(), agent=exits)[0]
    assert (measured.outcome, measured.reward, measured.turns[0].agent_failure) == ("Graded", 1.0, "exited")
    retried = run(two_turns(), agent=exits, retries=1, agent_outcomes={"exited": "retry"})[0]
    assert (retried.outcome, retried.failure_kind, len(retried.attempts)) == ("Ungraded", "outage:agent_exited", 2)
    failed = run(two_turns(), agent=exits, agent_outcomes={"exited": "fail"})[0]
    assert (failed.outcome, failed.failure_kind, len(failed.attempts)) == ("Ungraded", "agent:exited", 1)
    assert (failed.turns[0].failure_kind, failed.reward) == ("agent:exited", None)


def _failing(status_code: int, category: str, attempt: int) -> Any:
    def record(sandbox: Any, spec: Any) -> None:
        path = f"/capture/calls/attempt-{attempt}/a.jsonl"
        failed = call("a", status=status_code, category=category).model_copy(update={"attempt": attempt})
        sandbox.files.setdefault(CAPTURE_CONTAINER, {})[path] = failed.model_dump_json().encode() + b"\n"

    return record


def test_a_context_window_refusal_is_measured_and_the_verifier_still_decides() -> None:
    world = World()
    refused = call("a", status=400, category="client_error").model_copy(
        update={"response": {"error": {"code": "context_length_exceeded", "message": "maximum context length is 8192"}}}
    )
    plant(world, "a", [refused])
    status = run(two_turns(), agent=harness("opencode"), world=world)[0]
    assert status.outcome == "Graded" and status.turns[0].agent_failure == "context_window"
    assert status.turns[0].stage == Stage.DONE


def test_an_endpoint_that_never_answers_is_an_outage() -> None:
    world = World()
    hung = call("a", status=0, category="cancelled").model_copy(
        update={"status_code": None, "upstream_status_code": None, "latency_ttft_ms": None}
    )
    plant(world, "a", [hung])
    status = run(two_turns(), agent=harness("opencode"), world=world, retries=0)[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "outage:model_unavailable")


def test_a_call_dropped_when_the_agent_ended_on_a_refused_key_is_no_hang() -> None:
    """opencode asks for a title beside its first call; the first call is refused (401) and opencode exits,
    cutting the title request off unanswered: the refused key ended the turn, not a hanging endpoint. A call
    cut off with no failure answered while it waited (the control) is still the endpoint hanging."""
    unanswered = {"status_code": None, "upstream_status_code": None, "latency_ttft_ms": None}
    title = call("a", status=0, category="cancelled", ended=-1).model_copy(update=unanswered)
    title = title.model_copy(update={"completed_at": title.started_at + 2})  # in flight over the refusal
    refused = call("a", status=401, category="auth", ended=-0.5)
    world = World()
    plant(world, "a", [title, refused])
    status = run(two_turns(), agent=harness("opencode"), world=world, retries=0)[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "agent:model_auth")

    earlier = call("a", status=401, category="auth", ended=-5)  # answered before the dropped call began
    control = World()
    plant(control, "a", [earlier, title])
    status = run(two_turns(), agent=harness("opencode"), world=control, retries=0)[0]
    assert (status.outcome, status.failure_kind) == ("Ungraded", "outage:model_unavailable")


def test_a_turn_whose_calls_outgrew_the_capture_journal_fails_measured_and_unverified() -> None:
    """The proxy answered a call itself past the attempt's journal bound: the turn scores a measured 0,
    its verifier not run, never an outage (a retry would do the same)."""
    world = World()
    limited = call("a", status=400, category="client_error").model_copy(
        update={"response_source": "local", "local_response_reason": CAPTURE_LIMIT, "upstream_attempted": False}
    )
    plant(world, "a", [call("a"), limited])
    status = run(two_turns(), agent=harness("opencode"), world=world, retries=2)[0]
    first = status.turns[0]
    assert (first.failure_kind, first.reward_valid, first.stage) == ("agent:capture_limit", False, Stage.DONE)
    assert "capture journal" in (first.message or "")
    assert len(status.attempts) == 1 and not any(job.endswith("t1.verify") for job in world.sandboxes["pod-a1"].starts)


def test_a_refused_route_says_nothing_of_the_model_endpoint() -> None:
    """The agent's own 403 from the proxy (a path off the model API) is no refused key: the turn is measured."""
    world = World()
    refused = call("a", status=403, category="client_error", ended=1).model_copy(
        update={"dialect": None, "response_source": "local", "local_response_reason": ROUTE_REFUSED}
    )
    plant(world, "a", [call("a"), refused])
    status = run(two_turns(), agent=harness("opencode"), world=world)[0]
    assert status.outcome == "Graded" and status.turns[0].agent_failure is None


def test_an_agent_that_recovered_from_a_429_is_not_failed() -> None:
    world = World()
    plant(world, "a", [call("a", status=429, category="rate_limit", ended=-5), call("a", reply="fine")])
    status = run(two_turns(), agent=harness("opencode"), world=world)[0]
    assert status.outcome == "Graded" and status.turns[0].agent_failure is None


def test_continue_sessions_carry_earlier_turns_into_the_trajectory_as_copied_context() -> None:
    world = World()
    first = call("a", reply="first")
    plant(world, "a", [first])
    # The continued session's first request of turn 2 carries turn 1's conversation (as opencode's does).
    history = [
        {"role": "user", "content": "instruction of a"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "instruction of b"},
    ]
    second = call("b", reply="second", ended=1)
    second = second.model_copy(update={"request": {"model": "scripted-m1", "messages": history}})
    plant(world, "b", [second])
    store = run(two_turns(), agent=harness("opencode", turnSessions="continue"), world=world)[3]
    trajectory = json.loads(asyncio_run(store.read_file(1, "b", "trajectory.json")))
    copied = [step for step in trajectory["steps"] if step.get("is_copied_context")]
    new = [step for step in trajectory["steps"] if not step.get("is_copied_context")]
    assert "first" in json.dumps(copied) and "second" in json.dumps(new) and "second" not in json.dumps(copied)
