"""The pages of ``kubectl episode view``, rendered from statuses and kept records (pure: no I/O).

Everything an agent wrote is hostile here: its model's answers, its logs, its artifacts' file names,
the messages its failures left in a status. So nothing reaches the HTML as it is: :func:`element`
escapes every child and attribute value that is not :class:`Html` made by this module, and the pages
run no script at all — the server sends :data:`CONTENT_SECURITY_POLICY`, which forbids scripts
(inline or not), so even a hole in the escaping would show text, not run it. The plot is an SVG
drawn here, the stylesheet is :data:`STYLESHEET`, served by the same server: the page loads
nothing from elsewhere (the machine may have no network, and the page should not call out).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeStatus, TurnStatus
from episode_operator.api.episodeset_resource import EpisodeSetStatus, SetChildStatus, SetTaskStatus
from episode_operator.api.export import CALLS_RECORD, INSTRUCTION_RECORD, TRAJECTORY_RECORD
from episode_operator.api.vocabulary import is_terminal
from episode_operator.capture.atif import Content, Step, Trajectory
from episode_operator.capture.records import CapturedCall, model_call_record, parse_journal

# No script of any kind, no object, no frame, nothing fetched but this server's stylesheet and its
# downloads: what a page shows is text and an inline SVG.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# An artifact is served as a download, never shown as a page of this origin (it may be HTML the agent
# wrote): the sandbox directive gives it an opaque origin even if a browser rendered it anyway.
DOWNLOAD_SECURITY_POLICY = "default-src 'none'; sandbox"
# How much of a turn's logs a page shows (the end of them); the whole log is a link away.
LOG_SHOWN_CHARS = 64 * 1024
TASK_LABEL_CHARS = 32
# The turn name under which the store keeps an attempt's seed logs (runtime/episode_store.py SEED_LOGS, which this
# module may not import: the store does I/O; a unit test holds them equal).
SEED = "seed"

# Colours of the plot's bars: a task whose mean reward reached the success threshold, and one below.
PASS_COLOUR = "#2f855a"
BELOW_COLOUR = "#dd6b20"


class Html(str):
    """Markup made by this module: never escaped again. Any other string is text, and escaped."""

    __slots__ = ()


def escape(value: object) -> Html:
    """``value`` as text in HTML, in an element or a quoted attribute value."""
    return Html(html.escape(str(value), quote=True))


Child = Html | str | int | float | None


def join(parts: Iterable[Child]) -> Html:
    """Children side by side; text among them escaped."""
    return Html("".join(part if isinstance(part, Html) else escape(part) for part in parts if part is not None))


def element(tag: str, *children: Child, **attributes: object) -> Html:
    """``<tag attributes>children</tag>``: attribute names from keywords (``class_`` is ``class``,
    ``data_task`` is ``data-task``), every value and every child but :class:`Html` escaped; an
    attribute whose value is None or False is left out."""
    attrs = "".join(
        f' {name.rstrip("_").replace("_", "-")}="{escape(value)}"'
        for name, value in attributes.items()
        if value is not None and value is not False
    )
    return Html(f"<{tag}{attrs}>{join(children)}</{tag}>")


def link(href: str, *children: Child, **attributes: object) -> Html:
    return element("a", *children, href=href, **attributes)


def number(value: float | None, missing: str = "-") -> str:
    """A reward or a measure as people read it: 4 significant digits, counts whole."""
    if value is None:
        return missing
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def table(headers: Sequence[Child], rows: Iterable[Sequence[Child]], **attributes: object) -> Html:
    head = element("thead", element("tr", *(element("th", header) for header in headers)))
    body = element("tbody", *(element("tr", *(element("td", cell) for cell in row)) for row in rows))
    return element("table", head, body, **attributes)


def summary(items: Iterable[tuple[str, Child]]) -> Html:
    """A list of ``label: value`` (values left out when None)."""
    return element(
        "dl",
        *(join([element("dt", label), element("dd", value)]) for label, value in items if value is not None),
        class_="summary",
    )


def page(title: str, *body: Child, base: str) -> Html:
    """A whole page: ``base`` is the server's root path (where the stylesheet is)."""
    head = element(
        "head",
        Html('<meta charset="utf-8">'),
        Html('<meta name="referrer" content="no-referrer">'),
        element("title", title),
        Html(f'<link rel="stylesheet" href="{escape(base + "style.css")}">'),
    )
    return Html("<!DOCTYPE html>\n" + element("html", head, element("body", *body), lang="en"))


