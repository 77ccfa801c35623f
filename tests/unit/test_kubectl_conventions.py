"""``kubectl episode`` reads its arguments as kubectl does: kubeconfig, context, namespace, output formats.

Everything here runs without a cluster; ``tests/cluster/test_kubectl_plugin.py`` runs the same
commands against the real API server with a kubeconfig whose context sets a namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from episode_operator.api.episode_resource import EpisodeStatus, TurnStatus
from episode_operator.api.naming import content_name
from episode_operator.cli import printing
from episode_operator.cli.cluster import Cluster
from episode_operator.cli.episodes import turn_name
from episode_operator.cli.kubectl_episode import cli
from episode_operator.kube import kubeconfig
from episode_operator.kube.kubeconfig import KubeconfigError, Target, locate
from tests.conftest import EXAMPLE_TASKS

KUBECTL_EPISODE = str(Path(sys.executable).parent / "kubectl-episode")


def write_kubeconfig(path: Path, current: str | None, contexts: dict[str, str | None]) -> Path:
    """A kubeconfig with one cluster and these contexts (name -> namespace)."""
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://198.18.255.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": name, "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}}
            for name, ns in contexts.items()
        ],
    }
    if current:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment with no kubeconfig anywhere and outside any pod."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}


# --- where: kubeconfig, context, namespace ------------------------------------------------------------------
def test_the_namespace_comes_from_the_current_context(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "work", {"work": "team-a", "bare": None})
    assert locate(Target(str(path)), {}).namespace == "team-a"
    assert kubeconfig.current_namespace(Target(str(path), "bare"), {}) == "default"
    assert locate(Target(str(path), "bare"), {}).context == "bare"


def test_commands_work_in_the_contexts_namespace_unless_n_says_otherwise(
    tmp_path: Path, no_kubeconfig: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_kubeconfig(tmp_path / "config", "work", {"work": "team-a", "other": "team-b"})
    assert Cluster(Target(str(path))).namespace == "team-a"
    assert Cluster(Target(str(path), "other")).namespace == "team-b"
    assert Cluster(Target(str(path)), "evals").namespace == "evals"
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert Cluster(Target()).namespace == "team-a"


def test_kubeconfig_files_merge_first_wins_as_in_kubectl(tmp_path: Path) -> None:
    first = write_kubeconfig(tmp_path / "a", None, {"work": "from-a"})
    second = write_kubeconfig(tmp_path / "b", "work", {"work": "from-b", "other": "o"})
    environ = {"KUBECONFIG": f"{tmp_path / 'missing'}{os.pathsep}{first}{os.pathsep}{second}"}
    location = locate(Target(), environ)
    # The current-context is b's (a sets none); the context "work" is a's, the first to define it.
    assert (location.files, location.context, location.namespace) == ((str(first), str(second)), "work", "from-a")


def test_the_default_kubeconfig_is_in_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", "work", {"work": "home-ns"})
    assert kubeconfig.current_namespace(Target(), {}) == "home-ns"


def test_in_a_pod_without_kubeconfig_the_service_account_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "namespace").write_text("pod-ns\n")
    monkeypatch.setattr(kubeconfig, "IN_CLUSTER_NAMESPACE", tmp_path / "namespace")
    location = locate(Target(), {"KUBERNETES_SERVICE_HOST": "198.19.0.1"})
    assert location.in_cluster and location.namespace == "pod-ns"


@pytest.mark.parametrize(
    ("target", "environ", "message"),
    [
        (Target("/nowhere/config"), {}, "--kubeconfig /nowhere/config: no such file"),
        (
            Target(),
            {"KUBECONFIG": "/nowhere/a:/nowhere/b"},
            "$KUBECONFIG names no existing file (/nowhere/a, /nowhere/b)",
        ),
        (Target(), {}, "$KUBECONFIG is not set; HOME/.kube/config does not exist; not in a pod"),
        (Target("CONFIG", "nope"), {}, "no context 'nope' (contexts: work)"),
        (Target("UNSET"), {}, "no current-context; pass --context NAME"),
    ],
)
def test_what_was_looked_for_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Target, environ: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    files = {
        "CONFIG": write_kubeconfig(tmp_path / "config", "work", {"work": "w"}),
        "UNSET": write_kubeconfig(tmp_path / "unset", None, {"work": "w"}),
    }
    if target.kubeconfig in files:
        target = Target(str(files[target.kubeconfig]), target.context)
    with pytest.raises(KubeconfigError) as error:
        locate(target, environ)
    assert message.replace("HOME", str(tmp_path)) in str(error.value)


def test_no_kubeconfig_is_one_line_and_exit_code_1(no_kubeconfig: dict[str, str]) -> None:
    result = subprocess.run(
        [KUBECTL_EPISODE, "get"], capture_output=True, text=True, env=no_kubeconfig, timeout=60, check=False
    )
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.startswith("Error: no kubeconfig: $KUBECONFIG is not set; ")
    assert "~/.kube/config" not in result.stderr and "/.kube/config does not exist" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def test_an_unknown_context_is_a_user_error(tmp_path: Path, no_kubeconfig: dict[str, str]) -> None:
    path = write_kubeconfig(tmp_path / "config", "work", {"work": "w"})
    result = CliRunner().invoke(cli, ["get", "--kubeconfig", str(path), "--context", "elsewhere"])
    assert result.exit_code == 1
    assert f"Error: {path}: no context 'elsewhere' (contexts: work)" in result.output


# --- generated manifests: named, placed where -n says -----------------------------------------------------
def test_run_o_yaml_prints_named_manifests_and_creates_nothing(no_kubeconfig: dict[str, str]) -> None:
    hello = str(EXAMPLE_TASKS / "hello")
    result = CliRunner().invoke(cli, ["run", hello, "-o", "yaml"])
    assert result.exit_code == 0, result.output
    config_map, episode = yaml.safe_load_all(result.output)
    assert config_map["kind"] == "ConfigMap" and "namespace" not in config_map["metadata"]
    assert episode["metadata"]["name"] == content_name("hello", episode["spec"])
    assert "namespace" not in episode["metadata"] and "generateName" not in episode["metadata"]
    assert episode["spec"]["task"]["configMap"]["name"] == config_map["metadata"]["name"]
    # The same command prints the same manifests; another spec is another Episode.
    assert CliRunner().invoke(cli, ["run", hello, "-o", "yaml"]).output == result.output
    other = yaml.safe_load_all(CliRunner().invoke(cli, ["run", hello, "-o", "yaml", "--agent", "nop"]).output)
    assert list(other)[1]["metadata"]["name"] != episode["metadata"]["name"]
    placed = list(yaml.safe_load_all(CliRunner().invoke(cli, ["run", hello, "-o", "yaml", "-n", "evals"]).output))
    assert [document["metadata"]["namespace"] for document in placed] == ["evals", "evals"]


def test_pack_o_yaml_names_a_namespace_only_when_asked(no_kubeconfig: dict[str, str]) -> None:
    hello = str(EXAMPLE_TASKS / "hello")
    unplaced = yaml.safe_load(CliRunner().invoke(cli, ["pack", hello, "-o", "yaml"]).output)
    assert "namespace" not in unplaced["metadata"]
    placed = yaml.safe_load(CliRunner().invoke(cli, ["pack", hello, "-o", "yaml", "-n", "evals"]).output)
    assert list(placed["metadata"])[:2] == ["name", "namespace"] and placed["metadata"]["namespace"] == "evals"


def test_a_bad_folder_is_reported_before_the_kubeconfig_is_needed(
    tmp_path: Path, no_kubeconfig: dict[str, str]
) -> None:
    shutil.copytree(EXAMPLE_TASKS / "hello", tmp_path / "broken")
    (tmp_path / "broken" / "task.toml").write_text("[environment\n")
    for command in ("run", "pack"):
        result = CliRunner().invoke(cli, [command, str(tmp_path / "broken")])
        assert result.exit_code == 1 and "TOML syntax error" in result.output, result.output


# --- get: kubectl's flags and formats ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["get", "x", "-l", "a=b"], "a name cannot be given with a selector"),
        (["get", "x", "-A"], "cannot be named across all namespaces"),
        (["get", "-o", "table"], "'table' is not one of 'json', 'yaml', 'wide', 'name'"),
        (["export", "-o", "results/"], "'results/' is not 'gym-jsonl'"),
    ],
)
def test_usage_errors_exit_2(arguments: list[str], fragment: str, no_kubeconfig: dict[str, str]) -> None:
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 2 and fragment in result.output, result.output


EPISODE = {
    "apiVersion": "episode-operator.dev/v1alpha1",
    "kind": "Episode",
    "metadata": {"name": "ledger-x7k2p", "namespace": "team-a", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "status": {"phase": "Failed", "reward": 0.0, "progress": "2/3", "outcome": "Graded", "failureKind": "harbor:x"},
}
NOW = 1767225600 + 185  # 2026-01-01T00:03:05Z


def test_table_columns_are_the_crds_printer_columns() -> None:
    assert printing.table_header(wide=False, all_namespaces=False) == [
        "NAME",
        "PHASE",
        "REWARD",
        "TURNS",
        "OUTCOME",
        "AGE",
    ]
    row = printing.table_row(EPISODE, wide=True, all_namespaces=True, now=NOW)
    header = printing.table_header(wide=True, all_namespaces=True)
    assert dict(zip(header, row, strict=True)) == {
        "NAMESPACE": "team-a",
        "NAME": "ledger-x7k2p",
        "PHASE": "Failed",
        "REWARD": "0",
        "TURNS": "2/3",
        "OUTCOME": "Graded",
        "FAILURE": "harbor:x",
        "AGE": "3m5s",
    }
    widths = printing.column_widths([header, row])
    assert printing.render_row(header, widths).startswith("NAMESPACE   NAME           PHASE    REWARD   ")


def test_a_new_episode_prints_empty_cells() -> None:
    new = {"metadata": {"name": "fresh", "creationTimestamp": "2026-01-01T00:03:00Z"}}
    assert printing.table_row(new, wide=False, all_namespaces=False, now=NOW) == ["fresh", "", "", "", "", "5s"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (119, "119s"),
        (120, "2m"),
        (185, "3m5s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_age_is_rounded_as_kubectl_rounds_it(seconds: int, shown: str) -> None:
    assert printing.human_duration(seconds) == shown


def test_name_json_and_yaml_are_kubectls() -> None:
    assert printing.resource_name(EPISODE) == "episode.episode-operator.dev/ledger-x7k2p"
    listing = printing.as_document([EPISODE], single=False)
    assert (listing["apiVersion"], listing["kind"], listing["items"]) == ("v1", "List", [EPISODE])
    assert printing.as_document([EPISODE], single=True) is EPISODE
    assert yaml.safe_load(printing.render_document(EPISODE, "yaml")) == EPISODE
    assert printing.json_path(EPISODE, ".status.phase") == "Failed"
    assert printing.json_path({"status": {"passAtK": [{"value": 0.5}]}}, ".status.passAtK[0].value") == 0.5
    assert printing.json_path({"status": {"passAtK": []}}, ".status.passAtK[0].value") is None


# --- turns by name or number -------------------------------------------------------------------------------
STATUS = EpisodeStatus(turns=[TurnStatus(name=name) for name in ("setup", "2", "verify")])


@pytest.mark.parametrize(
    ("given", "turn"), [("setup", "setup"), ("1", "setup"), ("3", "verify"), ("2", "2"), ("seed", "seed")]
)
def test_a_turn_is_named_or_numbered_from_1(given: str, turn: str) -> None:
    assert turn_name(STATUS, given) == turn


@pytest.mark.parametrize("given", ["0", "4", "nope", "-1"])
def test_an_unknown_turn_lists_the_turns(given: str) -> None:
    with pytest.raises(Exception, match=r"no turn .* \(turns: seed, 1 setup, 2 2, 3 verify\)"):
        turn_name(STATUS, given)
