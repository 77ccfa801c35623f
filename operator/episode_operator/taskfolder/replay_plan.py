"""Gym's image rule: replay a task's Dockerfile in its pulled base image (pure planning).

A task without ``docker_image`` but with ``environment/Dockerfile`` runs, in Gym, by starting
the Dockerfile's ``FROM`` image and applying the rest of the Dockerfile in it at seed
(docs/task-format.md "Gym image rule"). This module turns a Dockerfile into a :class:`ReplayPlan`
— the base image, the ordered steps (``RUN`` lines, copies of the build context's files,
directories to create) each with the user, working directory and environment a build would
give it, and the ``ENTRYPOINT`` to start — or refuses it, naming the instruction
and its line, when replay cannot mean what a build would (multi-stage builds, ``COPY --from``,
``ADD`` of a URL, ``RUN --mount``, paths leaving the build context…).

The Dockerfile is parsed by the ``dockerfile`` package, which wraps BuildKit's own parser
(line continuations, the ``escape`` directive, heredocs, JSON and shell forms, comments);
words are processed as BuildKit does (:mod:`episode_operator.taskfolder.words`). Variables
that name the base image's environment (``ENV PATH=/opt/bin:$PATH``) need that environment:
the runtime reads it from the started sandbox and plans again with it (:class:`BaseImage`);
validation plans with an empty one, which decides every refusal the same way.

What a pod cannot hold is bounded before parsing (:class:`DockerfileLimits`), so a 10 MB file
of ``RUN`` lines or binary garbage is refused in microseconds, never parsed.
"""

from __future__ import annotations

import io
import posixpath
import re
import shlex
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Annotated, Literal

import dockerfile
from pydantic import BaseModel, ConfigDict, Field

from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.image_refs import InvalidImageReference, parse_image_reference
from episode_operator.taskfolder.sources import TaskFiles
from episode_operator.taskfolder.task_toml import CAMEL_OUTPUT, EnvironmentConfig
from episode_operator.taskfolder.words import WordError, process_word

DEFAULT_SHELL = ("/bin/sh", "-c")
DOCKERIGNORE = ".dockerignore"
# An instruction shown in a message: its first line, cut here.
SHOWN_INSTRUCTION_CHARS = 60
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OCTAL_MODE = re.compile(r"[0-7]{3,4}")
DIRECTIVE = re.compile(r"#\s*([A-Za-z][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")
URL = re.compile(r"^(https?://|git@|git://|ssh://)|\.git(#.*)?$")
# The architectures BuildKit names in TARGETARCH, by ``uname -m``.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}

# Instructions that only describe an image: replay records nothing for them.
METADATA_INSTRUCTIONS = {
    "LABEL": "image metadata",
    "MAINTAINER": "image metadata",
    "EXPOSE": "a pod's ports need no declaration",
    "STOPSIGNAL": "the sandbox stops with its pod",
    "HEALTHCHECK": "ignored: [environment.healthcheck] is the task's health check",
    "ONBUILD": "ignored: it runs only in images built FROM this one",
}
# Flags each instruction may carry in replay; the value None accepts any value.
ACCEPTED_FLAGS: dict[str, dict[str, frozenset[str] | None]] = {
    "FROM": {"platform": None},
    "RUN": {"network": frozenset({"default"})},
    "COPY": {"chown": None, "chmod": None, "link": None},
    "ADD": {"chown": None, "chmod": None, "link": None},
}
# Why a flag needs a build: each names a BuildKit feature replay has no equivalent for.
FLAGS_NEEDING_A_BUILD = {
    "from": "copies from another stage or image",
    "mount": "mounts caches, secrets or other images",
    "security": "asks for an insecure build sandbox",
    "parents": "keeps parent directories (a labs feature)",
    "exclude": "excludes paths (a labs feature)",
    "checksum": "verifies a download",
    "keep-git-dir": "clones a Git repository",
}


@dataclass(frozen=True)
class DockerfileLimits:
    """Bounds checked before parsing: real task Dockerfiles are a few KiB and a few hundred lines.

    BuildKit's parser is quadratic in the lines of one instruction (a 100,000-line heredoc
    takes seconds), so both the size and the line count are bounded.
    """

    max_bytes: int = 256 * 1024
    max_lines: int = 4_000


@dataclass(frozen=True)
class BaseImage:
    """What replay needs to know of the started base image: its environment, directory and machine."""

    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    machine: str = "x86_64"


class ReplayModel(BaseModel):
    model_config = ConfigDict(frozen=True, alias_generator=CAMEL_OUTPUT)


class StepContext(ReplayModel):
    """Where an instruction ran in the build: its line, text, user, directory and environment."""

    line: int
    instruction: str = Field(description="The instruction's first line, shortened, for logs and messages.")


