"""File sources: a directory, a tar stream and a mapping give the same folder, the same plan."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import tarfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from episode_operator.taskfolder import SourceLimits, TaskFiles, load_task, resolve_plan, validate_task
from episode_operator.taskfolder.sources import MAX_SYMLINK_HOPS, pack_tar
from tests.conftest import EXAMPLE_TASKS
from tests.unit.folders import single_step

EXAMPLES = sorted(path.name for path in EXAMPLE_TASKS.iterdir() if path.is_dir())


def tar_of(directory: Path, *, top: str | None = None, gzip: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as archive:
        archive.add(directory, arcname=top or ".")
    return buffer.getvalue()


def plan_json(files: TaskFiles) -> str:
    return json.dumps(resolve_plan(load_task(files), timeout_multiplier=1.5).model_dump(mode="json", by_alias=True))


def test_every_example_is_valid() -> None:
    assert EXAMPLES, "examples/tasks is empty"
    for name in EXAMPLES:
        result = validate_task(TaskFiles.from_directory(EXAMPLE_TASKS / name))
        assert result.valid, [problem.render() for problem in result.problems]


@pytest.mark.parametrize("name", EXAMPLES)
def test_directory_tar_and_mapping_give_identical_plans(name: str) -> None:
    directory = TaskFiles.from_directory(EXAMPLE_TASKS / name)
    as_tar = TaskFiles.from_tar(tar_of(EXAMPLE_TASKS / name))
    as_plain_tar_in_a_folder = TaskFiles.from_tar(tar_of(EXAMPLE_TASKS / name, top=name, gzip=False))
    as_mapping = TaskFiles.from_mapping({path: entry.data for path, entry in directory.items()})
    expected = plan_json(directory)
    assert plan_json(as_tar) == expected
    assert plan_json(as_plain_tar_in_a_folder) == expected
    assert plan_json(as_mapping) == expected
    assert dict(as_tar) == dict(directory)  # modes survive a tar


def test_pack_is_reproducible_and_round_trips() -> None:
    files = TaskFiles.from_directory(EXAMPLE_TASKS / "three-step-ledger")
    packed = pack_tar(files)
    assert packed == pack_tar(TaskFiles.from_tar(packed))
    assert TaskFiles.from_tar(packed).digest() == files.digest()


def test_digest_changes_with_content_and_mode() -> None:
    base = TaskFiles.from_mapping({"a.txt": "x"})
    assert base.digest() == TaskFiles.from_mapping({"a.txt": b"x"}).digest()
    assert base.digest() != TaskFiles.from_mapping({"a.txt": "y"}).digest()
    from episode_operator.taskfolder.sources import TaskFile

    assert base.digest() != TaskFiles({"a.txt": TaskFile(b"x", 0o755)}).digest()


def test_empty_directories_are_kept(tmp_path: Path) -> None:
    (tmp_path / "steps" / "a" / "tests").mkdir(parents=True)
    files = TaskFiles.from_directory(tmp_path)
    assert files.has_dir("steps/a/tests")
    assert TaskFiles.from_tar(tar_of(tmp_path)).has_dir("steps/a/tests")
    assert TaskFiles.from_mapping({"steps/a/tests/": b""}).has_dir("steps/a/tests")


def test_symlink_inside_the_folder_is_a_copy(tmp_path: Path) -> None:
    for path, content in single_step().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    (tmp_path / "tests" / "test.sh").rename(tmp_path / "tests" / "real.sh")
    os.symlink("real.sh", tmp_path / "tests" / "test.sh")
    for files in (TaskFiles.from_directory(tmp_path), TaskFiles.from_tar(tar_of(tmp_path))):
        assert not files.problems
        assert files["tests/test.sh"] == files["tests/real.sh"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("/etc/passwd", "symlink to the absolute path '/etc/passwd' outside the task folder"),
        ("../../outside", "symlink to '../../outside' points outside the task folder"),
        ("missing.txt", "dangling symlink to 'missing.txt'"),
        (".", "symlink to the directory '.' is not supported; copy it"),
    ],
)
def test_symlinks_leaving_the_folder_are_refused(tmp_path: Path, target: str, message: str) -> None:
    (tmp_path / "task.toml").write_text("")
    os.symlink(target, tmp_path / "link")
    for files in (TaskFiles.from_directory(tmp_path), TaskFiles.from_tar(tar_of(tmp_path))):
        assert [problem.render() for problem in files.problems] == [f"link: {message}"]
        assert "link" not in files


def test_symlink_loop_is_refused(tmp_path: Path) -> None:
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    assert {p.message for p in TaskFiles.from_directory(tmp_path).problems} == {
        f"a loop, or a chain of more than {MAX_SYMLINK_HOPS} symlinks"
    }


def test_task_folder_itself_must_not_be_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    assert [p.message for p in TaskFiles.from_directory(tmp_path / "alias").problems] == [
        "a task folder must not be a symlink"
    ]


def test_hostile_tar_members_are_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("/etc/cron.d/x", "../escape", "ok/../../escape2", "fine.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
        fifo = tarfile.TarInfo("pipe")
        fifo.type = tarfile.FIFOTYPE
        archive.addfile(fifo)
        hardlink = tarfile.TarInfo("hard")
        hardlink.type = tarfile.LNKTYPE
        hardlink.linkname = "/etc/shadow"
        archive.addfile(hardlink)
    files = TaskFiles.from_tar(buffer.getvalue())
    assert list(files) == ["fine.txt"]
    assert sorted(problem.render() for problem in files.problems) == [
        "../escape: path escapes the task folder ('..')",
        "/etc/cron.d/x: absolute path in a task folder source",
        "/etc/shadow: absolute path in a task folder source",
        "ok/../../escape2: path escapes the task folder ('..')",
        "pipe: not a regular file, directory or link",
    ]


def test_hard_link_inside_the_tar_is_a_copy() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("a.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
        link = tarfile.TarInfo("b.txt")
        link.type = tarfile.LNKTYPE
        link.linkname = "a.txt"
        archive.addfile(link)
    files = TaskFiles.from_tar(buffer.getvalue())
    assert files["b.txt"].data == b"hi" and not files.problems


def test_not_a_tar() -> None:
    files = TaskFiles.from_tar(b"this is not a tar archive at all" * 20)
    assert [problem.file for problem in files.problems] == ["<tar>"]
    assert "not a readable tar archive" in files.problems[0].message


def test_non_utf8_names_are_refused(tmp_path: Path) -> None:
    (tmp_path / "task.toml").write_text("")
    bad = os.fsencode(tmp_path) + b"/caf\xe9.txt"
    with open(bad, "wb") as handle:
        handle.write(b"x")
    files = TaskFiles.from_directory(tmp_path)
    assert [problem.message for problem in files.problems] == ["file name is not valid UTF-8"]
    assert list(files) == ["task.toml"]
    as_tar = TaskFiles.from_tar(tar_of(tmp_path))
    assert [problem.message for problem in as_tar.problems] == ["file name is not valid UTF-8"]


def test_limits_stop_reading_with_one_problem(tmp_path: Path) -> None:
    for index in range(5):
        (tmp_path / f"f{index}").write_bytes(b"x" * 100)
    by_count = TaskFiles.from_directory(tmp_path, limits=SourceLimits(max_files=3))
    assert len(by_count) == 3
    assert [p.render() for p in by_count.problems] == ["f3: more than 3 files and links; refusing to read on"]
    by_size = TaskFiles.from_tar(tar_of(tmp_path), limits=SourceLimits(max_total_bytes=250))
    assert len(by_size) == 2 and "exceeds 250 bytes" in by_size.problems[0].message
    deep = TaskFiles.from_mapping({"/".join(["d"] * 10) + "/f": "x"}, limits=SourceLimits(max_depth=5))
    assert "nested deeper than 5 levels" in deep.problems[0].message


# --- link bombs: a few KiB that would be a folder of GiBs ------------------------------------------

MiB = 1 << 20


def bomb(links: int, *, kind: bytes) -> bytes:
    """A gzipped tar of one MiB of zeros and ``links`` links to it (a few KiB in all)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("big.bin")
        info.size = MiB
        archive.addfile(info, io.BytesIO(bytes(MiB)))
        for number in range(links):
            link = tarfile.TarInfo(f"copy{number}")
            link.type, link.linkname = kind, "big.bin"
            archive.addfile(link)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.SYMTYPE], ids=["hard", "symbolic"])
