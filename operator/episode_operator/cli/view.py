"""``kubectl episode view``: an EpisodeSet's results (or those of the Episodes a selector picks) as a
web page served from this process, on this machine only.

The server is the standard library's, bound to 127.0.0.1, and reads what it shows as the other verbs
do, each time a page is asked for: the objects from the API server with the user's kubeconfig, the
kept logs, artifacts and trajectories from the operator's data API (or ``--data-dir``). So it needs
no permission ``get``, ``logs``, ``artifacts`` and ``trajectory`` do not need, and shows what they
would print. Since it answers with the user's credentials, it answers only

- under a random path it prints (``http://127.0.0.1:PORT/SECRET/``): another user of this machine,
  or a web page in the user's browser, cannot guess it;
- to requests naming this server in their Host header (127.0.0.1:PORT or localhost:PORT): a web
  page whose hostname was re-pointed at 127.0.0.1 (DNS rebinding) names its own;
- GET, and nothing that changes anything.

The pages are rendered by :mod:`episode_operator.cli.results_page`, which escapes everything the
agents wrote; every answer carries a Content-Security-Policy that allows no script at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import click

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.api.episodeset_resource import SET_TASK_NAME_ANNOTATION, EpisodeSetStatus
from episode_operator.api.vocabulary import SET_LABEL, TASK_LABEL, is_terminal
from episode_operator.cli import results_page
from episode_operator.cli.cluster import Cluster, cluster_options
from episode_operator.cli.episodes import KeptData, kept_data, operator_options
from episode_operator.cli.results_page import ArtifactFile, EpisodeData, Html, Results
from episode_operator.kube.client import KubeClient, KubeError, NotFound
from episode_operator.runtime.data_api_server import API_SERVICE, DATA_GROUP, DATA_VERSION, SUBRESOURCES
from episode_operator.runtime.episode_store import SEED_LOGS, safe
from episode_operator.runtime.evaluation import ChildView, selection_status


class Missing(Exception):
    """What a page or download names is not there (an Episode, an artifact, a page): a 404 page."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: a page, a stylesheet, a log or an artifact (``file``: sent from disk)."""

    status: int
    content_type: str
    body: bytes = b""
    file: Path | None = None
    download: str | None = None  # the file name a browser saves it as

    @classmethod
    def html(cls, page: Html, status: int = HTTPStatus.OK) -> Answer:
        return cls(status, "text/html; charset=utf-8", page.encode())

    @classmethod
    def text(cls, text: str, status: int = HTTPStatus.OK) -> Answer:
        return cls(status, "text/plain; charset=utf-8", text.encode())


def security_headers(answer: Answer) -> dict[str, str]:
    """What every answer carries: pages may run no script and load nothing from elsewhere; logs and
    artifacts are never rendered as pages of this origin; nothing is cached or referred."""
    policy = (
        results_page.CONTENT_SECURITY_POLICY
        if answer.content_type.startswith(("text/html", "text/css"))
        else results_page.DOWNLOAD_SECURITY_POLICY
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-store",
    }
    if answer.download is not None:
        # RFC 6266: the name percent-encoded (filename*), so no quote or newline of it reaches the header.
        headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(answer.download, safe='')}"
    return headers


# --- where the pages' data comes from -----------------------------------------------------------------
def task_id(episode: Mapping[str, Any]) -> str:
    """The task an Episode ran, as the set names it, else its packed task's label, else its task's name."""
    metadata = episode.get("metadata") or {}
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    return str(
        (metadata.get("annotations") or {}).get(SET_TASK_NAME_ANNOTATION)
        or (metadata.get("labels") or {}).get(TASK_LABEL)
        or (status.task.name if status.task else None)
        or (status.task.digest if status.task else None)
        or metadata.get("name")
    )


def child_view(episode: Mapping[str, Any]) -> ChildView:
    status = EpisodeStatus.model_validate(episode.get("status") or {})
    terminal = is_terminal(status.phase)
    return ChildView(
        index=0,
        attempt=0,
        name=str(episode["metadata"]["name"]),
        phase=status.phase,
        outcome=status.outcome if terminal else None,
        reward=status.reward if terminal else None,
        failure_kind=status.failure_kind if terminal else None,
        created_at=episode["metadata"].get("creationTimestamp"),
        finished_at=status.finished_at,
    )