class RunStep(StepContext):
    """A ``RUN`` line: ``command`` runs under ``sh -c`` (already wrapped for a ``SHELL`` or the exec form).

    A heredoc script that starts with ``#!`` is run by its interpreter instead, as BuildKit
    does: ``script`` holds it and ``command`` is None (the runtime uploads and executes it).
    """

    kind: Literal["run"] = "run"
    command: str | None
    user: str | None
    cwd: str | None
    env: dict[str, str]
    script: str | None = None


class Placement(ReplayModel):
    """One source of a ``COPY``/``ADD``: staged under ``staged`` and placed at ``destination``.

    ``kind`` is ``file`` (``destination`` is the file; with ``into_directory`` it goes inside
    ``destination`` when that is an existing directory, as Docker does), ``tree`` (a
    directory's contents merged into ``destination``) or ``archive`` (a local tar unpacked
    into ``destination`` by ``ADD``).
    """

    kind: Literal["file", "tree", "archive"]
    staged: str
    destination: str
    into_directory: bool = False
    name: str | None = Field(default=None, description="The source's own name, for a file placed into a directory.")
    top_level: list[str] = Field(default_factory=list, description="The names of a tree's top-level entries.")


class StagedFile(ReplayModel):
    """A file of the staging tar: from the task folder (``source``) or a heredoc (``content``)."""

    path: str
    mode: int
    source: str | None = None
    content: str | None = None


class CopyStep(StepContext):
    """A ``COPY`` or ``ADD``: its files travel with the task, staged in the sandbox, then placed."""

    kind: Literal["copy"] = "copy"
    files: list[StagedFile]
    directories: list[str] = Field(description="Staged directories (paths in the staging tar), with empty ones.")
    placements: list[Placement]
    owner: str | None = Field(description="chown spec from --chown (user: for a name alone, uid:uid for a number).")
    mode: str | None = Field(description="chmod mode from --chmod.")


class MakeDirectoryStep(StepContext):
    """A ``WORKDIR`` (created owned by the current ``USER``, as BuildKit does) or ``VOLUME`` directory."""

    kind: Literal["mkdir"] = "mkdir"
    path: str
    owner: str | None = None


ReplayStep = Annotated[RunStep | CopyStep | MakeDirectoryStep, Field(discriminator="kind")]


class ReplayPlan(ReplayModel):
    """What replaying one Dockerfile does, in order, and the image settings it leaves."""

    dockerfile: str
    context: str
    from_image: str = Field(description="The FROM image, variables substituted (mirrors not applied).")
    steps: list[ReplayStep]
    entrypoint: list[str] | None = Field(
        description="ENTRYPOINT as an argv; null when none is declared. CMD is not kept: the sandbox replaces it "
        "with its keep-alive, as Harbor's compose replaces it with `sleep infinity`."
    )
    workdir: str | None = Field(description="The last WORKDIR; null when the Dockerfile sets none.")
    env: dict[str, str] = Field(description="Every ENV, variables substituted, in declaration order.")
    user: str | None = Field(description="The last USER (its user part); null when the Dockerfile sets none.")


@dataclass(frozen=True)
class ImageSettings:
    """The image's working directory, environment and default user, with task.toml winning (§2.8)."""

    workdir: str | None
    env: dict[str, str]
    user: str | None


def merged_settings(plan: ReplayPlan, environment: EnvironmentConfig) -> ImageSettings:
    """The Dockerfile's WORKDIR, ENV and USER under ``[environment]``'s ``workdir`` and ``env``."""
    return ImageSettings(
        workdir=environment.workdir or plan.workdir,
        env={**plan.env, **environment.env},
        user=plan.user,
    )


@dataclass(frozen=True)
class ReplayPlanning:
    """A plan, or the problems that refuse replay (each naming a line); warnings either way.

    ``needs_build`` says that every problem is one an image build would not have (a multi-stage
    build, ``COPY --from``, ``ADD`` of a URL…): the Dockerfile is sound, only replay cannot apply
    it. A syntax error, binary garbage, a path leaving the build context or an oversized file is
    no Dockerfile a build would take either.
    """

    plan: ReplayPlan | None
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...]
    needs_build: bool = False


