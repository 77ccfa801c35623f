"""The artifacts an agent's pod sends, re-packed by the operator, and kept artifacts unpacked on a user's disk.

Every byte of a downloaded artifact is hostile (a root agent can replace its pod's supervisor and
tar): a crafted tar must bring nothing but the regular files and directories of the artifact's
source to a verifier, the store or a user's machine. One rule on every Python (no tar filter is
relied on: Debian 12's 3.11.2 has none).
"""

from __future__ import annotations

import io
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from episode_operator.runtime.archive import RefusedMember, extract_files, read_member, repack_artifact
from episode_operator.runtime.limits import OutputLimitExceeded, OutputLimits
from episode_operator.runtime.sandbox_protocol import ArchiveFile

SOURCE = "/logs/artifacts"
LIMITS = OutputLimits()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.uid, info.uname = kind, mode, link, 4242, "agent"
    return info


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


@pytest.fixture
def raw() -> Iterator[list[ArchiveFile]]:
    made: list[ArchiveFile] = []
    yield made
    for archive in made:
        archive.discard()


def repack(made: list[ArchiveFile], data: bytes, *, limits: OutputLimits = LIMITS, source: str = SOURCE):  # type: ignore[no-untyped-def]
    archive = ArchiveFile.of_bytes(data)
    made.append(archive)
    repacked = repack_artifact(archive, source, limits, turn_left=limits.turn_artifact_bytes)
    made.append(repacked.archive)
    return repacked


def members_of(archive: ArchiveFile) -> dict[str, tuple[bytes, int, int, int, bytes]]:
    """name → (type, mode, uid, size, data)."""
    found = {}
    with tarfile.open(archive.path) as tar:
        for info in tar:
            extracted = tar.extractfile(info) if info.isreg() else None
            found[info.name] = (info.type, info.mode, info.uid, info.size, extracted.read() if extracted else b"")
    return found


HOSTILE = [
    (member("logs/verifier/reward.txt"), b"1", "outside the artifact's source /logs/artifacts"),
    (member("logs/artifacts/../verifier/reward.txt"), b"1", "a name with '..'"),
    (member("/logs/verifier/reward.txt"), b"1", "an absolute name"),
    (member("/episode-operator/jobs/x/exit"), b"0", "an absolute name"),
    (
        member("logs/artifacts/up", tarfile.SYMTYPE, link="/logs/verifier"),
        b"",
        "a symbolic link to /logs/verifier: only regular files and directories are kept",
    ),
    (
        member("logs/artifacts/hard", tarfile.LNKTYPE, link="logs/verifier/reward.txt"),
        b"",
        "a hard link to logs/verifier/reward.txt: only regular files and directories are kept",
    ),
    (
        member("logs/artifacts/tty", tarfile.CHRTYPE),
        b"",
        "a character device: only regular files and directories are kept",
    ),
    (
        member("logs/artifacts/disk", tarfile.BLKTYPE),
        b"",
        "a block device: only regular files and directories are kept",
    ),
    (member("logs/artifacts/pipe", tarfile.FIFOTYPE), b"", "a FIFO: only regular files and directories are kept"),
    (member("logs/artifactsX/next-door"), b"1", "outside the artifact's source /logs/artifacts"),
]


def test_a_hostile_download_keeps_only_the_clean_members_and_says_why_of_the_rest(raw: list[ArchiveFile]) -> None:
    clean = [
        (member("logs/artifacts", tarfile.DIRTYPE, mode=0o755), b""),
        (member("logs/artifacts/result.txt", mode=0o6755), b"42"),
        (member("./logs/artifacts//deep/./note.md"), b"hi"),
    ]
    repacked = repack(raw, tar_bytes(*clean, *((info, data) for info, data, _ in HOSTILE)))
    assert members_of(repacked.archive) == {
        "logs/artifacts": (tarfile.DIRTYPE, 0o755, 0, 0, b""),
        "logs/artifacts/result.txt": (tarfile.REGTYPE, 0o755, 0, 2, b"42"),  # no setuid, setgid; root's
        "logs/artifacts/deep/note.md": (tarfile.REGTYPE, 0o644, 0, 2, b"hi"),
    }
    assert [(item.name, item.reason) for item in repacked.refused] == [
        (info.name, reason) for info, _, reason in HOSTILE
    ]
    assert (repacked.kind, repacked.files, repacked.size, repacked.present) == ("directory", 2, 4, True)


