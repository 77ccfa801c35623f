"""Datasets by name: Harbor's registry.json read as Harbor reads it, its tasks found on this machine, and
`kubectl episode eval NAME@VERSION --registry …` refusing bad input naming the file and key, nothing made."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from episode_operator.api.episodeset_resource import DATASET_ANNOTATION, REGISTRY_ANNOTATION, EpisodeSetSpec
from episode_operator.cli.kubectl_episode import cli
from episode_operator.taskfolder.registry import (
    Checkout,
    RegistryRefused,
    RegistryRoot,
    normalized_git_url,
    parse_registry,
    resolve_tasks,
    select_dataset,
)
from tests.reference import harbor_registry
from tests.unit.test_episodeset_children import copy_example

TERMINAL_BENCH = "https://github.com/laude-institute/terminal-bench.git"
COMMIT = "4b36bc9b7a5e2bb2e70e3b1e0d2b06a11cd7f3a3"


def dataset(name: str = "hello", version: str = "1.0", tasks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A registry.json row as Harbor's own registry writes them."""
    return {
        "name": name,
        "version": version,
        "description": f"The {name} tasks.",
        "tasks": tasks if tasks is not None else [{"name": "hello", "path": "tasks/hello"}],
    }


# --- read as Harbor reads it ------------------------------------------------------------------------
DOCUMENTS: dict[str, Any] = {
    "local and git tasks, metrics": [
        {
            **dataset(tasks=[{"name": "hello", "path": "tasks/hello"}]),
            "metrics": [{"type": "mean"}, {"type": "uv-script", "kwargs": {"script": "m.py"}}],
        },
        dataset(
            "terminal-bench-core",
            "0.1.1",
            [{"name": "hello-world", "git_url": TERMINAL_BENCH, "git_commit_id": COMMIT, "path": "tasks/hello-world"}],
        ),
    ],
    "an empty catalogue": [],
    "keys Harbor does not know": [{**dataset(), "homepage": "https://x", "owner": {"name": "y"}}],
    "a version that is a number": [{**dataset(), "version": 1.0}],
    "no description": [{key: value for key, value in dataset().items() if key != "description"}],
    "a task without a path": [dataset(tasks=[{"name": "hello"}])],
    "a task whose name is a list": [dataset(tasks=[{"name": ["a"], "path": "x"}])],
    "an unknown metric": [{**dataset(), "metrics": [{"type": "median"}]}],
    "metric kwargs that are no object": [{**dataset(), "metrics": [{"type": "mean", "kwargs": 5}]}],
    "tasks that are no list": [dataset(tasks={"hello": "x"})],  # type: ignore[arg-type]
    "a row that is a string": ["hello"],
    "the top level an object": {"datasets": [dataset()]},
}


def ours(text: str) -> list[tuple[Any, ...]] | None:
    try:
        registry = parse_registry(text)
    except RegistryRefused:
        return None
    return [
        (row.name, row.version, row.description, [(t.name, t.git_url, t.git_commit_id, str(t.path)) for t in row.tasks])
        for row in registry.datasets
    ]


def harbors(path: Path) -> list[tuple[Any, ...]] | None:
    try:
        registry = harbor_registry().Registry.from_path(path)
    except (ValueError, TypeError, AttributeError):  # pydantic's ValidationError is a ValueError
        return None
    return [
        (row.name, row.version, row.description, [(t.name, t.git_url, t.git_commit_id, str(t.path)) for t in row.tasks])
        for row in registry.datasets
    ]


