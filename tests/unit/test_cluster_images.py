"""hack/cluster's image cache: an image is rebuilt when what it is built from changes, and only then."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import REPO
from tests.unit.test_release import load_script


def keys(cluster: object) -> dict[str, str]:
    """The keys of the images whose inputs are files of the checkout. (An image with a `prepare` step
    hashes what that step makes outside the checkout, e.g. the operator's wheel: not there before the
    first `hack/cluster images` of a machine.)"""
    specs = [*cluster.IMAGES.values(), *cluster.toolchain_image_specs()]  # type: ignore[attr-defined]
    return {spec.name: spec.key() for spec in specs if not spec.prepare}


def test_a_checkout_elsewhere_reuses_the_image_cache(tmp_path: Path) -> None:
    """The same files in another checkout (a worktree, a CI clone) give the same cache keys; a changed
    input changes its image's key alone. (A key of the inputs' absolute paths rebuilt every
    toolchain, minutes each, in every other checkout.)"""
    here = keys(load_script("cluster"))
    assert any("toolchain-" in name for name in here), here
    elsewhere = tmp_path / "checkout"
    shutil.copytree(REPO / "hack", elsewhere / "hack")
    moved = keys(load_script("cluster", root=elsewhere))
    assert moved == here
    lock = next((elsewhere / "hack" / "toolchains").glob("mini-swe-agent-*.txt"))
    lock.write_text(lock.read_text() + "# changed\n")
    changed = keys(load_script("cluster", root=elsewhere))
    assert {name for name in here if changed[name] != here[name]} == {
        name for name in here if "toolchain-mini-swe-agent" in name
    }


def test_the_toolchain_images_install_where_the_operator_looks() -> None:
    """hack/toolchain imports nothing of the operator's package, so it spells the toolchains' root
    itself: it must be the folder the agent pod's toolchain volumes mount (runtime/agents/model.py)."""
    from episode_operator.runtime.agents.model import TOOLCHAINS

    assert load_script("toolchain").TOOLCHAIN_ROOT == TOOLCHAINS


def test_the_pause_image_keeps_alive_as_the_sandbox_containers_do() -> None:
    """hack/cluster spells the keep-alive loop itself (it imports nothing of the operator's): it must
    be the loop the operator's sandbox containers run (runtime/sandbox.py)."""
    from episode_operator.runtime.sandbox import KEEP_ALIVE

    assert KEEP_ALIVE[:2] == ("sh", "-c")
    assert KEEP_ALIVE[2] == load_script("cluster").KEEP_ALIVE_SCRIPT