def plan_replay(
    files: TaskFiles,
    dockerfile_path: str,
    context: str,
    *,
    base: BaseImage | None = None,
    build_args: Mapping[str, str] | None = None,
    limits: DockerfileLimits | None = None,
) -> ReplayPlanning:
    """Plan the replay of ``dockerfile_path`` with the task folder's ``context`` as its build context.

    Never raises for what the files hold: every reason replay cannot apply the Dockerfile
    is a :class:`Problem` naming the file and, where there is one, the line.
    """
    planner = _Planner(files, dockerfile_path, context.strip("/"), base or BaseImage(), dict(build_args or {}))
    text = planner.read(limits or DockerfileLimits())
    plan = planner.plan(text) if text is not None else None
    problems = tuple(planner.problems)
    needs_build = bool(problems) and len(planner.build_only) == len(problems)
    return ReplayPlanning(plan if not problems else None, problems, tuple(planner.warnings), needs_build)


def replay_machine(uname: str) -> str:
    """BuildKit's TARGETARCH for a ``uname -m`` answer (unknown machines pass through)."""
    return ARCHITECTURES.get(uname.strip(), uname.strip())


@dataclass
class _Stage:
    """The build state as instructions change it."""

    shell: tuple[str, ...] = DEFAULT_SHELL
    workdir: str | None = None
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str | None] = field(default_factory=dict)
    entrypoint: list[str] | None = None