@pytest.mark.parametrize("case", list(DOCUMENTS))
def test_registry_json_is_read_as_harbors_own_models_read_it(case: str, tmp_path: Path) -> None:
    text = json.dumps(DOCUMENTS[case])
    (tmp_path / "registry.json").write_text(text)
    assert ours(text) == harbors(tmp_path / "registry.json")


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("[{", "registry.json: not JSON: line 1 column 3: Expecting property name enclosed in double quotes"),
        ('{"a": 1}', "registry.json: the top level is an object; Harbor's registry.json is a list of datasets"),
        (
            json.dumps([dataset(tasks=[{"name": "hello"}])]),
            "registry.json: [0] (hello@1.0).tasks[0].path: Field required",
        ),
        (
            json.dumps([dataset(), {**dataset("b"), "version": 2}]),
            "registry.json: [1] (b@2).version: Input should be a valid string",
        ),
        (
            json.dumps([{**dataset(), "metrics": [{"type": "p50"}]}]),
            "registry.json: [0] (hello@1.0).metrics[0].type: Input should be",
        ),
        (json.dumps(["x"]), "registry.json: [0]: Input should be a valid dictionary or instance of RegistryDataset"),
    ],
)
def test_a_malformed_registry_is_refused_naming_the_file_and_key(text: str, rendered: str) -> None:
    with pytest.raises(RegistryRefused) as refused:
        parse_registry(text)
    assert any(problem.render().startswith(rendered) for problem in refused.value.problems), refused.value.problems


# --- name@version ------------------------------------------------------------------------------------
CATALOGUE = parse_registry(
    json.dumps(
        [
            dataset("hello", "1.0"),
            dataset("hello", "2.0"),
            dataset("nightly", "head"),
            dataset("nightly", "0.3"),
            dataset("solo", "7"),
        ]
    )
)


@pytest.mark.parametrize(
    ("wanted", "position"),
    [("hello@1.0", 0), ("hello@2.0", 1), ("nightly", 2), ("nightly@0.3", 3), ("solo", 4), ("solo@7", 4)],
)
def test_a_dataset_is_named_by_name_and_version(wanted: str, position: int) -> None:
    assert select_dataset(CATALOGUE, wanted)[0] == position


@pytest.mark.parametrize(
    ("wanted", "rendered"),
    [
        ("nope@1.0", "registry.json: dataset 'nope': not in the registry (its datasets: hello, nightly, solo)"),
        ("hello@3.0", "registry.json: dataset 'hello' version '3.0': not in the registry (its versions: 1.0, 2.0)"),
        ("hello", "registry.json: dataset 'hello': has versions 1.0, 2.0: name one, hello@VERSION"),
        ("hello@", "registry.json: 'hello@': name a dataset as NAME@VERSION"),
        ("@1.0", "registry.json: '@1.0': name a dataset as NAME@VERSION"),
    ],
)
def test_an_unknown_name_or_version_is_refused_naming_what_there_is(wanted: str, rendered: str) -> None:
    with pytest.raises(RegistryRefused) as refused:
        select_dataset(CATALOGUE, wanted)
    assert [problem.render() for problem in refused.value.problems] == [rendered]


def test_a_name_at_version_listed_twice_is_refused_naming_both_entries() -> None:
    registry = parse_registry(json.dumps([dataset(), dataset("other"), dataset()]))
    with pytest.raises(RegistryRefused, match=r"\[0\] and \[2\]: hello@1.0 is listed more than once"):
        select_dataset(registry, "hello@1.0")


# --- where the tasks are -------------------------------------------------------------------------------
def task_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "task.toml").write_text("")
    return path


def resolve(rows: list[dict[str, Any]], root: RegistryRoot) -> list[tuple[str, Path]]:
    registry = parse_registry(json.dumps([dataset(tasks=rows)]))
    return [(task.name, task.path) for task in resolve_tasks(registry, 0, registry.datasets[0], root)]


def refusals(rows: list[dict[str, Any]], root: RegistryRoot) -> list[str]:
    with pytest.raises(RegistryRefused) as refused:
        resolve(rows, root)
    return [problem.render() for problem in refused.value.problems]


