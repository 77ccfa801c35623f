"""Property-based bad input: whatever a task folder or an Episode spec holds, the answer is a
clear refusal or a plan — never an exception, never a hang.

Hypothesis generates task.toml documents from the real key vocabulary with wrong types,
NaN and infinity, odd nesting; folder trees with escaping paths, non-UTF-8 names, deep
nesting and big files; tar streams of random bytes; and Episode specs of any shape.
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import os
import tarfile
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeSpec, EpisodeStatus
from episode_operator.kube.driver import DriverSettings, drive_episode
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.taskfolder import SourceLimits, TaskFiles, resolve_plan, validate_task

KEYS = [
    "version",
    "schema_version",
    "source",
    "multi_step_reward_strategy",
    "multi_step_reward_mode",
    "artifacts",
    "steps",
    "task",
    "metadata",
    "agent",
    "verifier",
    "environment",
    "solution",
    "name",
    "timeout_sec",
    "user",
    "env",
    "environment_mode",
    "collect",
    "command",
    "service",
    "docker_image",
    "image",
    "memory",
    "memory_mb",
    "storage",
    "cpus",
    "gpus",
    "os",
    "network_mode",
    "allowed_hosts",
    "allow_internet",
    "workdir",
    "healthcheck",
    "retries",
    "interval_sec",
    "start_period_sec",
    "min_reward",
    "source",
    "destination",
    "exclude",
    "mcp_servers",
    "transport",
    "url",
    "tpu",
    "topology",
    "build_timeout_sec",
    "unknown_key",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "shared",
            "separate",
            "mean",
            "final",
            "linux",
            "windows",
            "public",
            "no-network",
            "allowlist",
            "/app",
            "../x",
            "2G",
            "512",
            "org/name",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25,
)
DOCUMENTS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def toml_text(document: dict[str, Any]) -> str | None:
    """TOML for ``document`` (None-free: TOML has no null), or None when it cannot be written."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [clean(v) for v in value if v is not None]
        return value

    try:
        return tomli_w.dumps(clean(document))
    except (TypeError, ValueError):
        return None


def answers_cleanly(files: TaskFiles) -> None:
    result = validate_task(files)
    for problem in [*result.problems, *result.warnings]:
        assert problem.file and problem.message and "Traceback" not in problem.message
    if result.task is not None:
        plan = resolve_plan(result.task)
        assert plan.turns and math.isfinite(plan.deadline_sec)


@FAST
@given(DOCUMENTS, st.sampled_from(["", "single", "steps"]))
def test_any_task_toml_is_answered(document: dict[str, Any], layout: str) -> None:
    text = toml_text(document)
    if text is None:
        return
    files: dict[str, str] = {"task.toml": text}
    if layout == "single":
        files |= {"instruction.md": "x", "tests/test.sh": "true"}
    elif layout == "steps":
        for step in document.get("steps", []) if isinstance(document.get("steps"), list) else []:
            if isinstance(step, dict) and isinstance(step.get("name"), str) and step["name"]:
                files[f"steps/{step['name']}/instruction.md"] = "x"
        files["tests/test.sh"] = "true"
    answers_cleanly(TaskFiles.from_mapping(files))


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_as_task_toml_or_tar(data: bytes) -> None:
    answers_cleanly(TaskFiles.from_mapping({"task.toml": data}))
    answers_cleanly(TaskFiles.from_tar(data))


PATH_PARTS = st.sampled_from(
    [
        "a",
        "..",
        ".",
        "",
        "tests",
        "steps",
        "x y",
        "é",
        "task.toml",
        "instruction.md",
        "test.sh",
        "/",
        "\\",
        "\x00",
        "deep",
    ]
)


@FAST
@given(
    st.dictionaries(st.lists(PATH_PARTS, min_size=1, max_size=12).map("/".join), st.binary(max_size=64), max_size=12)
)
def test_odd_file_trees(mapping: dict[str, bytes]) -> None:
    answers_cleanly(TaskFiles.from_mapping(mapping, limits=SourceLimits(max_depth=8)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=12), st.integers(0, 3000)), min_size=1, max_size=6))
def test_odd_trees_on_disk_and_in_tars(entries: list[tuple[bytes, int]]) -> None:
    """Non-UTF-8 names, symlinks and sizes past a limit, from a real directory and its tar."""
    import tempfile

    with tempfile.TemporaryDirectory() as temporary:
        root = os.fsencode(temporary)
        for number, (name, size) in enumerate(entries):
            safe = name.replace(b"/", b"_").replace(b"\x00", b"_") or b"_"
            if safe in (b".", b".."):
                safe = b"_" + safe
            path = os.path.join(root, safe)
            if os.path.lexists(path):
                continue
            if number % 3 == 2:
                os.symlink(b"../../etc/passwd" if number % 2 else b"task.toml", path)
            else:
                with open(path, "wb") as handle:
                    handle.write(b"x" * size)
        limits = SourceLimits(max_total_bytes=4000)
        answers_cleanly(TaskFiles.from_directory(temporary, limits=limits))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(temporary, arcname=".")
        answers_cleanly(TaskFiles.from_tar(buffer.getvalue(), limits=limits))


SPEC_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "task",
                    "inline",
                    "files",
                    "configMap",
                    "name",
                    "key",
                    "agent",
                    "kind",
                    "command",
                    "env",
                    "envFrom",
                    "image",
                    "timeoutMultiplier",
                    "retries",
                    "outages",
                    "suspend",
                    "resources",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=20,
)


class RecordingClient:
    """Stands in for the API where the driver refuses before any pod: it only writes status and events."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.event_recorder = EventRecorder(self.create_event)

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.statuses.append(status)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        pass


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["task", "agent", "image", "timeoutMultiplier", "retries", "suspend", "x"]),
        SPEC_VALUES,
        max_size=6,
    )
)
def test_any_episode_spec_is_answered(spec: dict[str, Any]) -> None:
    try:
        EpisodeSpec.model_validate(spec)
    except ValidationError:
        pass  # the only way a spec may be refused; it must end Failed through the operator's own path
    else:
        return  # a valid spec would go on to read its task (the cluster tests cover that)
    client = RecordingClient()
    body = {"metadata": {"name": "e", "namespace": "ns", "uid": "u"}, "spec": spec}
    driver_settings = DriverSettings(store=BlobStore.memory())
    status = asyncio.run(drive_episode(client, body, driver_settings, logging.getLogger("test")))  # type: ignore[arg-type]
    assert isinstance(status, EpisodeStatus)
    assert (status.phase, status.outcome, status.failure_kind) == ("Failed", "TerminalFailure", "episode:invalid_spec")
    assert status.message and status.message.startswith("invalid spec: spec.")
    assert client.statuses and client.statuses[-1]["phase"] == "Failed"
