"""Which image each sandbox runs and how it is made (runtime/sandbox_images.py), decided at admission.

Mirrors apply everywhere an image is named; a Dockerfile is replayed when replay means what a
build means, built when it cannot be and the operator builds, refused naming its line otherwise;
what no build would take either (syntax errors, binary garbage, paths leaving the context, 10 MB)
is refused whatever the operator's settings.
"""

from __future__ import annotations

from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.runtime.admission import Admission, Refusal, admit_task
from episode_operator.runtime.sandbox_images import (
    DOCKERFILE_MAKING,
    VERIFIER_OWN_COMPOSE,
    ImagePlan,
    ImagePolicy,
    Takes,
    plan_images,
)
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from episode_operator.taskfolder.image_refs import ImageMirrors

MIRRORS = ImageMirrors.parse(
    ["ubuntu:24.04=mirror.test/ubuntu:24.04", "python=mirror.test/python", "docker.io/library/=mirror.test/hub/"]
)
REPLAY_ONLY = ImagePolicy(MIRRORS)
BUILDS = ImagePolicy(MIRRORS, "registry.test:5000/builds")
MULTI_STAGE = "FROM ubuntu:24.04 AS build\nRUN make\nFROM ubuntu:24.04\nCOPY --from=build /out /out\n"


def folder(toml: str = "", **files: str) -> dict[str, str]:
    return {
        "task.toml": f'schema_version = "1.4"\n{toml}',
        "instruction.md": "Do it.\n",
        "tests/test.sh": "exit 0\n",
        "solution/solve.sh": "true\n",
        **{path.replace("__", "/"): text for path, text in files.items()},
    }


def images(
    files: dict[str, str], policy: ImagePolicy = REPLAY_ONLY, override: str | None = None, *, set_child: bool = False
) -> Any:
    task = load_task(TaskFiles.from_mapping(files))
    return plan_images(task, resolve_plan(task), image_override=override, policy=policy, set_child=set_child)


def problems(files: dict[str, str], policy: ImagePolicy = REPLAY_ONLY) -> list[str]:
    found = images(files, policy)
    assert isinstance(found, list), found
    return [problem.render() for problem in found]


def test_a_prebuilt_image_is_mirrored_and_spec_image_wins() -> None:
    planned = images(folder('[environment]\ndocker_image = "python:3.12"\n'))
    assert isinstance(planned, ImagePlan)
    assert (planned.agent.image, planned.agent.replay, planned.agent.build) == ("mirror.test/python:3.12", None, None)
    dockerfile = folder(environment__Dockerfile="FROM ubuntu:24.04\n")
    overridden = images(dockerfile, override="ubuntu:24.04")
    assert isinstance(overridden, ImagePlan)
    assert (overridden.agent.image, overridden.agent.origin) == ("mirror.test/ubuntu:24.04", "spec.image")
    assert overridden.agent.replay is None  # a prebuilt image of the task: the Dockerfile is not applied


def test_a_replayable_dockerfile_runs_in_its_mirrored_from_image() -> None:
    planned = images(folder(environment__Dockerfile="ARG BASE=ubuntu:24.04\nFROM ${BASE}\nRUN true\n"))
    assert isinstance(planned, ImagePlan)
    assert planned.agent.image == "mirror.test/ubuntu:24.04"
    assert planned.agent.replay is not None and planned.agent.replay.dockerfile == "environment/Dockerfile"
    assert planned.builds() == []