class _Planner:
    def __init__(self, files: TaskFiles, path: str, context: str, base: BaseImage, build_args: dict[str, str]) -> None:
        self.files = files
        self.path = path
        self.context = context
        self.base = base
        self.build_args = build_args
        self.problems: list[Problem] = []
        # The problems an image build would not have (see ReplayPlanning.needs_build).
        self.build_only: list[Problem] = []
        self.warnings: list[Problem] = []
        self.escape = "\\"
        self.stage = _Stage()
        self.steps: list[RunStep | CopyStep | MakeDirectoryStep] = []
        self.ignore_rules = self.read_dockerignore()

    # Reading ---------------------------------------------------------------------------
    def refuse(self, message: str, line: int | None = None, *, a_build_can: bool = False) -> None:
        """Refuse replay; ``a_build_can``: BuildKit builds this (replay alone cannot mean it)."""
        problem = Problem(self.path, None, message, line=line)
        self.problems.append(problem)
        if a_build_can:
            self.build_only.append(problem)

    def warn(self, message: str, line: int | None = None) -> None:
        self.warnings.append(Problem(self.path, None, message, line=line))

    def read(self, limits: DockerfileLimits) -> str | None:
        if not self.files.has_file(self.path):
            self.refuse("missing: replay needs the Dockerfile")
            return None
        data = self.files[self.path].data
        if len(data) > limits.max_bytes:
            self.refuse(
                f"{len(data)} bytes: a replayed Dockerfile may hold at most {limits.max_bytes} bytes "
                "(build the image and set docker_image instead)"
            )
            return None
        if b"\x00" in data:
            line = data[: data.index(b"\x00")].count(b"\n") + 1
            self.refuse("contains a NUL byte: this is not a Dockerfile", line)
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            self.refuse(f"not valid UTF-8 ({error.reason} at byte {error.start}): this is not a Dockerfile", line)
            return None
        lines = text.count("\n") + 1
        if lines > limits.max_lines:
            self.refuse(f"{lines} lines: a replayed Dockerfile may hold at most {limits.max_lines} lines")
            return None
        self.escape = _escape_directive(text)
        return text

    def read_dockerignore(self) -> list[tuple[bool, re.Pattern[str]]]:
        path = f"{self.context}/{DOCKERIGNORE}" if self.context else DOCKERIGNORE
        if not self.files.has_file(path):
            return []
        return _dockerignore_rules(self.files[path].data.decode("utf-8", "replace"))

    # Planning --------------------------------------------------------------------------
    def plan(self, text: str) -> ReplayPlan | None:
        try:
            commands = dockerfile.parse_string(text)
        except dockerfile.GoParseError as error:
            self.refuse(f"syntax error: {error}", _error_line(text, str(error)))
            return None
        global_args: dict[str, str | None] = {}
        from_image: str | None = None
        for command in commands:
            if command.cmd is None or command.original is None:
                self.refuse("syntax error: not an instruction", command.start_line)
                continue
            instruction = command.cmd.upper()
            shown = _shown(command.original)
            if from_image is None and instruction == "ARG":
                self.arg(command, shown, global_args, global_args, global_scope=True)
            elif instruction == "FROM":
                if from_image is not None:
                    self.refuse(
                        f"{shown}: a second FROM (a multi-stage build) needs an image build",
                        command.start_line,
                        a_build_can=True,
                    )
                    break
                from_image = self.from_line(command, shown, global_args) or ""
            elif from_image is None:
                self.refuse(f"{shown}: only ARG may come before FROM", command.start_line)
            else:
                self.instruction(command, instruction, shown, global_args)
        if from_image is None:
            self.refuse("no FROM instruction: replay needs a base image")
            return None
        if self.problems:
            return None
        return ReplayPlan(
            dockerfile=self.path,
            context=self.context,
            from_image=from_image,
            steps=self.steps,
            entrypoint=self.stage.entrypoint or None,
            workdir=self.stage.workdir,
            env=dict(self.stage.env),
            user=self.stage.user,
        )

    def instruction(
        self, command: dockerfile.Command, instruction: str, shown: str, global_args: dict[str, str | None]
    ) -> None:
        line = command.start_line
        if instruction in METADATA_INSTRUCTIONS:
            if instruction in ("HEALTHCHECK", "ONBUILD"):
                self.warn(f"{shown}: {METADATA_INSTRUCTIONS[instruction]}", line)
            return
        handler = {
            "RUN": self.run,
            "COPY": self.copy,
            "ADD": self.copy,
            "ENV": self.env,
            "WORKDIR": self.workdir,
            "USER": self.user,
            "SHELL": self.shell,
            "VOLUME": self.volume,
            "ENTRYPOINT": self.start_part,
            "CMD": self.start_part,
        }.get(instruction)
        if instruction == "ARG":
            self.arg(command, shown, self.stage.args, global_args, global_scope=False)
        elif handler is None:
            self.refuse(f"{shown}: unknown instruction {command.cmd}", line)
        elif self.flags_accepted(command, instruction, shown):
            try:
                handler(command, shown)
            except WordError as error:
                self.refuse(f"{shown}: {error}", line)

    def flags_accepted(self, command: dockerfile.Command, instruction: str, shown: str) -> bool:
        accepted = ACCEPTED_FLAGS.get(instruction, {})
        good = True
        for flag in command.flags:
            name, _, value = flag.removeprefix("--").partition("=")
            if name in FLAGS_NEEDING_A_BUILD:
                self.refuse(
                    f"{shown}: --{name} {FLAGS_NEEDING_A_BUILD[name]}, which needs an image build",
                    command.start_line,
                    a_build_can=True,
                )
                good = False
            elif name not in accepted:
                self.refuse(f"{shown}: replay does not support the flag --{name}", command.start_line, a_build_can=True)
                good = False
            elif (allowed := accepted[name]) is not None and value not in allowed:
                self.refuse(
                    f"{shown}: --{name}={value} is not supported by replay (only {', '.join(sorted(allowed))})",
                    command.start_line,
                    a_build_can=True,
                )
                good = False
        return good

    def expansion_env(self) -> dict[str, str]:
        """What ``$NAME`` means in an instruction: ARGs, under the image's environment (ENV wins)."""
        args = {name: value for name, value in self.stage.args.items() if value is not None}
        return {**args, **self.base.env, **self.stage.env}

    def word(self, text: str, *, json: bool = False) -> str:
        return process_word(text, self.expansion_env(), escape=self.escape, quotes=not json)

    def automatic_args(self) -> dict[str, str]:
        """BuildKit's platform ARGs, for the sandbox's machine."""
        arch = replay_machine(self.base.machine)
        platform = f"linux/{arch}"
        values = {"PLATFORM": platform, "OS": "linux", "ARCH": arch, "VARIANT": ""}
        return {f"{side}{key}": value for side in ("TARGET", "BUILD") for key, value in values.items()}

    def from_line(self, command: dockerfile.Command, shown: str, global_args: dict[str, str | None]) -> str | None:
        line = command.start_line
        self.flags_accepted(command, "FROM", shown)
        if command.flags:
            self.warn(f"{shown}: --platform is ignored: the sandbox runs on the node's platform", line)
        words = list(command.value)
        if not words or len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
            self.refuse(f"{shown}: FROM takes an image and optionally AS name", line)
            return None
        env = {**self.automatic_args(), **{k: v for k, v in global_args.items() if v is not None}}
        try:
            image = process_word(words[0], env, escape=self.escape)
        except WordError as error:
            self.refuse(f"{shown}: {error}", line)
            return None
        if image == "scratch":
            self.refuse(
                f"{shown}: an image FROM scratch has no shell to replay in; it needs an image build",
                line,
                a_build_can=True,
            )
            return None
        try:
            parse_image_reference(image)
        except InvalidImageReference as error:
            self.refuse(f"{shown}: {error}", line)
            return None
        return image

    def arg(
        self,
        command: dockerfile.Command,
        shown: str,
        scope: dict[str, str | None],
        global_args: dict[str, str | None],
        *,
        global_scope: bool,
    ) -> None:
        for raw in command.value:
            name, has_default, default = raw.partition("=")
            if not ENV_NAME.fullmatch(name):
                self.refuse(f"{shown}: {name!r} is not a valid ARG name", command.start_line)
                continue
            automatic = self.automatic_args()
            env = {**automatic, **{k: v for k, v in global_args.items() if v is not None}} if global_scope else None
            try:
                value = (
                    (process_word(default, env, escape=self.escape) if env is not None else self.word(default))
                    if has_default
                    else None
                )
            except WordError as error:
                self.refuse(f"{shown}: {error}", command.start_line)
                continue
            if name in self.build_args:
                value = self.build_args[name]
            elif value is None and not global_scope:
                value = global_args.get(name) if name in global_args else automatic.get(name)
            scope[name] = value

    def run(self, command: dockerfile.Command, shown: str) -> None:
        script: str | None = None
        text: str | None
        if command.json:
            if command.heredocs:
                self.refuse(f"{shown}: a heredoc needs the shell form of RUN", command.start_line)
                return
            text = "exec " + shlex.join(command.value)
        elif command.heredocs and _sole_heredoc(command):
            body = command.heredocs[0].content
            if body.startswith("#!"):
                script = body
                text = None
            else:
                text = self.in_shell(body)
        else:
            line = command.value[0] if command.value else ""
            text = self.in_shell("\n".join([line, *(doc.content + doc.name for doc in command.heredocs)]))
        if not (text or script):
            self.refuse(f"{shown}: RUN needs a command", command.start_line)
            return
        args = {name: value for name, value in self.stage.args.items() if value is not None}
        self.steps.append(
            RunStep(
                line=command.start_line,
                instruction=shown,
                command=text,
                user=self.stage.user,
                cwd=self.stage.workdir,
                env={**{k: v for k, v in args.items() if k not in self.base.env}, **self.stage.env},
                script=script,
            )
        )

    def in_shell(self, text: str) -> str:
        """Shell-form text as a ``sh -c`` command: itself under the default SHELL, else the SHELL's argv."""
        if self.stage.shell == DEFAULT_SHELL:
            return text
        return "exec " + shlex.join([*self.stage.shell, text])

    def env(self, command: dockerfile.Command, shown: str) -> None:
        pairs = list(command.value)
        # Every value reads the environment as it was before this instruction (Docker's rule).
        before = self.expansion_env()
        updates: dict[str, str] = {}
        for index in range(0, len(pairs) - 1, 2):
            name = process_word(pairs[index], before, escape=self.escape)
            if not ENV_NAME.fullmatch(name):
                self.refuse(
                    f"{shown}: {name!r} cannot be passed to a process as an environment variable", command.start_line
                )
                continue
            updates[name] = process_word(pairs[index + 1], before, escape=self.escape)
        for name, value in updates.items():
            self.stage.env.pop(name, None)  # keep declaration order: a re-declared name moves last
            self.stage.env[name] = value

    def absolute(self, path: str) -> str:
        """``path`` against the current WORKDIR (the image's when none is set), normalised."""
        if not path.startswith("/"):
            path = posixpath.join(self.stage.workdir or self.base.workdir or "/", path)
        return posixpath.normpath(path).replace("//", "/")

    def workdir(self, command: dockerfile.Command, shown: str) -> None:
        raw = self.word(command.value[0] if command.value else "", json=command.json)
        if not raw:
            self.refuse(f"{shown}: WORKDIR needs a path", command.start_line)
            return
        path = self.absolute(raw)
        self.stage.workdir = path
        self.steps.append(
            MakeDirectoryStep(line=command.start_line, instruction=shown, path=path, owner=self.stage.user)
        )

    def volume(self, command: dockerfile.Command, shown: str) -> None:
        for raw in command.value:
            path = self.word(raw, json=command.json)
            if path:
                self.steps.append(
                    MakeDirectoryStep(line=command.start_line, instruction=shown, path=self.absolute(path))
                )

    def user(self, command: dockerfile.Command, shown: str) -> None:
        raw = self.word(command.value[0] if command.value else "")
        user, _, group = raw.partition(":")
        if not user:
            self.refuse(f"{shown}: USER needs a user", command.start_line)
            return
        if group:
            self.warn(
                f"{shown}: the group {group!r} is not applied; jobs run with {user}'s own group", command.start_line
            )
        self.stage.user = user

    def shell(self, command: dockerfile.Command, shown: str) -> None:
        if not command.json or not command.value:
            self.refuse(f'{shown}: SHELL takes a JSON array, e.g. ["/bin/bash", "-c"]', command.start_line)
            return
        self.stage.shell = tuple(command.value)

    def start_part(self, command: dockerfile.Command, shown: str) -> None:
        """ENTRYPOINT is kept; CMD is read (its syntax checked) but replaced by the sandbox's keep-alive."""
        argv = list(command.value) if command.json else [*self.stage.shell, command.value[0] if command.value else ""]
        if (command.cmd or "").upper() == "ENTRYPOINT":
            self.stage.entrypoint = argv

    # COPY and ADD ----------------------------------------------------------------------
    def copy(self, command: dockerfile.Command, shown: str) -> None:
        line = command.start_line
        flags = dict(flag.removeprefix("--").partition("=")[::2] for flag in command.flags)
        words = [self.word(word, json=command.json) for word in command.value]
        if len(words) < 2:
            self.refuse(f"{shown}: {(command.cmd or '').upper()} needs a source and a destination", line)
            return
        *sources, destination_word = words
        is_add = (command.cmd or "").upper() == "ADD"
        owner = self.owner(self.word(flags["chown"]), shown, line) if "chown" in flags else None
        mode = flags.get("chmod")
        if mode is not None and not OCTAL_MODE.fullmatch(mode):
            self.refuse(f"{shown}: --chmod={mode} must be an octal mode such as 755", line)
            return
        builder = _CopyBuilder()
        heredocs = list(command.heredocs)
        matched: list[tuple[str, str]] = []  # (kind, context-relative path or heredoc name)
        for source, raw in zip(sources, command.value[:-1], strict=True):
            if raw.startswith("<<") and heredocs:
                matched.append(("heredoc", raw))
            elif URL.search(source):
                self.refuse(
                    f"{shown}: ADD of a URL needs an image build (or download it in a RUN line)", line, a_build_can=True
                )
                return
            else:
                found = self.context_sources(source, shown, line)
                if found is None:
                    return
                matched += [("path", path) for path in found]
        into = destination_word.endswith("/") or destination_word in (".", "..")
        destination = self.absolute(destination_word)
        if len(matched) > 1 and not into:
            self.refuse(f"{shown}: with more than one source the destination must be a directory ending in /", line)
            return
        for kind, item in matched:
            if kind == "heredoc":
                document = heredocs.pop(0)
                content = document.content if _quoted_heredoc(item) else self.word(document.content, json=True)
                target = posixpath.join(destination, document.name) if into else destination
                builder.file(content=content, mode=0o644, destination=target)
            elif self.is_directory(item):
                builder.tree(self.files, self.context_path(item), self.tree_entries(item), destination)
            elif is_add and _is_archive(self.files[self.context_path(item)].data):
                builder.archive(self.files, self.context_path(item), destination)
            else:
                entry = self.files[self.context_path(item)]
                if into:
                    builder.file(
                        source=self.context_path(item),
                        mode=entry.mode,
                        destination=posixpath.join(destination, posixpath.basename(item)),
                    )
                else:
                    builder.file(
                        source=self.context_path(item), mode=entry.mode, destination=destination, into_directory=True
                    )
        self.steps.append(builder.step(line=line, instruction=shown, owner=owner, mode=mode))

    def owner(self, spec: str, shown: str, line: int) -> str | None:
        user, _, group = spec.partition(":")
        if not user or ":" in group:
            self.refuse(f"{shown}: --chown={spec} must be user, user:group, uid or uid:gid", line)
            return None
        if group:
            return f"{user}:{group}"
        # Docker: a name alone takes its own group; a number alone is uid and gid.
        return f"{user}:{user}" if user.isdigit() else f"{user}:"

    def context_path(self, relative: str) -> str:
        return f"{self.context}/{relative}" if self.context and relative else (relative or self.context)

    def is_directory(self, relative: str) -> bool:
        return relative == "" or self.files.has_dir(self.context_path(relative))

    def context_sources(self, source: str, shown: str, line: int) -> list[str] | None:
        """The context-relative paths a COPY source names (wildcards expanded), or None after refusing."""
        cleaned = posixpath.normpath("/" + source.lstrip("/")) if source else "/"
        if posixpath.normpath(source.lstrip("/") or ".").split("/")[0] == "..":
            self.refuse(f"{shown}: {source} leaves the build context {self.context}/", line)
            return None
        relative = cleaned.lstrip("/")
        if not any(character in relative for character in "*?["):
            if relative and not (self.files.has_file(self.context_path(relative)) or self.is_directory(relative)):
                self.refuse(f"{shown}: {source} is not in the build context {self.context}/", line)
                return None
            if relative and self.ignored(relative):
                self.refuse(f"{shown}: {source} is excluded by {self.context}/{DOCKERIGNORE}", line)
                return None
            return [relative]
        found = [path for path in self.context_paths() if _glob_match(relative, path) and not self.ignored(path)]
        if not found:
            self.refuse(f"{shown}: {source} matches nothing in the build context {self.context}/", line)
            return None
        return found

    def context_paths(self) -> list[str]:
        prefix = f"{self.context}/" if self.context else ""
        paths = [path[len(prefix) :] for path in self.files if path.startswith(prefix)]
        paths += [d[len(prefix) :] for d in self.files.directories if d.startswith(prefix)]
        return sorted(set(paths))

    def tree_entries(self, relative: str) -> tuple[list[str], list[str]]:
        """Files and directories below a source directory, relative to it, minus what .dockerignore excludes."""
        base = self.context_path(relative)
        prefix = f"{base}/" if base else ""
        inside = f"{relative}/" if relative else ""
        files = [
            p[len(prefix) :] for p in self.files if p.startswith(prefix) and not self.ignored(inside + p[len(prefix) :])
        ]
        directories = [
            d[len(prefix) :]
            for d in self.files.directories
            if d.startswith(prefix) and not self.ignored(inside + d[len(prefix) :])
        ]
        return sorted(files), sorted(directories)

    def ignored(self, relative: str) -> bool:
        excluded = False
        parts = relative.split("/")
        for negated, pattern in self.ignore_rules:
            if any(pattern.fullmatch("/".join(parts[:end])) for end in range(1, len(parts) + 1)):
                excluded = not negated
        return excluded


