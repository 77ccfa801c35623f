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
from tests.cluster.toolchains import API_KEY, HARNESS_APIS

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
    records = [json.loads(line) for line in model_server.read_text().splitlines()]
    assert [r["step"] for r in records if r["rule"] == "offline"] == harness.loop_steps(2)
    assert {r["api_key"] for r in records} == {API_KEY}
    assert foreign_peers(trace) == [], "the harness reached for something other than the model"
