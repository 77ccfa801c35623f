"""Gym rows of finished Episodes, table-driven over turn sessions and outcomes, checked against Gym's own models."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from episode_operator.api.export import (
    ENVIRONMENT_SERVER,
    GYM_IDENTITY_ANNOTATION,
    NO_EVIDENCE,
    EpisodeEvidence,
    TurnEvidence,
    rollout_id,
    rows,
    split_rows,
)
from episode_operator.capture.records import CapturedCall
from tests.gym_row_schema import check_rows
from tests.reference import check_failure_row, check_rollout_row, gym
from tests.unit.conversations import INSTRUCTION, captured, chat_call

SPEC = {"task": {"inline": {"files": {}}}, "agent": {"kind": "command", "command": "run-agent"}}
SET_LABELS = {"episode-operator.dev/task-index": "3", "episode-operator.dev/set-attempt": "1"}
SECOND = "Now append bye to hello.txt."


def episode(status: dict[str, Any], *, labels: dict[str, str] | None = None, name: str = "e") -> dict[str, Any]:
    metadata = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels or {}}
    return {"metadata": metadata, "spec": SPEC, "status": status}


def turn(name: str, reward: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "phase": "Succeeded",
        "reward": reward,
        "verifierRewards": {"reward": reward} if reward is not None else {},
        "rewardValid": reward is not None,
        "agentExitCode": 0,
        "startedAt": "2026-11-30T10:00:00Z",
        "finishedAt": "2026-11-30T10:01:00Z",
        **extra,
    }


def graded(*turns: dict[str, Any], attempts: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Succeeded",
        "outcome": "Graded",
        "reward": 1.0,
        "verifierRewards": {"reward": 1.0},
        "verifierMode": "shared",
        "attempt": attempts,
        "attempts": [
            {"number": number, **({"reason": "PodLost: node went away"} if number < attempts else {})}
            for number in range(1, attempts + 1)
        ],
        "task": {"digest": "sha256:" + "0" * 64, "name": "org/hello"},
        "turns": list(turns),
        **extra,
    }


# --- the calls of two turns, fresh (two sessions) and continued (one) --------------------------------------
def second_turn_call(*, continued: bool) -> CapturedCall:
    """Turn 2's one call: a new session, or turn 1's conversation with the new instruction appended."""
    history: list[dict[str, Any]] = []
    if continued:
        first = chat_call(2)
        assert first.request is not None and first.response is not None
        history = [*first.request["messages"], first.response["choices"][0]["message"]]
    else:
        history = [{"role": "system", "content": "You are an agent in a Linux sandbox."}]
    request = {"model": "policy", "messages": [*history, {"role": "user", "content": SECOND}]}
    response = {
        "id": "chatcmpl-2b",
        "model": "policy",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Appended."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 3, "total_tokens": 203},
    }
    return captured("turn-2", "chat", request, response, 10, turn="02-append")


def evidence(sessions: str, **extra: Any) -> EpisodeEvidence:
    return EpisodeEvidence(
        turns={
            "01-make": TurnEvidence(instruction=INSTRUCTION, calls=[chat_call(index) for index in range(3)]),
            "02-append": TurnEvidence(instruction=SECOND, calls=[second_turn_call(continued=sessions == "continue")]),
        },
        harness="opencode",
        harness_version="1.17.11",
        model="policy",
        turn_sessions=sessions,  # type: ignore[arg-type]
        **extra,
    )


TWO_TURNS = graded(turn("01-make", 1.0), turn("02-append", 1.0))


@dataclass
class Case:
    name: str
    status: dict[str, Any]
    evidence: EpisodeEvidence = NO_EVIDENCE
    labels: dict[str, str] = field(default_factory=dict)
    rollouts: int = 0
    failures: list[tuple[bool, str | None]] = field(default_factory=list)  # (terminal, stage) per failure row
    row: dict[str, Any] = field(default_factory=dict)  # expected values of the rollout row


CASES = [
    Case(
        "fresh: two sessions",
        TWO_TURNS,
        evidence("fresh"),
        rollouts=1,
        row={
            "mask_sample": False,
            "reward": 1.0,
            "params": SECOND,
            "answer": "Appended.",
            "episode_observations": False,
        },
    ),
    Case(
        "fresh: one session",
        graded(turn("01-make", 1.0)),
        evidence("fresh"),
        rollouts=1,
        row={"params": INSTRUCTION, "answer": "Done.", "episode_observations": True},
    ),
    Case(
        "continue: the cumulative session",
        TWO_TURNS,
        evidence("continue"),
        rollouts=1,
        row={"params": SECOND, "answer": "Appended.", "episode_observations": True},
    ),
    Case(
        "masked",
        {**graded(turn("01-make", None)), "outcome": "Masked", "reward": None, "message": "verifier could not start"},
        evidence("fresh"),
        rollouts=1,
        row={"mask_sample": True, "reward": 0.0, "failure_reason": "verifier could not start"},
    ),
    Case(
        "step 2 preparation failed: measured 0, the response is turn 1's",
        {
            **graded(
                turn("01-make", 1.0), turn("02-append", 0.0, agentExitCode=None, failureKind="harbor:step_setup_failed")
            ),
            "reward": 0.5,
            "failureKind": "harbor:step_setup_failed",
            "stoppedAfterTurn": "02-append",
            "message": "setup.sh exited 1",
        },
        replace(evidence("fresh"), turns={"01-make": evidence("fresh").turns["01-make"]}),
        rollouts=1,
        row={"reward": 0.5, "params": INSTRUCTION, "answer": "Done.", "failure_reason": "setup.sh exited 1"},
    ),
    Case(
        "graded after an outage: a failure row for the lost attempt",
        graded(turn("01-make", 1.0), attempts=2),
        evidence("fresh"),
        labels=SET_LABELS,
        rollouts=1,
        failures=[(False, None)],
        row={"rollout_id": "3-0-a1"},
    ),
    Case(
        "terminal: step 1 preparation failed",
        {
            "phase": "Failed",
            "outcome": "TerminalFailure",
            "failureKind": "harbor:step_healthcheck_failed",
            "message": "healthcheck never passed",
            "attempt": 1,
            "attempts": [{"number": 1}],
            "turns": [
                {"name": "01-make", "phase": "Failed", "stage": "setup"},
                {"name": "02-append", "phase": "Skipped"},
            ],
        },
        labels=SET_LABELS,
        failures=[(True, "seed")],
    ),
    Case(
        "ungraded: every attempt lost",
        {
            "phase": "Failed",
            "outcome": "Ungraded",
            "failureKind": "outage:PodLost",
            "message": "3 attempt(s) failed; last: PodLost",
            "attempt": 3,
            "attempts": [{"number": n, "reason": "PodLost: evicted"} for n in (1, 2, 3)],
            "turns": [{"name": "01-make", "phase": "Running", "stage": "agent"}],
        },
        failures=[(False, None), (False, None), (False, "agent")],
    ),
    Case(
        "an oracle: no capture, no observation keys",
        graded(turn("01-make", 1.0)),
        rollouts=1,
        row={"answer": None, "model": "command"},
    ),
    Case("running: no row yet", {"phase": "Running", "turns": [turn("01-make", None)]}),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_rows(case: Case) -> None:
    item = episode(case.status, labels=case.labels)
    rollouts, failures = rows(item, case.evidence)
    assert (len(rollouts), [(row["_ng_failure_terminal"], row.get("_ng_failure_stage")) for row in failures]) == (
        case.rollouts,
        case.failures,
    )
    check_rows([json.loads(json.dumps(row)) for row in rollouts], failures)
    for row in failures:
        if case.labels:
            assert (row["_ng_task_index"], row["_ng_rollout_index"]) == (3, 0)
    for row in rollouts:
        check_expectations(row, case)


def check_expectations(row: dict[str, Any], case: Case) -> None:
    expected = case.row
    for key in ("mask_sample", "reward", "failure_reason"):
        if key in expected:
            assert row[key] == expected[key], key
    if "params" in expected:
        assert row["responses_create_params"] == {
            "input": [{"role": "user", "content": expected["params"], "type": "message"}]
        }
    if "answer" in expected:
        texts = [item["content"][0]["text"] for item in row["response"]["output"] if item["type"] == "message"]
        assert (texts[-1] if texts else None) == expected["answer"]
    if "model" in expected:
        assert row["response"]["model"] == expected["model"]
    captured_row = case.evidence.captured
    assert ("ng_model_call_capture" in row) == captured_row
    if not captured_row:
        assert not [key for key in row if key.startswith("ng_")]
        return
    if "episode_observations" in expected:
        assert ("ng_agent_observations" in row) == expected["episode_observations"]
    if "rollout_id" in expected:
        assert row["ng_model_call_capture"]["rollout_id"] == expected["rollout_id"]
    sessions = case.evidence.turn_sessions
    names = [turn["name"] for turn in case.status["turns"] if turn["phase"] != "Skipped"]
    calls = sum(len(case.evidence.turns[name].calls) for name in names if name in case.evidence.turns)
    assert row["ng_model_call_capture"]["metrics"]["num_calls"] == calls
    assert len(row["ng_trajectory"]["model_calls"]) == calls
    assert all(call["request"] is not None for call in row["ng_trajectory"]["model_calls"])
    for entry in row["turns"]:
        ran = entry["name"] in case.evidence.turns
        assert ("ng_agent_observations" in entry) == (sessions == "fresh" and ran), entry["name"]


def test_fresh_turns_each_keep_their_own_session() -> None:
    (row,), _ = rows(episode(TWO_TURNS), evidence("fresh"))
    first, second = row["turns"]
    assert [ref["model_call_id"] for ref in first["ng_agent_observations"]["records"][0]["model_calls"]] == [
        "chat-0",
        "chat-1",
        "chat-2",
    ]
    assert [ref["model_call_id"] for ref in second["ng_agent_observations"]["records"][0]["model_calls"]] == ["turn-2"]
    assert [turn["turn_no"] for turn in first["ng_trajectory"]["turns"]] == [1, 2, 3]
    assert not any("request" in call for call in first["ng_trajectory"]["model_calls"])  # the episode's hold them
    assert first["responses_create_params"]["input"][0]["content"] == INSTRUCTION
    assert [call["turn"] for call in row["ng_model_call_capture"]["calls"]] == ["01-make"] * 3 + ["02-append"]


def test_a_continued_turn_reports_only_its_own_activation() -> None:
    (row,), _ = rows(episode(TWO_TURNS), evidence("continue"))
    second = row["turns"][1]
    assert [item["type"] for item in second["response"]["output"]] == ["message"]
    (invocation,) = row["ng_agent_observations"]["records"]
    assert [ref["model_call_id"] for ref in invocation["model_calls"]] == ["chat-0", "chat-1", "chat-2", "turn-2"]
    contents = [item.get("content") for item in invocation["conversation"] if item.get("role") == "user"]
    assert contents == [INSTRUCTION, SECOND]  # the whole session, both instructions
    assert row["response"]["usage"]["input_tokens"] == 200  # the last activation's call alone


def test_calls_outside_any_turn_are_counted_and_flagged() -> None:
    stray = chat_call(0).model_copy(update={"model_call_id": "stray", "turn": None})
    (row,), _ = rows(episode(TWO_TURNS), replace(evidence("fresh"), outside_turn_calls=[stray]))
    capture = row["ng_model_call_capture"]
    assert capture["metrics"]["num_calls"] == 5
    assert {"code": "model_call_outside_turn", "detail": "count=1:stray"} in capture["gaps"]
    assert ("model_call_outside_turn", "count=1:stray") in [
        (gap["code"], gap["detail"]) for gap in row["ng_trajectory"]["gaps"]
    ]


def test_an_incomplete_capture_is_a_gap() -> None:
    partial = replace(
        evidence("fresh"), turns={"01-make": TurnEvidence(INSTRUCTION, [chat_call(0)], capture_complete=False)}
    )
    (row,), _ = rows(episode(graded(turn("01-make", 1.0))), partial)
    assert {"code": "model_call_capture_incomplete", "detail": "01-make"} in row["ng_model_call_capture"]["gaps"]


def test_rollout_ids_follow_gym() -> None:
    assert rollout_id({"labels": SET_LABELS}, 1) == "3-0"
    assert rollout_id({"labels": SET_LABELS}, 3) == "3-0-a2"
    assert rollout_id({"namespace": "ns", "name": "e"}, None) == "ns.e"


def test_split_rows_keeps_masked_rows_with_the_graded() -> None:
    masked = copy.deepcopy(CASES[3].status)
    terminal = CASES[6].status
    rollouts, failures = split_rows(
        [
            episode(TWO_TURNS, name="a"),
            episode(masked, name="b"),
            episode(terminal, name="c"),
            episode({"phase": "Running"}),
        ]
    )
    assert [(row["episode"], row["mask_sample"]) for row in rollouts] == [("ns/a", False), ("ns/b", True)]
    assert [(row["episode"], row["failure_kind"]) for row in failures] == [("ns/c", "harbor:step_healthcheck_failed")]


def test_the_reference_check_rejects_a_malformed_row() -> None:
    (row,), _ = rows(episode(TWO_TURNS), evidence("fresh"))
    for breakage in (
        lambda bad: bad.update(reward="high"),
        lambda bad: bad["response"].update(output=[{"type": "message"}]),
        lambda bad: bad["ng_trajectory"].update(schema_version="2.0"),
        lambda bad: bad["ng_model_call_capture"]["metrics"].update(num_calls=99),
        lambda bad: bad.update(_ng_invented=1),
    ):
        bad = copy.deepcopy(row)
        breakage(bad)
        with pytest.raises((AssertionError, ValueError)):
            check_rollout_row(bad)
    (failure,) = rows(episode(CASES[6].status))[1]
    with pytest.raises((AssertionError, ValueError)):
        check_failure_row({**failure, "_ng_failure_stage": "preparation"})


@pytest.mark.parametrize("params", [{}, {"temperature": 0.2, "top_p": 0.9, "max_tokens": 512, "seed": 7}])
def test_a_row_says_the_sampling_every_call_was_sent_with(params: dict[str, Any]) -> None:
    """spec.agent.model.params, which the capture proxy set on every call, in the row's
    responses_create_params and response under the Responses API's names (Gym's models accept
    them); without params, none (not a guess of the harness's defaults)."""
    sampling = {"temperature": 0.2, "top_p": 0.9, "max_output_tokens": 512} if params else {}
    (row,), _ = rows(episode(TWO_TURNS), evidence("fresh", sampling=sampling))
    check_rollout_row(row)
    for entry in (row, *row["turns"]):
        assert {key: entry["response"][key] for key in sampling} == sampling
        assert {key: entry["responses_create_params"].get(key) for key in sampling} == sampling
    if not params:
        assert (row["response"]["temperature"], row["response"]["top_p"]) == (None, None)
        assert set(row["responses_create_params"]) == {"input"}


def test_the_sampling_of_a_row_is_the_episodes_params_by_their_responses_names() -> None:
    from episode_operator.api.episode_resource import EpisodeSpec
    from episode_operator.api.export import evidence_of

    model = {"name": "policy", "baseURL": "http://198.19.0.9:8000/v1", "params": {"max_tokens": 64, "top_k": 5}}
    spec = EpisodeSpec.model_validate({**SPEC, "agent": {"kind": "command", "command": "x", "model": model}})
    assert evidence_of(spec, {}).sampling == {"max_output_tokens": 64}  # top_k: sent, but no Responses key


# --- Gym's identity keys -----------------------------------------------------------------------------------
GYM_TRY = {
    "instance_id": "examples::hello",
    "agent_ref": {"name": "harbor_agent"},
    "_ng_attempt_index": 2,
}


def gym_try(status: dict[str, Any], identity: Any, **extra: Any) -> dict[str, Any]:
    item = episode(status, **extra)
    item["metadata"]["annotations"] = {
        GYM_IDENTITY_ANNOTATION: identity if isinstance(identity, str) else json.dumps(identity)
    }
    return item


def test_the_rows_of_a_gym_try_carry_what_gym_named_it_by() -> None:
    """Gym's third try (``_ng_attempt_index`` 2), lost once inside the Episode: the lost attempt is
    Gym's try 2, the graded one try 3; both name the agent and the task as Gym's row did."""
    (row,), (lost,) = rows(gym_try(graded(turn("01-make", 1.0), attempts=2), GYM_TRY, labels=SET_LABELS))
    check_rows([row], [lost])
    assert (lost["_ng_attempt_index"], row["_ng_attempt_index"]) == (2, 3)
    for each in (row, lost):
        assert each["instance_id"] == "examples::hello" and "task_name" not in each
        assert each["agent_ref"] == {"name": "harbor_agent"}
        assert (each["_ng_task_index"], each["_ng_rollout_index"], each["_ng_environment_server"]) == (
            3,
            0,
            ENVIRONMENT_SERVER,
        )


def test_an_episode_gym_did_not_send_names_its_task_and_counts_its_own_tries() -> None:
    (row,), (lost,) = rows(episode(graded(turn("01-make", 1.0), attempts=2)), environment_server="harbor_env")
    check_rows([row], [lost])
    assert row["task_name"] == lost["task_name"] == "org/hello"
    assert not {"instance_id", "agent_ref", "_ng_task_id"} & (set(row) | set(lost))
    assert ("_ng_attempt_index" not in lost, row["_ng_attempt_index"]) == (True, 1)
    assert row["_ng_environment_server"] == lost["_ng_environment_server"] == "harbor_env"


@pytest.mark.parametrize(
    "identity",
    [
        "not json",
        "[1, 2]",
        {"_ng_attempt_index": "2", "agent_ref": "harbor_agent", "instance_id": 7},
        {"_ng_attempt_index": -1, "_ng_task_id": ["examples", "hello"]},
        {"reward": 1.0, "_ng_failure_terminal": True, "mask_sample": False},
    ],
    ids=["not JSON", "not an object", "wrong types", "negative attempt", "other keys"],
)
def test_an_identity_annotation_gym_did_not_write_changes_no_score_and_no_key(identity: Any) -> None:
    """Whoever creates an Episode may write its annotations: what is not an identity key of the right
    type is left out, and the row is the row of an Episode Gym did not send."""
    status = graded(turn("01-make", 1.0))
    (row,), _ = rows(gym_try(status, identity))
    (plain,), _ = rows(episode(status))
    check_rows([row], [])

    def scored(each: dict[str, Any]) -> dict[str, Any]:  # all but the responses, whose ids are random
        return {k: v for k, v in each.items() if k not in ("response", "turns")} | {
            "turns": [{k: v for k, v in entry.items() if k != "response"} for entry in each["turns"]]
        }

    assert scored(row) == scored(plain)


def test_the_agents_timeout_and_context_window_are_gyms_error_flags() -> None:
    (timed_out,), _ = rows(episode(graded(turn("01-make", 0.0, agentFailure="timeout"))))
    (overflowed,), _ = rows(
        episode(graded(turn("01-make", 1.0), turn("02-append", 0.0, agentFailure="context_window")))
    )
    (clean,), _ = rows(episode(graded(turn("01-make", 1.0, agentFailure="exited"))))
    flags = ("agent_timeout_error", "context_length_exceeded_error")
    assert [tuple(row[flag] for flag in flags) for row in (timed_out, overflowed, clean)] == [(1, 0), (0, 1), (0, 0)]


def made(name: str, digest: str, created: str, **extra: Any) -> dict[str, Any]:
    item = episode({**graded(turn("01-make", 1.0)), "task": {"digest": "sha256:" + digest * 64}}, name=name, **extra)
    item["metadata"]["creationTimestamp"] = created
    return item


def test_an_export_numbers_the_episodes_without_indices_as_gym_tells_rollouts_apart() -> None:
    """Standalone Episodes get task indices after every index an exported Episode has, one per task,
    their rollouts in the order they were made; Gym's own identity key tells every row apart, and
    the same Episodes number the same way in any order."""
    child = made("child", "9", "2026-12-01T00:00:00Z", labels=SET_LABELS)
    later, earlier = made("a1", "0", "2026-12-01T00:00:05Z"), made("a2", "0", "2026-12-01T00:00:01Z")
    other = made("b", "1", "2026-12-01T00:00:00Z")
    running = episode({"phase": "Running"}, name="c")
    rollouts, _ = split_rows([other, later, running, child, earlier])
    check_rows(rollouts, [])
    numbered = {row["episode"]: (row["_ng_task_index"], row["_ng_rollout_index"]) for row in rollouts}
    assert numbered == {"ns/child": (3, 0), "ns/a2": (4, 0), "ns/a1": (4, 1), "ns/b": (5, 0)}
    collection = gym()["nemo_gym.rollout_collection"]
    keys = {collection._identity_key(row, collection._routing_identity) for row in rollouts}
    assert len(keys) == len(rollouts) and {key[0] for key in keys} == {ENVIRONMENT_SERVER}
    again, _ = split_rows([earlier, child, other, later])
    assert {row["episode"]: (row["_ng_task_index"], row["_ng_rollout_index"]) for row in again} == numbered