class _CopyBuilder:
    """Collects one COPY's staged files and placements; staged paths are numbered per source."""

    def __init__(self) -> None:
        self.files: list[StagedFile] = []
        self.directories: list[str] = []
        self.placements: list[Placement] = []

    def slot(self) -> str:
        return f"s{len(self.placements)}"

    def file(
        self,
        *,
        destination: str,
        mode: int,
        source: str | None = None,
        content: str | None = None,
        into_directory: bool = False,
    ) -> None:
        staged = self.slot()
        self.files.append(StagedFile(path=staged, mode=mode, source=source, content=content))
        name = posixpath.basename(source) if source is not None and into_directory else None
        self.placements.append(
            Placement(kind="file", staged=staged, destination=destination, into_directory=into_directory, name=name)
        )

    def tree(self, files: TaskFiles, base: str, entries: tuple[list[str], list[str]], destination: str) -> None:
        staged = self.slot()
        relative_files, relative_directories = entries
        self.directories.append(staged)
        self.directories += [f"{staged}/{directory}" for directory in relative_directories]
        prefix = f"{base}/" if base else ""
        self.files += [
            StagedFile(path=f"{staged}/{path}", mode=files[prefix + path].mode, source=prefix + path)
            for path in relative_files
        ]
        top = sorted({path.split("/")[0] for path in [*relative_files, *relative_directories]})
        self.placements.append(Placement(kind="tree", staged=staged, destination=destination, top_level=top))

    def archive(self, files: TaskFiles, source: str, destination: str) -> None:
        staged = self.slot()
        self.files.append(StagedFile(path=staged, mode=files[source].mode, source=source))
        self.placements.append(Placement(kind="archive", staged=staged, destination=destination))

    def step(self, *, line: int, instruction: str, owner: str | None, mode: str | None) -> CopyStep:
        return CopyStep(
            line=line,
            instruction=instruction,
            files=self.files,
            directories=self.directories,
            placements=self.placements,
            owner=owner,
            mode=mode,
        )