def selected_tasks(episodes: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[ChildView]]]:
    """Episodes grouped by task ID (tasks by ID, each task's Episodes in the order they were made)."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for episode in episodes:
        by_task.setdefault(task_id(episode), []).append(episode)
    return [
        (
            task,
            [
                child_view(e)
                for e in sorted(
                    made, key=lambda e: (e["metadata"].get("creationTimestamp") or "", e["metadata"]["name"])
                )
            ],
        )
        for task, made in sorted(by_task.items())
    ]


@dataclass
class Source:
    """Reads what the pages show, through the paths ``get``, ``logs``, ``artifacts`` and ``trajectory`` use."""

    cluster: Cluster
    data_dir: str | None
    set_name: str | None = None
    selector: str | None = None
    success_threshold: float = 1.0
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kubectl-episode-view-")))
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Per Episode uid: the folder its artifacts are unpacked in, and the members refused.
    _artifacts: dict[str, tuple[Path, list[tuple[str, str]]]] = field(default_factory=dict, init=False)

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    def results(self) -> Results:
        """The set's status (or one made from the selected Episodes); a missing set is a usage error."""
        namespace = self.namespace
        if self.set_name is not None:
            name = self.set_name

            async def get_set(client: KubeClient) -> dict[str, Any]:
                try:
                    return await client.get_episodeset(namespace, name)
                except NotFound:
                    raise click.ClickException(f'no EpisodeSet "{name}" in namespace {namespace}') from None

            item = self.cluster.run(get_set)
            spec = item.get("spec") or {}
            return Results(
                title=f"EpisodeSet {namespace}/{name}",
                status=EpisodeSetStatus.model_validate(item.get("status") or {}),
                attempts=int(spec.get("attempts") or 1),
                success_threshold=float(spec.get("successThreshold", 1.0)),
            )
        selector = self.selector

        async def list_selected(client: KubeClient) -> list[dict[str, Any]]:
            return await client.list_episodes(namespace, selector)

        episodes = self.cluster.run(list_selected)
        if not episodes:
            raise click.ClickException(f"no Episodes match -l {selector} in namespace {namespace}")
        tasks = selected_tasks(episodes)
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        return Results(
            title=f"Episodes of {namespace} (-l {selector})",
            status=selection_status(tasks, self.success_threshold, now=now),
            attempts=max(len(children) for _task, children in tasks),
            success_threshold=self.success_threshold,
        )

    def episode_object(self, name: str) -> dict[str, Any]:
        namespace = self.namespace

        async def get(client: KubeClient) -> dict[str, Any]:
            try:
                return await client.get_episode(namespace, name)
            except NotFound:
                raise Missing(
                    f'no Episode "{name}" in namespace {namespace} (a finished child may have been deleted: '
                    "its result stays in its set's status)"
                ) from None

        return self.cluster.run(get)

    def episode(self, name: str) -> EpisodeData:
        """An Episode's status and what the operator kept of it; what cannot be read is said on the page."""
        episode = self.episode_object(name)
        status = EpisodeStatus.model_validate(episode.get("status") or {})
        data = EpisodeData(
            namespace=self.namespace,
            name=name,
            status=status,
            set_name=(episode["metadata"].get("labels") or {}).get(SET_LABEL),
        )
        try:
            kept = kept_data(self.cluster, episode, self.data_dir)
            logs = {turn: kept.logs(turn=turn, attempt=None) for turn in [SEED_LOGS, *(t.name for t in status.turns)]}
            document = kept.turns()
            folder, refused = self._artifacts_of(episode, kept)
        except click.ClickException as error:
            return dataclasses.replace(data, kept_problem=error.message)
        # The store names a turn's blobs and folders by the turn's name made path-safe; the page by its name.
        named = {safe(turn.name): turn.name for turn in status.turns}
        return dataclasses.replace(
            data,
            logs=logs,
            records_attempt=document.get("attempt"),
            turns={named.get(key, key): records for key, records in results_page.turn_records(document).items()},
            artifacts=[
                dataclasses.replace(artifact, turn=named.get(artifact.turn, artifact.turn))
                for artifact in artifact_files(folder)
            ],
            refused_artifacts=refused,
        )

    def _artifacts_of(self, episode: Mapping[str, Any], kept: KeptData) -> tuple[Path, list[tuple[str, str]]]:
        """The Episode's artifacts unpacked in the scratch folder (as ``kubectl episode artifacts`` unpacks
        them): once for a finished Episode, again at each look while it runs."""
        uid = str(episode["metadata"]["uid"])
        finished = is_terminal((episode.get("status") or {}).get("phase"))
        with self._lock:
            cached = self._artifacts.get(uid)
            if cached is not None and finished:
                return cached
            folder = Path(tempfile.mkdtemp(prefix="artifacts-", dir=self.scratch))
            exported = kept.artifacts(folder / "turns")
            refused = [(member.name or "an archive", member.reason) for member in exported.refused]
            if cached is not None:
                shutil.rmtree(cached[0], ignore_errors=True)
            self._artifacts[uid] = (folder, refused)
            return folder, refused

    def log(self, name: str, turn: str) -> str:
        episode = self.episode_object(name)
        return kept_data(self.cluster, episode, self.data_dir).logs(turn=turn, attempt=None)

    def artifact(self, name: str, turn: str, parts: Sequence[str]) -> Path | None:
        """The unpacked file ``turn/parts…`` of the Episode's artifacts; None for anything else (a name
        leaving the folder, a folder, a file not there)."""
        if any(part in ("", ".", "..") or "/" in part or "\0" in part for part in [turn, *parts]):
            return None
        episode = self.episode_object(name)
        folder, _refused = self._artifacts_of(episode, kept_data(self.cluster, episode, self.data_dir))
        root = (folder / "turns").resolve()
        path = root.joinpath(safe(turn), *parts)
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(root):
            return None
        return path

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def artifact_files(folder: Path) -> list[ArtifactFile]:
    """The files of ``folder/turns/<turn>/…``, by turn and path."""
    root = folder / "turns"
    if not root.is_dir():
        return []
    files = []
    for turn in sorted(root.iterdir()):
        for path in sorted(turn.rglob("*")):
            if path.is_file() and not path.is_symlink():
                files.append(ArtifactFile(turn.name, path.relative_to(turn).as_posix(), path.stat().st_size))
    return files


