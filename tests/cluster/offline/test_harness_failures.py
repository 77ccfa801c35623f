"""What each harness does when the model fails at once: the records failure classification reads.

docs/harnesses.md tabulates every harness against every failure of the scripted server; the
rows here are the ones that end by themselves within seconds (the others retry for minutes or
wait for ever, and only a turn's deadline ends them). Each row pins the exit status and the
harness's own error record, so a harness upgrade that changes what the operator must parse
fails here, not in a user's rollout. Run like the offline test: the toolchain image's own root,
a network namespace with only the scripted server, an unprivileged user.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cluster.offline.chroot import prepared_root, run_chrooted
from tests.cluster.toolchains import HARNESSES

AUTH = {"rules": [{"name": "auth", "fail": {"status": 401}}]}
RATE_LIMIT = {"rules": [{"name": "rate-limit", "fail": {"status": 429}}]}
CONTEXT_WINDOW = {"rules": [{"name": "context-window", "fail": {"kind": "context_window"}}]}
GARBAGE = {"rules": [{"name": "garbage", "fail": {"kind": "garbage"}}]}

# (harness, script, where the record is, a pattern it must match): every row exits 1 but pi's and aider's
# (FAILED_EXIT).
FAST_FAILURES = [
    ("mini-swe-agent", AUTH, "stderr", r"AuthenticationError: litellm\.AuthenticationError"),
    ("mini-swe-agent", CONTEXT_WINDOW, "stderr", r"ContextWindowExceededError: litellm\.ContextWindowExceededError"),
    ("opencode", AUTH, "event", r'"name": "APIError".*"statusCode": 401'),
    ("opencode", CONTEXT_WINDOW, "event", r'"name": "ContextOverflowError"'),
    ("opencode", GARBAGE, "event", r'"name": "UnknownError".*JSON parsing failed'),
    ("claude-code", CONTEXT_WINDOW, "event", r'"is_error": true.*"api_error_status": 400.*Prompt is too long'),
    ("claude-code", GARBAGE, "event", r'"is_error": true.*API Error: API returned an empty or malformed response'),
    ("codex", AUTH, "event", r'"type": "turn.failed".*401 Unauthorized'),
    ("codex", RATE_LIMIT, "event", r'"type": "turn.failed".*exceeded retry limit, last status: 429'),
    ("codex", CONTEXT_WINDOW, "event", r'"type": "turn.failed".*exceeds the context window'),
    ("codex", GARBAGE, "event", r'"type": "turn.failed".*stream closed before response.completed'),
    # Terminus-2 asks 3 times (its own retry of a call: litellm does not retry a 401), then its traceback.
    ("terminus-2", AUTH, "stderr", r"litellm\.exceptions\.AuthenticationError: litellm\.AuthenticationError"),
    ("qwen-code", AUTH, "event", r'"is_error": true.*"error": \{"message": "\[API Error: 401 Incorrect API key'),
    ("qwen-code", CONTEXT_WINDOW, "event", r'"is_error": true.*"\[API Error: 400 .*maximum context length'),
    ("qwen-code", GARBAGE, "event", r'"is_error": true.*"error": \{"message": "\[API Error: Expected property name'),
    ("pi", AUTH, "event", r'"stopReason": "error".*"errorMessage": "401: .*Incorrect API key'),
    ("pi", RATE_LIMIT, "event", r'"stopReason": "error".*"errorMessage": "429: '),  # after 3 retries, 2+4+8 s apart
    ("pi", CONTEXT_WINDOW, "event", r'"stopReason": "error".*"errorMessage": "400: .*maximum context length'),
    ("pi", GARBAGE, "event", r'"stopReason": "error".*"errorMessage": "Error reading response: malformed server-sent'),
    # kimi-cli and aider: plain text records.
    ("kimi-cli", AUTH, "stdout", r"^Error code: 401 - .*Incorrect API key provided"),
    ("kimi-cli", CONTEXT_WINDOW, "stdout", r"^Error code: 400 - .*maximum context length"),
    ("kimi-cli", GARBAGE, "stdout", r"^Unknown error: Expecting property name"),
    ("aider", AUTH, "stdout", r"litellm\.AuthenticationError: .*Incorrect API key provided"),
    ("aider", CONTEXT_WINDOW, "stdout", r"has hit a token limit!.*possibly exhausted context window"),
]
# A failed run's exit status where it is not 1: pi and aider exit 0 whatever failed (pi's final event
# says it; for aider only its output and the capture's records do).
FAILED_EXIT = {"pi": 0, "aider": 0}
# The event each JSON-speaking harness ends a failed run with.
FINAL_EVENT = {
    "opencode": lambda event: event.get("type") == "error",
    "claude-code": lambda event: event.get("type") == "result",
    "codex": lambda event: event.get("type") == "turn.failed",
    "qwen-code": lambda event: event.get("type") == "result",
    "pi": lambda event: event.get("type") == "message_end" and event["message"].get("stopReason") == "error",
}


def final_event(name: str, stdout: str) -> str:
    """The harness's last failure event on stdout, re-serialized with stable spacing."""
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    matching = [event for event in events if FINAL_EVENT[name](event)]
    assert matching, f"{name} printed no failure event:\n{stdout[-2000:]}"
    return json.dumps(matching[-1])


@pytest.mark.parametrize(
    ("name", "model_server", "where", "pattern"),
    FAST_FAILURES,
    indirect=["model_server"],
    ids=[f"{name}-{script['rules'][0]['name']}" for name, script, _, _ in FAST_FAILURES],
)
def test_a_fast_model_failure_ends_the_harness_with_its_own_error_record(
    name: str,
    where: str,
    pattern: str,
    image_archives: dict[str, Path],
    netns: str,
    model_server: Path,
    tmp_path: Path,
) -> None:
    with prepared_root(image_archives[name], tmp_path) as rootfs:
        result = run_chrooted(netns, rootfs, HARNESSES[name], tmp_path / "network.strace")

    assert result.returncode == FAILED_EXIT.get(name, 1), (
        f"{name} exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    )
    texts = {"stderr": result.stderr, "stdout": result.stdout}
    record = texts[where] if where in texts else final_event(name, result.stdout)
    assert re.search(pattern, " ".join(record.split())), record[-2000:]