def test_each_link_counts_as_the_file_it_becomes(kind: bytes) -> None:
    """A 168 KB ConfigMap of links once made 148 GiB: each copy now counts against the limits as it
    is made, and the first one past them is named."""
    packed = bomb(200, kind=kind)
    assert len(packed) < 64 * 1024
    files = TaskFiles.from_tar(packed, limits=SourceLimits(max_total_bytes=10 * MiB))
    first_refused = sorted(f"copy{number}" for number in range(200))[9]  # big.bin and 9 copies make 10 MiB
    assert [problem.render() for problem in files.problems] == [
        f"{first_refused}: task folder exceeds {10 * MiB} bytes in all; refusing to read on"
    ]
    assert sum(len(entry.data) for entry in files.values()) <= 10 * MiB
    by_count = TaskFiles.from_tar(bomb(10, kind=kind), limits=SourceLimits(max_files=5))
    assert [problem.message for problem in by_count.problems] == ["more than 5 files and links; refusing to read on"]
    assert len(by_count) <= 5


def test_a_chain_of_links_deeper_than_a_few_is_refused_naming_each_link(tmp_path: Path) -> None:
    (tmp_path / "task.toml").write_text("")
    depth = 10  # a0 → a1 → … → a9 → task.toml: a0 is 10 links from the file, a2 is 8
    for number in range(depth):
        os.symlink(f"a{number + 1}" if number + 1 < depth else "task.toml", tmp_path / f"a{number}")
    for files in (TaskFiles.from_directory(tmp_path), TaskFiles.from_tar(tar_of(tmp_path))):
        assert sorted(problem.render() for problem in files.problems) == [
            f"a{number}: a loop, or a chain of more than 8 symlinks" for number in range(2)
        ]
        assert "a2" in files and "a1" not in files


def test_the_operator_reads_a_task_folder_off_its_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A big folder is unpacked, validated and hashed in a worker thread: the loop other Episodes
    run on goes on meanwhile."""
    from episode_operator.api.episode_resource import TaskSource
    from episode_operator.kube.driver import read_task_files

    threads: list[threading.Thread] = []
    unpack = TaskFiles.from_tar

    def recorded(source: bytes, **kwargs: object) -> TaskFiles:
        threads.append(threading.current_thread())
        return unpack(source)

    monkeypatch.setattr(TaskFiles, "from_tar", recorded)
    packed = pack_tar(TaskFiles.from_mapping(single_step()))

    class ConfigMaps:
        async def get_config_map(self, namespace: str, name: str) -> object:
            return SimpleNamespace(binary_data={"task.tar.gz": base64.b64encode(packed).decode()}, data=None)

    source = TaskSource.model_validate({"configMap": {"name": "task-x"}})
    files = asyncio.run(read_task_files(ConfigMaps(), "ns", source, 0))  # type: ignore[arg-type]
    assert "task.toml" in files and threads and threads[0] is not threading.main_thread()