def test_what_would_not_unpack_is_refused_so_the_verifier_always_gets_its_inputs(raw: list[ArchiveFile]) -> None:
    """A crafted tar whose members clash (a file where a directory is, twice the same name) would
    make the verifier's tar fail, and the episode masked: the agent's way out of a 0."""
    repacked = repack(
        raw,
        tar_bytes(
            (member("logs/artifacts/a"), b"file"),
            (member("logs/artifacts/a/b"), b"under a file"),
            (member("logs/artifacts/a"), b"again"),
            (member("logs/artifacts/d/x"), b"x"),
            (member("logs/artifacts/d"), b"a file where a directory is"),
            (member("logs/artifacts/d", tarfile.DIRTYPE), b""),
        ),
    )
    assert members_of(repacked.archive).keys() == {"logs/artifacts/a", "logs/artifacts/d/x", "logs/artifacts/d"}
    assert [item.reason for item in repacked.refused] == [
        "inside /logs/artifacts/a, a file of the artifact",
        "a second member of that name",
        "a second member of that name",
    ]


def test_a_file_artifact_is_a_file_and_nothing_else_under_its_name(raw: list[ArchiveFile]) -> None:
    repacked = repack(
        raw,
        tar_bytes((member("app/out.txt"), b"7"), (member("app/out.txt/x"), b"8"), (member("app/other"), b"9")),
        source="/app/out.txt",
    )
    assert members_of(repacked.archive).keys() == {"app/out.txt"}
    assert repacked.kind == "file" and len(repacked.refused) == 2


@pytest.mark.parametrize(
    ("limits", "data", "passed"),
    [
        (
            OutputLimits(artifact_members=3),
            tar_bytes(*[(member(f"logs/artifacts/{n}"), b"x") for n in range(4)]),
            "artifact members bound",
        ),
        (OutputLimits(artifact_bytes=10), tar_bytes((member("logs/artifacts/big"), b"x" * 11)), "artifact bound"),
        (
            OutputLimits(turn_artifact_bytes=10),
            tar_bytes((member("logs/artifacts/big"), b"x" * 11)),
            "turn artifacts bound",
        ),
    ],
    ids=["members", "bytes", "turn"],
)
def test_an_artifact_past_a_bound_raises_and_leaves_no_file(
    raw: list[ArchiveFile],
    limits: OutputLimits,
    data: bytes,
    passed: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the operator's scratch space, this test's own
    with pytest.raises(OutputLimitExceeded, match=passed):
        repack(raw, data, limits=limits)
    assert [path.name for path in tmp_path.iterdir()] == [raw[0].path.name]  # the download only: the caller's


def test_a_sparse_file_is_refused_by_its_size_before_its_bytes_are_read(raw: list[ArchiveFile], tmp_path: Path) -> None:
    """GNU tar --sparse (what the supervisor's download uses) sends a 1 GiB hole in a few KiB; the
    member's size says what it would be, and the bound refuses it before a byte of it is made."""
    hole = tmp_path / "logs" / "artifacts" / "hole"
    hole.parent.mkdir(parents=True)
    with hole.open("wb") as file:
        file.truncate(1 << 30)
    small = hole.with_name("small")
    with small.open("wb") as file:
        file.truncate(3000)
        file.write(b"end")

    def sparse_tar(name: str) -> bytes:
        return subprocess.run(
            ["tar", "--sparse", "-c", "-f", "-", "-C", str(tmp_path), f"logs/artifacts/{name}"],
            check=True,
            capture_output=True,
        ).stdout

    data = sparse_tar("hole")
    assert len(data) < 64 * 1024
    with pytest.raises(OutputLimitExceeded, match=r"the files of artifact /logs/artifacts \(1073741824 bytes\)"):
        repack(raw, data, limits=OutputLimits(artifact_bytes=1 << 20))
    repacked = repack(raw, sparse_tar("small"))
    assert members_of(repacked.archive)["logs/artifacts/small"][4] == small.read_bytes()


@pytest.mark.parametrize("data", [b"not a tar" * 100, tar_bytes((member("logs/artifacts/x"), b"12345"))[:700]])
def test_a_download_that_is_not_a_tar_keeps_nothing_and_says_why(raw: list[ArchiveFile], data: bytes) -> None:
    repacked = repack(raw, data)
    assert not repacked.present and members_of(repacked.archive) == {}
    assert [item.name for item in repacked.refused] == [""] and "cannot be re-packed" in repacked.refused[0].reason


def test_the_capture_journal_is_read_within_the_bounds(raw: list[ArchiveFile]) -> None:
    archive = ArchiveFile.of_bytes(tar_bytes((member("capture/calls.jsonl"), b"{}\n")))
    raw.append(archive)
    assert read_member(archive, "capture/calls.jsonl", LIMITS) == b"{}\n"
    assert read_member(archive, "capture/other", LIMITS) is None
    with pytest.raises(OutputLimitExceeded):
        read_member(archive, "capture/calls.jsonl", OutputLimits(artifact_bytes=2))


# --- on a user's disk -------------------------------------------------------------------------


def opened(data: bytes) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(data), mode="r|")


