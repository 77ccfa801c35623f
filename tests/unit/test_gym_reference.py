"""Our capture records, trajectories and Responses items against the reference implementations' own code.

Gym's and Harbor's models and functions come from their published wheels (:mod:`tests.reference`):
the same inputs must give what they give.
"""

from __future__ import annotations

import json
import re
from typing import Any, get_args

import pytest

from episode_operator.api.vocabulary import FailureKind, OutageKind, outage_failure_kind
from episode_operator.capture.atif import Trajectory, trajectory_from_calls, trajectory_to_responses
from episode_operator.capture.records import CapturedCall, aggregate, classify_status, model_call_record
from episode_operator.capture.sse import reassemble
from tests.reference import check_rollout_row, gym, gym_example_rows, harbor_trajectory
from tests.unit.conversations import SESSIONS, chat_call
from tests.unit.model_upstream import JSON_ANSWERS, sse_answer

DIALECTS = ("chat", "responses", "messages")


def test_gyms_own_rows_pass_the_check() -> None:
    """The check is Gym's: its own Harbor example rows pass it (bar the harbor keys they predate)."""
    for row in gym_example_rows():
        gym()["nemo_gym.base_resources_server"].BaseVerifyResponse.model_validate(row)
    with pytest.raises(ValueError):
        check_rollout_row({**gym_example_rows()[0], "turns": [], "reward": None})


@pytest.mark.parametrize("status", range(100, 600))
def test_status_categories_are_gyms(status: int) -> None:
    assert classify_status(status) == gym()["nemo_gym.base_responses_api_model"]._classify_status(status)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_stream_reassembles_as_gym_reassembles_it(dialect: str) -> None:
    raw = b"".join(sse_answer(dialect))
    theirs = gym()["nemo_gym.base_responses_api_model"]._reconstruct_streamed_response(raw, dialect)
    ours = reassemble(raw, dialect)
    assert ours is not None and theirs is not None
    # We keep a little more (ids, timestamps, vLLM's token fields); everything Gym keeps is the same.
    if dialect == "messages":
        for block in ours["content"]:
            block.pop("signature", None)
    assert {key: ours[key] for key in theirs} == theirs


def exchanges() -> list[CapturedCall]:
    calls = [call for dialect in DIALECTS for call in SESSIONS[dialect]()]
    for dialect in DIALECTS:
        raw = b"".join(sse_answer(dialect))
        streamed = chat_call(0).model_copy(
            update={
                "model_call_id": f"streamed-{dialect}",
                "dialect": dialect,
                "streaming": True,
                "response": reassemble(raw, dialect),
                "response_raw": raw.decode(),
            }
        )
        calls.append(streamed)
        calls.append(
            streamed.model_copy(update={"model_call_id": f"json-{dialect}", "response": JSON_ANSWERS[dialect]})
        )
    failed = chat_call(1).model_copy(
        update={"model_call_id": "failed", "response": None, "status_code": 504, "error_category": "timeout"}
    )
    return [*calls, failed]


def test_call_records_are_gyms() -> None:
    """Our ModelCallRecord of each stored call is what Gym's build_model_call_record makes of the same exchange."""
    module = gym()["nemo_gym.base_responses_api_model"]
    ours, theirs = [], []
    for index, call in enumerate(exchanges()):
        exchange = call.model_dump(mode="json", exclude_none=True)
        theirs.append(module.build_model_call_record(exchange, call_index=index))
        ours.append(model_call_record(call, call_index=index))
        expected = theirs[-1].model_dump(mode="json")
        got = ours[-1].model_dump(mode="json", exclude={"turn"})
        assert got == expected, call.model_call_id
    assert aggregate(ours).model_dump(mode="json") == module.aggregate_model_call_records(theirs)


def trajectories() -> list[Trajectory]:
    built = [trajectory_from_calls(SESSIONS[dialect](), agent_name="a", agent_version="1") for dialect in DIALECTS]
    built.append(
        trajectory_from_calls([chat_call(i, token_ids=True) for i in range(3)], agent_name="a", agent_version="1")
    )
    built.append(
        trajectory_from_calls(
            [chat_call(2)], agent_name="a", agent_version="1", earlier_calls=[chat_call(0), chat_call(1)]
        )
    )
    assert all(trajectory is not None for trajectory in built)
    return [trajectory for trajectory in built if trajectory is not None]


@pytest.mark.parametrize("index", range(5))
def test_trajectories_are_valid_atif_for_harbor_and_gym(index: int) -> None:
    document = trajectories()[index].to_json_dict()
    harbor_trajectory().model_validate(document)
    gym()["nemo_gym.atif_v1_7"].AtifTrajectoryV1_7.model_validate(json.loads(json.dumps(document)))


def test_our_atif_models_refuse_what_harbor_refuses() -> None:
    document = trajectories()[0].to_json_dict()
    for breakage in (
        lambda bad: bad["steps"][0].update(step_id=7),
        lambda bad: bad["steps"][0].update(source="user", tool_calls=[]),
        lambda bad: bad["steps"][2]["observation"]["results"][0].update(source_call_id="nobody"),
        lambda bad: bad.update(schema_version="ATIF-v2"),
        lambda bad: bad.update(unknown=1),
    ):
        bad = json.loads(json.dumps(document))
        breakage(bad)
        with pytest.raises(ValueError):
            harbor_trajectory().model_validate(bad)
        with pytest.raises(ValueError):
            Trajectory.model_validate(bad)


IDS = re.compile(r"^(cht_[0-9a-f]{12}|fc_[0-9a-f]{8}|fco_[0-9a-f]{8}|call_[0-9a-f]{8})$")


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {key: ("<id>" if isinstance(value, str) and IDS.match(value) else value) for key, value in item.items()}
        for item in items
    ]


@pytest.mark.parametrize("index", range(5))
def test_responses_items_are_gyms(index: int) -> None:
    """Our trajectory_to_responses gives what Gym's HarborAgentUtils.trajectory_to_responses gives (ids are random)."""
    document = trajectories()[index].to_json_dict()
    utils = gym()["responses_api_agents.harbor_agent.utils"].HarborAgentUtils
    assert without_ids(trajectory_to_responses(document)) == without_ids(utils.trajectory_to_responses(document))


def test_raw_content_parsing_is_gyms() -> None:
    utils = gym()["responses_api_agents.harbor_agent.utils"].HarborAgentUtils
    for message in (
        '{"commands": [{"keystrokes": "ls\\n", "duration": "x"}], "task_complete": true}',
        'Thinking... {"a": "}"} then {"commands": [{"keystrokes": "pwd\\n"}]}',
        "no json at all",
        '{"commands": "not a list"}',
    ):
        document = {
            "steps": [
                {"step_id": 1, "source": "agent", "message": message, "observation": {"results": [{"content": "out"}]}}
            ]
        }
        assert without_ids(trajectory_to_responses(document)) == without_ids(utils.trajectory_to_responses(document))


def test_every_failure_kind_the_operator_writes_is_one_gyms_vocabulary_accepts() -> None:
    """Gym's ``validate_failure_kind`` takes a registered name or a namespaced ``<server>:<kind>``;
    anything else is a second, silently different label for one failure (nemo_gym/failure_kinds.py)."""
    failure_kinds = gym()["nemo_gym.failure_kinds"]
    written = [*get_args(FailureKind), *(outage_failure_kind(kind) for kind in get_args(OutageKind))]
    refused = [kind for kind in written if not (failure_kinds.is_registered(kind) or failure_kinds.is_namespaced(kind))]
    assert refused == []