STYLESHEET = """
body { font-family: "DejaVu Sans", system-ui, sans-serif; margin: 1.5rem; color: #1a202c; background: #fff; }
h1 { font-size: 1.4rem; }
h2 { font-size: 1.15rem; margin-top: 1.6rem; border-bottom: 1px solid #cbd5e0; }
h3 { font-size: 1rem; margin-top: 1.2rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #cbd5e0; padding: .2rem .5rem; text-align: left; vertical-align: top; }
th { background: #edf2f7; }
pre { background: #f7fafc; border: 1px solid #e2e8f0; padding: .5rem; white-space: pre-wrap;
      word-break: break-word; max-height: 30rem; overflow: auto; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: .15rem 1rem; }
dl.summary dt { font-weight: bold; }
dl.summary dd { margin: 0; }
.pass { background: #c6f6d5; }
.below { background: #feebc8; }
.ungraded, .masked, .terminal { background: #e2e8f0; }
.running { background: #bee3f8; }
.step { border-left: 4px solid #cbd5e0; padding-left: .6rem; margin: .8rem 0; }
.step.agent { border-color: #3182ce; }
.step.user { border-color: #38a169; }
.copied { opacity: .6; }
.note { color: #4a5568; }
.error { color: #c53030; }
svg text { font-family: "DejaVu Sans", sans-serif; font-size: 12px; fill: #1a202c; }
"""


# --- the plot ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlotGeometry:
    label_width: int = 240
    bar_width: int = 420
    row_height: int = 22
    bar_height: int = 14
    top: int = 24
    bottom: int = 28


def reward_plot(tasks: Sequence[SetTaskStatus], threshold: float, geometry: PlotGeometry = PlotGeometry()) -> Html:
    """Mean reward by task as a horizontal bar chart (SVG): one row per task in task order, the bar's
    length its mean over graded attempts (none: no bar, "no graded attempt"), green when it reached the
    success threshold (a dashed line), orange below it."""
    g = geometry
    means = [task.mean_reward for task in tasks if task.mean_reward is not None]
    scale = max([1.0, threshold, *means])
    height = g.top + g.row_height * max(len(tasks), 1) + g.bottom
    width = g.label_width + g.bar_width + 90
    x0 = g.label_width

    def x(value: float) -> float:
        return x0 + g.bar_width * value / scale

    parts: list[Html] = [element("title", "Mean reward by task")]
    for tick in (scale * i / 4 for i in range(5)):
        parts.append(
            element(
                "line", x1=f"{x(tick):.1f}", y1=g.top - 6, x2=f"{x(tick):.1f}", y2=height - g.bottom, stroke="#e2e8f0"
            )
        )
        parts.append(element("text", number(tick), x=f"{x(tick):.1f}", y=height - 10, text_anchor="middle"))
    for row, task in enumerate(tasks):
        y = g.top + row * g.row_height
        name = task.name if len(task.name) <= TASK_LABEL_CHARS else task.name[: TASK_LABEL_CHARS - 1] + "…"
        parts.append(element("text", name, x=x0 - 8, y=y + g.bar_height - 2, text_anchor="end", class_="task-label"))
        if task.mean_reward is None:
            parts.append(element("text", "no graded attempt", x=x0 + 4, y=y + g.bar_height - 2, class_="note"))
            continue
        colour = PASS_COLOUR if task.mean_reward >= threshold else BELOW_COLOUR
        parts.append(
            element(
                "rect",
                element("title", f"{task.name}: mean reward {number(task.mean_reward)} over {task.graded} graded"),
                x=x0,
                y=y,
                width=f"{x(task.mean_reward) - x0:.1f}",
                height=g.bar_height,
                fill=colour,
                class_="bar",
                data_task=task.name,
                data_mean=repr(task.mean_reward),
            )
        )
        parts.append(
            element("text", number(task.mean_reward), x=f"{x(task.mean_reward) + 4:.1f}", y=y + g.bar_height - 2)
        )
    if threshold <= scale:
        parts.append(
            Html(
                f'<line class="threshold" x1="{x(threshold):.1f}" y1="{g.top - 6}" x2="{x(threshold):.1f}" '
                f'y2="{height - g.bottom}" stroke="#4a5568" stroke-dasharray="4 3"/>'
            )
        )
    return element(
        "svg",
        *parts,
        xmlns="http://www.w3.org/2000/svg",
        width=width,
        height=height,
        viewBox=f"0 0 {width} {height}",
        role="img",
        class_="reward-plot",
    )


