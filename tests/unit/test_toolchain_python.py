"""hack/toolchain's Python harnesses: wheels for the tree's own Python and glibc, an entry that is a console
script of theirs, and a lock file per entry pinning exactly its harness (docs/harnesses.md, "Building")."""

from __future__ import annotations

from pathlib import Path

import pytest

from episode_operator.runtime.agents.harness_registry import HARNESSES
from tests.unit.test_release import load_script

PYTHON_HARNESSES = [name for name, entry in HARNESSES.items() if "harness" in entry.toolchain.pypi]


def test_a_python_tree_takes_wheels_for_its_own_python_and_its_releases_glibc() -> None:
    toolchain = load_script("toolchain")
    kimi, mini = toolchain.known("kimi-cli"), toolchain.known("mini-swe-agent")
    # kimi-cli needs Python >= 3.12: trixie's CPython 3.13 on trixie's glibc.
    assert (kimi.suite, kimi.python) == ("trixie", "3.13")
    assert {"--python-version=3.13", "--abi=cp313", "--platform=manylinux_2_41_x86_64"} <= set(
        toolchain.pip_target_args(kimi)
    )
    assert {"--python-version=3.11", "--abi=cp311", "--platform=manylinux_2_36_x86_64"} <= set(
        toolchain.pip_target_args(mini)
    )
    assert "--platform=manylinux_2_41_x86_64" not in toolchain.pip_target_args(mini)


def test_the_entry_is_the_installed_console_script_of_its_name(tmp_path: Path) -> None:
    toolchain = load_script("toolchain")
    dist_info = tmp_path / "aider_chat-0.86.2.dist-info"
    dist_info.mkdir()
    (dist_info / "entry_points.txt").write_text(
        "[gui_scripts]\naider = wrong:one\n\n[console_scripts]\naider = aider.main:main\n"
    )
    assert toolchain.console_script(tmp_path, "aider") == ("aider.main", "main")
    with pytest.raises(toolchain.ToolchainError, match="'kimi'"):
        toolchain.console_script(tmp_path, "kimi")


@pytest.mark.parametrize("name", PYTHON_HARNESSES)
def test_each_python_harness_has_its_lock_file_pinning_it_for_its_python(name: str) -> None:
    toolchain = load_script("toolchain").known(name)
    lines = toolchain.lock_file().read_text().splitlines()
    assert f"resolved for CPython {toolchain.python} on" in lines[0]
    pins = [line for line in lines if line and not line.startswith("#")]
    assert toolchain.pypi("harness") in pins
    assert all("==" in pin for pin in pins), "every requirement pinned"
    assert not {pin.split("==")[0].lower() for pin in pins} & set(toolchain.harness.toolchain.lock_excluded)


@pytest.mark.parametrize(
    ("required", "kept"),
    [
        ("httpx==0.28.1", "httpx==0.28.1"),
        ('pyyaml>=6; python_version >= "3.8"', 'pyyaml>=6; python_version >= "3.8"'),
        # The extra the pin names: its requirement without the marker, which no lock resolves.
        ('anthropic==0.87.0; extra == "anthropic"', "anthropic==0.87.0"),
        ("anthropic==0.87.0 ; extra=='anthropic'", "anthropic==0.87.0"),
        # Another extra's, or one the marker ties to more than the extra: left out.
        ('slack-bolt==1.21; extra == "slack"', ""),
        ('pywinpty; extra == "anthropic" and sys_platform == "win32"', ""),
    ],
)
def test_a_lock_keeps_the_requirements_of_the_extras_its_pin_names(required: str, kept: str) -> None:
    """hermes-agent[anthropic] needs the anthropic package: its Requires-Dist says so under the extra."""
    toolchain = load_script("toolchain")
    assert toolchain.requirement_extras("hermes-agent[anthropic]=={version}") == {"anthropic"}
    assert toolchain.requirement_extras("aider-chat==0.86.2") == set()
    assert toolchain.requirement_name("hermes-agent[anthropic]==0.19.0") == "hermes-agent"
    assert toolchain.extra_free(required, {"anthropic"}) == kept
