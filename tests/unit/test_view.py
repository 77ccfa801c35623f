"""``kubectl episode view`` against an API server on this machine (``tests/unit/fake_apiserver.py``, with
the data API answered by the operator's own handlers): what it serves and to whom, and that bad input
is one line on stderr, never a traceback.

The pages' content is ``test_results_page.py``'s; Chromium shows them in ``test_view_browser.py``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from episode_operator.cli import results_page
from episode_operator.cli.cluster import Cluster
from episode_operator.cli.kubectl_episode import cli
from episode_operator.cli.view import Site, Source
from episode_operator.kube.kubeconfig import Target
from tests.unit import results
from tests.unit.fake_apiserver import DataApi, FakeApiServer, fake_api_server
from tests.unit.test_results_page import Parsed

KUBECTL_EPISODE = str(Path(sys.executable).parent / "kubectl-episode")
SECRET = "s3cret"
URL_LINE = re.compile(r"at (http://127\.0\.0\.1:(\d+)/[A-Za-z0-9_-]+/) \(Ctrl-C stops it\)")


def objects() -> dict[str, list[dict[str, object]]]:
    return {"episodesets": [results.set_object()], "episodes": results.child_objects()}


@dataclass
class Served:
    """The fake API server with the hostile child's data kept, and a kubeconfig for it."""

    api: FakeApiServer
    kubeconfig: Path
    data_dir: Path


@contextmanager
def served(tmp_path: Path, data_api: DataApi = "served") -> Iterator[Served]:
    kept = results.keep_hostile_child(tmp_path / "data")
    with fake_api_server(objects(), kept.store, data_api) as api:
        yield Served(api, api.kubeconfig(tmp_path / "kubeconfig", results.NAMESPACE), kept.data_dir)


@pytest.fixture
def site(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Site]:
    """The server's pages, answered in this process, reading through the data API or ``--data-dir``."""
    with served(tmp_path) as api:
        data_dir = str(api.data_dir) if getattr(request, "param", "data API") == "--data-dir" else None
        source = Source(Cluster(Target(str(api.kubeconfig))), data_dir, results.SET_NAME)
        site = Site(source, SECRET)
        site.listening_on(8000)
        try:
            yield site
        finally:
            source.close()


HOST = "127.0.0.1:8000"


@pytest.mark.parametrize("site", ["data API", "--data-dir"], indirect=True)
def test_the_set_its_episodes_their_logs_and_artifacts_are_served(site: Site) -> None:
    answer = site.answer(HOST, f"/{SECRET}/")
    assert (answer.status, answer.content_type) == (200, "text/html; charset=utf-8")
    assert results.HOSTILE_TASK in Parsed(answer.body.decode()).text

    episode = site.answer("localhost:8000", f"/{SECRET}/episodes/{results.HOSTILE_CHILD}")
    assert episode.status == 200
    text = Parsed(episode.body.decode()).text
    for hostile in results.HOSTILE_TEXTS:
        assert hostile in text, hostile
    assert "Kept data" not in text  # everything was read

    log = site.answer(HOST, f"/{SECRET}/episodes/{results.HOSTILE_CHILD}/log?turn={results.TURN}")
    assert log.content_type == "text/plain; charset=utf-8"
    assert results.HOSTILE_LOG.encode() in log.body

    hrefs = [
        attrs["href"] or ""
        for _, attrs in Parsed(episode.body.decode()).tags
        if "/artifacts/" in (attrs.get("href") or "")
    ]
    downloads = {href.rsplit("/", 1)[1]: site.answer(HOST, href) for href in hrefs}
    names = sorted(download.download or "" for download in downloads.values())
    assert names == sorted(["manifest.json", "result.txt", results.HOSTILE_ARTIFACT])  # the turn's manifest too
    for download in downloads.values():
        assert download.status == 200 and download.content_type == "application/octet-stream"
        assert download.file is not None
    page = next(download for download in downloads.values() if download.download == results.HOSTILE_ARTIFACT)
    assert page.file is not None and page.file.read_bytes() == results.HOSTILE_ARTIFACT_CONTENT


