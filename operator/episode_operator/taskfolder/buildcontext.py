"""A Dockerfile and its build context as a content-addressed unit for in-cluster builds (pure).

A Dockerfile replay cannot apply (multi-stage, ``COPY --from``…) or a compose sidecar's
``build:`` is built in the cluster once per distinct context: the context's files, the
Dockerfile (its ``FROM`` images rewritten by the operator's mirrors, since the builder pulls
them too), the build arguments and the target stage are packed reproducibly, and the digest of
that pack names the image. A dataset of 1,000 attempts of one task has one digest, so one build.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field

import dockerfile

from episode_operator.taskfolder.image_refs import ImageMirrors, InvalidImageReference
from episode_operator.taskfolder.sources import TaskFiles
from episode_operator.taskfolder.words import WordError, process_word

# The Dockerfile's name inside a packed context: beside the context's own files, never one of them.
PACKED_DOCKERFILE = ".episode-operator.Dockerfile"


@dataclass(frozen=True)
class BuildSource:
    """What to build: a Dockerfile of the task, its context folder, build arguments and target stage."""

    dockerfile: str
    context: str
    args: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None


@dataclass(frozen=True)
class PackedContext:
    """A build context as a reproducible gzipped tar and the digest that names its image."""

    archive: bytes
    digest: str
    dockerfile_text: str = ""

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")


def pack_build_context(files: TaskFiles, source: BuildSource, mirrors: ImageMirrors | None = None) -> PackedContext:
    """The context folder's files plus the (mirrored) Dockerfile, packed; the digest covers args and target too."""
    text = files[source.dockerfile].data.decode("utf-8", "replace")
    rewritten = mirror_from_lines(text, mirrors or ImageMirrors(), source.args)
    context = source.context.strip("/")
    prefix = f"{context}/" if context else ""
    entries = {path[len(prefix) :]: files[path] for path in files if path.startswith(prefix)}
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for path, entry in sorted(entries.items()):
            _add(archive, path, entry.data, entry.mode)
        _add(archive, PACKED_DOCKERFILE, rewritten.encode(), 0o644)
    data = buffer.getvalue()
    digest = hashlib.sha256(data)
    digest.update(json.dumps({"args": dict(sorted(source.args.items())), "target": source.target}).encode())
    return PackedContext(data, f"sha256:{digest.hexdigest()}", rewritten)


def _add(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode & 0o7777
    archive.addfile(info, io.BytesIO(data))


def mirror_from_lines(text: str, mirrors: ImageMirrors, build_args: Mapping[str, str] | None = None) -> str:
    """``text`` with each ``FROM`` image replaced by its mirror; stage names and unreadable lines are kept.

    ``FROM ${BASE}`` is resolved with the global ARGs (and ``build_args``) first, as a build
    would; a Dockerfile the parser refuses is returned unchanged, for the builder to report.
    """
    if not mirrors.rules:
        return text
    lines = text.splitlines(keepends=True)
    for command, image in external_images(text, build_args):
        try:
            mirrored = mirrors.apply(image)
        except InvalidImageReference:
            continue
        words = list(command.value)
        rebuilt = " ".join(part for part in ("FROM", *command.flags, mirrored, *words[1:]) if part)
        first = command.start_line - 1
        ending = "\n" if lines[command.end_line - 1].endswith("\n") else ""
        lines[first] = rebuilt + ending
        for index in range(first + 1, command.end_line):
            lines[index] = ""
    return "".join(lines)


def base_images(text: str, build_args: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The images a Dockerfile's stages start FROM (not earlier stages, not scratch), in order, once each."""
    return tuple(dict.fromkeys(image for _, image in external_images(text, build_args)))


def external_images(text: str, build_args: Mapping[str, str] | None = None) -> list[tuple[dockerfile.Command, str]]:
    """Each ``FROM`` that names an image, with the image (global ARGs substituted); none if unparsable."""
    try:
        commands = dockerfile.parse_string(text)
    except dockerfile.GoParseError:
        return []
    arguments = dict(build_args or {})
    global_args: dict[str, str] = {}
    stages: set[str] = set()
    found: list[tuple[dockerfile.Command, str]] = []
    for command in commands:
        instruction = (command.cmd or "").upper()
        if instruction == "ARG" and not stages and not found:
            for raw in command.value:
                name, has_default, default = raw.partition("=")
                if name in arguments:
                    global_args[name] = arguments[name]
                elif has_default:
                    try:
                        global_args[name] = process_word(default, global_args)
                    except WordError:
                        continue
        if instruction != "FROM" or not command.value:
            continue
        words = list(command.value)
        try:
            image = process_word(words[0], global_args)
        except WordError:
            image = ""
        earlier_stage = image.lower() in stages
        stages.add(words[2].lower() if len(words) == 3 and words[1].upper() == "AS" else f"#{len(stages)}")
        if image and not earlier_stage and image != "scratch":
            found.append((command, image))
    return found
