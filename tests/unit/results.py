"""An evaluation as the operator leaves it, for ``kubectl episode view``'s tests: an EpisodeSet whose
status the set controller's own planner computed, its child Episodes (statuses of the API's models),
and what the store keeps of one hostile child (logs, artifacts, model calls, an ATIF trajectory built
from them), written through the store's own API.

The hostile child is what an attacker would put in front of the page: its agent printed HTML, its
model answered with a script, it left an artifact whose file name is markup and whose content is a
page, and its turn's message carries markup too. None of it may run, or be shown as anything but text.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.episodeset_resource import (
    CREATED_AT_ANNOTATION,
    SET_KIND,
    SET_TASK_NAME_ANNOTATION,
    EpisodeSetSpec,
    EpisodeSetStatus,
    SetTaskStatus,
)
from episode_operator.api.vocabulary import API_VERSION, SET_ATTEMPT_LABEL, SET_LABEL, SET_TASK_INDEX_LABEL
from episode_operator.capture.atif import trajectory_from_calls
from episode_operator.capture.records import CapturedCall
from episode_operator.kube.objects.children import child_name
from episode_operator.runtime.archive import tar_bytes
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.evaluation import ChildView, definition_digest, plan_set
from episode_operator.runtime.sandbox_protocol import ArchiveFile
from tests.unit.conversations import INSTRUCTION, SYSTEM, captured
from tests.unit.test_store import MANIFEST

NAMESPACE = "evals"
SET_NAME = "nightly"
THRESHOLD = 1.0
ATTEMPTS = 2
CREATED = "2026-01-02T03:04:05Z"
FINISHED = "2026-01-02T03:09:05Z"

# What an attacker writes where the page shows it.
SCRIPT = '<script>document.body.setAttribute("data-pwned", "script")</script>'
IMAGE = "<img src=x onerror=\"document.body.setAttribute('data-pwned', 'img')\">"
HOSTILE_TASK = '<b>task</b><script>document.title="pwned"</script>'
HOSTILE_ANSWER = f"Here is my answer: {SCRIPT} and {IMAGE}"
HOSTILE_LOG = f"agent output </pre>{SCRIPT}<pre>\n"
HOSTILE_ARTIFACT = '<img src=x onerror=alert(1)>"quoted".html'
HOSTILE_ARTIFACT_CONTENT = b"<html><body><script>alert(document.cookie)</script></body></html>"
HOSTILE_MESSAGE = f"test.sh said {IMAGE}"
HOSTILE_TEXTS = (HOSTILE_TASK, HOSTILE_ANSWER, HOSTILE_LOG.rstrip("\n"), HOSTILE_ARTIFACT, HOSTILE_MESSAGE)
TURN = "01-make"

# (task name, [(outcome, reward, failure kind) per attempt]): a task always solved, a flaky one, one of
# partial credit, the hostile one (an outage, then a measured 0), and one the operator refused.
TASKS: list[tuple[str, list[tuple[str, float | None, str | None]]]] = [
    ("solved", [("Graded", 1.0, None), ("Graded", 1.0, None)]),
    ("flaky", [("Graded", 1.0, None), ("Graded", 0.0, None)]),
    ("partial", [("Graded", 0.5, None), ("Graded", 0.5, None)]),
    (HOSTILE_TASK, [("Ungraded", None, "outage:image_pull"), ("Graded", 0.0, "agent:exited")]),
    ("refused", [("TerminalFailure", None, "harbor:invalid_task"), ("TerminalFailure", None, "harbor:invalid_task")]),
]
HOSTILE_INDEX = 3
HOSTILE_CHILD = child_name(SET_NAME, HOSTILE_INDEX, 2)


def set_spec() -> EpisodeSetSpec:
    return EpisodeSetSpec.model_validate(
        {
            "dataset": {
                "tasks": [{"name": name, "configMap": {"name": f"task-{i}"}} for i, (name, _) in enumerate(TASKS)]
            },
            "agent": {
                "kind": "command",
                "command": "my-agent",
                "model": {"name": "policy", "baseURL": "http://m:8000/v1"},
            },
            "attempts": ATTEMPTS,
            "parallelism": 4,
            "successThreshold": THRESHOLD,
        }
    )


def child_views() -> list[ChildView]:
    return [
        ChildView(
            index=index,
            attempt=attempt,
            name=child_name(SET_NAME, index, attempt),
            phase="Succeeded" if outcome == "Graded" else "Failed",
            outcome=outcome,  # type: ignore[arg-type]
            reward=reward,
            failure_kind=kind,
            created_at=CREATED,
            finished_at=FINISHED,
        )
        for index, (_name, attempts) in enumerate(TASKS)
        for attempt, (outcome, reward, kind) in enumerate(attempts, start=1)
    ]


def set_status() -> EpisodeSetStatus:
    """The set's status as its controller writes it once every child has finished."""
    spec = set_spec()
    definition = definition_digest(spec.model_dump(mode="json", by_alias=True))
    previous = EpisodeSetStatus(
        phase="Running",
        definition=definition,
        start_time=CREATED,
        tasks=[SetTaskStatus(index=index, name=name) for index, (name, _) in enumerate(TASKS)],
    )
    return plan_set(spec, previous, child_views(), definition=definition, now=FINISHED).status


