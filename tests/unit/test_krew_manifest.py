"""The krew plugin manifest (plugins/krew/episode.yaml): rendered as krew-release-bot renders it at a
release tag, it is a krew ``v1alpha2`` ``Plugin`` that krew's own validation rules accept, for Linux
and macOS on amd64 and arm64, and it names the command this package installs."""

from __future__ import annotations

import hashlib
import re
import tomllib
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

MANIFEST = REPO / "plugins" / "krew" / "episode.yaml"
PLATFORMS = {("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")}
TAG = "v0.1.0"
ADD_URI_AND_SHA = re.compile(r'\{\{\s*addURIAndSha\s+"(?P<uri>[^"]+)"\s+\.TagName\s*\}\}')
TAG_NAME = re.compile(r"\{\{\s*\.TagName\s*\}\}")
# krew's rules (sigs.k8s.io/krew internal/index/validation): a safe name, semver with a leading v, a
# one-line short description, and per platform a uri, a lowercase sha256, a bin, from/to file
# operations and a selector on os and arch only.
SAFE_NAME = re.compile(r"^[\w-]+$")
SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
SHA256 = re.compile(r"^[a-f0-9]{64}$")


def render(template: str, tag: str) -> str:
    """krew-release-bot's two template calls: the tag, and an archive's ``uri`` and ``sha256`` (here the
    digest of the URI stands in for the archive's)."""

    def uri_and_sha(match: re.Match[str]) -> str:
        uri = TAG_NAME.sub(tag, match["uri"])
        return f"uri: {uri}\n    sha256: {hashlib.sha256(uri.encode()).hexdigest()}"

    return TAG_NAME.sub(tag, ADD_URI_AND_SHA.sub(uri_and_sha, template))


def krew_problems(plugin: dict[str, Any], filename: str) -> list[str]:
    """What krew's validation would refuse in a plugin manifest stored as ``filename``."""
    problems = []
    name = plugin.get("metadata", {}).get("name", "")
    spec = plugin.get("spec") or {}
    if plugin.get("apiVersion") != "krew.googlecontainertools.github.com/v1alpha2":
        problems.append(f"apiVersion {plugin.get('apiVersion')}")
    if plugin.get("kind") != "Plugin":
        problems.append(f"kind {plugin.get('kind')}")
    if not SAFE_NAME.match(name) or filename != f"{name}.yaml":
        problems.append(f"name {name!r} in {filename}")
    short = spec.get("shortDescription") or ""
    if not short or "\n" in short or "\r" in short:
        problems.append("shortDescription")
    if not SEMVER.match(str(spec.get("version", ""))):
        problems.append(f"version {spec.get('version')!r}")
    if not spec.get("platforms"):
        problems.append("no platforms")
    for platform in spec.get("platforms") or []:
        if not platform.get("uri") or not platform.get("bin"):
            problems.append(f"uri/bin of {platform}")
        if not SHA256.match(str(platform.get("sha256", ""))):
            problems.append(f"sha256 of {platform.get('uri')}")
        files = platform.get("files")
        if files is not None and (not files or any(not f.get("from") or not f.get("to") for f in files)):
            problems.append(f"files of {platform.get('uri')}")
        labels = (platform.get("selector") or {}).get("matchLabels") or {}
        if not labels or set(labels) - {"os", "arch"}:
            problems.append(f"selector of {platform.get('uri')}")
    return problems


def rendered() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(render(MANIFEST.read_text(), TAG))
    return document


def test_the_rendered_manifest_passes_krews_validation() -> None:
    assert krew_problems(rendered(), MANIFEST.name) == []


def test_it_serves_linux_and_macos_on_amd64_and_arm64() -> None:
    platforms = rendered()["spec"]["platforms"]
    selected = [(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"]) for p in platforms]
    assert sorted(selected) == sorted(PLATFORMS)
    for (os_name, arch), platform in zip(selected, platforms, strict=True):
        # Each platform downloads its own archive of this release.
        assert platform["uri"].endswith(f"/releases/download/{TAG}/kubectl-episode_{TAG}_{os_name}_{arch}.tar.gz")


def test_the_plugin_is_the_command_this_package_installs() -> None:
    """``kubectl episode`` runs the ``kubectl-episode`` executable: the name, bin and script agree."""
    plugin = rendered()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert f"kubectl-{plugin['metadata']['name']}" in scripts
    assert {p["bin"] for p in plugin["spec"]["platforms"]} == {f"kubectl-{plugin['metadata']['name']}"}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda p: p["spec"].update(version="0.1.0"), "version '0.1.0'"),
        (lambda p: p["spec"]["platforms"][0].update(sha256="ABC"), "sha256 of"),
        (lambda p: p["spec"]["platforms"][0]["selector"]["matchLabels"].update(distro="debian"), "selector of"),
        (lambda p: p["spec"].update(shortDescription="two\nlines"), "shortDescription"),
        (lambda p: p["metadata"].update(name="epi"), "name 'epi' in episode.yaml"),
    ],
)
def test_the_check_refuses_what_krew_refuses(change: Any, problem: str) -> None:
    plugin = rendered()
    change(plugin)
    assert any(problem in found for found in krew_problems(plugin, MANIFEST.name))