# --- answering requests ---------------------------------------------------------------------------------
class Site:
    """What the server answers, by path: the results, each Episode, its logs and artifacts, the stylesheet."""

    def __init__(self, source: Source, secret: str) -> None:
        self.source = source
        self.base = f"/{secret}/"
        self.hosts: set[str] = set()

    def listening_on(self, port: int) -> None:
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}

    def answer(self, host: str | None, target: str) -> Answer:
        if host not in self.hosts:
            # A page of another site whose name was re-pointed here (DNS rebinding) names its own host.
            return Answer.text("this server answers requests to 127.0.0.1 or localhost only\n", HTTPStatus.FORBIDDEN)
        url = urlsplit(target)
        if not url.path.startswith(self.base):
            return Answer.text("not found\n", HTTPStatus.NOT_FOUND)  # says nothing of where the pages are
        parts = [unquote(part) for part in url.path[len(self.base) :].split("/")]
        query = parse_qs(url.query)
        try:
            return self.route(parts, query)
        except Missing as error:
            return Answer.html(results_page.error_page("Not found", str(error), base=self.base), HTTPStatus.NOT_FOUND)
        except click.ClickException as error:
            return Answer.html(
                results_page.error_page("Cannot read it", error.message, base=self.base), HTTPStatus.BAD_GATEWAY
            )

    def route(self, parts: list[str], query: Mapping[str, list[str]]) -> Answer:
        match parts:
            case [""]:
                return Answer.html(results_page.results_page(self.source.results(), base=self.base))
            case ["style.css"]:
                return Answer(HTTPStatus.OK, "text/css; charset=utf-8", results_page.STYLESHEET.encode())
            case ["episodes", name] | ["episodes", name, ""]:
                return Answer.html(results_page.episode_page(self.source.episode(name), base=self.base))
            case ["episodes", name, "log"]:
                turn = (query.get("turn") or [SEED_LOGS])[0]
                return Answer.text(self.source.log(name, turn))
            case ["episodes", name, "artifacts", turn, *path] if path:
                found = self.source.artifact(name, turn, path)
                if found is None:
                    raise Missing(f"no artifact {'/'.join(path)} in turn {turn} of {name}")
                return Answer(HTTPStatus.OK, "application/octet-stream", file=found, download=path[-1])
        raise Missing("no such page")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        try:
            answer = self.server.site.answer(self.headers.get("Host"), self.path)
        except Exception as error:  # a page, never a traceback: the cause in one line here and there
            click.echo(f"kubectl-episode view: {self.path}: {type(error).__name__}: {error}", err=True)
            answer = Answer.html(
                results_page.error_page(
                    "Internal error", f"{type(error).__name__}: {error}", base=self.server.site.base
                ),
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        self._send(answer)

    def _send(self, answer: Answer) -> None:
        size = answer.file.stat().st_size if answer.file is not None else len(answer.body)
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(size))
        for name, value in security_headers(answer).items():
            self.send_header(name, value)
        self.end_headers()
        if answer.file is not None:
            with answer.file.open("rb") as file:
                shutil.copyfileobj(file, self.wfile)
        else:
            self.wfile.write(answer.body)

    def do_HEAD(self) -> None:
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the terminal shows the URL and errors, not every request


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, site: Site) -> None:
        self.site = site
        super().__init__(("127.0.0.1", port), _Handler)
        site.listening_on(self.server_address[1])


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM stops the server as Ctrl-C does (its scratch folder removed), not the process outright."""

    def stop(_signal: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_data_api(cluster: Cluster) -> None:
    """The in-cluster operator's data API is served, else a usage error naming why."""
    hint = "is the operator installed with its Helm chart? (--data-dir reads an operator running on this machine)"

    async def served(client: KubeClient) -> set[str]:
        try:
            return await client.served_resources(DATA_GROUP, DATA_VERSION)
        except KubeError as error:  # registered, but its operator does not answer (503)
            raise click.ClickException(
                f"the operator's data API (apiservice {API_SERVICE}) is not available: {error}; {hint}"
            ) from error

    wanted = {f"episodes/{name}" for name in SUBRESOURCES}
    missing = wanted - cluster.run(served)
    if missing:
        raise click.ClickException(
            f"the operator's data API (apiservice {API_SERVICE}) is not served by the API server "
            f"(missing {', '.join(sorted(missing))}): logs, artifacts and trajectories cannot be read; {hint}"
        )


