"""Token ids in the capture, without a network: where each API's answer carries them (Gym's shapes read
with Gym's own code), and what the next request carries back (capture/correction.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from episode_operator.capture.correction import AnswerTokens
from episode_operator.capture.records import (
    TOKEN_FIELDS,
    CapturedCall,
    TokenIds,
    chat_token_ids,
    logprob_entries,
    messages_token_ids,
    responses_token_ids,
)
from episode_operator.capture.sse import reassemble
from tests.reference import gym

BUNDLE = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [7, 8], "generation_log_probs": [-0.5, -0.25]}
TOKENS = TokenIds(**BUNDLE)
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}


# --- where an answer carries them ---------------------------------------------------------------------
def test_a_responses_answer_of_gyms_carries_them_on_its_last_item_and_is_read_there() -> None:
    """Gym's own converter makes the answer (``postprocess_assistant_message_dict``, as its vllm_model does)."""
    converter = gym()["nemo_gym.responses_converter"].ResponsesConverter(return_token_id_information=True)
    items = converter.postprocess_assistant_message_dict(
        {"role": "assistant", "content": "<think>Look.</think>Listing.", "tool_calls": [CALL], **BUNDLE}
    )
    answer = {"output": [item.model_dump() for item in items]}
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message", "function_call"]
    assert responses_token_ids(answer) == TOKENS


def test_a_chat_completion_of_gyms_carries_them_on_its_message() -> None:
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Listing.", **BUNDLE}}]}
    assert chat_token_ids(answer) == TOKENS


def test_a_responses_answer_of_vllms_carries_them_as_raw_token_messages_and_output_logprobs() -> None:
    logprobs = [{"token": "L", "logprob": -0.5, "bytes": [76], "top_logprobs": []}] * 2
    answer = {
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "Li", "logprobs": logprobs}]}],
        "input_messages": [{"type": "raw_message_tokens", "message": "hi", "tokens": [1, 2, 3]}],
        "output_messages": [
            {"type": "raw_message_tokens", "message": "L", "tokens": [7]},
            {"type": "raw_message_tokens", "message": "i", "tokens": [8]},
        ],
    }
    assert responses_token_ids(answer) == TokenIds([1, 2, 3], [7, 8], [-0.5, -0.5])
    # Without the raw messages, tokens spelled token_id:<n> still give the generation.
    spelled = [{"token": f"token_id:{token}", "logprob": -0.5} for token in (7, 8)]
    answer = {"output": [{"type": "message", "content": [{"type": "output_text", "logprobs": spelled}]}]}
    assert responses_token_ids(answer) == TokenIds(None, [7, 8], [-0.5, -0.5])


def test_a_messages_answer_carries_them_on_the_message_streamed_or_not() -> None:
    message = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hi"}]}
    assert messages_token_ids(message) == TokenIds()
    assert messages_token_ids({**message, **BUNDLE}) == TOKENS
    events = [
        {"type": "message_start", "message": {**message, "content": [], "prompt_token_ids": [1, 2, 3]}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "generation_token_ids": [7, 8]},
        {"type": "message_delta", "generation_log_probs": [-0.5, -0.25]},
        {"type": "message_stop"},
    ]
    body = b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)
    reassembled = reassemble(body, "messages")
    assert reassembled is not None and messages_token_ids(reassembled) == TOKENS


def test_logprobs_give_ids_only_when_every_token_is_spelled_as_one() -> None:
    assert logprob_entries([{"token": "token_id:5", "logprob": -1}, {"token": "token_id:6", "logprob": -2}]) == (
        [-1.0, -2.0],
        [5, 6],
    )
    assert logprob_entries([{"token": "token_id:5", "logprob": -1}, {"token": "x", "logprob": -2}]) == (
        [-1.0, -2.0],
        None,
    )
    assert logprob_entries([{"token": "token_id:x", "logprob": -1}]) == ([-1.0], None)
    assert logprob_entries(None) == (None, None)


@pytest.mark.parametrize(
    ("tokens", "complete"),
    [
        (TOKENS, True),
        (TOKENS._replace(generation_log_probs=[-0.5]), False),
        (TOKENS._replace(prompt_token_ids=None), False),
    ],
    ids=["whole", "a-logprob-short", "no-prompt"],
)
def test_a_bundle_is_complete_with_all_three_and_a_logprob_per_token(tokens: TokenIds, complete: bool) -> None:
    assert tokens.complete is complete


# --- what the next request carries --------------------------------------------------------------------
def chat_call(call_id: str, messages: list[dict[str, Any]], reply: str, tokens: TokenIds = TOKENS) -> CapturedCall:
    return CapturedCall(
        model_call_id=call_id,
        dialect="chat",
        started_at=0.0,
        completed_at=1.0,
        latency_ms=1.0,
        status_code=200,
        request={"model": "m", "messages": messages},
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]},
        **tokens._asdict(),
    )


