"""Image references in Docker's normal form, and the operator's mirror rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episode_operator.taskfolder.image_refs import ImageMirrors, InvalidImageReference, parse_image_reference

MIRRORS = ImageMirrors.parse(
    [
        "ubuntu:24.04=registry.internal/library/ubuntu:24.04",
        "docker.io/library/=registry.internal/library/",
        "python=registry.internal/python-mirror",
        "ghcr.io/=ghcr.internal/",
        "index.docker.io/=hub.internal/",
        "ghcr.io/org/=org-mirror.internal/org/",
    ]
)


@pytest.mark.parametrize(
    ("image", "mirrored"),
    [
        ("ubuntu:24.04", "registry.internal/library/ubuntu:24.04"),  # a reference rule
        ("docker.io/library/ubuntu:24.04", "registry.internal/library/ubuntu:24.04"),  # the same, spelled out
        ("index.docker.io/library/ubuntu:24.04", "registry.internal/library/ubuntu:24.04"),
        ("ubuntu:22.04", "registry.internal/library/ubuntu:22.04"),  # the library/ prefix
        ("ubuntu", "registry.internal/library/ubuntu"),
        ("python:3.12-slim", "registry.internal/python-mirror:3.12-slim"),  # a repository rule beats the prefix
        (f"python@sha256:{'a' * 64}", f"registry.internal/python-mirror@sha256:{'a' * 64}"),
        ("myorg/app:1", "hub.internal/myorg/app:1"),  # docker.io/, shorter than docker.io/library/
        ("ghcr.io/org/tool:2", "org-mirror.internal/org/tool:2"),  # the longest prefix wins
        ("ghcr.io/other/tool:2", "ghcr.internal/other/tool:2"),
        ("episode-operator.local/sandbox:bookworm", "episode-operator.local/sandbox:bookworm"),  # untouched
        ("quay.io/x/y", "quay.io/x/y"),
    ],
)
def test_mirrors_apply_the_most_specific_rule(image: str, mirrored: str) -> None:
    assert MIRRORS.apply(image) == mirrored


def test_without_rules_images_pass_through_as_written() -> None:
    assert ImageMirrors().apply("Not A Reference") == "Not A Reference"


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["ubuntu"], "write a mirror as FROM=TO"),
        (["=x"], "write a mirror as FROM=TO"),
        (["docker.io/library/=registry.internal"], "a prefix maps to a prefix"),
        (["ubuntu=mirror/ubuntu:1"], "a repository maps to a repository"),
        (["Ubuntu:1=x:1"], "must be lowercase"),
        (["ubuntu:1=a:1", "docker.io/library/ubuntu:1=b:1"], "mirrored twice"),
        (["bad host!/=x/"], "is not a registry or repository prefix"),
    ],
)
def test_bad_rules_are_refused_clearly(specs: list[str], message: str) -> None:
    with pytest.raises(InvalidImageReference) as raised:
        ImageMirrors.parse(specs)
    assert message in str(raised.value)


def test_mapping_form_and_flags_round_trip() -> None:
    mirrors = ImageMirrors.from_mapping({"docker.io/library/": "registry.internal/library/", "ubuntu:24.04": "u:1"})
    assert mirrors.as_flags() == [
        "docker.io/library/ubuntu:24.04=docker.io/library/u:1",
        "docker.io/library/=registry.internal/library/",
    ]
    assert ImageMirrors.parse(mirrors.as_flags()) == mirrors


def test_references_are_normalised() -> None:
    assert str(parse_image_reference("ubuntu")) == "docker.io/library/ubuntu"
    assert str(parse_image_reference("localhost:5000/a/b:c")) == "localhost:5000/a/b:c"
    with pytest.raises(InvalidImageReference):
        parse_image_reference("")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_is_a_reference_or_a_clear_error(text: str) -> None:
    try:
        mirrored = MIRRORS.apply(text)
    except InvalidImageReference as error:
        assert "is not an image reference" in str(error)
    else:
        assert isinstance(mirrored, str) and mirrored
