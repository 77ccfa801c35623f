"""Extracting kept artifacts safely, with or without Python's tar "data" filter (3.11.4+).

Debian 12's Python is 3.11.2 (the test cluster's operator image, a Debian host's kubectl-episode):
there ``extract_safely`` makes the filter's refusals itself. Each case runs both ways.
"""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from episode_operator.runtime.archive import extract_safely

NATIVE = [
    pytest.param(True, id="filter", marks=pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="")),
    pytest.param(False, id="by-hand"),
]


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


def member(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.uid = kind, mode, link, 4242
    return info


@pytest.mark.parametrize("native", NATIVE)
def test_files_directories_and_inner_links_are_extracted_without_special_bits(native: bool, tmp_path: Path) -> None:
    archive = tar_of(
        (member("out", tarfile.DIRTYPE, mode=0o755), b""),
        (member("out/result.txt", mode=0o4777), b"42"),
        (member("out/latest", tarfile.SYMTYPE, link="result.txt"), b""),
    )
    extract_safely(archive, tmp_path, native=native)
    assert (tmp_path / "out" / "result.txt").read_text() == "42"
    assert (tmp_path / "out" / "latest").resolve() == (tmp_path / "out" / "result.txt").resolve()
    mode = (tmp_path / "out" / "result.txt").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH)


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize(
    "hostile",
    [
        member("../escaped.txt"),
        member("out/up", tarfile.SYMTYPE, link="../../escaped"),
        member("abs", tarfile.SYMTYPE, link="/etc/passwd"),
        member("fifo", tarfile.FIFOTYPE),
    ],
    ids=["dot-dot", "link-out", "absolute-link", "fifo"],
)
def test_what_would_leave_the_destination_is_refused(native: bool, hostile: tarfile.TarInfo, tmp_path: Path) -> None:
    destination = tmp_path / "dest"
    destination.mkdir()
    with pytest.raises(tarfile.TarError):
        extract_safely(tar_of((hostile, b"x" if hostile.isfile() else b"")), destination, native=native)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("native", NATIVE)
def test_an_absolute_name_lands_inside_the_destination(native: bool, tmp_path: Path) -> None:
    extract_safely(tar_of((member("/etc/escaped.txt"), b"x")), tmp_path / "dest", native=native)
    assert (tmp_path / "dest" / "etc" / "escaped.txt").read_text() == "x"