def set_object() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": SET_KIND,
        "metadata": {"name": SET_NAME, "namespace": NAMESPACE, "uid": "set-uid"},
        "spec": set_spec().model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": set_status().model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def child_status(view: ChildView) -> EpisodeStatus:
    turn: dict[str, Any] = {"name": TURN, "phase": "Succeeded" if view.outcome == "Graded" else "Failed"}
    if view.outcome == "Graded":
        turn |= {"reward": view.reward, "rewardValid": True, "verifierRewards": {"reward": view.reward}}
    if view.name == HOSTILE_CHILD:
        turn |= {"agentExitCode": 1, "agentFailure": "exited", "message": HOSTILE_MESSAGE}
    return EpisodeStatus.model_validate(
        {
            "phase": view.phase,
            "outcome": view.outcome,
            "reward": view.reward,
            "failureKind": view.failure_kind,
            "attempt": 1,
            "attempts": [{"number": 1, "startedAt": CREATED, "finishedAt": FINISHED}],
            "turns": [turn],
            "task": {"steps": 1, "name": TASKS[view.index][0]},
            "startedAt": CREATED,
            "finishedAt": FINISHED,
        }
    )


def child_objects() -> list[dict[str, Any]]:
    """The set's children as the API server lists them."""
    spec = set_spec()
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Episode",
            "metadata": {
                "name": view.name,
                "namespace": NAMESPACE,
                "uid": f"uid-{view.index}-{view.attempt}",
                "creationTimestamp": CREATED,
                "labels": {
                    SET_LABEL: SET_NAME,
                    SET_TASK_INDEX_LABEL: str(view.index),
                    SET_ATTEMPT_LABEL: str(view.attempt),
                },
                "annotations": {SET_TASK_NAME_ANNOTATION: TASKS[view.index][0], CREATED_AT_ANNOTATION: CREATED},
            },
            "spec": {"task": {"configMap": {"name": f"task-{view.index}"}}, "agent": spec.agent.to_api()},
            "status": child_status(view).model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        for view in child_views()
    ]


def hostile_calls() -> list[CapturedCall]:
    """The hostile child's one model call: a chat completion whose answer is markup and a script."""
    request = {
        "model": "policy",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": INSTRUCTION}],
    }
    response = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": HOSTILE_ANSWER,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"command": f"echo '{SCRIPT}'"})},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
    }
    return [captured("chat-hostile", "chat", request, response, 0, turn=TURN)]


def hostile_records() -> dict[str, Any]:
    """The hostile child's turn records as the store serves them (``turn_records``, the data API's ``turns``)."""
    calls = hostile_calls()
    trajectory = trajectory_from_calls(calls, agent_name="command", agent_version="unknown")
    assert trajectory is not None
    return {
        "attempt": 1,
        "turns": {
            TURN: {
                "instruction.md": f"{INSTRUCTION}\n{SCRIPT}\n",
                "model-calls.jsonl": "".join(call.model_dump_json() + "\n" for call in calls),
                "trajectory.json": json.dumps(trajectory.to_json_dict()),
            }
        },
    }


HOSTILE_LOGS = {"seed": "seeded\n", TURN: HOSTILE_LOG + "0 tests passed\n"}
ARTIFACTS = {f"out/{HOSTILE_ARTIFACT}": HOSTILE_ARTIFACT_CONTENT, "out/result.txt": b"42\n"}


@dataclass(frozen=True)
class Kept:
    """Where the store of the test keeps its Episodes' data."""

    data_dir: Path
    store: BlobStore


def keep_hostile_child(data_dir: Path) -> Kept:
    """The hostile child's logs, artifacts and records, written through the store as the runner writes them."""
    store = BlobStore.local(data_dir)
    blobs = store.episode(NAMESPACE, HOSTILE_CHILD, f"uid-{HOSTILE_INDEX}-2")

    async def write() -> None:
        await blobs.save_log(1, "seed", "setup", b"seeded\n")
        await blobs.save_log(1, TURN, "agent", HOSTILE_LOG.encode())
        await blobs.save_log(1, TURN, "verifier", b"0 tests passed\n")
        archive = ArchiveFile.of_bytes(
            tar_bytes([(f"app/{path}", content, 0o644) for path, content in ARTIFACTS.items()])
        )
        try:
            await blobs.save_artifact(1, TURN, 0, archive)
        finally:
            archive.discard()
        await blobs.save_manifest(1, TURN, MANIFEST)
        for name, text in hostile_records()["turns"][TURN].items():
            await blobs.save_file(1, TURN, name, text.encode())

    asyncio.run(write())
    return Kept(data_dir, store)