# --- the results of a set (or of Episodes chosen by a selector) ------------------------------------------
@dataclass(frozen=True)
class Results:
    """What the results page shows: a set's status (or one made from selected Episodes), and how it is named."""

    title: str
    status: EpisodeSetStatus
    attempts: int
    success_threshold: float = 1.0


def child_class(record: SetChildStatus, threshold: float) -> str:
    if not is_terminal(record.phase):
        return "running"
    if record.outcome == "Graded":
        return "pass" if record.reward is not None and record.reward >= threshold else "below"
    return {"Masked": "masked", "TerminalFailure": "terminal"}.get(record.outcome or "", "ungraded")


def child_text(record: SetChildStatus) -> str:
    if not is_terminal(record.phase):
        return record.phase or "Pending"
    if record.outcome == "Graded":
        return number(record.reward)
    return record.outcome or "?"


def episode_href(base: str, name: str) -> str:
    return f"{base}episodes/{quote(name, safe='')}"


def attempts_cell(task: SetTaskStatus, threshold: float, base: str) -> Html:
    return join(
        join(
            [
                link(
                    episode_href(base, record.name),
                    child_text(record),
                    class_=f"attempt {child_class(record, threshold)}",
                    title=f"attempt {record.attempt}: {record.name}"
                    + (f" ({record.failure_kind})" if record.failure_kind else ""),
                ),
                " ",
            ]
        )
        for record in task.children
    )


def failure_kinds(tasks: Sequence[SetTaskStatus]) -> list[tuple[str, str, list[str]]]:
    """(failure kind, outcome, the children that ended so), the commonest first."""
    found: dict[tuple[str, str], list[str]] = {}
    for record in (record for task in tasks for record in task.children):
        if is_terminal(record.phase) and record.failure_kind:
            found.setdefault((record.failure_kind, record.outcome or "?"), []).append(record.name)
    return [
        (kind, outcome, names) for (kind, outcome), names in sorted(found.items(), key=lambda i: (-len(i[1]), i[0]))
    ]


FAILURE_LINKS = 10  # children named per failure kind; the count says how many more


def results_page(results: Results, *, base: str) -> Html:
    """The page of a set: summary, outcomes, pass@k, failure kinds, the plot, every task and attempt."""
    status, threshold = results.status, results.success_threshold
    outcomes, phases = status.outcomes, status.phases
    head = summary(
        [
            ("phase", status.phase or "Pending"),
            ("finished", f"{status.progress or '-'} ({status.active} active)"),
            ("mean reward", f"{number(status.mean_reward)} over {outcomes.graded} graded"),
            ("success threshold", number(threshold)),
            ("message", status.message),
            ("started", status.start_time),
            ("completed", status.completion_time),
        ]
    )
    outcome_table = table(
        ["graded", "masked", "terminal failure", "ungraded (infra)", "pending", "running", "succeeded", "failed"],
        [
            [
                outcomes.graded,
                outcomes.masked,
                outcomes.terminal_failure,
                outcomes.ungraded,
                phases.pending,
                phases.running,
                phases.succeeded,
                phases.failed,
            ]
        ],
        class_="outcomes",
    )
    pass_table = table(
        ["k", "pass@k", "tasks", "ungraded counted as misses"],
        ([row.k, number(row.value), row.tasks, row.ungraded] for row in status.pass_at_k),
        class_="pass-at-k",
    )
    kinds = failure_kinds(status.tasks)
    kind_table: Html = (
        table(
            ["failure kind", "outcome", "episodes", ""],
            (
                [
                    element("code", kind),
                    outcome,
                    len(names),
                    join(
                        [
                            *(join([link(episode_href(base, name), name), " "]) for name in names[:FAILURE_LINKS]),
                            f"… {len(names) - FAILURE_LINKS} more" if len(names) > FAILURE_LINKS else None,
                        ]
                    ),
                ]
                for kind, outcome, names in kinds
            ),
            class_="failure-kinds",
        )
        if kinds
        else element("p", "No Episode ended with a failure kind.", class_="note")
    )
    ks = range(1, results.attempts + 1)
    task_table = table(
        ["#", "task", "attempts", "finished", "graded", "successes", "mean", *(f"pass@{k}" for k in ks)],
        (
            [
                task.index,
                task.name,
                attempts_cell(task, threshold, base),
                task.finished,
                task.graded,
                task.successes,
                number(task.mean_reward),
                *(number(task.pass_at_k[k - 1]) if len(task.pass_at_k) >= k else "-" for k in ks),
            ]
            for task in status.tasks
        ),
        class_="tasks",
    )
    return page(
        results.title,
        element("h1", results.title),
        head,
        element("h2", "Outcomes"),
        outcome_table,
        element("h2", "pass@k"),
        pass_table,
        element("h2", "Failure kinds"),
        kind_table,
        element("h2", "Mean reward by task"),
        reward_plot(status.tasks, threshold) if status.tasks else element("p", "No tasks yet.", class_="note"),
        element("h2", "Tasks"),
        task_table,
        base=base,
    )


