"""The release: the workflow that builds and pushes the images and the chart, and what it must agree with.

The workflow is checked against GitHub's published workflow schema (check-jsonschema ships it, so
no network is needed), then for what a release promises: every image of ``hack/images matrix`` for
amd64 and arm64 with an SBOM and a keyless signature, the chart pushed as an OCI artifact and
signed, under the names the chart's defaults pull.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.chart import CHART
from tests.conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def load_script(name: str, root: Path = REPO) -> ModuleType:
    loader = SourceFileLoader(f"hack_{name}", str(root / "hack" / name))
    spec = importlib.util.spec_from_loader(f"hack_{name}", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def lint_workflow(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def workflow() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def steps(job: str) -> list[dict[str, Any]]:
    return list(workflow()["jobs"][job]["steps"])


def test_the_workflow_is_valid_for_github(tmp_path: Path) -> None:
    result = lint_workflow(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    # The check can fail: a misspelled key is refused.
    broken = tmp_path / "release.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on:", "run-on:", 1))
    assert lint_workflow(broken).returncode != 0


def test_every_image_is_built_for_two_platforms_with_an_sbom_and_signed() -> None:
    image = workflow()["jobs"]["image"]
    assert image["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert any(
        step.get("run") == 'echo "matrix=$(python3 hack/images matrix)" >> "$GITHUB_OUTPUT"' for step in steps("plan")
    )
    assert image["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    (build,) = [s for s in steps("image") if str(s.get("uses", "")).startswith("docker/build-push-action@")]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["push"] is True and build["with"]["sbom"] is True
    assert build["with"]["provenance"] == "mode=max"
    assert (build["with"]["file"], build["with"]["context"]) == ("${{ matrix.dockerfile }}", "${{ matrix.context }}")
    assert any(str(s.get("uses", "")).startswith("docker/setup-qemu-action@") for s in steps("image"))
    signs = [s["run"] for s in steps("image") if "cosign sign" in str(s.get("run", ""))]
    assert signs == ['cosign sign --yes "${IMAGE}@${DIGEST}"']  # the pushed digest, not a tag
    assert image["env"]["IMAGE"] == "${{ needs.plan.outputs.registry }}/${{ matrix.name }}"


def test_the_chart_is_pushed_as_an_oci_artifact_and_signed() -> None:
    scripts = "\n".join(str(s.get("run", "")) for s in steps("chart"))
    assert 'helm package helm/episode-operator --version "$VERSION" --app-version "$VERSION"' in scripts
    assert 'helm push "dist/episode-operator-${VERSION}.tgz" "oci://${REGISTRY}/charts"' in scripts
    assert 'cosign sign --yes "${REGISTRY}/charts/episode-operator@${DIGEST}"' in scripts
    assert workflow()["jobs"]["chart"]["needs"] == ["plan", "image"]  # never a chart whose images are missing


def test_the_released_names_are_the_charts_defaults() -> None:
    """ghcr.io/<owner>/<image>: the chart pulls what the workflow pushes when <owner> is the project's."""
    matrix = json.loads(
        subprocess.run([str(REPO / "hack" / "images"), "matrix"], capture_output=True, text=True, check=True).stdout
    )
    names = [row["name"] for row in matrix["include"]]
    assert names[0] == "episode-operator" and "sandbox" in names
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    owner = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"].removeprefix("https://github.com/").split("/")[0]
    assert values["image"]["repository"] == f"ghcr.io/{owner}/episode-operator"
    assert values["sandboxImage"]["repository"] == f"ghcr.io/{owner}/sandbox"
    version_step = next(s for s in steps("plan") if s.get("id") == "version")
    assert 'echo "registry=ghcr.io/${OWNER,,}"' in version_step["run"]  # GHCR wants lower case


def test_every_dockerfile_takes_its_base_as_a_build_argument() -> None:
    images = load_script("images")
    for image in images.images().values():
        text = image.dockerfile.read_text()
        base = image.base()
        assert f"FROM ${{{base.build_arg}}}" in text, image.dockerfile
        assert not re.search(r"^FROM (?!\$\{)", text, re.M), f"{image.dockerfile}: a base not given as an argument"
    assert {path.parent.name for path in (REPO / "images").glob("*/Dockerfile")} <= set(images.images())


def test_the_released_sandbox_has_the_test_clusters_packages() -> None:
    cluster = load_script("cluster")
    packages = set(cluster.IMAGES[cluster.SANDBOX_IMAGE].packages)
    dockerfile = (REPO / "images" / "sandbox" / "Dockerfile").read_text()
    installed = re.search(r"--no-install-recommends \\\n\s+(.+?)\n", dockerfile)
    assert installed is not None
    assert set(installed.group(1).split()) - {"\\"} == packages


@pytest.mark.parametrize("name", ["episode-operator", "sandbox"])
def test_build_keys_follow_the_inputs(name: str, tmp_path: Path) -> None:
    images = load_script("images")
    image = images.images()[name]
    assert image.key("base-1") == image.key("base-1")
    assert image.key("base-1") != image.key("base-2")
    assert image.dockerfile in images.files_under(image.inputs)


def test_the_chart_packages_at_the_release_version_with_its_schema(tmp_path: Path) -> None:
    """What the workflow's `helm package --version V --app-version V` makes (Helm's own packager)."""
    import helm_python as helm

    archive = Path(helm.package(CHART, destination=tmp_path, version="1.2.3", app_version="1.2.3"))
    assert archive.name == "episode-operator-1.2.3.tgz"
    with helm.Chart.load_archive(archive.read_bytes()) as chart:
        metadata = chart.metadata
        assert (metadata["version"], metadata["appVersion"]) == ("1.2.3", "1.2.3")
        assert chart.schema, "values.schema.json travels with the chart"
        rendered = chart.render({}, name="episode-operator", namespace="ns")
    deployment = yaml.safe_load(rendered["episode-operator/templates/deployment.yaml"])
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith("/episode-operator:1.2.3")


def test_the_plugin_archives_are_the_ones_the_krew_manifest_names() -> None:
    """hack/plugin runs on one runner per platform of plugins/krew/episode.yaml; its archive name is checked there."""
    manifest = (REPO / "plugins" / "krew" / "episode.yaml").read_text()
    named = set(re.findall(r"kubectl-episode_\{\{ \.TagName \}\}_(\w+)_(\w+)\.tar\.gz", manifest))
    matrix = workflow()["jobs"]["plugin"]["strategy"]["matrix"]["include"]
    assert (
        {(row["os"], row["arch"]) for row in matrix}
        == named
        == {
            ("linux", "amd64"),
            ("linux", "arm64"),
            ("darwin", "amd64"),
            ("darwin", "arm64"),
        }
    )
    build = next(s for s in steps("plugin") if s.get("id") == "build")["run"]
    assert 'archive=$(hack/plugin "$TAG")' in build
    assert 'test "$archive" = "dist/kubectl-episode_${TAG}_${{ matrix.os }}_${{ matrix.arch }}.tar.gz"' in build
    (bot,) = [s for s in steps("krew") if str(s.get("uses", "")).startswith("rajatjindal/krew-release-bot@")]
    assert bot["with"]["krew_template_file"] == "plugins/krew/episode.yaml"