def test_a_local_task_is_a_folder_of_the_registrys_own(tmp_path: Path) -> None:
    hello = task_folder(tmp_path / "tasks" / "hello")
    deep = task_folder(tmp_path / "tasks" / "deep" / "er")
    rows = [{"name": "hello", "path": "tasks/hello"}, {"name": "deeper", "path": "tasks/./deep/../deep/er"}]
    assert resolve(rows, RegistryRoot(tmp_path)) == [("hello", hello), ("deeper", deep)]


def test_a_task_path_outside_the_checkout_is_refused_naming_its_key(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    task_folder(tmp_path / "elsewhere")
    task_folder(root / "tasks" / "hello")
    (root / "tasks" / "link").symlink_to(tmp_path / "elsewhere")
    rows = [
        {"name": "up", "path": "../elsewhere"},
        {"name": "linked", "path": "tasks/link"},
        {"name": "absolute", "path": str(tmp_path / "elsewhere")},
        {"name": "empty", "path": "tasks"},
        {"name": "up", "path": "tasks/hello"},
    ]
    key = "registry.json: [0] (hello@1.0).tasks"
    assert refusals(rows, RegistryRoot(root)) == [
        f"{key}[0].path: ../elsewhere: outside the registry's folder {root}",
        f"{key}[1].path: tasks/link: outside the registry's folder {root}",
        f"{key}[2].path: {tmp_path / 'elsewhere'}: an absolute path; a task's path is relative",
        f"{key}[3].path: tasks: no task folder there ({root / 'tasks'} holds no task.toml)",
        f"{key}[4].name: task 'up' is also tasks[0]: task IDs are unique",
    ]


@pytest.mark.parametrize(
    ("remote", "task_url"),
    [
        (TERMINAL_BENCH, TERMINAL_BENCH),
        ("git@github.com:laude-institute/terminal-bench.git", TERMINAL_BENCH),
        ("ssh://git@github.com/Laude-Institute/terminal-bench", "https://github.com/laude-institute/terminal-bench/"),
    ],
)
def test_a_git_task_is_a_folder_of_the_checkout_of_its_url_at_its_commit(
    tmp_path: Path, remote: str, task_url: str
) -> None:
    assert normalized_git_url(remote) == normalized_git_url(task_url)
    checkout = Checkout(tmp_path / "tb", (remote,), COMMIT)
    folder = task_folder(checkout.path / "tasks" / "hello-world")
    row = {"name": "hello-world", "git_url": task_url, "git_commit_id": COMMIT, "path": "tasks/hello-world"}
    root = RegistryRoot(tmp_path / "registry", (checkout,))
    assert resolve([row], root) == [("hello-world", folder)]
    assert resolve([{**row, "git_commit_id": None}], root) == [("hello-world", folder)]


def test_a_git_task_without_its_checkout_or_at_another_commit_is_refused(tmp_path: Path) -> None:
    checkout = Checkout(tmp_path / "tb", (TERMINAL_BENCH,), "0" * 40)
    task_folder(checkout.path / "tasks" / "a")
    rows = [
        {"name": "a", "git_url": TERMINAL_BENCH, "git_commit_id": COMMIT, "path": "tasks/a"},
        {"name": "b", "git_url": "https://github.com/other/repo.git", "path": "tasks/b"},
        {"name": "c", "git_url": TERMINAL_BENCH, "path": "../../etc"},
    ]
    key = "registry.json: [0] (hello@1.0).tasks"
    assert refusals(rows, RegistryRoot(tmp_path, (checkout,))) == [
        f"{key}[0].git_commit_id: {COMMIT}: the checkout {checkout.path} is at {'0' * 40}; "
        f"git -C {checkout.path} checkout {COMMIT}",
        f"{key}[1].git_url: https://github.com/other/repo.git: no checkout of it was given (--checkout DIR, a clone "
        f"whose remote is that URL: nothing is fetched); checkouts given: {checkout.path}",
        f"{key}[2].path: ../../etc: outside the checkout {checkout.path}",
    ]


def test_a_dataset_without_tasks_is_refused(tmp_path: Path) -> None:
    assert refusals([], RegistryRoot(tmp_path)) == ["registry.json: [0] (hello@1.0).tasks: the dataset has no tasks"]


# --- kubectl episode eval NAME@VERSION --registry ----------------------------------------------------------
def git(folder: Path, *arguments: str) -> str:
    environment = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    result = subprocess.run(
        ["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=True, env=environment
    )
    return result.stdout.strip()


def checkout_of(folder: Path, url: str) -> str:
    """``folder`` made a Git clone of ``url`` (a remote only: nothing is fetched) with one commit; its HEAD."""
    git(folder, "init", "-q")
    git(folder, "remote", "add", "origin", url)
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "tasks")
    return git(folder, "rev-parse", "HEAD")


@pytest.fixture
def catalogue(tmp_path: Path) -> tuple[Path, Path]:
    """A registry in a folder of its own (a local task) and a checkout of another repository (a git task)."""
    registry = tmp_path / "registry"
    copy_example("hello", registry / "tasks" / "hello")
    bench = tmp_path / "bench"
    copy_example("three-step-ledger", bench / "tasks" / "ledger")
    head = checkout_of(bench, TERMINAL_BENCH)
    rows = [
        dataset("suite", "1.0", [{"name": "hello", "path": "tasks/hello"}]),
        dataset(
            "suite",
            "2.0",
            [
                {"name": "hello", "path": "tasks/hello"},
                {"name": "ledger", "git_url": TERMINAL_BENCH, "git_commit_id": head, "path": "tasks/ledger"},
            ],
        ),
    ]
    (registry / "registry.json").write_text(json.dumps(rows))
    return registry, bench


def test_eval_by_name_packs_the_datasets_folders_and_annotates_the_set(catalogue: tuple[Path, Path]) -> None:
    registry, bench = catalogue
    arguments = ["eval", "suite@2.0", "--registry", str(registry), "--checkout", str(bench), "-n", "evals"]
    result = CliRunner().invoke(cli, [*arguments, "--attempts", "2", "-o", "yaml"])
    assert result.exit_code == 0, result.output
    *config_maps, episode_set = list(yaml.safe_load_all(result.stdout))
    assert [config_map["metadata"]["labels"]["episode-operator.dev/task"] for config_map in config_maps] == [
        "hello",
        "ledger",
    ]
    assert episode_set["metadata"]["name"].startswith("suite-2-0-")
    assert episode_set["metadata"]["annotations"] == {
        DATASET_ANNOTATION: "suite@2.0",
        REGISTRY_ANNOTATION: str(registry),
    }
    spec = EpisodeSetSpec.model_validate(episode_set["spec"])
    assert [(task.name, task.config_map.name if task.config_map else None) for task in spec.dataset.tasks] == [
        ("hello", config_maps[0]["metadata"]["name"]),
        ("ledger", config_maps[1]["metadata"]["name"]),
    ]
    # The same folders packed by `pack` are the same ConfigMaps: content-addressed either way.
    packed = CliRunner().invoke(cli, ["pack", str(registry / "tasks" / "hello"), "-o", "yaml"])
    assert yaml.safe_load(packed.stdout)["metadata"]["name"] == config_maps[0]["metadata"]["name"]
    # The registry.json file itself, or the registry's folder as a checkout of its own, do as well.
    again = CliRunner().invoke(cli, ["eval", "suite@1.0", "--registry", str(registry / "registry.json"), "-o", "yaml"])
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize(
    ("change", "arguments", "expected"),
    [
        (None, ["nope@1.0"], "registry.json: dataset 'nope': not in the registry (its datasets: suite)"),
        (
            None,
            ["suite@3.0"],
            "registry.json: dataset 'suite' version '3.0': not in the registry (its versions: 1.0, 2.0)",
        ),
        (
            None,
            ["suite@2.0"],
            "(suite@2.0).tasks[1].git_url: https://github.com/laude-institute/terminal-bench.git: no checkout",
        ),
        (
            "outside",
            ["suite@1.0"],
            "registry.json: [0] (suite@1.0).tasks[0].path: ../bench/tasks/ledger: outside the registry's folder",
        ),
        ("malformed", ["suite@1.0"], "registry.json: not JSON: line 1 column 3: Expecting value"),
        ("moved-on", ["suite@2.0", "--checkout", "BENCH"], "(suite@2.0).tasks[1].git_commit_id: "),
        (None, ["suite@1.0", "--checkout", "REGISTRY/tasks"], "REGISTRY/tasks: --checkout: not a Git checkout"),
    ],
)
def test_eval_refuses_a_bad_registry_naming_the_file_and_key_and_makes_nothing(
    catalogue: tuple[Path, Path], change: str | None, arguments: list[str], expected: str
) -> None:
    registry, bench = catalogue
    if change == "outside":
        rows = json.loads((registry / "registry.json").read_text())
        rows[0]["tasks"][0]["path"] = "../bench/tasks/ledger"
        (registry / "registry.json").write_text(json.dumps(rows))
    if change == "malformed":
        (registry / "registry.json").write_text("[[")
    if change == "moved-on":
        (bench / "NEWS").write_text("later\n")
        git(bench, "add", "NEWS")
        git(bench, "commit", "-q", "-m", "later")
    arguments = [argument.replace("BENCH", str(bench)).replace("REGISTRY", str(registry)) for argument in arguments]
    # No kubeconfig: a refusal must come before anything would reach a cluster.
    result = CliRunner().invoke(cli, ["eval", *arguments, "--registry", str(registry), "--kubeconfig", "/nonexistent"])
    assert result.exit_code == 1, result.output
    assert expected.replace("REGISTRY", str(registry)) in result.stderr, result.stderr
    assert "nothing was created" in result.stderr and result.stdout == ""


def test_eval_by_name_needs_a_registry_and_a_checkout_needs_one_too(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["eval", "suite@1.0", "-o", "yaml"])
    assert (
        result.exit_code == 2 and "'suite@1.0': no such directory (a dataset by name needs --registry)" in result.output
    )
    copy_example("hello", tmp_path / "hello")
    result = CliRunner().invoke(cli, ["eval", str(tmp_path), "--checkout", str(tmp_path), "-o", "yaml"])
    assert result.exit_code == 2 and "--checkout goes with --registry" in result.output
    result = CliRunner().invoke(cli, ["eval", "suite@1.0", "--registry", str(tmp_path / "none"), "-o", "yaml"])
    assert result.exit_code == 2 and "no registry.json there" in result.output


def test_a_registry_in_a_configmap_resolves_its_local_tasks_from_the_current_directory(
    catalogue: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalogue read from the cluster: its local tasks are where Harbor looks for them, the current folder."""
    from episode_operator.cli import registries

    registry, _ = catalogue
    monkeypatch.setattr(
        registries, "_read_config_map_registry", lambda cluster, name: (registry / "registry.json").read_bytes()
    )
    monkeypatch.chdir(registry)
    result = CliRunner().invoke(cli, ["eval", "suite@1.0", "--registry", "configmap/catalogue", "-o", "yaml"])
    assert result.exit_code == 0, result.output
    *_, episode_set = list(yaml.safe_load_all(result.stdout))
    assert episode_set["metadata"]["annotations"][REGISTRY_ANNOTATION] == "configmap/catalogue"
    monkeypatch.chdir(registry.parent)
    result = CliRunner().invoke(cli, ["eval", "suite@1.0", "--registry", "configmap/catalogue", "-o", "yaml"])
    assert result.exit_code == 1
    assert (
        "configmap/catalogue (registry.json): [0] (suite@1.0).tasks[0].path: tasks/hello: no task folder"
        in result.stderr
    )