def test_an_episode_the_operator_kept_nothing_of_says_so_on_its_page(site: Site) -> None:
    other = results.child_views()[0].name
    answer = site.answer(HOST, f"/{SECRET}/episodes/{other}")
    assert answer.status == 200
    assert "No logs kept." in Parsed(answer.body.decode()).text


@pytest.mark.parametrize(
    ("host", "target", "status"),
    [
        pytest.param("evil.example:8000", f"/{SECRET}/", 403, id="another-host-DNS-rebinding"),
        pytest.param(None, f"/{SECRET}/", 403, id="no-host"),
        pytest.param("127.0.0.1:8001", f"/{SECRET}/", 403, id="another-port"),
        pytest.param(HOST, "/", 404, id="no-secret"),
        pytest.param(HOST, "/guess/", 404, id="a-wrong-secret"),
        pytest.param(HOST, f"/{SECRET}/episodes/nightly-9-9", 404, id="no-such-episode"),
        pytest.param(HOST, f"/{SECRET}/elsewhere", 404, id="no-such-page"),
        pytest.param(
            HOST, f"/{SECRET}/episodes/{results.HOSTILE_CHILD}/artifacts/01-make/../../../kubeconfig", 404, id="dot-dot"
        ),
        pytest.param(
            HOST,
            f"/{SECRET}/episodes/{results.HOSTILE_CHILD}/artifacts/01-make/%2e%2e/%2e%2e/x",
            404,
            id="quoted-dot-dot",
        ),
        pytest.param(
            HOST, f"/{SECRET}/episodes/{results.HOSTILE_CHILD}/artifacts/..%2f..%2fkubeconfig/x", 404, id="quoted-slash"
        ),
        pytest.param(HOST, f"/{SECRET}/episodes/{results.HOSTILE_CHILD}/artifacts/01-make/out", 404, id="a-folder"),
    ],
)
def test_what_is_not_asked_of_this_server_or_leaves_its_pages_is_refused(
    site: Site, host: str | None, target: str, status: int
) -> None:
    answer = site.answer(host, target)
    assert answer.status == status
    assert answer.file is None


def headers_of(url: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()), error.read()


