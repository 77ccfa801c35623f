"""Trajectories built from captured calls, in every dialect, and turned into Responses items."""

from __future__ import annotations

import pytest

from episode_operator.capture.atif import (
    Trajectory,
    trajectory_from_calls,
    trajectory_to_responses,
    without_copied_context,
)
from episode_operator.capture.records import CapturedCall
from tests.unit.conversations import ANSWERS, INSTRUCTION, SESSIONS, SYSTEM, TOKENS, USAGES, chat_call, title_call

DIALECTS = ("chat", "responses", "messages")


def build(calls: list[CapturedCall], **options: object) -> Trajectory:
    trajectory = trajectory_from_calls(calls, agent_name="opencode", agent_version="1.17.11", session_id="s", **options)  # type: ignore[arg-type]
    assert trajectory is not None
    return trajectory


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_session_becomes_its_steps(dialect: str) -> None:
    trajectory = build(SESSIONS[dialect]())
    steps = trajectory.steps
    assert [step.source for step in steps] == ["system", "user", "agent", "agent", "agent"]
    assert (steps[0].message, steps[1].message) == (SYSTEM, INSTRUCTION)
    for step, (reasoning, text, call, output) in zip(steps[2:], ANSWERS, strict=True):
        assert (step.message, step.reasoning_content) == (text, reasoning)
        if call is None:
            assert step.tool_calls is None and step.observation is None
            continue
        assert [(c.tool_call_id, c.function_name, c.arguments) for c in step.tool_calls or []] == [call]
        assert step.observation is not None
        assert [(r.source_call_id, r.content) for r in step.observation.results] == [(call[0], output)]
    # Each agent step carries the metrics of the call that produced it; the title request made no step.
    ids = [step.metrics.extra["model_call_id"] for step in steps[2:] if step.metrics and step.metrics.extra]
    assert ids == [f"{dialect}-{index}" for index in range(3)]
    assert [
        (step.metrics.prompt_tokens, step.metrics.completion_tokens) for step in steps[2:] if step.metrics
    ] == USAGES
    assert trajectory.final_metrics is not None
    assert (trajectory.final_metrics.total_prompt_tokens, trajectory.final_metrics.total_steps) == (380, 5)
    assert trajectory.notes == f"1 answered model call(s) off the main thread: {dialect}-title"
    assert trajectory.agent.model_name == "policy" and trajectory.schema_version == "ATIF-v1.7"
    assert steps[2].timestamp == "2027-01-15T08:00:12Z"  # the answer's completion


def test_anthropic_cached_tokens_count_in_the_prompt() -> None:
    trajectory = build(SESSIONS["messages"]())
    metrics = [step.metrics for step in trajectory.steps if step.metrics]
    assert [(m.prompt_tokens, m.cached_tokens) for m in metrics] == [(100, 40), (130, 40), (150, 40)]


def test_no_answered_call_no_trajectory() -> None:
    failed = chat_call(0).model_copy(update={"response": None, "status_code": 504, "error_category": "timeout"})
    assert trajectory_from_calls([failed], agent_name="a", agent_version="1") is None
    assert trajectory_from_calls([], agent_name="a", agent_version="1") is None


def test_a_retried_sample_keeps_the_answer_the_conversation_kept() -> None:
    dropped = chat_call(1).model_copy(
        update={
            "model_call_id": "dropped",
            "started_at": chat_call(1).started_at - 1,
            "response": {**chat_call(1).response, "choices": [{"message": {"role": "assistant", "content": "other"}}]},  # type: ignore[dict-item]
        }
    )
    trajectory = build([chat_call(0), dropped, chat_call(1), chat_call(2)])
    assert [
        step.metrics.extra["model_call_id"] for step in trajectory.steps if step.metrics and step.metrics.extra
    ] == [
        "chat-0",
        "chat-1",
        "chat-2",
    ]
    assert trajectory.notes is not None and "dropped" in trajectory.notes


def test_token_ids_reach_the_steps_and_the_training_items() -> None:
    trajectory = build([chat_call(index, token_ids=True) for index in range(3)])
    metrics = [step.metrics for step in trajectory.steps if step.metrics]
    assert [(m.prompt_token_ids, m.completion_token_ids, m.logprobs) for m in metrics] == TOKENS
    messages = [item for item in trajectory_to_responses(trajectory.to_json_dict()) if item["type"] == "message"]
    assert [(m["prompt_token_ids"], m["generation_token_ids"], m["generation_log_probs"]) for m in messages] == TOKENS


def test_a_continued_session_marks_the_earlier_turns_steps() -> None:
    earlier = [chat_call(0), chat_call(1)]
    trajectory = build([chat_call(2)], earlier_calls=earlier)
    assert [step.is_copied_context for step in trajectory.steps] == [True, True, True, True, None]
    mine = without_copied_context(trajectory)
    assert [(step.step_id, step.source, step.message) for step in mine.steps] == [(1, "agent", "Done.")]
    assert mine.final_metrics is not None and mine.final_metrics.total_prompt_tokens == 150
    assert trajectory_from_calls([], agent_name="a", agent_version="1", earlier_calls=earlier) is None


def test_responses_items_follow_the_steps() -> None:
    items = trajectory_to_responses(build(SESSIONS["responses"]()).to_json_dict())
    assert [item["type"] for item in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[0]["content"][0]["text"] == "<think>I need a file.</think>I'll write it."
    assert [item["call_id"] for item in items if item["type"] != "message"] == ["call_1", "call_1", "call_2", "call_2"]
    assert "prompt_token_ids" not in items[0]


def test_terminus_raw_content_commands_become_calls() -> None:
    """Gym parses a terminus-2 JSON answer with no tool calls into bash_command calls."""
    message = 'Plan: {"analysis": "a", "commands": [{"keystrokes": "ls\\n", "duration": 0.1}, {"keystrokes": ""}]}'
    steps = {"steps": [{"step_id": 1, "source": "agent", "message": message}]}
    (_, call) = trajectory_to_responses(steps)
    assert (call["name"], call["call_id"], call["arguments"]) == (
        "bash_command",
        "call_0_1",
        '{"keystrokes": "ls\\n", "duration": 0.1}',
    )


def test_a_title_call_alone_is_still_a_trajectory() -> None:
    trajectory = build([title_call("chat")])
    assert [step.source for step in trajectory.steps] == ["user", "agent"]