def serve(source: Source, port: int, announce: Callable[[str], None]) -> None:
    """Serve the pages on 127.0.0.1:``port`` (0: a free port) until Ctrl-C or SIGTERM."""
    site = Site(source, secrets.token_urlsafe(18))
    try:
        server = _Server(port, site)
    except OSError as error:
        raise click.ClickException(f"cannot listen on 127.0.0.1:{port}: {error.strerror or error}") from error
    try:
        with _stopped_by_sigterm():
            announce(f"http://127.0.0.1:{server.server_address[1]}{site.base}")
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C, or SIGTERM above: the way out
                server.serve_forever()
    finally:
        server.server_close()


def register_view(cli: click.Group) -> None:
    @cli.command()
    @click.argument("episodeset", required=False)
    @cluster_options
    @click.option("-l", "--selector", default=None, help="Instead of a set: the Episodes this label selector picks.")
    @click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=0,
        show_default=True,
        help="The port on 127.0.0.1 to serve on; 0: a free one.",
    )
    @click.option(
        "--success-threshold",
        type=float,
        default=1.0,
        show_default=True,
        help="With -l: a graded Episode with reward ≥ this is a success (pass@k); a set has its own.",
    )
    @operator_options
    def view(
        episodeset: str | None,
        cluster: Cluster,
        selector: str | None,
        port: int,
        success_threshold: float,
        data_dir: str | None,
    ) -> None:
        """Serve a web page of an EpisodeSet's results on this machine (127.0.0.1) until Ctrl-C.

        Per task: rewards, pass@k, outcomes and failure kinds, a plot of mean reward by task; per Episode:
        its turns, logs, artifacts (downloads) and trajectory step by step. With -l, the Episodes the
        selector picks, grouped by task, instead of a set.
        """
        if (episodeset is None) == (selector is None):
            raise click.UsageError("name an EpisodeSet, or select Episodes with -l (one of the two)")
        if data_dir and not Path(data_dir).is_dir():
            raise click.ClickException(f"{data_dir}: not found; is --data-dir the operator's data directory?")
        what = f"episodeset {cluster.namespace}/{episodeset}" if episodeset else f"episodes -l {selector}"

        def announce(url: str) -> None:
            click.echo(f"Serving the results of {what} at {url} (Ctrl-C stops it)")
            sys.stdout.flush()

        source = Source(cluster, data_dir, episodeset, selector, success_threshold)
        try:  # the scratch folder of unpacked artifacts goes however the command ends
            source.results()  # a set that is not there is said here, not on the page
            if not data_dir:
                check_data_api(cluster)
            serve(source, port, announce)
        finally:
            source.close()
        click.echo("stopped")