@contextmanager
def viewing(api: Served, *args: str, scratch: Path | None = None) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``kubectl-episode view ARGS`` as a user runs it, until the block ends (SIGTERM, as a service
    manager or the test harness stops it); yields the process and the URL it printed."""
    process = subprocess.Popen(
        [KUBECTL_EPISODE, "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBECONFIG": str(api.kubeconfig), **({"TMPDIR": str(scratch)} if scratch else {})},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # returns once the server listens, or the command ended
        found = URL_LINE.search(line)
        assert found, (
            f"no URL printed: {line!r} {process.stderr.read() if process.poll() is not None and process.stderr else ''}"
        )
        yield process, found.group(1)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_view_serves_on_loopback_with_its_security_headers_and_stops_on_sigterm(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with served(tmp_path) as api, viewing(api, results.SET_NAME, scratch=scratch) as (process, url):
        status, headers, body = headers_of(url)
        assert status == 200 and results.SET_NAME.encode() in body
        assert headers["Content-Security-Policy"] == results_page.CONTENT_SECURITY_POLICY
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        status, headers, _ = headers_of(url + "style.css")
        assert (status, headers["Content-Type"]) == (200, "text/css; charset=utf-8")
        episode = headers_of(f"{url}episodes/{results.HOSTILE_CHILD}")[2].decode()
        href = next(
            attrs["href"] or ""
            for _, attrs in Parsed(episode).tags
            if (attrs.get("href") or "").endswith(".html") and "/artifacts/" in (attrs.get("href") or "")
        )
        status, headers, body = headers_of(url.split("/", 3)[0] + "//" + url.split("/", 3)[2] + href)
        assert status == 200 and body == results.HOSTILE_ARTIFACT_CONTENT
        assert headers["Content-Type"] == "application/octet-stream"
        assert headers["Content-Disposition"].startswith("attachment; filename*=UTF-8''")
        assert headers["Content-Security-Policy"] == results_page.DOWNLOAD_SECURITY_POLICY
        port = url.split(":")[2].split("/")[0]
        assert headers_of(url, host=f"rebound.example:{port}")[0] == 403
        assert [path.name[:21] for path in scratch.iterdir()] == ["kubectl-episode-view-"]  # the artifacts
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert process.stdout is not None and process.stdout.read() == "stopped\n"
        assert process.stderr is not None and process.stderr.read() == ""
        assert list(scratch.iterdir()) == [], "the unpacked artifacts are removed when the server stops"


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("data_api", "args", "code", "said"),
    [
        pytest.param("served", ["nope"], 1, 'Error: no EpisodeSet "nope" in namespace evals\n', id="no-such-set"),
        pytest.param(
            "served",
            ["-l", "team=none"],
            1,
            "Error: no Episodes match -l team=none in namespace evals\n",
            id="no-episodes",
        ),
        pytest.param(
            "absent",
            [results.SET_NAME],
            1,
            "Error: the operator's data API (apiservice v1alpha1.data.episode-operator.dev) is not served by the "
            "API server (missing episodes/artifacts, episodes/log, episodes/turns): logs, artifacts and "
            "trajectories cannot be read; is the operator installed with its Helm chart? (--data-dir reads an "
            "operator running on this machine)\n",
            id="no-data-api",
        ),
        pytest.param(
            "unavailable",
            [results.SET_NAME],
            1,
            "is not available: discovery of data.episode-operator.dev/v1alpha1: the server is currently unable "
            "to handle the request;",
            id="data-api-down",
        ),
        pytest.param("served", [], 2, "name an EpisodeSet, or select Episodes with -l (one of the two)", id="neither"),
        pytest.param(
            "served", [results.SET_NAME, "-l", "a=b"], 2, "name an EpisodeSet, or select Episodes with -l", id="both"
        ),
        pytest.param(
            "served",
            [results.SET_NAME, "--data-dir", "/nonexistent"],
            1,
            "Error: /nonexistent: not found;",
            id="no-data-dir",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_cause(
    tmp_path: Path, data_api: DataApi, args: list[str], code: int, said: str
) -> None:
    with served(tmp_path, data_api) as api:
        exit_code, output = run_cli("view", "--kubeconfig", str(api.kubeconfig), *args)
    assert exit_code == code, output
    assert said in output
    assert "Traceback" not in output


def test_an_api_server_that_does_not_answer_is_named(tmp_path: Path) -> None:
    with socket.socket() as bound:
        # A port held but not listening refuses every connection, and no other process can take it meanwhile.
        bound.bind(("127.0.0.1", 0))
        api = FakeApiServer({}, None, "served")
        api.port = bound.getsockname()[1]
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", results.NAMESPACE)
        exit_code, output = run_cli("view", "--kubeconfig", str(kubeconfig), results.SET_NAME)
    assert exit_code == 1
    assert output.startswith("Error: cannot reach the API server: ") and output.count("\n") == 1, output


def test_a_port_in_use_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with socket.socket() as taken, served(tmp_path) as api:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        exit_code, output = run_cli("view", "--kubeconfig", str(api.kubeconfig), results.SET_NAME, "--port", str(port))
    assert exit_code == 1
    assert output == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert list(scratch.iterdir()) == [], "the scratch folder is removed when the command fails"


def test_selected_episodes_make_a_page_of_their_own(tmp_path: Path) -> None:
    with served(tmp_path) as api:
        source = Source(
            Cluster(Target(str(api.kubeconfig))), None, selector=f"episode-operator.dev/set={results.SET_NAME}"
        )
        site = Site(source, SECRET)
        site.listening_on(1)
        try:
            page = site.answer("127.0.0.1:1", f"/{SECRET}/").body.decode()
        finally:
            source.close()
    text = Parsed(page).text
    assert f"Episodes of evals (-l episode-operator.dev/set={results.SET_NAME})" in text
    assert results.HOSTILE_TASK in text  # the task IDs come from the children's annotation