def test_files_and_directories_are_extracted_without_special_bits(tmp_path: Path) -> None:
    written, refused = extract_files(
        opened(
            tar_bytes((member("out", tarfile.DIRTYPE, mode=0o755), b""), (member("out/result.txt", mode=0o4777), b"42"))
        ),
        tmp_path,
    )
    assert written == [tmp_path / "out" / "result.txt"] and refused == []
    assert (tmp_path / "out" / "result.txt").read_text() == "42"
    mode = (tmp_path / "out" / "result.txt").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)


@pytest.mark.parametrize(
    ("hostile", "reason"),
    [
        (member("../escaped.txt"), "a name with '..'"),
        (member("/etc/escaped.txt"), "an absolute name"),
        (member("out/up", tarfile.SYMTYPE, link="../../escaped"), "a symbolic link to ../../escaped"),
        (member("abs", tarfile.SYMTYPE, link="/etc/passwd"), "a symbolic link to /etc/passwd"),
        (member("inner", tarfile.SYMTYPE, link="out"), "a symbolic link to out"),
        (member("hard", tarfile.LNKTYPE, link="out/result.txt"), "a hard link to out/result.txt"),
        (member("fifo", tarfile.FIFOTYPE), "a FIFO"),
        (member("dev", tarfile.CHRTYPE), "a character device"),
    ],
    ids=["dot-dot", "absolute", "link-out", "absolute-link", "inner-link", "hard-link", "fifo", "device"],
)
def test_what_is_not_a_file_or_directory_inside_the_destination_is_refused(
    hostile: tarfile.TarInfo, reason: str, tmp_path: Path
) -> None:
    destination = tmp_path / "dest"
    data = b"x" if hostile.isreg() else b""
    written, refused = extract_files(opened(tar_bytes((hostile, data), (member("out/result.txt"), b"42"))), destination)
    assert written == [destination / "out" / "result.txt"]
    assert [item.name for item in refused] == [hostile.name] and refused[0].reason.startswith(reason)
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["dest", "out", "result.txt"]


def test_a_link_chain_in_the_archive_can_lead_nowhere(tmp_path: Path) -> None:
    """The chain that beat the by-hand check before it (``d`` → ``.``, ``e`` → ``d/d/d/../..``, then
    a file through ``e``): no link is ever made, so no chain exists to follow."""
    destination = tmp_path / "a" / "b" / "dest"
    written, refused = extract_files(
        opened(
            tar_bytes(
                (member("e", tarfile.SYMTYPE, link="d/d/d/../.."), b""),
                (member("d", tarfile.SYMTYPE, link="."), b""),
                (member("e/escaped.txt"), b"x"),
            )
        ),
        destination,
    )
    assert not (tmp_path / "a" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()
    assert [item.reason.split(":")[0] for item in refused] == ["a symbolic link to d/d/d/../..", "a symbolic link to ."]
    assert written == [destination / "e" / "escaped.txt"]  # a plain directory e, inside


def test_a_link_already_in_the_destination_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / "out").symlink_to(outside)
    (destination / "file").symlink_to(outside / "target")
    written, refused = extract_files(
        opened(tar_bytes((member("out/result.txt"), b"42"), (member("file"), b"replaced"))), destination
    )
    assert list(outside.iterdir()) == []
    assert [item.name for item in refused] == ["out/result.txt"] and "in the way" in refused[0].reason
    assert written == [destination / "file"] and not (destination / "file").is_symlink()
    assert (destination / "file").read_text() == "replaced"


def test_renaming_keeps_what_is_wanted_inside_the_destination(tmp_path: Path) -> None:
    def rename(name: str) -> str | None:
        return {"a": "kept/a", "b": "../b"}.get(name)

    written, refused = extract_files(
        opened(tar_bytes((member("a"), b"1"), (member("b"), b"2"), (member("c"), b"3"))), tmp_path / "d", rename
    )
    assert written == [tmp_path / "d" / "kept" / "a"]
    assert refused == [RefusedMember("b", "renamed to '../b', outside the destination")]
