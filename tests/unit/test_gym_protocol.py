"""The Gym environment server's protocol layer against Gym's own collector code (from its wheel).

Requests are built as Gym's collector builds them (``_episode_request_body``; the flat row as it
stamps it), the rollout id is compared with Gym's ``maybe_rollout_id_from_run_body``, answers are
read back with Gym's ``BaseEpisodeResponse`` and ``_episode_record``, and pass@k is compared with
``compute_pass_majority_metrics``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episode_operator.api.export import GYM_IDENTITY_ANNOTATION, NO_EVIDENCE, rows
from episode_operator.runtime.gym_protocol import (
    GymRequestError,
    TaskRef,
    aggregate_metrics,
    answer,
    cancelled_answer,
    episode_name,
    model_base_url,
    parse_run,
)
from tests.reference import check_failure_row, check_rollout_row, gym
from tests.unit.test_export import TWO_TURNS, evidence, graded, turn
from tests.unit.test_export import episode as finished

COLLECTION = "nemo_gym.rollout_collection"


def flat_row(task: int = 3, rollout: int = 1, **extra: Any) -> dict[str, Any]:
    """A harbor dataset line as the collector dispatches it."""
    return {
        "instance_id": "red-team::answer",
        "responses_create_params": {"input": []},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": "episode_agent"},
        **extra,
    }


def episode_request(attempt: int = 0, task_id: str = "answer") -> dict[str, Any]:
    row = {
        "task_id": {"taskset": "red-team", "task_id": task_id},
        "task_input": {"instruction_hint": "x"},
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        **({"_ng_attempt_index": attempt} if attempt else {}),
    }
    body: dict[str, Any] = gym()[COLLECTION]._episode_request_body(row)
    return body


def failed(outcome: str, message: str = "pod sandbox-a1 was lost") -> dict[str, Any]:
    return {
        "phase": "Failed",
        "outcome": outcome,
        "message": message,
        "failureKind": "outage:pod_lost" if outcome == "Ungraded" else "environment:build_failed",
        "attempt": 1,
        "attempts": [{"number": 1}],
        "turns": [{"name": "task", "phase": "Failed", "stage": "agent"}],
    }


# --- what a request names ----------------------------------------------------------------------------------
@given(
    task=st.integers(0, 10_000),
    rollout=st.integers(0, 64),
    attempt=st.integers(0, 5),
    explicit=st.none() | st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._]{0,20}\Z"),
)
def test_the_capture_key_is_gyms(task: int, rollout: int, attempt: int, explicit: str | None) -> None:
    body = flat_row(task, rollout, **({"_ng_attempt_index": attempt} if attempt else {}))
    if explicit is not None:
        body["_ng_rollout_id"] = explicit
    run = parse_run(body)
    assert run.capture_key == gym()["nemo_gym.rollout_correlation"].maybe_rollout_id_from_run_body(body)


@pytest.mark.parametrize("server", ["http://gym-model:8000", "http://gym-model:8000/"])
@pytest.mark.parametrize(("capture", "token_capture"), [("evaluation", False), ("training", True)])
@pytest.mark.parametrize("attempt", [0, 2])
def test_a_trys_model_calls_take_the_route_gyms_agents_take(
    server: str, capture: Any, token_capture: bool, attempt: int
) -> None:
    """Gym's agents call its model server at ``apply_rollout_prefix(server, rollout id, token_capture=…)``
    then ``/v1`` (base_responses_api_agent.py ``resolve_model_base_url``): the key its capture files the
    calls under, and the route of the capture its run asked for."""
    run = parse_run(flat_row(**({"_ng_attempt_index": attempt} if attempt else {})))
    prefix = gym()["nemo_gym.server_utils"].apply_rollout_prefix
    assert model_base_url(server, run.capture_key, capture) == (
        f"{prefix(server.rstrip('/'), run.capture_key, token_capture=token_capture)}/v1"
    )


@pytest.mark.parametrize("attempt", [0, 2])
def test_an_episode_request_names_the_same_try_as_gym(attempt: int) -> None:
    body = episode_request(attempt)
    gym()["nemo_gym.episode_types"].BaseEpisodeRequest.model_validate(body)
    run = parse_run(body)
    assert (run.shape, run.task, run.attempt) == ("episode", TaskRef("red-team", "answer"), attempt)
    assert run.capture_key == gym()["nemo_gym.episode_types"].EpisodeId.model_validate(body["episode_id"]).capture_key


@pytest.mark.parametrize(
    ("body", "default", "task"),
    [
        (flat_row(), None, TaskRef("red-team", "answer")),
        ({**flat_row(), "instance_id": None, "task_name": "hello"}, "examples", TaskRef("examples", "hello")),
        (episode_request(task_id="examples::hello"), None, TaskRef("examples", "hello")),
    ],
)
def test_the_task_comes_from_the_row_or_the_default_dataset(body: Any, default: str | None, task: TaskRef) -> None:
    body = {key: value for key, value in body.items() if value is not None}
    assert parse_run(body, default).task == task


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ([], "the body"),
        ({"instance_id": "a::b"}, "_ng_task_index"),
        ({**flat_row(), "instance_id": "no-dataset"}, "instance_id"),
        ({key: value for key, value in flat_row().items() if key != "instance_id"}, "instance_id"),
        ({**flat_row(), "_ng_attempt_index": -1}, "_ng_attempt_index"),
        ({**flat_row(), "_ng_rollout_id": "x-a1"}, "_ng_rollout_id"),
        ({**flat_row(), "_ng_rollout_id": "../x"}, "_ng_rollout_id"),
        ({**flat_row(), "agent_ref": "episode_agent"}, "agent_ref"),
        ({**flat_row(), "agent_ref": {"name": "x" * 20_000}}, "agent_ref, instance_id"),
        ({"episode_id": {"rollout_id": "3-1"}, "task": {"task_id": "x"}}, "task.task_id"),
        (
            {"episode_id": {"rollout_id": "3-1", "attempt": "1"}, "task": episode_request()["task"]},
            "episode_id.attempt",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_the_key(body: Any, key: str) -> None:
    with pytest.raises(GymRequestError, match=key.replace(".", r"\.")):
        parse_run(body)


def test_a_try_has_one_episode_name() -> None:
    """The same try is the same Episode (Gym re-sends /run); another attempt, scope or task is another."""
    run = parse_run(flat_row())
    assert episode_name("default", run) == episode_name("default", parse_run(dict(flat_row())))
    others = {
        episode_name("other", run),
        episode_name("default", parse_run(flat_row(_ng_attempt_index=1))),
        episode_name("default", parse_run({**flat_row(), "instance_id": "red-team::other"})),
        episode_name("default", parse_run(flat_row(4, 1))),
    }
    assert episode_name("default", run) not in others and len(others) == 4
    assert all(len(name) <= 63 and name.startswith("gym-3-1") for name in [episode_name("default", run)])


# --- what a finished try answers ------------------------------------------------------------------------------
def test_a_graded_episode_answers_the_flat_row_as_a_rollout_row() -> None:
    run = parse_run(flat_row())
    reply = answer(run, finished(graded(turn("task", 1.0))), NO_EVIDENCE, "gym")
    assert reply["reward"] == 1.0 and reply["instance_id"] == "red-team::answer"
    assert not [key for key in reply if key.startswith("_ng_")], "the collector writes its own keys"
    check_rollout_row(reply)


@pytest.mark.parametrize(
    ("outcome", "owner", "terminal"),
    [
        ("Ungraded", "gym", False),  # Gym dispatches the next attempt
        ("Ungraded", "operator", True),  # the operator already retried: never both
        ("TerminalFailure", "gym", True),
        ("TerminalFailure", "operator", True),
    ],
)
def test_a_failure_is_terminal_unless_gym_owns_the_retry_of_an_outage(outcome: str, owner: Any, terminal: bool) -> None:
    flat = answer(parse_run(flat_row()), finished(failed(outcome)), NO_EVIDENCE, owner)
    assert flat["_ng_failure_terminal"] is terminal and flat["_ng_failure_class"] == "environment_server_failed"
    check_failure_row(flat)
    body = episode_request()
    reply = answer(parse_run(body), finished(failed(outcome)), NO_EVIDENCE, owner)
    gym()["nemo_gym.episode_types"].BaseEpisodeResponse.model_validate(reply)
    collection = gym()[COLLECTION]
    assert collection._is_episode_response(reply)
    record = collection._episode_record(reply)
    assert record["_ng_failure_terminal"] is terminal and record["_ng_failure_message"] == "pod sandbox-a1 was lost"
    assert reply["failure"]["stage"] == "agent"


def test_a_graded_episode_answers_the_episode_request_as_gym_reads_a_result() -> None:
    body = episode_request()
    reply = answer(parse_run(body), finished(graded(turn("task", 1.0))), NO_EVIDENCE, "gym")
    gym()["nemo_gym.episode_types"].BaseEpisodeResponse.model_validate(reply)
    record = gym()[COLLECTION]._episode_record(reply)  # raises on a key reserved for the collector
    assert record["reward"] == 1.0 and record["_ng_task_id"] == body["task"]["task_id"]


def test_a_captured_episode_answers_without_the_keys_the_collector_reserves() -> None:
    """The export row carries ng_model_call_capture and ng_trajectory; Gym refuses them in a result."""
    captured_rows = answer(parse_run(flat_row()), finished(TWO_TURNS), evidence("fresh"), "gym")
    assert "ng_model_call_capture" in captured_rows, "the flat row keeps the operator's capture"
    reply = answer(parse_run(episode_request()), finished(TWO_TURNS), evidence("fresh"), "gym")
    record = gym()[COLLECTION]._episode_record(reply)
    assert record["reward"] == 1.0 and "turns" in record


def test_an_unfinished_episode_has_no_answer() -> None:
    with pytest.raises(ValueError, match="not finished"):
        answer(parse_run(flat_row()), finished({"phase": "Running"}), NO_EVIDENCE, "gym")


def kept(run: Any, status: dict[str, Any]) -> dict[str, Any]:
    """The finished Episode of a try, with the identity the server keeps on it (gym_server.try_manifest)."""
    item = finished(status)
    item["metadata"]["annotations"] = {GYM_IDENTITY_ANNOTATION: json.dumps(run.identity)}
    return item


def test_a_trys_episode_exports_gyms_identity_and_answers_without_the_collectors_keys() -> None:
    """Gym's collector stamps agent_ref, _ng_task_id and the indices itself, so the answers leave them
    out; the same Episode exported offline carries them, as the collector would have written its row."""
    flat = parse_run(flat_row(_ng_attempt_index=2))
    item = kept(flat, graded(turn("task", 1.0)))
    reply = answer(flat, item, NO_EVIDENCE, "gym")
    assert "agent_ref" not in reply and reply["instance_id"] == "red-team::answer" and "task_name" not in reply
    (row,), _ = rows(item)
    assert (row["agent_ref"], row["instance_id"], row["_ng_attempt_index"]) == (
        {"name": "episode_agent"},
        "red-team::answer",
        2,
    )
    request = episode_request(attempt=1)
    materialized = parse_run(request)
    item = kept(materialized, graded(turn("task", 1.0)))
    record = gym()[COLLECTION]._episode_record(answer(materialized, item, NO_EVIDENCE, "gym"))
    (row,), _ = rows(item)
    assert row["_ng_task_id"] == record["_ng_task_id"] == request["task"]["task_id"]
    assert row["_ng_attempt_index"] == 1 and not {"task_name", "instance_id", "agent_ref"} & set(row)


def test_a_cancelled_try_may_be_dispatched_again() -> None:
    reply = cancelled_answer(parse_run(episode_request()), "the server is shutting down")
    gym()["nemo_gym.episode_types"].BaseEpisodeResponse.model_validate(reply)
    assert gym()[COLLECTION]._episode_record(reply)["_ng_failure_terminal"] is False
    check_failure_row(cancelled_answer(parse_run(flat_row()), "the server is shutting down"))


# --- /aggregate_metrics -------------------------------------------------------------------------------------
@given(
    st.lists(
        st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0, 1, allow_nan=False), min_size=1, max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_pass_at_k_is_gyms(rewards: list[list[float]]) -> None:
    rows = [
        {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward}
        for task, values in enumerate(rewards)
        for rollout, reward in enumerate(values)
    ]
    tasks = [[{"reward": reward} for reward in values] for values in rewards]
    expected, *_ = gym()["nemo_gym.reward_profile"].compute_pass_majority_metrics(tasks)
    ours = aggregate_metrics(rows)["agent_metrics"]
    for key, value in expected.items():
        if key.startswith("pass@") and "std_" not in key:
            assert ours[key] == pytest.approx(value), key


def test_mean_reward_leaves_masked_rows_out() -> None:
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": True},
    ]
    metrics = aggregate_metrics(rows)
    assert metrics["agent_metrics"]["mean/reward"] == 0.5 and metrics["key_metrics"]["mean/reward"] == 0.5
    assert metrics["key_metrics"]["pass@2/accuracy"] == 100.0
    assert [group["_ng_task_index"] for group in metrics["group_level_metrics"]] == [0]


def test_aggregate_metrics_refuses_rows_without_a_task_index() -> None:
    with pytest.raises(GymRequestError, match=r"verify_responses\[1\]"):
        aggregate_metrics([{"_ng_task_index": 0, "reward": 1.0}, {"reward": 1.0}])
