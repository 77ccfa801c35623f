"""Summaries of repeated measurements and the tables the suite prints."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    """Median and spread of repeated measurements."""

    n: int
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(values), statistics.median(values), min(values), max(values))

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "median": self.median, "min": self.low, "max": self.high}

    def render(self, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
        if not self.n:
            return "-"
        middle = f"{self.median * scale:.{digits}f}{unit}"
        if self.n == 1:
            return middle
        return f"{middle} [{self.low * scale:.{digits}f}–{self.high * scale:.{digits}f}]"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> str:
    """A plain-text table (also valid Markdown)."""
    cells = [[str(cell) for cell in header], *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"

    out = [f"### {title}", "", line(cells[0]), "|" + "|".join("-" * (width + 2) for width in widths) + "|"]
    out += [line(row) for row in cells[1:]]
    if note:
        out += ["", note]
    return "\n".join(out) + "\n"


def seconds(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f} s"


def millis(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.0f} ms"