# --- one Episode ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TurnRecords:
    """What the operator kept of one turn's agent: its instruction, model calls and ATIF trajectory."""

    instruction: str | None = None
    calls: Sequence[CapturedCall] = ()
    unreadable_calls: int = 0
    trajectory: Trajectory | None = None
    trajectory_problem: str | None = None  # kept, but not ATIF: why
    trajectory_text: str | None = None


def turn_records(document: Mapping[str, Any]) -> dict[str, TurnRecords]:
    """The data API's ``turns`` document (``{"attempt", "turns": {turn: {file: text}}}``) read: calls
    and trajectories parsed with the capture's own models, what does not parse kept as text."""
    records: dict[str, TurnRecords] = {}
    for turn, kept in (document.get("turns") or {}).items():
        journal = parse_journal(str(kept.get(CALLS_RECORD) or "").encode())
        text = kept.get(TRAJECTORY_RECORD)
        trajectory, problem = None, None
        if text:
            try:
                trajectory = Trajectory.model_validate_json(text)
            except ValidationError as error:
                problem = f"not an ATIF trajectory: {error.error_count()} problem(s), first: {error.errors()[0]['msg']}"
        records[str(turn)] = TurnRecords(
            instruction=kept.get(INSTRUCTION_RECORD),
            calls=journal.calls,
            unreadable_calls=journal.unreadable,
            trajectory=trajectory,
            trajectory_problem=problem,
            trajectory_text=text if problem else None,
        )
    return records


@dataclass(frozen=True)
class ArtifactFile:
    """A file of a turn's artifacts, by its path below the turn (as ``kubectl episode artifacts`` writes it)."""

    turn: str
    path: str
    size: int


@dataclass(frozen=True)
class EpisodeData:
    """One Episode as its page shows it: its status, and what the operator kept of it."""

    namespace: str
    name: str
    status: EpisodeStatus
    set_name: str | None = None
    logs: Mapping[str, str] = field(default_factory=dict)  # turn (or "seed") → the kept logs' text
    records_attempt: int | None = None
    turns: Mapping[str, TurnRecords] = field(default_factory=dict)
    artifacts: Sequence[ArtifactFile] = ()
    refused_artifacts: Sequence[tuple[str, str]] = ()  # (member, why) not unpacked
    kept_problem: str | None = None  # why nothing kept could be read


def content_text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        part.text if part.text is not None else f"[image {part.source.path if part.source else ''}]" for part in content
    )