USER = {"role": "user", "content": "hi"}
FIRST = {"role": "assistant", "content": "one"}
SECOND = {"role": "assistant", "content": "two"}
MORE = {"role": "user", "content": "more"}


def test_each_answer_of_the_history_carries_its_own_token_ids() -> None:
    """Gym puts each generation's ids on the assistant message it made, not only the latest."""
    answers = AnswerTokens()
    second_tokens = TokenIds([1, 2, 3, 7, 8, 4], [9], [-0.1])
    answers.remember(chat_call("a", [USER], "one"))
    answers.remember(chat_call("b", [USER, FIRST, MORE], "two", second_tokens))
    body = {"model": "m", "messages": [USER, FIRST, MORE, SECOND, MORE]}
    carried, ids = answers.carry("chat", body)
    assert ids == ["a", "b"]
    assert carried["messages"] == [
        USER,
        {**FIRST, **BUNDLE},
        MORE,
        {**SECOND, **second_tokens._asdict()},
        MORE,
    ]
    assert body["messages"][1] == FIRST  # the harness's own request is left alone


def test_a_message_that_already_holds_token_ids_is_left_as_the_client_sent_it() -> None:
    answers = AnswerTokens()
    answers.remember(chat_call("a", [USER], "one"))
    own = {**FIRST, "prompt_token_ids": [42]}
    carried, ids = answers.carry("chat", {"messages": [USER, own, MORE]})
    assert (carried["messages"][1], ids) == (own, [])


def test_an_answer_is_carried_only_after_the_same_conversation() -> None:
    answers = AnswerTokens()
    answers.remember(chat_call("a", [USER], "one"))
    other = {"role": "user", "content": "something else"}
    assert answers.carry("chat", {"messages": [other, FIRST, MORE]}) == ({"messages": [other, FIRST, MORE]}, [])
    # The same words as another API's answer are not carried across APIs.
    body = {"input": [{"role": "user", "content": "hi"}, {"type": "message", "role": "assistant", "content": "one"}]}
    assert answers.carry("responses", body) == (body, [])


@pytest.mark.parametrize(
    "tokens",
    [TOKENS._replace(generation_log_probs=[-0.5]), TOKENS._replace(prompt_token_ids=None), TokenIds()],
    ids=["a-logprob-short", "no-prompt", "none"],
)
def test_a_partial_bundle_is_never_carried(tokens: TokenIds) -> None:
    """Gym refuses a request with a part of one (``_validate_atomic_token_metadata``)."""
    answers = AnswerTokens()
    answers.remember(chat_call("a", [USER], "one", tokens))
    assert len(answers) == 0
    assert answers.carry("chat", {"messages": [USER, FIRST, MORE]})[1] == []


def test_messages_never_carry_token_ids() -> None:
    """Neither Gym's Messages endpoint nor vLLM's reads them on a request."""
    answers = AnswerTokens()
    call = chat_call("a", [USER], "one").model_copy(
        update={
            "dialect": "messages",
            "request": {"messages": [USER]},
            "response": {"type": "message", "content": [{"type": "text", "text": "one"}]},
        }
    )
    answers.remember(call)
    body = {"messages": [USER, FIRST, MORE]}
    assert answers.carry("messages", body) == (body, [])


def test_what_is_remembered_is_bounded_the_oldest_forgotten_first() -> None:
    size = len(TOKENS.prompt_token_ids or []) + len(TOKENS.generation_token_ids or [])
    answers = AnswerTokens(max_tokens=2 * size)
    for index in range(3):
        answers.remember(chat_call(f"c{index}", [{"role": "user", "content": f"q{index}"}], "one"))
    assert (len(answers), answers.held) == (2, 2 * size)
    assert answers.carry("chat", {"messages": [{"role": "user", "content": "q0"}, FIRST, MORE]})[1] == []
    assert answers.carry("chat", {"messages": [{"role": "user", "content": "q2"}, FIRST, MORE]})[1] == ["c2"]


def test_the_carried_fields_are_gyms() -> None:
    answers = AnswerTokens()
    answers.remember(chat_call("a", [USER], "one"))
    carried, _ = answers.carry("chat", {"messages": [USER, FIRST, MORE]})
    assert set(carried["messages"][1]) - set(FIRST) == set(TOKEN_FIELDS)
    utils = gym()["nemo_gym.openai_utils"]
    assert set(TOKEN_FIELDS) == set(utils.REQUIRED_TOKEN_METADATA_FIELDS)
