"""hack/cluster's image cache: an image is rebuilt when what it is built from changes, and only then."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import REPO
from tests.unit.test_release import load_script

REGISTRY = Path("operator/episode_operator/runtime/agents/harness_registry.py")


def keys(cluster: object) -> dict[str, str]:
    """The keys of the images whose inputs are files of the checkout. (An image with a `prepare` step
    hashes what that step makes outside the checkout, e.g. the operator's wheel: not there before the
    first `hack/cluster images` of a machine.)"""
    specs = [*cluster.IMAGES.values(), *cluster.toolchain_image_specs()]  # type: ignore[attr-defined]
    return {spec.name: spec.key() for spec in specs if not spec.prepare}


def checkout(tmp_path: Path) -> Path:
    """What the image keys are computed from, copied elsewhere: hack/ and the harness registry."""
    elsewhere = tmp_path / "checkout"
    shutil.copytree(REPO / "hack", elsewhere / "hack")
    (elsewhere / REGISTRY).parent.mkdir(parents=True)
    shutil.copy2(REPO / REGISTRY, elsewhere / REGISTRY)
    return elsewhere


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path} no longer has {old!r} once"
    path.write_text(text.replace(old, new))


def changed_images(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if after[name] != before[name]}


def test_a_checkout_elsewhere_reuses_the_image_cache(tmp_path: Path) -> None:
    """The same files in another checkout (a worktree, a CI clone) give the same cache keys; a changed
    input changes its image's key alone. (A key of the inputs' absolute paths rebuilt every
    toolchain, minutes each, in every other checkout.)"""
    here = keys(load_script("cluster"))
    assert any("toolchain-" in name for name in here), here
    elsewhere = checkout(tmp_path)
    moved = keys(load_script("cluster", root=elsewhere))
    assert moved == here
    lock = next((elsewhere / "hack" / "toolchains").glob("mini-swe-agent-*.txt"))
    lock.write_text(lock.read_text() + "# changed\n")
    changed = keys(load_script("cluster", root=elsewhere))
    assert changed_images(here, changed) == {name for name in here if "toolchain-mini-swe-agent" in name}


def test_a_harness_registry_entry_keys_its_own_toolchain_image_alone(tmp_path: Path) -> None:
    """The registry holds every harness, but a toolchain image is keyed by its own entry's toolchain
    part: what one harness is built from rebuilds that harness's image, and a change to an entry's
    other fields (its docs row) rebuilds none."""
    elsewhere = checkout(tmp_path)
    before = keys(load_script("cluster", root=elsewhere))
    registry = elsewhere / REGISTRY
    edit(registry, 'debian=("libc6", "libgcc-s1", "bash"),', 'debian=("libc6", "libgcc-s1", "bash", "zsh"),')
    rebuilt = keys(load_script("cluster", root=elsewhere))
    assert changed_images(before, rebuilt) == {name for name in before if "toolchain-claude-code" in name}
    edit(registry, 'origin="npm `@openai/codex`",', 'origin="npm `@openai/codex` (platform package)",')
    assert keys(load_script("cluster", root=elsewhere)) == rebuilt


def test_hack_toolchains_code_keys_the_images_it_builds_and_no_other(tmp_path: Path) -> None:
    """A toolchain image is keyed by the part of hack/toolchain that builds it: one harness's assembler
    changed rebuilds that image alone (rebuilding all eleven cost CI about ten minutes), a helper two
    harnesses call rebuilds those two, the code every build runs rebuilds every toolchain, and a comment
    between definitions rebuilds none."""
    elsewhere = checkout(tmp_path)
    script = elsewhere / "hack" / "toolchain"
    toolchains = {name for name in keys(load_script("cluster", root=elsewhere)) if "toolchain-" in name}
    before = keys(load_script("cluster", root=elsewhere))
    edit(
        script, '    """codex\'s npm platform package as it lays', '    """codex\'s own npm platform package as it lays'
    )
    after_codex = keys(load_script("cluster", root=elsewhere))
    assert changed_images(before, after_codex) == {name for name in toolchains if "toolchain-codex" in name}
    edit(
        script,
        "def bundle_shell(tree: Path, rootfs: Path) -> None:\n",
        "def bundle_shell(tree: Path, rootfs: Path) -> None:\n    pass\n",
    )
    after_shell = keys(load_script("cluster", root=elsewhere))
    assert changed_images(after_codex, after_shell) == {
        name for name in toolchains if any(f"toolchain-{h}:" in name for h in ("qwen-code", "hermes"))
    }
    edit(script, "def bundle(tree: Path,", "# a comment between definitions\n\n\ndef bundle(tree: Path,")
    assert keys(load_script("cluster", root=elsewhere)) == after_shell
    edit(script, '    """Copy every shared library the tree', '    """Copy each shared library the tree')
    after_bundle = keys(load_script("cluster", root=elsewhere))
    assert changed_images(after_shell, after_bundle) == toolchains
    edit(
        script,
        '    """Write the toolchain image\'s root filesystem',
        '    """Write a toolchain image\'s root filesystem',
    )
    assert changed_images(after_bundle, keys(load_script("cluster", root=elsewhere))) == toolchains


def test_the_toolchain_images_install_where_the_operator_looks() -> None:
    """hack/toolchain imports nothing of the operator's package, so it spells the toolchains' root
    itself: it must be the folder the agent pod's toolchain volumes mount (runtime/agents/model.py)."""
    from episode_operator.runtime.agents.model import TOOLCHAINS

    assert load_script("toolchain").TOOLCHAIN_ROOT == TOOLCHAINS


def test_the_pause_image_keeps_alive_as_the_sandbox_containers_do() -> None:
    """hack/cluster spells the keep-alive loop itself (it imports nothing of the operator's): it must
    be the loop the operator's sandbox containers run (runtime/sandbox_protocol.py)."""
    from episode_operator.runtime.sandbox_protocol import KEEP_ALIVE

    assert KEEP_ALIVE[:2] == ("sh", "-c")
    assert KEEP_ALIVE[2] == load_script("cluster").KEEP_ALIVE_SCRIPT
