"""The pages of ``kubectl episode view``, rendered from a set's status and a child's kept records: what
they say, the plot's geometry, and that nothing an agent wrote becomes markup.

The inputs are the real shapes: the set's status as its controller's planner computes it, Episode
statuses of the API's models, a capture journal and an ATIF trajectory built from it
(``tests/unit/results.py``). ``test_view.py`` serves these pages; ``test_view_browser.py`` shows them
in Chromium.
"""

from __future__ import annotations

import html.parser
import re
import xml.etree.ElementTree as ElementTree
from typing import Any

import pytest

from episode_operator.api.episodeset_resource import SetTaskStatus
from episode_operator.cli import results_page
from episode_operator.cli.results_page import (
    BELOW_COLOUR,
    PASS_COLOUR,
    ArtifactFile,
    EpisodeData,
    PlotGeometry,
    Results,
    element,
    episode_page,
    reward_plot,
    turn_records,
)
from episode_operator.runtime.episode_store import SEED_LOGS
from episode_operator.runtime.evaluation import selection_status
from tests.unit import results

BASE = "/s3cret/"
# Every element the pages are made of: an agent's markup would add others (script, img, iframe…).
PAGE_TAGS = {
    *("html", "head", "meta", "title", "link", "body", "h1", "h2", "h3", "h4", "p", "a", "code", "pre", "strong"),
    *("em", "div", "section", "details", "summary", "dl", "dt", "dd", "table", "thead", "tbody", "tr", "th", "td"),
    *("svg", "line", "rect", "text"),
}