def staging_archive(step: CopyStep, files: TaskFiles) -> bytes:
    """The tar of a COPY's staged files (modes kept, owned by root), for the sandbox's upload."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in step.directories:
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        for staged in step.files:
            data = files[staged.source].data if staged.source is not None else (staged.content or "").encode()
            info = tarfile.TarInfo(staged.path)
            info.size, info.mode = len(data), staged.mode & 0o7777
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def copy_command(step: CopyStep, staging: str) -> str:
    """The ``sh -c`` command that places a COPY's staged files, then applies --chown and --chmod.

    ``cp -p`` keeps the staged modes; ownership follows Docker: root, or ``--chown`` for what
    the COPY brought and for the destination directory when the COPY created it.
    """
    lines = ["set -e"]
    targets: list[str] = []
    created: list[str] = []
    for index, placement in enumerate(step.placements):
        source = shlex.quote(f"{staging}/{placement.staged}")
        destination = shlex.quote(placement.destination)
        directory = placement.destination if placement.kind != "file" else posixpath.dirname(placement.destination)
        quoted_directory = shlex.quote(directory or "/")
        new = f"new{index}"
        lines.append(f"{new}=; [ -d {quoted_directory} ] || {{ {new}=1; mkdir -p {quoted_directory}; }}")
        created.append(f'[ -z "${new}" ] || chown {{owner}} {quoted_directory}')
        if placement.kind == "file" and placement.into_directory:
            # Docker: a file copied to an existing directory lands inside it, under its own name.
            name = shlex.quote(placement.name or posixpath.basename(placement.destination))
            lines.append(f't={destination}; if [ -d "$t" ]; then t="$t"/{name}; fi; cp -p {source} "$t"')
            targets.append('"$t"')
        elif placement.kind == "file":
            lines.append(f"cp -p {source} {destination}")
            targets.append(destination)
        elif placement.kind == "tree" and placement.top_level:
            # Entry by entry: copying the staged folder itself would reset an existing destination's owner.
            entries = " ".join(shlex.quote(f"{staging}/{placement.staged}/{name}") for name in placement.top_level)
            lines.append(f"cp -R -p {entries} {destination}/")
            targets += [shlex.quote(posixpath.join(placement.destination, name)) for name in placement.top_level]
        elif placement.kind == "archive":
            lines.append(f"tar -x -f {source} -C {destination}")
    if step.owner:
        owner = shlex.quote(step.owner)
        if targets:
            lines.append(f"chown -R {owner} {' '.join(targets)}")
        lines += [line.replace("{owner}", owner) for line in created]
    if step.mode and targets:
        lines.append(f"chmod -R {step.mode} {' '.join(targets)}")
    return "\n".join(lines)


def mkdir_command(step: MakeDirectoryStep) -> str:
    """Create the directory if missing; only a directory created here gets the owner (BuildKit's WORKDIR)."""
    path = shlex.quote(step.path)
    if step.owner is None:
        return f"mkdir -p {path}"
    return f"[ -d {path} ] || {{ mkdir -p {path} && chown {shlex.quote(step.owner)} {path}; }}"


def _escape_directive(text: str) -> str:
    """The ``# escape=`` parser directive, read as BuildKit does: only at the very top of the file."""
    for line in text.lstrip("\ufeff").splitlines():
        match = DIRECTIVE.fullmatch(line.strip())
        if match is None:
            break
        if match.group(1).lower() == "escape" and match.group(2) in ("\\", "`"):
            return match.group(2)
    return "\\"


def _error_line(text: str, message: str) -> int | None:
    """The line of a syntax error: the parser does not say, so find the shortest prefix failing alike."""
    lines = text.splitlines(keepends=True)
    low, high = 1, len(lines)
    while low < high:
        middle = (low + high) // 2
        try:
            dockerfile.parse_string("".join(lines[:middle]))
        except dockerfile.GoParseError as error:
            if str(error) == message:
                high = middle
                continue
        low = middle + 1
    return low if lines and message != "file with no instructions" else None


def _shown(original: str) -> str:
    first = original.split("\n", 1)[0].strip()
    return first if len(first) <= SHOWN_INSTRUCTION_CHARS else first[: SHOWN_INSTRUCTION_CHARS - 1] + "…"


def _sole_heredoc(command: dockerfile.Command) -> bool:
    """``RUN <<EOF`` alone: the heredoc is the script (BuildKit runs it with the shell, or by its #!)."""
    return (
        len(command.heredocs) == 1
        and len(command.value) == 1
        and command.value[0].lstrip("<-").strip("'\"") == command.heredocs[0].name
    )


def _quoted_heredoc(word: str) -> bool:
    """``<<"EOF"`` and ``<<'EOF'`` keep their content as written; ``<<EOF`` substitutes variables."""
    return word.lstrip("<-")[:1] in ("'", '"')


def _is_archive(data: bytes) -> bool:
    """A tar, plain or compressed (gzip, bzip2, xz): what ADD unpacks."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            return archive.next() is not None
    except (tarfile.TarError, EOFError, OSError, ValueError):
        return False


def _glob_match(pattern: str, path: str) -> bool:
    """Go's filepath.Match, component by component: ``*`` never crosses ``/``."""
    pattern_parts, path_parts = pattern.split("/"), path.split("/")
    return len(pattern_parts) == len(path_parts) and all(
        fnmatchcase(part, wildcard) for part, wildcard in zip(path_parts, pattern_parts, strict=True)
    )


def _dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """``.dockerignore`` lines as (negated, regex): comments and blanks skipped, ``**`` spans directories."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = posixpath.normpath(line.lstrip("!").strip().lstrip("/"))
        if pattern in (".", ""):
            continue
        rules.append((negated, re.compile(_ignore_regex(pattern))))
    return rules


def _ignore_regex(pattern: str) -> str:
    parts: list[str] = []
    for component in pattern.split("/"):
        if component == "**":
            parts.append("(?:.*)")
            continue
        regex = ""
        for character in component:
            regex += {"*": "[^/]*", "?": "[^/]"}.get(character, re.escape(character))
        parts.append(regex)
    joined = "/".join(parts)
    return joined.replace("(?:.*)/", "(?:.*/)?").replace("/(?:.*)", "(?:/.*)?")
