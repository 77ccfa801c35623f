"""Replay planning (Gym's image rule): every supported instruction, every refusal with its line."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.replay_plan import (
    BaseImage,
    CopyStep,
    DockerfileLimits,
    MakeDirectoryStep,
    ReplayPlan,
    RunStep,
    copy_command,
    merged_settings,
    mkdir_command,
    plan_replay,
    staging_archive,
)
from episode_operator.taskfolder.task_toml import EnvironmentConfig

DOCKERFILE = "environment/Dockerfile"


def plan(text: str | bytes, extra: dict[str, str | bytes] | None = None, **kwargs: object) -> ReplayPlan:
    files = TaskFiles.from_mapping({DOCKERFILE: text, **(extra or {})})
    planning = plan_replay(files, DOCKERFILE, "environment", **kwargs)  # type: ignore[arg-type]
    assert not planning.problems, [problem.render() for problem in planning.problems]
    assert planning.plan is not None
    return planning.plan


def refusals(text: str | bytes, extra: dict[str, str | bytes] | None = None) -> list[str]:
    files = TaskFiles.from_mapping({DOCKERFILE: text, **(extra or {})})
    planning = plan_replay(files, DOCKERFILE, "environment")
    assert planning.plan is None
    return [problem.render() for problem in planning.problems]


def test_a_realistic_dockerfile() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"  # 1
        "ARG BASE=ubuntu:24.04\n"  # 2
        "FROM ${BASE} AS base\n"  # 3
        "ARG VERSION=1.2\n"  # 4
        'ENV PATH=/opt/tool/bin:$PATH \\\n    GREETING="hello world"\n'  # 5-6
        "RUN useradd -m agent && echo $VERSION\n"  # 7
        "WORKDIR app\n"  # 8
        "COPY --chown=agent --chmod=755 serve.sh ./\n"  # 9
        "USER agent\n"  # 10
        "WORKDIR /app/work\n"  # 11
        "RUN echo as agent\n"  # 12
        'ENTRYPOINT ["/app/serve.sh"]\n'  # 13
        'CMD ["--port", "8000"]\n'  # 14
    )
    result = plan(text, {"environment/serve.sh": "#!/bin/sh\n"}, base=BaseImage(env={"PATH": "/usr/bin:/bin"}))
    assert result.from_image == "ubuntu:24.04"
    assert result.env == {"PATH": "/opt/tool/bin:/usr/bin:/bin", "GREETING": "hello world"}
    assert (result.workdir, result.user) == ("/app/work", "agent")
    assert result.entrypoint == ["/app/serve.sh"]
    kinds = [(step.kind, step.line) for step in result.steps]
    assert kinds == [("run", 7), ("mkdir", 8), ("copy", 9), ("mkdir", 11), ("run", 12)]
    first, _, copy, workdir, second = result.steps
    assert isinstance(first, RunStep) and isinstance(second, RunStep)
    assert (first.user, first.cwd, first.command) == (None, None, "useradd -m agent && echo $VERSION")
    assert first.env == {"VERSION": "1.2", "PATH": "/opt/tool/bin:/usr/bin:/bin", "GREETING": "hello world"}
    assert (second.user, second.cwd) == ("agent", "/app/work")
    assert isinstance(copy, CopyStep) and copy.owner == "agent:" and copy.mode == "755"
    assert copy.placements[0].destination == "/app/serve.sh"
    # A WORKDIR created under USER is the user's, as BuildKit makes it; an existing one is left alone.
    assert isinstance(workdir, MakeDirectoryStep) and workdir.owner == "agent"
    assert mkdir_command(workdir) == "[ -d /app/work ] || { mkdir -p /app/work && chown agent /app/work; }"


@pytest.mark.parametrize(
    ("text", "entrypoint"),
    [
        # CMD is replaced by the sandbox's keep-alive (Harbor's compose: `sleep infinity`).
        ('FROM x\nCMD ["a", "b"]\n', None),
        ('FROM x\nENTRYPOINT ["run"]\n', ["run"]),
        ('FROM x\nCMD ["b"]\nENTRYPOINT ["a"]\n', ["a"]),
        ("FROM x\nENTRYPOINT run it\nCMD ignored\n", ["/bin/sh", "-c", "run it"]),
        ('FROM x\nSHELL ["/bin/bash", "-c"]\nENTRYPOINT serve\n', ["/bin/bash", "-c", "serve"]),
        ('FROM x\nENTRYPOINT ["a"]\nENTRYPOINT ["b"]\n', ["b"]),
        ("FROM x\nRUN true\n", None),
    ],
)
def test_entrypoint_is_kept_and_cmd_replaced(text: str, entrypoint: list[str] | None) -> None:
    assert plan(text).entrypoint == entrypoint


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("FROM x\nRUN echo hi && \\\n    echo there\n", "echo hi &&     echo there"),
        ('FROM x\nRUN ["echo", "two words"]\n', "exec echo 'two words'"),
        ('FROM x\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\nRUN a | b\n', "exec /bin/bash -o pipefail -c 'a | b'"),
        ("FROM x\nRUN <<EOF\necho one\necho two\nEOF\n", "echo one\necho two\n"),
        ("FROM x\nRUN python3 <<EOF\nprint(1)\nEOF\n", "python3 <<EOF\nprint(1)\nEOF"),
        ("# escape=`\nFROM x\nRUN echo a `\n    b\n", "echo a     b"),
        ("FROM x\n# a comment\nRUN echo \\\n# inside\n  done\n", "echo   done"),
        ("FROM x\nRUN --network=default true\n", "true"),
    ],
)
def test_run_forms(text: str, command: str) -> None:
    steps = plan(text).steps
    assert isinstance(steps[-1], RunStep)
    assert steps[-1].command == command


def test_a_heredoc_script_with_a_shebang_runs_by_its_interpreter() -> None:
    (step,) = plan("FROM x\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n").steps
    assert isinstance(step, RunStep) and step.command is None
    assert step.script == "#!/usr/bin/env python3\nprint(1)\n"


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ('FROM x\nENV A=1 B="two words" C=$A\n', {"A": "1", "B": "two words", "C": ""}),
        (
            "FROM x\nENV A=1\nENV B=$A C=${A}x D=${U:-dflt} E=${A:+set}\n",
            {"A": "1", "B": "1", "C": "1x", "D": "dflt", "E": "set"},
        ),
        ("FROM x\nENV A legacy form with spaces\n", {"A": "legacy form with spaces"}),
        ("FROM x\nARG V=3\nENV W=v$V\n", {"W": "v3"}),
        ("FROM x\nENV A=1\nENV B=2 A=3\n", {"B": "2", "A": "3"}),
        ("FROM x\nENV P='$literal' Q=a\\ b\n", {"P": "$literal", "Q": "a b"}),
        ("FROM x\nENV HOME_BIN=$HOME/bin\n", {"HOME_BIN": "/root/bin"}),
        # ENV wins over an ARG of the same name, and the image's environment over ARGs too.
        ("FROM x\nARG A=arg\nARG HOME=arg\nENV A=env\nENV B=$A C=$HOME\n", {"A": "env", "B": "env", "C": "/root"}),
    ],
)
def test_env_substitution(text: str, env: dict[str, str]) -> None:
    assert plan(text, base=BaseImage(env={"HOME": "/root"})).env == env


def test_args_before_and_after_from() -> None:
    text = "ARG TAG=24.04\nARG UNUSED\nFROM ubuntu:$TAG\nARG TAG\nARG LOCAL=x-$TAG\nARG TARGETARCH\nRUN echo\n"
    result = plan(text, base=BaseImage(machine="aarch64"))
    assert result.from_image == "ubuntu:24.04"
    (step,) = result.steps
    assert isinstance(step, RunStep)
    assert step.env == {"TAG": "24.04", "LOCAL": "x-24.04", "TARGETARCH": "arm64"}
    # Build arguments (compose `build.args`) win over defaults.
    assert plan(text, build_args={"TAG": "22.04"}).from_image == "ubuntu:22.04"


def test_copy_destinations_and_sources() -> None:
    extra = {
        "environment/a.txt": "a",
        "environment/b.txt": "b",
        "environment/src/main.py": "print()",
        "environment/src/pkg/mod.py": "x",
        "environment/src/cache/big.bin": "ignored",
        "environment/src/empty/": "",
        "environment/.dockerignore": "# comment\n**/cache\n*.log\n!keep.log\n",
        "environment/keep.log": "kept by the ! rule",
        "environment/debug.log": "ignored",
    }
    text = (
        "FROM x\nWORKDIR /w\n"
        "COPY a.txt /etc/single\n"  # 3: a file named by its destination (or into it, if a directory)
        "COPY a.txt b.txt dir/\n"  # 4: several into a directory, relative to WORKDIR
        "COPY src /opt/src\n"  # 5: a directory's contents
        "COPY *.txt /globbed/\n"  # 6: wildcards
        "COPY . /all/\n"  # 7: the whole context, minus .dockerignore
    )
    steps = plan(text, extra).steps
    single, several, tree, globbed, everything = steps[1:]
    assert isinstance(single, CopyStep) and single.placements[0].into_directory
    assert single.placements[0].name == "a.txt"
    assert isinstance(several, CopyStep)
    assert [p.destination for p in several.placements] == ["/w/dir/a.txt", "/w/dir/b.txt"]
    assert isinstance(tree, CopyStep)
    assert sorted(f.path for f in tree.files) == ["s0/main.py", "s0/pkg/mod.py"]
    assert "s0/empty" in tree.directories and "s0/cache" not in tree.directories
    assert tree.placements[0].top_level == ["empty", "main.py", "pkg"]
    # Entry by entry, so an existing destination keeps its owner and mode.
    assert "cp -R -p /s/s0/empty /s/s0/main.py /s/s0/pkg /opt/src/" in copy_command(tree, "/s")
    assert isinstance(globbed, CopyStep) and [p.destination for p in globbed.placements] == [
        "/globbed/a.txt",
        "/globbed/b.txt",
    ]
    assert isinstance(everything, CopyStep)
    copied = sorted(f.source or "" for f in everything.files)
    assert "environment/debug.log" not in copied and "environment/src/cache/big.bin" not in copied
    assert "environment/Dockerfile" in copied and "environment/keep.log" in copied


def test_copy_command_and_staging_archive() -> None:
    files = {"environment/run.sh": b"#!/bin/sh\necho hi\n"}
    mapping = TaskFiles.from_mapping({DOCKERFILE: "FROM x\nCOPY --chown=1000 --chmod=0750 run.sh /bin/ x/\n", **files})
    planning = plan_replay(mapping, DOCKERFILE, "environment")
    assert planning.problems and "x/" in planning.problems[0].message  # a missing second source
    mapping = TaskFiles.from_mapping(
        {DOCKERFILE: "FROM x\nCOPY --chown=1000 --chmod=0750 run.sh /usr/local/bin/\n", **files}
    )
    result = plan_replay(mapping, DOCKERFILE, "environment").plan
    assert result is not None
    (step,) = result.steps
    assert isinstance(step, CopyStep)
    assert copy_command(step, "/stage").split("\n") == [
        "set -e",
        "new0=; [ -d /usr/local/bin ] || { new0=1; mkdir -p /usr/local/bin; }",
        "cp -p /stage/s0 /usr/local/bin/run.sh",
        "chown -R 1000:1000 /usr/local/bin/run.sh",
        # A destination directory the COPY created is the --chown user's too.
        '[ -z "$new0" ] || chown 1000:1000 /usr/local/bin',
        "chmod -R 0750 /usr/local/bin/run.sh",
    ]
    with tarfile.open(fileobj=io.BytesIO(staging_archive(step, mapping))) as archive:
        member = archive.getmember("s0")
        assert member.mode == 0o644 and archive.extractfile(member).read() == files["environment/run.sh"]  # type: ignore[union-attr]


def test_copy_heredoc_substitutes_unless_quoted() -> None:
    text = 'FROM x\nENV WHO=world\nCOPY <<EOF /etc/motd\nhello $WHO\nEOF\nCOPY <<"EOF" /etc/raw\nhello $WHO\nEOF\n'
    first, second = plan(text).steps
    assert isinstance(first, CopyStep) and isinstance(second, CopyStep)
    assert first.files[0].content == "hello world\n"
    assert second.files[0].content == "hello $WHO\n"


def test_add_unpacks_a_local_archive_and_copies_other_files() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("inside.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
    extra = {"environment/bundle.tgz": buffer.getvalue(), "environment/plain.txt": "p"}
    archive_step, plain_step = plan("FROM x\nADD bundle.tgz /opt/\nADD plain.txt /opt/\n", extra).steps
    assert isinstance(archive_step, CopyStep) and archive_step.placements[0].kind == "archive"
    assert "tar -x -f /s/s0 -C /opt" in copy_command(archive_step, "/s")
    assert isinstance(plain_step, CopyStep) and plain_step.placements[0].kind == "file"


def test_metadata_instructions_and_volume() -> None:
    text = "FROM x\nLABEL a=b\nEXPOSE 80\nMAINTAINER m\nSTOPSIGNAL SIGINT\n"
    text += "HEALTHCHECK CMD true\nONBUILD RUN x\nVOLUME /data\n"
    files = TaskFiles.from_mapping({DOCKERFILE: text})
    planning = plan_replay(files, DOCKERFILE, "environment")
    assert planning.plan is not None
    assert [(s.kind, getattr(s, "path", None)) for s in planning.plan.steps] == [("mkdir", "/data")]
    assert [w.line for w in planning.warnings] == [6, 7]


def test_task_toml_wins_over_the_dockerfile() -> None:
    result = plan("FROM x\nWORKDIR /img\nENV A=image B=image\nUSER agent\n")
    merged = merged_settings(result, EnvironmentConfig(workdir="/task", env={"B": "task"}))
    assert (merged.workdir, merged.env, merged.user) == ("/task", {"A": "image", "B": "task"}, "agent")
    merged = merged_settings(result, EnvironmentConfig())
    assert (merged.workdir, merged.env) == ("/img", {"A": "image", "B": "image"})


@pytest.mark.parametrize(
    ("text", "extra", "expected"),
    [
        (
            "FROM x AS build\nRUN make\nFROM y\nCOPY --from=build /out /app\n",
            {},
            "environment/Dockerfile:3: FROM y: a second FROM (a multi-stage build) needs an image build",
        ),
        (
            "FROM x\nRUN true\n\n\n\n\nCOPY --from=build /out /app\n",
            {},
            "environment/Dockerfile:7: COPY --from=build /out /app: --from copies from another stage or image, "
            "which needs an image build",
        ),
        (
            "FROM x\nADD https://example.com/a.tgz /opt/\n",
            {},
            "environment/Dockerfile:2: ADD https://example.com/a.tgz /opt/: ADD of a URL needs an image build "
            "(or download it in a RUN line)",
        ),
        (
            "FROM x\nCOPY ../../etc/passwd /etc/\n",
            {},
            "environment/Dockerfile:2: COPY ../../etc/passwd /etc/: ../../etc/passwd leaves the build context "
            "environment/",
        ),
        (
            "FROM x\nRUN --mount=type=cache,target=/root/.cache pip install x\n",
            {},
            "environment/Dockerfile:2: RUN --mount=type=cache,target=/root/.cache pip install x: --mount mounts "
            "caches, secrets or other images, which needs an image build",
        ),
        ("FROM x\nBOGUS y\n", {}, "environment/Dockerfile:2: BOGUS y: unknown instruction BOGUS"),
        ("RUN x\nFROM y\n", {}, "environment/Dockerfile:1: RUN x: only ARG may come before FROM"),
        ("FROM scratch\nCOPY a /\n", {"environment/a": "a"}, "FROM scratch: an image FROM scratch has no shell"),
        ("# just a comment\n", {}, "environment/Dockerfile: syntax error: file with no instructions"),
        ("ARG A=1\n", {}, "environment/Dockerfile: no FROM instruction: replay needs a base image"),
        ("FROM x\nCOPY missing.txt /\n", {}, "environment/Dockerfile:2: COPY missing.txt /: missing.txt is not in"),
        ("FROM x\nCOPY *.py /app/\n", {}, "*.py matches nothing in the build context environment/"),
        ("FROM x\nCOPY a b /dst\n", {"environment/a": "", "environment/b": ""}, "destination must be a directory"),
        ("FROM x\nENV A=${B\n", {}, "environment/Dockerfile:2: ENV A=${B: syntax error: missing '}'"),
        ('FROM x\nENV A="open\n', {}, "matching double-quote"),
        ("FROM x\nENV a.b=1\n", {}, "'a.b' cannot be passed to a process as an environment variable"),
        ("FROM x\nENV A\n", {}, "environment/Dockerfile:2: syntax error: ENV must have two arguments"),
        ("FROM Bad:Image\n", {}, "environment/Dockerfile:1: FROM Bad:Image: 'Bad:Image' is not an image reference"),
        ("FROM x\nCOPY --chmod=u+rwx a /\n", {"environment/a": ""}, "--chmod=u+rwx must be an octal mode"),
        ("FROM x\nRUN --network=none true\n", {}, "--network=none is not supported by replay (only default)"),
        ("FROM x\nCOPY --exclude=*.md . /\n", {}, "--exclude excludes paths (a labs feature)"),
        ("FROM x\nSHELL /bin/bash -c\n", {}, "SHELL takes a JSON array"),
        ("FROM x\nCOPY secret /\n", {"environment/secret": "", "environment/.dockerignore": "secret"}, "excluded by"),
    ],
)
def test_refusals_name_the_line(text: str, extra: dict[str, str], expected: str) -> None:
    problems = refusals(text, extra)
    assert any(expected in problem for problem in problems), problems


def test_bad_files_are_refused_before_parsing() -> None:
    ten_megabytes = b"FROM x\n" + b"RUN echo this line is repeated\n" * 350_000
    assert refusals(ten_megabytes) == [
        f"environment/Dockerfile: {len(ten_megabytes)} bytes: a replayed Dockerfile may hold at most 262144 bytes "
        "(build the image and set docker_image instead)"
    ]
    many_lines = "FROM x\n" + "RUN a\n" * 5000
    assert refusals(many_lines) == [
        "environment/Dockerfile: 5002 lines: a replayed Dockerfile may hold at most 4000 lines"
    ]
    assert refusals(b"FROM x\nRUN \xff\xfe") == [
        "environment/Dockerfile:2: not valid UTF-8 (invalid start byte at byte 11): this is not a Dockerfile"
    ]
    assert refusals(b"FROM x\n\nRUN a\x00b") == [
        "environment/Dockerfile:3: contains a NUL byte: this is not a Dockerfile"
    ]
    files = TaskFiles.from_mapping({"environment/x": ""})
    assert [p.render() for p in plan_replay(files, DOCKERFILE, "environment").problems] == [
        "environment/Dockerfile: missing: replay needs the Dockerfile"
    ]
    limits = DockerfileLimits(max_bytes=10)
    assert plan_replay(
        TaskFiles.from_mapping({DOCKERFILE: "FROM x\nRUN a\n"}), DOCKERFILE, "environment", limits=limits
    ).problems


def test_every_problem_of_a_file_at_once() -> None:
    problems = refusals("FROM x\nBOGUS\nCOPY --from=a b c\nADD http://x/y /z\n")
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4"]


DOCKERFILE_WORDS = st.sampled_from(
    [
        "FROM ubuntu:24.04\n",
        "FROM ${BASE:-x}\n",
        "ARG BASE=y\n",
        "RUN echo hi\n",
        "RUN <<EOF\n",
        "EOF\n",
        "COPY . /app/\n",
        "COPY --from=x a b\n",
        "ADD a.tgz /\n",
        "ENV A=$B\n",
        "ENV A\n",
        "WORKDIR rel\n",
        "USER 1000:1000\n",
        'CMD ["a"\n',
        "ENTRYPOINT x\n",
        'SHELL ["sh", "-c"]\n',
        "\\\n",
        "`\n",
        "# escape=`\n",
        '"',
        "'",
        "${",
        "}",
        "\x00",
        "\ufeff",
        "\r\n",
        "ONBUILD ",
        "HEALTHCHECK NONE\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=400), st.lists(DOCKERFILE_WORDS, max_size=30).map(lambda w: "".join(w).encode())))
def test_any_bytes_as_a_dockerfile_are_answered(data: bytes) -> None:
    """Binary garbage, broken syntax, odd words: a plan or problems naming the file — never an exception."""
    files = TaskFiles.from_mapping({DOCKERFILE: data, "environment/a.tgz": b"\x1f\x8b junk", "environment/a": "a"})
    planning = plan_replay(files, DOCKERFILE, "environment", base=BaseImage(env={"B": "v"}))
    assert (planning.plan is None) == bool(planning.problems)
    for problem in [*planning.problems, *planning.warnings]:
        assert problem.file == DOCKERFILE and problem.message and "Traceback" not in problem.message
    if planning.plan is not None:
        for step in planning.plan.steps:
            if isinstance(step, CopyStep):
                staging_archive(step, files)
                copy_command(step, "/stage")


def test_copy_commands_do_in_a_real_shell_what_docker_does(tmp_path: Path) -> None:
    """The placement commands run under real ``sh`` against a scratch tree (absolute paths below tmp_path)."""
    import os
    import subprocess

    root = str(tmp_path)
    os.makedirs(f"{root}/existing", mode=0o700)
    os.makedirs(f"{root}/dir-target")
    text = (
        f"FROM x\nWORKDIR {root}\n"
        "COPY --chown=1234:2345 site existing/\n"  # a tree into an existing directory
        "COPY --chown=1234 --chmod=750 tool.sh new/bin/\n"  # a file into a directory the COPY creates
        "COPY notes.txt dir-target\n"  # a file to an existing directory: inside it, under its own name
        "COPY notes.txt renamed.txt\n"  # a file to a new name
    )
    files = TaskFiles.from_mapping(
        {
            DOCKERFILE: text,
            "environment/site/index.html": "<p>",
            "environment/site/a/b.txt": "b",
            "environment/tool.sh": "echo",
            "environment/notes.txt": "n",
        }
    )
    result = plan_replay(files, DOCKERFILE, "environment").plan
    assert result is not None
    for number, step in enumerate(result.steps):
        if not isinstance(step, CopyStep):
            continue
        staging = f"{root}/.staging{number}"
        with tarfile.open(fileobj=io.BytesIO(staging_archive(step, files))) as archive:
            archive.extractall(staging, filter="data")
        subprocess.run(["sh", "-c", copy_command(step, staging)], check=True)

    def owner(path: str) -> tuple[int, int, int]:
        info = os.stat(f"{root}/{path}")
        return info.st_uid, info.st_gid, info.st_mode & 0o777

    assert owner("existing")[2] == 0o700 and owner("existing")[0] == os.getuid()  # kept as it was
    assert owner("existing/index.html")[:2] == (1234, 2345) and owner("existing/a/b.txt")[:2] == (1234, 2345)
    assert owner("new/bin")[:2] == (1234, 1234)  # created by the COPY: the --chown user's
    assert owner("new/bin/tool.sh") == (1234, 1234, 0o750)
    assert (tmp_path / "dir-target" / "notes.txt").read_text() == "n"
    assert (tmp_path / "renamed.txt").read_text() == "n"


def test_dockerfile_sources_and_validate_warnings() -> None:
    from episode_operator.taskfolder import validate_task
    from episode_operator.taskfolder.dockerfiles import dockerfile_sources
    from tests.unit.folders import single_step

    folder = single_step(
        files={
            "task.toml": '[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\nbuild_timeout_sec = 60\n',
            DOCKERFILE: "FROM x AS build\nFROM y\nCOPY --from=build /a /b\n",
            "tests/Dockerfile": "FROM verifier\nRUN --mount=type=cache,target=/c true\n",
            "environment/docker-compose.yaml": "services:\n  api:\n    build: ./api\n",
            "environment/api/Dockerfile": "FROM python:3.12\nADD https://example.com/x /x\n",
        },
    )
    result = validate_task(TaskFiles.from_mapping(folder))
    assert result.task is not None, result.problems
    sources = dockerfile_sources(result.task.files, result.task.config, result.task.compose)
    assert [(s.role, s.dockerfile, s.context) for s in sources] == [
        ("environment", DOCKERFILE, "environment"),
        ("verifier", "tests/Dockerfile", "tests"),
        ("sidecar:api", "environment/api/Dockerfile", "environment/api"),
    ]
    replay = [w.render() for w in result.warnings if "replay cannot apply it" in w.message]
    # A sidecar is always built: replay's limits are no news there.
    assert replay == [
        "environment/Dockerfile:2: FROM y: a second FROM (a multi-stage build) needs an image build "
        "(replay cannot apply it)",
        "tests/Dockerfile:2: RUN --mount=type=cache,target=/c true: --mount mounts caches, secrets or other "
        "images, which needs an image build (replay cannot apply it)",
    ]
