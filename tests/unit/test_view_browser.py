"""``kubectl episode view`` in a browser: the command runs as a user runs it, against the API server of
``tests/unit/fake_apiserver.py``, and headless Chromium loads its pages. What Chromium made of them is
checked twice: in the DOM after loading (the hostile child's markup is text, no script ran — a script
that ran would have left its mark there, as the control shows) and in the screenshot's pixels (the
plot's bars in their colours, at lengths in the ratio of their tasks' mean rewards).

The screenshots are kept in ``tests/out/view/`` (``$EPISODE_TEST_OUTPUT`` overrides it) for a person
to look at.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from episode_operator.cli.results_page import BELOW_COLOUR, PASS_COLOUR
from tests.conftest import REPO
from tests.unit import results
from tests.unit.chromium import load
from tests.unit.png import read_png
from tests.unit.test_results_page import Parsed
from tests.unit.test_view import served, viewing

OUTPUT = Path(os.environ.get("EPISODE_TEST_OUTPUT") or REPO / "tests" / "out") / "view"


def rgb(colour: str) -> tuple[int, int, int]:
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return red, green, blue


def attributes_of(dom: str, tag: str) -> list[dict[str, str | None]]:
    return [attrs for name, attrs in Parsed(dom).tags if name == tag]


def test_a_script_that_runs_leaves_its_mark_in_the_dom(tmp_path: Path) -> None:
    """The control: the DOM Chromium dumps is the one scripts changed, so the checks below can fail."""
    page = tmp_path / "control.html"
    page.write_text(f"<!DOCTYPE html><html><body><p>control</p>{results.SCRIPT}</body></html>")
    loaded = load(page.as_uri(), tmp_path / "control.png", width=400, height=300)
    assert attributes_of(loaded.dom, "body") == [{"data-pwned": "script"}]


def test_the_results_and_a_hostile_episode_in_chromium(tmp_path: Path) -> None:
    with served(tmp_path) as api, viewing(api, results.SET_NAME) as (_process, url):
        summary = load(url, OUTPUT / "results.png")
        episode = load(f"{url}episodes/{results.HOSTILE_CHILD}", OUTPUT / "episode.png", height=2400)

    # No script ran, none is in the page, and what the agents wrote is text.
    for loaded, shown in (
        (summary, [results.HOSTILE_TASK]),
        (episode, [results.HOSTILE_ANSWER, results.HOSTILE_ARTIFACT, results.HOSTILE_MESSAGE, results.SCRIPT]),
    ):
        assert attributes_of(loaded.dom, "body") == [{}], "a script ran: it marked the body"
        for tag in ("script", "img", "iframe", "object", "embed"):
            assert attributes_of(loaded.dom, tag) == [], f"a <{tag}> of the agent's became an element"
        text = Parsed(loaded.dom).text
        for hostile in shown:
            assert hostile in text, hostile
    assert Parsed(summary.dom).tags[0] == ("html", {"lang": "en"})
    titles = [chunk for chunk in Parsed(summary.dom).chunks if chunk.startswith("EpisodeSet ")]
    assert titles[0] == f"EpisodeSet {results.NAMESPACE}/{results.SET_NAME}"  # the <title>, unchanged

    # The plot as drawn: the solved task's bar green, the two half-solved tasks' bars orange and half as long.
    image = read_png(summary.screenshot)
    green, orange = image.where(rgb(PASS_COLOUR)), image.where(rgb(BELOW_COLOUR))
    assert green and orange, "the plot's bars are not on the screenshot"
    green_rows = {y for _, y in green}
    orange_rows = sorted({y for _, y in orange})
    green_width = max(x for x, _ in green) - min(x for x, _ in green) + 1
    orange_width = max(x for x, _ in orange) - min(x for x, _ in orange) + 1
    assert abs(green_width - 2 * orange_width) <= 2, (green_width, orange_width)
    assert min(x for x, _ in green) == min(x for x, _ in orange), "bars start on one axis"
    assert max(green_rows) < orange_rows[0], "the solved task's row comes first"
    bands = sum(1 for previous, row in itertools.pairwise(orange_rows) if row != previous + 1) + 1
    assert bands == 2, "two orange bars: flaky and partial (the hostile task's mean 0 draws none)"
    assert len(green) >= 0.9 * green_width * len(green_rows), "the green bar is solid"