def step_view(step: Step) -> Html:
    labels = [f"step {step.step_id}", step.source, step.model_name, step.timestamp]
    parts: list[Child] = [element("h4", " · ".join(label for label in labels if label))]
    if step.is_copied_context:
        parts.append(element("p", "copied from the session's earlier turns", class_="note"))
    if step.reasoning_content:
        parts.append(element("details", element("summary", "reasoning"), element("pre", step.reasoning_content)))
    message = content_text(step.message)
    if message:
        parts.append(element("pre", message, class_="message"))
    for call in step.tool_calls or []:
        parts.append(
            element(
                "div",
                element("strong", "→ "),
                element("code", call.function_name),
                element("pre", json.dumps(call.arguments, indent=2, ensure_ascii=False)),
                class_="tool-call",
            )
        )
    for result in step.observation.results if step.observation else []:
        parts.append(element("div", element("em", "observation"), element("pre", content_text(result.content))))
    if step.metrics is not None:
        metrics = step.metrics
        parts.append(
            element(
                "p",
                f"tokens: prompt {number(metrics.prompt_tokens)}, completion {number(metrics.completion_tokens)}"
                + (f", cached {metrics.cached_tokens}" if metrics.cached_tokens is not None else ""),
                class_="note",
            )
        )
    classes = f"step {step.source}" + (" copied" if step.is_copied_context else "")
    return element("div", *parts, class_=classes)


def when(timestamp: float | None) -> str:
    return "-" if timestamp is None else datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def calls_table(calls: Sequence[CapturedCall]) -> Html:
    rows: list[list[Child]] = []
    for index, call in enumerate(sorted(calls, key=lambda call: call.started_at)):
        record = model_call_record(call, call_index=index)
        rows.append(
            [
                index + 1,
                when(call.started_at),
                f"{call.method} {call.path}",
                "-" if call.status_code is None else call.status_code,
                record.error_category or call.local_response_reason or "",
                number(call.latency_ms),
                number(call.latency_ttft_ms),
                number(record.tokens_in),
                number(record.tokens_out),
                ", ".join(f"{part} cut at {size} bytes" for part, size in (call.truncated or {}).items()),
            ]
        )
    return table(
        [
            "#",
            "started (UTC)",
            "request",
            "status",
            "error",
            "latency ms",
            "first byte ms",
            "tokens in",
            "tokens out",
            "",
        ],
        rows,
        class_="model-calls",
    )


def episode_base(base: str, name: str) -> str:
    return episode_href(base, name) + "/"


def log_href(base: str, name: str, turn: str) -> str:
    return episode_base(base, name) + "log?" + urlencode({"turn": turn})


def artifact_href(base: str, name: str, artifact: ArtifactFile) -> str:
    path = "/".join(quote(part, safe="") for part in [artifact.turn, *artifact.path.split("/")])
    return episode_base(base, name) + "artifacts/" + path


def logs_view(data: EpisodeData, turn: str, base: str) -> Html:
    text = data.logs.get(turn)
    if not text:
        return element("p", "No logs kept.", class_="note")
    shown = text if len(text) <= LOG_SHOWN_CHARS else text[-LOG_SHOWN_CHARS:]
    note = (
        element(
            "p",
            f"The last {LOG_SHOWN_CHARS} of {len(text)} characters; ",
            link(log_href(base, data.name, turn), "the whole log"),
            class_="note",
        )
        if shown is not text
        else element("p", link(log_href(base, data.name, turn), "as text"), class_="note")
    )
    return join([note, element("pre", shown, class_="log")])


