"""EpisodeSet children as manifests (pure builders), dataset folders, and `kubectl-episode eval` offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from episode_operator.api.episode_resource import EpisodeSpec, ImageStatus
from episode_operator.api.episodeset_resource import SET_KIND, EpisodeSetSpec, SetTaskStatus
from episode_operator.api.naming import content_name
from episode_operator.api.vocabulary import SET_ATTEMPT_LABEL, SET_TASK_INDEX_LABEL
from episode_operator.cli.kubectl_episode import cli
from episode_operator.kube.objects.children import (
    child_manifest,
    child_name,
    child_view,
    set_selector,
    task_label_value,
)
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.runtime.evaluation import record_children
from episode_operator.taskfolder.dataset import discover_dataset
from tests.conftest import EXAMPLE_TASKS

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    ("set_name", "index", "attempt", "expected"),
    [
        ("evals", 0, 1, "evals-0-1"),
        ("evals", 4999, 100, "evals-4999-100"),
        ("x" * 63, 12, 3, None),
        ("a" * 200, 0, 1, None),
    ],
)
def test_child_names_are_deterministic_dns_labels(
    set_name: str, index: int, attempt: int, expected: str | None
) -> None:
    name = child_name(set_name, index, attempt)
    assert name == child_name(set_name, index, attempt)
    assert len(name) <= 63 and DNS_LABEL.match(name), name
    assert name.endswith(f"-{index}-{attempt}")
    if expected is not None:
        assert name == expected
    # Long set names keep a hash of the whole name: two long names differing at the end differ.
    assert child_name(set_name + "b", index, attempt) != child_name(set_name + "c", index, attempt)


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("hello", "hello"),
        ("task-07", "task-07"),
        ("org/task name", None),
        ("-leading.and.trailing-", None),
        ("é" * 10, None),
        ("t" * 80, None),
    ],
)
def test_task_ids_become_valid_label_values(task: str, expected: str | None) -> None:
    value = task_label_value(task)
    assert len(value) <= 63 and LABEL_VALUE.match(value), value
    if expected is not None:
        assert value == expected
    else:
        assert value != task


def test_a_child_is_owned_labelled_and_carries_its_task_and_attempt() -> None:
    spec = EpisodeSetSpec.model_validate(
        {
            "dataset": {"tasks": [{"name": "inline one", "inline": {"files": {"task.toml": ""}}}]},
            "agent": {"kind": "oracle"},
            "queueName": "team-a",
            "template": {"image": "img:1", "retries": {"outages": 0}},
        }
    )
    ref = OwnerRef("evals", "ns", "uid-1", kind=SET_KIND)
    manifest = child_manifest(ref, spec, SetTaskStatus(index=0, name="inline one"), 2, "2026-01-01T00:00:00.5Z")
    metadata = manifest["metadata"]
    assert metadata["name"] == "evals-0-2" and metadata["namespace"] == "ns"
    assert metadata["ownerReferences"] == [
        {
            "apiVersion": "episode-operator.dev/v1alpha1",
            "kind": "EpisodeSet",
            "name": "evals",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert {key: value for key, value in metadata["labels"].items() if "managed-by" not in key} == {
        "episode-operator.dev/set": "evals",
        "episode-operator.dev/task": task_label_value("inline one"),
        "episode-operator.dev/task-index": "0",
        "episode-operator.dev/set-attempt": "2",
        "kueue.x-k8s.io/queue-name": "team-a",
    }
    assert metadata["annotations"] == {
        "episode-operator.dev/task-name": "inline one",
        "episode-operator.dev/created-at": "2026-01-01T00:00:00.5Z",
    }
    child = EpisodeSpec.model_validate(manifest["spec"])
    assert (child.image, child.retries.outages, child.task.inline is not None) == ("img:1", 0, True)
    assert {entry["name"]: entry["value"] for entry in child.agent.env} == {
        "EPISODE_SET": "evals",
        "EPISODE_SET_TASK": "inline one",
        "EPISODE_SET_TASK_INDEX": "0",
        "EPISODE_SET_ATTEMPT": "2",
    }
    assert "name" not in manifest["spec"]["task"]  # the task ID is not part of an Episode's task source
    assert set_selector("evals") == "episode-operator.dev/set=evals"


def test_a_selected_task_comes_from_its_configmap() -> None:
    spec = EpisodeSetSpec.model_validate(
        {"dataset": {"selector": {"matchLabels": {"suite": "a"}}}, "agent": {"kind": "nop"}}
    )
    task = SetTaskStatus(index=0, name="alpha", config_map="task-alpha-0123")
    manifest = child_manifest(OwnerRef("s", "ns", "u", kind=SET_KIND), spec, task, 1, "t")
    assert manifest["spec"]["task"] == {"configMap": {"name": "task-alpha-0123", "key": "task.tar.gz"}}


# --- dataset folders ------------------------------------------------------------------------------
def task_folder(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "task.toml").write_text("[environment]\n")
    return root


def test_dataset_discovery_follows_the_dataset_rules(tmp_path: Path) -> None:
    task_folder(tmp_path / "b-task")
    task_folder(tmp_path / "a-task")
    task_folder(tmp_path / "group" / "inner" / "deep-task")
    task_folder(tmp_path / ".hidden" / "ignored")
    task_folder(tmp_path / "1" / "2" / "3" / "4" / "5" / "six-levels")
    task_folder(tmp_path / "1" / "2" / "3" / "4" / "5" / "6" / "too-deep")
    task_folder(tmp_path / "other" / "a-task")  # the same task ID twice
    (tmp_path / "linked").symlink_to(tmp_path / "b-task")
    task_folder(tmp_path / "a-task" / "nested-in-a-task")  # a task folder is not searched further
    (tmp_path / "notes.txt").write_text("not a folder")
    dataset = discover_dataset(tmp_path)
    assert [(task.name, task.path.relative_to(tmp_path).as_posix()) for task in dataset.tasks] == [
        ("six-levels", "1/2/3/4/5/six-levels"),
        ("a-task", "a-task"),
        ("b-task", "b-task"),
        ("deep-task", "group/inner/deep-task"),
    ]
    assert [problem.render() for problem in dataset.problems] == [
        f"{tmp_path}/linked: a task folder must not be a symlink",
        f"{tmp_path}/other/a-task: task ID 'a-task' is also the folder {tmp_path}/a-task",
    ]


def test_a_task_folder_is_a_dataset_of_one_and_a_file_is_no_dataset(tmp_path: Path) -> None:
    assert [task.name for task in discover_dataset(EXAMPLE_TASKS / "hello").tasks] == ["hello"]
    assert discover_dataset(tmp_path / "missing").problems[0].message == "not a directory"
    assert discover_dataset(tmp_path).tasks == []


# --- kubectl-episode eval, offline ------------------------------------------------------------------
def copy_example(name: str, destination: Path) -> None:
    for path in (EXAMPLE_TASKS / name).rglob("*"):
        if path.is_file():
            target = destination / path.relative_to(EXAMPLE_TASKS / name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())


def test_eval_prints_the_configmaps_and_the_set(tmp_path: Path) -> None:
    copy_example("hello", tmp_path / "suite" / "hello")
    copy_example("three-step-ledger", tmp_path / "suite" / "more" / "ledger")
    result = CliRunner().invoke(
        cli,
        [
            *("eval", str(tmp_path / "suite"), "-n", "evals", "--attempts", "3", "--parallelism", "2", "-o", "yaml"),
            *("--queue-name", "q", "--outage-retries", "0", "--max-outages", "1", "--image", "img:2"),
        ],
    )
    assert result.exit_code == 0, result.output
    *config_maps, episode_set = list(yaml.safe_load_all(result.output))
    assert [config_map["kind"] for config_map in config_maps] == ["ConfigMap", "ConfigMap"]
    # Named after the folder and the spec: GitOps tools apply it; the same evaluation is one set.
    assert episode_set["metadata"] == {"name": content_name("suite", episode_set["spec"]), "namespace": "evals"}
    spec = EpisodeSetSpec.model_validate(episode_set["spec"])
    assert [(task.name, task.config_map.name if task.config_map else None) for task in spec.dataset.tasks] == [
        ("hello", config_maps[0]["metadata"]["name"]),
        ("ledger", config_maps[1]["metadata"]["name"]),
    ]
    assert (spec.attempts, spec.parallelism, spec.queue_name, spec.failure_policy.max_outages) == (3, 2, "q", 1)
    template = spec.template.model_dump(by_alias=True, exclude_unset=True)
    assert template == {"timeoutMultiplier": 1.0, "image": "img:2", "retries": {"outages": 0}}


@pytest.mark.parametrize(
    ("arguments", "code", "fragment"),
    [
        (["--parallelism", "0"], 2, "0 is not in the range 1<=x<=10000"),
        (["--attempts", "0"], 2, "0 is not in the range 1<=x<=100"),
        (["--agent", "command"], 1, "spec.agent.command is required"),
    ],
)
def test_eval_refuses_bad_options(tmp_path: Path, arguments: list[str], code: int, fragment: str) -> None:
    copy_example("hello", tmp_path / "hello")
    result = CliRunner().invoke(cli, ["eval", str(tmp_path), "-o", "yaml", *arguments])
    assert result.exit_code == code and fragment in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_eval_refuses_an_empty_dataset_and_invalid_folders_before_creating_anything(tmp_path: Path) -> None:
    (tmp_path / "empty" / "notes").mkdir(parents=True)
    result = CliRunner().invoke(cli, ["eval", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "no task folders" in result.output
    copy_example("hello", tmp_path / "bad" / "good")
    copy_example("hello", tmp_path / "bad" / "broken")
    (tmp_path / "bad" / "broken" / "task.toml").write_text("[environment\n")
    result = CliRunner().invoke(cli, ["eval", str(tmp_path / "bad")])
    assert result.exit_code == 1, result.output
    assert f"{tmp_path}/bad/broken: task.toml: TOML syntax error" in result.output
    assert "refused (1 error(s)); nothing was created" in result.output


def test_the_sets_record_of_a_child_says_which_image_it_started_from_and_why() -> None:
    """Seed once: each child's status.image (its digest when built once) reaches the set's record of it, a
    malformed one is no record, and a finished record keeps what it said."""
    pinned = "registry.test/builds@sha256:" + "d" * 64
    image = {"ref": pinned, "made": "built", "message": "environment/Dockerfile: built once"}
    labels = {SET_TASK_INDEX_LABEL: "0", SET_ATTEMPT_LABEL: "1"}
    item = {"metadata": {"name": "s-0-1", "labels": labels}, "status": {"phase": "Running", "image": image}}
    view = child_view(item)
    assert view.image == ImageStatus(ref=pinned, made="built", message="environment/Dockerfile: built once")
    assert child_view({**item, "status": {"image": {"made": "baked"}}}).image is None
    task = SetTaskStatus(index=0, name="t")
    (updated,), lost = record_children([task], [view], "2026-01-01T00:00:00Z")
    assert not lost and updated.children[0].image == view.image
    finished = child_view({**item, "status": {"phase": "Succeeded", "outcome": "Graded", "image": image}})
    (done,), _ = record_children([task], [finished], "2026-01-01T00:00:00Z")
    assert done.children[0].image is not None and done.children[0].image.ref == pinned