def test_a_dockerfile_replay_cannot_apply_is_built_when_the_operator_builds_and_refused_else() -> None:
    files = folder(environment__Dockerfile=MULTI_STAGE)
    assert problems(files) == [
        "environment/Dockerfile:3: FROM ubuntu:24.04: a second FROM (a multi-stage build) needs an image build",
        "environment/Dockerfile: replay cannot apply this Dockerfile, and this operator builds no images: set "
        "docker_image, or run the operator with --build-registry",
    ]
    planned = images(files, BUILDS)
    assert isinstance(planned, ImagePlan) and planned.agent.build is not None and planned.agent.replay is None
    assert planned.agent.image.startswith("registry.test:5000/builds:")
    assert [(build.role, build.timeout_sec) for build in planned.builds()] == [("environment", 600.0)]
    # The tag is the context's digest: the same task plans the same image; another context another.
    again = images(folder(environment__Dockerfile=MULTI_STAGE), BUILDS)
    other = images(folder(environment__Dockerfile=MULTI_STAGE, environment__x="x"), BUILDS)
    assert again.agent.image == planned.agent.image != other.agent.image


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ("FROM ubuntu:24.04\nRUN <<EOF\necho unterminated\n", "environment/Dockerfile:2: syntax error: unterminated"),
        ("FROM ubuntu:24.04\nCOPY ../../etc/passwd /x\n", "environment/Dockerfile:2: COPY ../../etc/passwd /x: "),
        ("FROM ubuntu\x00\x01\x02\xff", "environment/Dockerfile:1: contains a NUL byte: this is not a Dockerfile"),
        ("FROM ubuntu:24.04\n" + "RUN true\n" * 1_300_000, "environment/Dockerfile: 11700018 bytes: a replayed"),
    ],
    ids=["syntax-error", "leaves-the-context", "binary", "10-MB"],
)
def test_what_no_build_would_take_is_refused_whatever_the_operator(dockerfile: str, expected: str) -> None:
    for policy in (REPLAY_ONLY, BUILDS):
        found = problems(folder(environment__Dockerfile=dockerfile), policy)
        assert len(found) == 1 and found[0].startswith(expected), found


def test_no_image_at_all_is_refused() -> None:
    assert problems(folder()) == [
        "task.toml: environment.docker_image: not set, no environment/Dockerfile to make the image from, and the "
        "Episode gives no spec.image"
    ]


def test_an_unmirrorable_reference_is_named() -> None:
    found = problems(folder('[environment]\ndocker_image = "Not An Image"\n'))
    assert len(found) == 1 and found[0].startswith("task.toml: environment.docker_image: 'Not An Image' is not")


SEPARATE = '[verifier]\nenvironment_mode = "separate"\n'


def test_a_separate_verifier_without_its_own_environment_runs_the_agents_image_made_alike() -> None:
    planned = images(folder(SEPARATE, environment__Dockerfile="FROM ubuntu:24.04\n"))
    assert isinstance(planned, ImagePlan)
    assert planned.verifier(0) is planned.agent
    overridden = images(folder(SEPARATE + '[environment]\ndocker_image = "python:3.12"\n'), override="ubuntu:24.04")
    assert overridden.verifier(0).image == "mirror.test/ubuntu:24.04"  # the override, as the agent's


def test_a_separate_verifier_environment_runs_its_image_or_its_tests_dockerfile() -> None:
    declared = SEPARATE + '[verifier.environment]\ndocker_image = "python:3.12-slim"\n'
    planned = images(folder(declared, environment__Dockerfile="FROM ubuntu:24.04\n"))
    assert isinstance(planned, ImagePlan)
    assert planned.verifier(0).image == "mirror.test/python:3.12-slim" and planned.verifier(0).replay is None
    own = images(
        folder(
            SEPARATE + "[verifier.environment]\n",
            environment__Dockerfile="FROM ubuntu:24.04\n",
            tests__Dockerfile="FROM python:3.12\nRUN true\n",
        )
    )
    assert isinstance(own, ImagePlan)
    assert own.verifier(0).image == "mirror.test/python:3.12"
    assert own.verifier(0).replay is not None and own.verifier(0).replay.context == "tests"
    built = images(
        folder(
            SEPARATE + "[verifier.environment]\n",
            environment__Dockerfile="FROM ubuntu:24.04\n",
            tests__Dockerfile=MULTI_STAGE,
        ),
        BUILDS,
    )
    assert [build.role for build in built.builds()] == ["verifier"]


COMPOSE = "services:\n  db:\n    image: db:1\n"