class Parsed(html.parser.HTMLParser):
    """A page as a browser's parser reads it: its elements, their attributes, and its text."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.chunks: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def results_of_the_set() -> Results:
    return Results(
        title=f"EpisodeSet {results.NAMESPACE}/{results.SET_NAME}",
        status=results.set_status(),
        attempts=results.ATTEMPTS,
        success_threshold=results.THRESHOLD,
    )


def hostile_episode() -> EpisodeData:
    view = next(view for view in results.child_views() if view.name == results.HOSTILE_CHILD)
    return EpisodeData(
        namespace=results.NAMESPACE,
        name=results.HOSTILE_CHILD,
        status=results.child_status(view),
        set_name=results.SET_NAME,
        logs=results.HOSTILE_LOGS,
        records_attempt=1,
        turns=turn_records(results.hostile_records()),
        artifacts=[ArtifactFile(results.TURN, path, len(data)) for path, data in results.ARTIFACTS.items()],
        refused_artifacts=[("app/out/<script>link</script>", "a symbolic link")],
    )


PAGES = {
    "results": lambda: results_page.results_page(results_of_the_set(), base=BASE),
    "episode": lambda: episode_page(hostile_episode(), base=BASE),
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_what_agents_wrote_is_text_on_the_page_never_markup(name: str) -> None:
    """The hostile child's markup (a script, an image with onerror, a closing </pre>) shows as the text
    it is; the page has only its own elements, no event handler, and links only within the server."""
    page = PAGES[name]()
    parsed = Parsed(page)
    assert {tag for tag, _ in parsed.tags} <= PAGE_TAGS
    assert [attr for _, attrs in parsed.tags for attr in attrs if attr.startswith("on")] == []
    hrefs = [attrs["href"] or "" for tag, attrs in parsed.tags if "href" in attrs]
    assert hrefs and all(href.startswith((BASE, "#")) for href in hrefs), hrefs
    shown = {
        "results": [results.HOSTILE_TASK],
        "episode": [
            results.HOSTILE_TASK,
            results.HOSTILE_ANSWER,
            results.HOSTILE_LOG.rstrip("\n"),
            results.HOSTILE_ARTIFACT,
            results.HOSTILE_MESSAGE,
            results.SCRIPT,
            "app/out/<script>link</script>",
        ],
    }[name]
    for text in shown:
        assert text in parsed.text, text


def test_the_escaping_covers_attributes_and_text_alike() -> None:
    made = element("a", 'x"><script>1</script>', href='/a" onclick="b', title="'single'")
    assert made == (
        '<a href="/a&quot; onclick=&quot;b" title="&#x27;single&#x27;">x&quot;&gt;&lt;script&gt;1&lt;/script&gt;</a>'
    )
    assert Parsed(made).tags == [("a", {"href": '/a" onclick="b', "title": "'single'"})]


def directives(policy: str) -> dict[str, list[str]]:
    return {name: values for name, *values in (part.split() for part in policy.split(";") if part.strip())}


def test_the_pages_may_run_no_script_and_load_nothing_from_elsewhere() -> None:
    page = directives(results_page.CONTENT_SECURITY_POLICY)
    assert page["default-src"] == ["'none'"]
    assert page["script-src"] == ["'none'"]  # not inline, not hashed, not from anywhere
    assert page["style-src"] == ["'self'"] and page["img-src"] == ["'self'"]
    assert page["frame-ancestors"] == ["'none'"] and page["base-uri"] == ["'none'"]
    download = directives(results_page.DOWNLOAD_SECURITY_POLICY)
    assert download["default-src"] == ["'none'"] and "sandbox" in download
    for tag, attrs in Parsed(PAGES["episode"]()).tags:
        assert "style" not in attrs, f"<{tag} style=…> is an inline style the policy refuses"


def bars(svg: str) -> dict[str, ElementTree.Element]:
    root = ElementTree.fromstring(svg)
    return {rect.get("data-task", ""): rect for rect in root.iter("{http://www.w3.org/2000/svg}rect")}


def test_the_plot_draws_each_tasks_mean_reward_to_scale_coloured_by_the_threshold() -> None:
    status = results.set_status()
    geometry = PlotGeometry()
    svg = reward_plot(status.tasks, results.THRESHOLD, geometry)
    drawn = bars(svg)
    means = {task.name: task.mean_reward for task in status.tasks}
    assert means == {"solved": 1.0, "flaky": 0.5, "partial": 0.5, results.HOSTILE_TASK: 0.0, "refused": None}
    assert sorted(drawn) == sorted(name for name, mean in means.items() if mean is not None)
    for name, rect in drawn.items():
        mean = means[name]
        assert mean is not None
        assert float(rect.get("width", "")) == pytest.approx(geometry.bar_width * mean, abs=0.1)
        assert rect.get("fill") == (PASS_COLOUR if mean >= results.THRESHOLD else BELOW_COLOUR)
        assert float(rect.get("data-mean", "")) == mean
    rows = [float(rect.get("y", "")) for rect in drawn.values()]
    assert rows == sorted(rows), "one row per task, in task order"
    root = ElementTree.fromstring(svg)
    texts = ["".join(text.itertext()) for text in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "no graded attempt" in texts  # the refused task: no bar, said so
    threshold = next(line for line in root.iter("{http://www.w3.org/2000/svg}line") if line.get("class") == "threshold")
    assert float(threshold.get("x1", "")) == pytest.approx(geometry.label_width + geometry.bar_width, abs=0.1)


def test_rewards_above_one_widen_the_scale() -> None:
    tasks = [
        SetTaskStatus(index=0, name="big", mean_reward=2.0, graded=1),
        SetTaskStatus(index=1, name="one", mean_reward=1.0, graded=1),
    ]
    drawn = bars(reward_plot(tasks, 1.0, PlotGeometry(bar_width=400)))
    assert float(drawn["big"].get("width", "")) == pytest.approx(400)
    assert float(drawn["one"].get("width", "")) == pytest.approx(200)


def cells(page: str, table_class: str) -> list[list[str]]:
    """The text of each row of the page's table of that class."""
    body = page[page.index(f'<table class="{table_class}">') :]
    body = body[: body.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)[1:]
    return [[Parsed(cell).text for cell in re.findall(r"<td>(.*?)</td>", row, re.S)] for row in rows]


