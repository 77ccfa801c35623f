"""How an agent's turn failed, and what that means for the episode (the seed's rules).

The evidence comes first from the turn's recorded model calls — written by the capture proxy,
which the agent cannot touch — and only then from the harness's own output. What each failure
means follows Gym: a failure of the environment (here the model endpoint, which the operator
stands between) is an *outage*, retried with a fresh attempt; a failure no retry can mend (a
refused key, an unknown model) ends the episode *ungraded* without a retry; a failure of the
agent itself (it ran out of budget, outgrew the context window, exited non-zero) is *measured*:
the verifier still decides, as in Harbor and Gym.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from episode_operator.api.vocabulary import (
    DEFAULT_AGENT_OUTCOMES,
    FAILURE_MODEL_AUTH,
    FAILURE_MODEL_NOT_FOUND,
    AgentFailure,
    AgentOutcome,
    FailureKind,
    OutageKind,
)
from episode_operator.capture.records import CapturedCall, ErrorCategory
from episode_operator.runtime.sandbox_protocol import JobState


@dataclass(frozen=True)
class Consequence:
    """What an agent failure does to the episode: an outage, an ungraded end, or nothing (measured)."""

    outage: OutageKind | None = None
    ungraded: FailureKind | None = None

    @property
    def measured(self) -> bool:
        return self.outage is None and self.ungraded is None


MEASURED: Final = Consequence()

#: The outage a retried failure is, and the failure kind a failed one ends the episode with.
OUTAGES: Final[Mapping[AgentFailure, OutageKind]] = MappingProxyType(
    {
        "model_auth": "agent_model_auth",
        "model_not_found": "agent_model_not_found",
        "model_rate_limit": "model_rate_limit",
        "model_unavailable": "model_unavailable",
        "context_window": "agent_context_window",
        "timeout": "agent_timeout",
        "exited": "agent_exited",
    }
)
UNGRADED: Final[Mapping[AgentFailure, FailureKind]] = MappingProxyType(
    {
        "model_auth": FAILURE_MODEL_AUTH,
        "model_not_found": FAILURE_MODEL_NOT_FOUND,
        "model_rate_limit": "agent:model_rate_limit",
        "model_unavailable": "agent:model_unavailable",
        "context_window": "agent:context_window",
        "timeout": "agent:timeout",
        "exited": "agent:exited",
    }
)


def consequence(failure: AgentFailure, policy: Mapping[AgentFailure, AgentOutcome]) -> Consequence:
    """What ``failure`` does under ``policy`` (spec.harbor.agentOutcomePolicy; a failure it does not name
    does what the seed's rules say: ``DEFAULT_AGENT_OUTCOMES``)."""
    outcome = policy.get(failure, DEFAULT_AGENT_OUTCOMES[failure])
    if outcome == "retry":
        return Consequence(outage=OUTAGES[failure])
    if outcome == "fail":
        return Consequence(ungraded=UNGRADED[failure])
    return MEASURED


#: A failed call's ``error_category`` (Gym's) → the failure it shows; None: it says nothing of the endpoint.
CATEGORY_FAILURES: Final[dict[ErrorCategory, AgentFailure | None]] = {
    "auth": "model_auth",
    "not_found": "model_not_found",
    "rate_limit": "model_rate_limit",
    "timeout": "model_unavailable",
    "connection": "model_unavailable",
    "upstream_error": "model_unavailable",
    "exception": "model_unavailable",
    "incomplete": "model_unavailable",
    "stream_truncated": "model_unavailable",
    "capture_parse_error": "model_unavailable",
    "client_error": None,  # a 4xx the harness caused; a context-window refusal is told by its body
    "cancelled": None,  # the agent went away (e.g. killed at its budget): see _never_answered
}

# How endpoints word a context-window refusal (OpenAI, vLLM, Anthropic, LiteLLM).
CONTEXT_WINDOW = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context window|prompt is too long|"
    r"too many tokens|exceeds the (?:model'?s? )?(?:max(?:imum)? )?(?:context|input)",
    re.IGNORECASE,
)


def classify(
    state: JobState,
    calls: Sequence[CapturedCall],
    output: bytes,
    patterns: Sequence[tuple[re.Pattern[str], AgentFailure]] = (),
) -> AgentFailure | None:
    """How the turn's agent failed, or None when it did not.

    The turn's last model call decides when it failed (the agent ended on it, whatever its exit
    code); a call the agent abandoned while the endpoint had not answered at all means the
    endpoint hung -- unless, while it waited, another call of the turn was answered with a
    failure: the agent ended on that answer and dropped the call still in flight (opencode's
    title request, cut off when it exits on a 401; a CI run graded such a refused key as a hang).
    Otherwise a succeeded agent did not fail; a failed one is told apart by its output
    (``patterns``, the preset's), else by how it ended.
    """
    ended = sorted(calls, key=lambda call: call.completed_at)
    if ended:
        last = ended[-1]
        failure = _failure_of(last)
        if failure == "model_unavailable" and last.error_category == "cancelled":
            meanwhile = [_failure_of(call) for call in ended[:-1] if call.completed_at >= last.started_at]
            failure = next((answer for answer in reversed(meanwhile) if answer is not None), failure)
        if failure is not None:
            return failure
    if state.succeeded:
        return None
    text = output.decode("utf-8", "replace")
    if CONTEXT_WINDOW.search(text):
        return "context_window"
    for pattern, failure in patterns:
        if pattern.search(text):
            return failure
    return "timeout" if state.timed_out else "exited"


def _failure_of(call: CapturedCall) -> AgentFailure | None:
    if call.error_category is None:
        return None
    if call.error_category == "cancelled":
        return "model_unavailable" if _never_answered(call) else None
    if call.error_category == "client_error" and CONTEXT_WINDOW.search(_body(call)):
        return "context_window"
    return CATEGORY_FAILURES[call.error_category]


def _never_answered(call: CapturedCall) -> bool:
    """The agent gave up on a call the endpoint never began to answer (no status, no first byte)."""
    return call.upstream_status_code is None and call.latency_ttft_ms is None


def _body(call: CapturedCall) -> str:
    if call.response is not None:
        return str(call.response)
    return call.response_raw or ""