@pytest.mark.parametrize(
    ("toml", "tests_files", "compose"),
    [
        ("", {}, True),  # Harbor's fallback: the verifier's environment is environment/, its compose file too
        ('[verifier.environment]\ndocker_image = "python:3.12"\n', {}, False),  # made from tests/
        ("", {"tests__Dockerfile": "FROM python:3.12\n"}, False),
    ],
    ids=["fallback", "declared-image", "tests-dockerfile"],
)
def test_a_separate_verifier_gets_the_compose_services_when_harbors_environment_for_it_is_environment(
    toml: str, tests_files: dict[str, str], compose: bool
) -> None:
    """Harbor's resolve_verifier_environment_definition: a declared image or a tests folder with a Dockerfile
    or docker-compose.yaml defines the verifier's environment; else it is environment/, compose file and all."""
    base = '[environment]\ndocker_image = "python:3.12"\n'
    files = folder(SEPARATE + toml + base, environment__docker_compose_yaml=COMPOSE, **tests_files)
    files = {path.replace("docker_compose_yaml", "docker-compose.yaml"): text for path, text in files.items()}
    plan = resolve_plan(load_task(TaskFiles.from_mapping(files)))
    assert plan.turns[0].verifier.compose is compose
    # A shared verifier runs in the agent's pod, beside its services already: no pod of its own.
    shared = {path: text.replace('environment_mode = "separate"', "") for path, text in files.items()}
    assert resolve_plan(load_task(TaskFiles.from_mapping(shared))).turns[0].verifier.compose is False


def test_a_verifiers_own_compose_file_is_refused_naming_it() -> None:
    """A tests folder with a docker-compose.yaml is Harbor's definition of a separate verifier's environment,
    its services included: the operator runs compose services from environment/ only, so it says so."""
    files = folder(SEPARATE + '[environment]\ndocker_image = "python:3.12"\n', tests__docker_compose_yaml=COMPOSE)
    files = {path.replace("docker_compose_yaml", "docker-compose.yaml"): text for path, text in files.items()}
    assert problems(files) == [f"tests/docker-compose.yaml: {VERIFIER_OWN_COMPOSE.format(turn='task')}"]
    # The control: a shared verifier's tests/ is only copied to /tests (Harbor reads no compose file there).
    shared = {path: text.replace('environment_mode = "separate"', "") for path, text in files.items()}
    assert isinstance(images(shared), ImagePlan)


def test_a_steps_tests_dockerfile_comes_before_the_tasks() -> None:
    """Harbor's precedence; Gym refuses a step tests folder without an image (refusal 8), so the task has one."""
    toml = (
        '[[steps]]\nname = "one"\n[steps.verifier]\nenvironment_mode = "separate"\n'
        '[[steps]]\nname = "two"\n[environment]\ndocker_image = "python:3.12"\n'
    )
    files = folder(
        toml,
        tests__Dockerfile="FROM python:3.12\n",
        steps__one__instruction_md="One.\n",
        steps__one__tests__Dockerfile="FROM python:3.12\n",
        steps__two__instruction_md="Two.\n",
    )
    files = {path.replace("instruction_md", "instruction.md"): text for path, text in files.items()}
    planned = images(files)
    assert isinstance(planned, ImagePlan)
    assert planned.verifier(0).replay.dockerfile == "steps/one/tests/Dockerfile"
    assert planned.verifier(1) is None


def test_sidecars_images_are_mirrored_and_built_sidecars_need_builds() -> None:
    compose = "services:\n  db:\n    image: postgres:16\n  api:\n    build: ./api\n"
    files = folder(
        '[environment]\ndocker_image = "python:3.12"\n',
        environment__docker_compose_yaml=compose,
        environment__api__Dockerfile="FROM python:3.12\n",
    )
    files = {path.replace("docker_compose_yaml", "docker-compose.yaml"): text for path, text in files.items()}
    planned = images(files, BUILDS)
    assert isinstance(planned, ImagePlan)
    assert planned.sidecars["db"].image == "mirror.test/hub/postgres:16"
    assert planned.sidecars["api"].build is not None


def test_admission_puts_every_decided_image_in_the_plan() -> None:
    files = folder(
        SEPARATE,
        environment__Dockerfile="FROM ubuntu:24.04\n",
        environment__docker_compose_yaml="services:\n  api:\n    build: ./api\n",
        environment__api__Dockerfile=MULTI_STAGE,
    )
    files = {path.replace("docker_compose_yaml", "docker-compose.yaml"): text for path, text in files.items()}
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": files}}, "agent": {"kind": "oracle"}})
    admitted = admit_task(spec, TaskFiles.from_mapping(files), BUILDS)
    assert isinstance(admitted, Admission)
    assert admitted.image == "mirror.test/ubuntu:24.04"
    assert admitted.plan.turns[0].verifier.image == "mirror.test/ubuntu:24.04"
    assert admitted.plan.sidecars[0].image == admitted.images.sidecars["api"].image
    refused = admit_task(spec, TaskFiles.from_mapping(files), REPLAY_ONLY)
    assert isinstance(refused, Refusal) and refused.failure_kind == "harbor:seed_refused"
    assert refused.message.startswith("refused at seed: environment/api/Dockerfile:3: FROM ubuntu:24.04: a second FROM")


