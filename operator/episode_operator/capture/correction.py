"""On-policy correction: an earlier answer's token ids carried back on the request that continues it, as NeMo Gym does.

What Gym does (nemo-gym 0.7.0): its vllm_model sends vLLM the conversation with each assistant message
that a generation produced carrying that generation's ``prompt_token_ids``, ``generation_token_ids``
and ``generation_log_probs`` beside its ``role`` and ``content``
(``NeMoGymChatCompletionAssistantMessageForTrainingParam``; ``responses_to_chat_completion_create_params``
puts them there). It takes them from the Responses input items its agent replays: Gym's answer holds
them on its last output item (``postprocess_assistant_message_dict``), the agent sends the items back
as they were, and the converter attaches the ones of an answer's items to the assistant message they
become. A server that reads them (NeMo RL's vLLM server) puts the exact tokens the policy generated in
place of a re-tokenized history, so the prompt of the next call extends the previous call's tokens.

Which APIs: Gym sends them to vLLM on chat completions only (its Responses-native path refuses token
ids), and takes them on Responses input items, where its own Responses endpoint reads them. Its
Anthropic Messages endpoint drops them (``responses_to_anthropic_response``: "carried out-of-band"), and
vLLM's Messages endpoint reads none. So the proxy carries them on chat completions (on the assistant
message) and on Responses (on the answer's last item), never on Messages: :data:`CARRIERS`.

A harness replays its history without them; the proxy knows which earlier call each assistant entry
of a new request is: the call whose conversation (its request's entries, then its answer) the new
request's entries begin with (capture/conversation.py). Pure: the proxy remembers each answer's token
ids (:meth:`AnswerTokens.remember`) and asks what a request carries (:meth:`AnswerTokens.carry`).
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from episode_operator.capture.conversation import Entry, request_entries, response_entries
from episode_operator.capture.records import TOKEN_FIELDS, CapturedCall, TokenIds
from episode_operator.capture.wire import Dialect

#: Where a request's history is, per API whose requests carry earlier answers' token ids (see above).
CARRIERS: Final[dict[Dialect, str]] = {"chat": "messages", "responses": "input"}
# The most token ids (and log-probabilities) remembered at once, oldest answers forgotten first: an
# answer forgotten is sent without them (as before this existed). 8 Mi tokens is five long sessions
# (100 calls of 16k-token prompts), 32 MiB of prompt ids, well inside the capture container's memory.
MAX_REMEMBERED_TOKENS: Final = 8 * 1024 * 1024


@dataclass(frozen=True)
class Remembered:
    """One answer's token ids, packed (4 bytes an id, 8 a log-probability)."""

    model_call_id: str
    prompt_token_ids: array[int]
    generation_token_ids: array[int]
    generation_log_probs: array[float]

    @property
    def size(self) -> int:
        return len(self.prompt_token_ids) + len(self.generation_token_ids)

    def fields(self) -> dict[str, list[Any]]:
        """Gym's three fields, as they go on the message or item."""
        return dict(
            zip(
                TOKEN_FIELDS,
                (
                    self.prompt_token_ids.tolist(),
                    self.generation_token_ids.tolist(),
                    self.generation_log_probs.tolist(),
                ),
                strict=True,
            )
        )


def prefix_digests(dialect: Dialect, entries: Sequence[Entry]) -> list[str]:
    """``digests[k]``: what identifies the conversation of ``entries[: k + 1]`` (what each entry says, in order)."""
    digest = hashlib.sha256(dialect.encode())
    digests = []
    for entry in entries:
        digest.update(json.dumps(entry.key()).encode() + b"\n")
        digests.append(digest.copy().hexdigest())
    return digests


class AnswerTokens:
    """The token ids of the answers the proxy saw, by the conversation each answer ends; bounded."""

    def __init__(self, max_tokens: int = MAX_REMEMBERED_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.held = 0
        self._answers: OrderedDict[str, Remembered] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def remember(self, call: CapturedCall) -> None:
        """Keep a call's token ids when a later request may continue its conversation: an answered call
        of a carrying API, with Gym's whole bundle (Gym refuses a part of one)."""
        if call.dialect not in CARRIERS or call.request is None or call.response is None or call.error_category:
            return
        tokens = TokenIds(call.prompt_token_ids, call.generation_token_ids, call.generation_log_probs)
        answer = response_entries(call.dialect, call.response)[:1]
        if not tokens.complete or not answer:
            return
        assert tokens.prompt_token_ids is not None and tokens.generation_token_ids is not None
        assert tokens.generation_log_probs is not None
        try:
            remembered = Remembered(
                call.model_call_id,
                array("i", tokens.prompt_token_ids),
                array("i", tokens.generation_token_ids),
                array("d", tokens.generation_log_probs),
            )
        except OverflowError:  # no tokenizer's id; nothing to carry
            return
        conversation = [*request_entries(call.dialect, call.request), *answer]
        key = prefix_digests(call.dialect, conversation)[-1]
        if (replaced := self._answers.pop(key, None)) is not None:
            self.held -= replaced.size
        self._answers[key] = remembered
        self.held += remembered.size
        while self.held > self.max_tokens and self._answers:
            _, forgotten = self._answers.popitem(last=False)
            self.held -= forgotten.size

    def carry(self, dialect: Dialect, body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``body`` with each assistant message (chat) or answer's last item (Responses) of its history
        that an earlier call answered carrying that call's token ids, and those calls' ids. A message or
        item that already holds any of the fields is left as the client sent it."""
        name = CARRIERS.get(dialect)
        history = body.get(name) if name is not None else None
        if name is None or not isinstance(history, list) or not self._answers:
            return dict(body), []
        entries = request_entries(dialect, body)
        answered = {
            entry.at: remembered
            for entry, digest in zip(entries, prefix_digests(dialect, entries), strict=True)
            if entry.kind == "assistant" and entry.at is not None and (remembered := self._answers.get(digest))
        }
        carried: list[str] = []
        history = list(history)
        for at, remembered in sorted(answered.items()):
            holder = history[at]
            if isinstance(holder, dict) and not any(field in holder for field in TOKEN_FIELDS):
                history[at] = {**holder, **remembered.fields()}
                carried.append(remembered.model_call_id)
        if not carried:
            return dict(body), []
        return {**body, name: history}, carried