def turn_view(data: EpisodeData, number_: int | None, turn: str, status: TurnStatus | None, base: str) -> Html:
    records = data.turns.get(turn, TurnRecords())
    title = f"Turn {number_}: {turn}" if number_ is not None else f"{turn}"
    parts: list[Child] = [element("h2", title, id=f"turn-{turn}")]
    if status is not None:
        parts.append(
            summary(
                [
                    ("phase", status.phase),
                    ("stage", status.stage),
                    ("reward", number(status.reward)),
                    (
                        "verifier rewards",
                        ", ".join(f"{k} {number(v)}" for k, v in status.verifier_rewards.items()) or None,
                    ),
                    ("agent exit code", status.agent_exit_code),
                    ("agent failure", status.agent_failure),
                    ("failure kind", status.failure_kind),
                    ("message", status.message),
                ]
            )
        )
    if records.instruction:
        parts += [element("h3", "Instruction"), element("pre", records.instruction, class_="instruction")]
    parts.append(element("h3", "Trajectory"))
    if records.trajectory is not None:
        parts.append(join(step_view(step) for step in records.trajectory.steps))
    elif records.trajectory_problem:
        parts += [element("p", records.trajectory_problem, class_="error"), element("pre", records.trajectory_text)]
    else:
        parts.append(element("p", "No trajectory kept (only agents with a model endpoint have one).", class_="note"))
    if records.calls or records.unreadable_calls:
        parts += [element("h3", f"Model calls ({len(records.calls)})"), calls_table(records.calls)]
        if records.unreadable_calls:
            parts.append(element("p", f"{records.unreadable_calls} unreadable record(s) left out", class_="error"))
    parts += [element("h3", "Logs"), logs_view(data, turn, base)]
    artifacts = [artifact for artifact in data.artifacts if artifact.turn == turn]
    if artifacts:
        parts += [
            element("h3", "Artifacts"),
            table(
                ["file", "bytes"],
                (
                    [link(artifact_href(base, data.name, artifact), artifact.path), artifact.size]
                    for artifact in artifacts
                ),
                class_="artifacts",
            ),
        ]
    return element("section", *parts, class_="turn")


def episode_page(data: EpisodeData, *, base: str) -> Html:
    """The page of one Episode: outcome, attempts, and per turn its status, instruction, trajectory step
    by step, model calls, logs and artifacts (downloads); the seed's logs last."""
    status = data.status
    title = f"Episode {data.namespace}/{data.name}"
    back = element("p", link(base, f"← results of {data.set_name}" if data.set_name else "← results"))
    head = summary(
        [
            ("phase", status.phase or "Pending"),
            ("outcome", status.outcome),
            ("reward", number(status.reward)),
            ("verifier rewards", ", ".join(f"{k} {number(v)}" for k, v in status.verifier_rewards.items()) or None),
            ("failure kind", status.failure_kind),
            ("message", status.message),
            ("stopped after turn", status.stopped_after_turn),
            ("task", (status.task.name or status.task.digest) if status.task else None),
            ("started", status.started_at),
            ("finished", status.finished_at),
            ("records of attempt", data.records_attempt),
        ]
    )
    attempts = (
        table(
            ["attempt", "started", "finished", "ended because"],
            ([a.number, a.started_at or "-", a.finished_at or "-", a.reason or ""] for a in status.attempts),
            class_="attempts",
        )
        if status.attempts
        else None
    )
    turns = table(
        ["#", "turn", "phase", "reward", "agent exit", "failure", "message"],
        (
            [
                index,
                link(f"#turn-{quote(turn.name, safe='')}", turn.name),
                turn.phase,
                number(turn.reward),
                "" if turn.agent_exit_code is None else turn.agent_exit_code,
                turn.failure_kind or "",
                turn.message or "",
            ]
            for index, turn in enumerate(status.turns, start=1)
        ),
        class_="turns",
    )
    known = [turn.name for turn in status.turns]
    # Turns the records name that the status does not (an earlier attempt's) still show, after the known ones.
    others = sorted({*data.turns, *(a.turn for a in data.artifacts), *data.logs} - {*known, SEED})
    sections = [
        *(turn_view(data, index, turn.name, turn, base) for index, turn in enumerate(status.turns, start=1)),
        *(turn_view(data, None, name, None, base) for name in others),
    ]
    refused = (
        join(
            [
                element("h2", "Artifact members not unpacked"),
                table(["member", "why"], ([member, why] for member, why in data.refused_artifacts)),
            ]
        )
        if data.refused_artifacts
        else None
    )
    return page(
        title,
        back,
        element("h1", title),
        head,
        element("p", "Kept data: ", data.kept_problem, class_="error") if data.kept_problem else None,
        element("h2", "Attempts") if attempts else None,
        attempts,
        element("h2", "Turns"),
        turns,
        *sections,
        refused,
        element("h2", "Seed logs"),
        logs_view(data, SEED, base),
        base=base,
    )


def error_page(title: str, message: str, *, base: str) -> Html:
    return page(
        title,
        element("p", link(base, "← results")),
        element("h1", title),
        element("p", message, class_="error"),
        base=base,
    )