# Seed once: a set's children build a replayable Dockerfile once, when the operator has a registry ----------
def test_the_making_table_covers_every_case_and_only_a_set_child_with_a_registry_builds_what_replays() -> None:
    assert set(DOCKERFILE_MAKING) == {(takes, r, c) for takes in Takes for r in (True, False) for c in (True, False)}
    made = {key: making.made for key, making in DOCKERFILE_MAKING.items()}
    assert [key for key, how in made.items() if key[0] is Takes.REPLAY and how == "built"] == [
        (Takes.REPLAY, True, True)
    ]
    # What only a build takes is built with a registry, refused without; what neither takes, always refused.
    assert {how for (takes, registry, _), how in made.items() if takes is Takes.BUILD} == {"built", None}
    assert all(how == ("built" if registry else None) for (t, registry, _), how in made.items() if t is Takes.BUILD)
    assert all(how is None for (takes, _, _), how in made.items() if takes is Takes.NEITHER)
    assert all(making.why for making in DOCKERFILE_MAKING.values())


REPLAYABLE = "FROM ubuntu:24.04\nRUN echo hi > /hi\nCOPY app.py /app/app.py\n"


@pytest.mark.parametrize(
    ("policy", "set_child", "made", "image"),
    [
        (BUILDS, True, "built", "registry.test:5000/builds:"),
        (BUILDS, False, "replayed", "mirror.test/ubuntu:24.04"),  # a standalone Episode replays as before
        (REPLAY_ONLY, True, "replayed", "mirror.test/ubuntu:24.04"),  # no registry: replay as today
        (REPLAY_ONLY, False, "replayed", "mirror.test/ubuntu:24.04"),
    ],
    ids=["set-child-with-registry", "standalone-with-registry", "set-child-no-registry", "standalone-no-registry"],
)
def test_a_replayable_dockerfile_is_built_once_for_a_set_child_of_an_operator_that_builds(
    policy: ImagePolicy, set_child: bool, made: str, image: str
) -> None:
    task = folder(environment__Dockerfile=REPLAYABLE, **{"environment/app.py": "print()\n"})
    planned = images(task, policy, set_child=set_child)
    assert isinstance(planned, ImagePlan)
    assert planned.agent.made == made and planned.agent.image.startswith(image), planned.agent
    assert (planned.agent.replay is None) == (made == "built") and (planned.agent.build is None) == (made != "built")
    assert len(planned.builds()) == (made == "built")
    assert planned.agent.why == DOCKERFILE_MAKING[Takes.REPLAY, policy.build_repository is not None, set_child].why


def test_a_set_childs_separate_verifier_made_from_the_agents_dockerfile_is_the_same_build() -> None:
    toml = '[verifier]\nenvironment_mode = "separate"\n'
    planned = images(
        folder(toml, environment__Dockerfile=REPLAYABLE, **{"environment/app.py": "x\n"}), BUILDS, set_child=True
    )
    assert isinstance(planned, ImagePlan)
    verifier = planned.verifier(0)
    assert verifier is not None and verifier.image == planned.agent.image and verifier.made == "built"
    assert len(planned.builds()) == 1  # one build, both pods from its digest


def test_admission_passes_set_child_through() -> None:
    task = folder(environment__Dockerfile=REPLAYABLE, **{"environment/app.py": "print()\n"})
    spec = EpisodeSpec.model_validate({"task": {"inline": {"files": task}}, "agent": {"kind": "oracle"}})
    child = admit_task(spec, TaskFiles.from_mapping(task), BUILDS, set_child=True)
    alone = admit_task(spec, TaskFiles.from_mapping(task), BUILDS)
    assert isinstance(child, Admission) and isinstance(alone, Admission)
    assert (child.images.agent.made, alone.images.agent.made) == ("built", "replayed")
    assert child.image.startswith("registry.test:5000/builds:")
