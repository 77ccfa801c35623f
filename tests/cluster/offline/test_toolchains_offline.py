"""Each toolchain image runs its harness with no libc, no runtime and no network but the model's.

The strictest task image there is: the toolchain image's own root filesystem (a static busybox
and the tree, no glibc, no Python, no Node), chrooted into a network namespace that has only
loopback, where the scripted model server listens. strace records every connect/send of the
harness and its children: the only peer allowed is the model. This is the toolchain's promise
("self-contained, offline") checked without Kubernetes in the way; the cluster tests check the
same harnesses in a sandbox pod, as root; here the harness runs as an unprivileged user, as a
task's agent user may be.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.offline.chroot import (
    INSTRUCTION,
    MARKER,
    foreign_peers,
    give_image_programs,
    prepared_root,
    run_chrooted,
)
from tests.cluster.toolchains import API_KEY, HARNESS_APIS, LOGS, conversation_text
from tests.reference import harbor_trajectory

SCRIPT = {
    "rules": [
        {
            "name": "offline",
            "when": {"prompt": INSTRUCTION, "tools": True},
            # A write, which every harness can make: a command through a shell tool, or an edit (aider).
            "steps": [{"write": MARKER, "content": "offline-ok\n"}, {"finish": "Done."}],
        }
    ]
}
# Harnesses that write an ATIF trajectory of their own, and where under LOGS.
NATIVE_ATIF = {"terminus-2": "terminus-2/trajectory.json"}


@pytest.mark.parametrize("name", sorted(HARNESS_APIS))
def test_toolchain_runs_in_an_empty_root_with_only_the_model_reachable(
    name: str, image_archives: dict[str, Path], netns: str, model_server: Path, tmp_path: Path
) -> None:
    """Each harness with each model API it speaks (NAME: its default; NAME:API: another)."""
    harness = HARNESS_APIS[name]
    trace = tmp_path / "network.strace"
    with prepared_root(image_archives[harness.name], tmp_path) as rootfs:
        give_image_programs(rootfs, harness.preset.entry.image_needs)
        result = run_chrooted(netns, rootfs, harness, trace)
        assert result.returncode == 0, (
            f"{name} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        assert (rootfs / MARKER.lstrip("/")).read_text() == "offline-ok\n"
        # Its own logs where its registry entry says (docs/harnesses.md); Harbor's models read an ATIF one.
        logs = rootfs / LOGS.lstrip("/")
        absent = [pattern for pattern in harness.native_logs if not list(logs.glob(pattern))]
        assert not absent, f"no native log {absent} under {LOGS}: {sorted(map(str, logs.rglob('*')))}"
        if harness.name in NATIVE_ATIF:
            native = json.loads((logs / NATIVE_ATIF[harness.name]).read_text())
            trajectory = harbor_trajectory().model_validate(native)
            assert INSTRUCTION in trajectory.steps[0].message and trajectory.agent.name == "terminus-2"
    records = [json.loads(line) for line in model_server.read_text().splitlines()]
    assert {r["dialect"] for r in records if r.get("dialect")} == {harness.dialect}
    assert {r["api_key"] for r in records} == {API_KEY}
    # The agent's loop (requests that let the model act: no title or summary requests) is the script's, each
    # step asked once, and the conversation goes on: each later request carries more than the first.
    assert [r["step"] for r in records if r["rule"] == "offline"] == harness.loop_steps(2)
    loop = [r for r in records if r.get("action") is not None and r.get("offered")]
    assert [(r["rule"], r["step"]) for r in loop] == [("offline", step) for step in harness.loop_steps(2)]
    first = conversation_text(loop[0])
    assert "offline-ok" not in first and INSTRUCTION in first
    assert all(len(conversation_text(r)) > len(first) for r in loop[1:])
    assert foreign_peers(trace) == [], "the harness reached for something other than the model"
