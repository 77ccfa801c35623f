"""Pixels of a PNG, with the standard library only: what the browser tests need of Chromium's screenshots
(8-bit RGB or RGBA, not interlaced, as the PNG specification filters them), read to count the colours a page shows."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        start = x * self.channels
        red, green, blue = self.rows[y][start : start + 3]
        return red, green, blue

    def where(self, colour: tuple[int, int, int]) -> list[tuple[int, int]]:
        """Every (x, y) of exactly that colour."""
        found = []
        wanted = bytes(colour)
        for y, row in enumerate(self.rows):
            start = row.find(wanted)
            while start != -1:
                if start % self.channels == 0:
                    found.append((start // self.channels, y))
                start = row.find(wanted, start + 1)
        return found


def _paeth(left: int, up: int, corner: int) -> int:
    estimate = left + up - corner
    distances = (abs(estimate - left), abs(estimate - up), abs(estimate - corner))
    return (
        left
        if distances[0] <= distances[1] and distances[0] <= distances[2]
        else up
        if distances[1] <= distances[2]
        else corner
    )


def read_png(path: Path) -> Image:
    data = path.read_bytes()
    assert data.startswith(SIGNATURE), f"{path}: not a PNG"
    position, compressed = len(SIGNATURE), b""
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind, body = data[position + 4 : position + 8], data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour_type in (2, 6) and interlace == 0, f"{path}: an 8-bit RGB(A) PNG expected"
            channels = 3 if colour_type == 2 else 4
        elif kind == b"IDAT":
            compressed += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(compressed)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        method, row = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if method == 1:  # Sub
            for i in range(channels, stride):
                row[i] = (row[i] + row[i - channels]) & 0xFF
        elif method == 2:  # Up
            row = bytearray((a + b) & 0xFF for a, b in zip(row, previous, strict=True))
        elif method == 3:  # Average
            for i in range(stride):
                left = row[i - channels] if i >= channels else 0
                row[i] = (row[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif method == 4:  # Paeth
            for i in range(stride):
                left = row[i - channels] if i >= channels else 0
                corner = previous[i - channels] if i >= channels else 0
                row[i] = (row[i] + _paeth(left, previous[i], corner)) & 0xFF
        rows.append(bytes(row))
        previous = row
    return Image(width, height, channels, rows)