def test_the_results_page_shows_the_sets_outcomes_pass_at_k_failure_kinds_and_tasks() -> None:
    page = PAGES["results"]()
    status = results.set_status()
    assert cells(page, "outcomes") == [["7", "0", "2", "1", "0", "0", "7", "3"]]
    assert cells(page, "pass-at-k") == [
        [str(row.k), f"{row.value:.4g}", str(row.tasks), str(row.ungraded)] for row in status.pass_at_k
    ]
    assert [row[:3] for row in cells(page, "failure-kinds")] == [
        ["harbor:invalid_task", "TerminalFailure", "2"],
        ["agent:exited", "Graded", "1"],
        ["outage:image_pull", "Ungraded", "1"],
    ]
    tasks = cells(page, "tasks")
    assert [row[1] for row in tasks] == [name for name, _ in results.TASKS]
    assert [row[2].split() for row in tasks] == [
        ["1", "1"],
        ["1", "0"],
        ["0.5", "0.5"],
        ["Ungraded", "0"],
        ["TerminalFailure", "TerminalFailure"],
    ]
    assert [row[6:] for row in tasks] == [
        ["1", "1", "1"],
        ["0.5", "0.5", "1"],
        ["0.5", "0", "0"],
        ["0", "0", "0"],
        ["-", "-", "-"],
    ]
    assert f'href="{BASE}episodes/{results.HOSTILE_CHILD}"' in page


def test_the_episode_page_shows_each_turn_its_trajectory_calls_logs_and_artifacts() -> None:
    page = PAGES["episode"]()
    parsed = Parsed(page)
    steps = [attrs.get("class") for tag, attrs in parsed.tags if tag == "div" and "step" in (attrs.get("class") or "")]
    assert steps == ["step system", "step user", "step agent"]
    assert cells(page, "model-calls")[0][2:9] == ["POST ", "200", "", "2000", "300", "120", "30"]
    artifact_links = [
        attrs["href"] for tag, attrs in parsed.tags if tag == "a" and "/artifacts/" in (attrs["href"] or "")
    ]
    assert artifact_links == [
        f"{BASE}episodes/{results.HOSTILE_CHILD}/artifacts/{results.TURN}/out/"
        "%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E%22quoted%22.html",
        f"{BASE}episodes/{results.HOSTILE_CHILD}/artifacts/{results.TURN}/out/result.txt",
    ]
    assert f'href="{BASE}episodes/{results.HOSTILE_CHILD}/log?turn=seed"' in page
    assert "seeded" in parsed.text


def test_a_trajectory_that_is_not_atif_is_shown_as_text_with_why() -> None:
    records = turn_records({"attempt": 1, "turns": {"t": {"trajectory.json": '{"steps": "<b>no</b>"}'}}})
    assert records["t"].trajectory is None
    assert (records["t"].trajectory_problem or "").startswith("not an ATIF trajectory")
    data = EpisodeData(namespace="n", name="e", status=results.child_status(results.child_views()[0]), turns=records)
    parsed = Parsed(episode_page(data, base=BASE))
    assert '{"steps": "<b>no</b>"}' in parsed.text


def test_a_long_log_shows_its_end_and_links_the_whole() -> None:
    text = "first line\n" + "x" * results_page.LOG_SHOWN_CHARS + "\nlast line\n"
    data = EpisodeData(
        namespace="n", name="e", status=results.child_status(results.child_views()[0]), logs={"01-make": text}
    )
    parsed = Parsed(episode_page(data, base=BASE))
    assert "last line" in parsed.text and "first line" not in parsed.text
    assert f"of {len(text)} characters" in parsed.text


def test_the_seed_logs_are_where_the_store_keeps_them() -> None:
    assert results_page.SEED == SEED_LOGS


def test_selected_episodes_score_as_the_same_episodes_in_a_set() -> None:
    """``view -l``: the Episodes grouped by task give the set's own numbers."""
    by_task: dict[int, list[Any]] = {}
    for view in results.child_views():
        by_task.setdefault(view.index, []).append(view)
    tasks = [(results.TASKS[index][0], views) for index, views in sorted(by_task.items())]
    selected = selection_status(tasks, results.THRESHOLD, now=results.FINISHED)
    expected = results.set_status()
    for field in ("mean_reward", "pass_at_k", "outcomes", "phases", "finished", "total", "progress"):
        assert getattr(selected, field) == getattr(expected, field), field
    assert [task.model_dump(exclude={"config_map"}) for task in selected.tasks] == [
        task.model_dump(exclude={"config_map"}) for task in expected.tasks
    ]
    assert selected.phase == "Succeeded"
