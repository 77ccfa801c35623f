"""Compose sidecars: what a pod can express is read, what it cannot is refused by service and key."""

from __future__ import annotations

import pytest

from episode_operator.runtime.sandbox_images import ImagePlan, ImagePolicy, plan_images
from episode_operator.taskfolder import TaskFiles, resolve_plan
from episode_operator.taskfolder.compose import parse_compose
from episode_operator.taskfolder.task_toml import EnvironmentConfig
from tests.unit.folders import check, plan_of, single_step

COMPOSE = "environment/docker-compose.yaml"


def parse(yaml_text: str, **files: str) -> tuple[list[dict[str, object]], list[str], list[str]]:
    tree = TaskFiles.from_mapping({COMPOSE: yaml_text, **{f"environment/{k}": v for k, v in files.items()}})
    spec, problems, warnings = parse_compose(tree, EnvironmentConfig(cpus=2, memory_mb=2048))
    return (
        [sidecar.model_dump(by_alias=True, exclude_defaults=True) for sidecar in spec.sidecars],
        [problem.render() for problem in problems],
        [warning.render() for warning in warnings],
    )


def test_full_sidecar() -> None:
    sidecars, problems, _ = parse(
        """
services:
  main:
    depends_on: [db]
    environment: {FROM_COMPOSE: "1"}
  db:
    image: postgres:16
    entrypoint: docker-entrypoint.sh
    command: ["postgres", "-c", "fsync=off"]
    environment:
      - POSTGRES_PASSWORD=secret
      - PORT=${CPUS}
    env_file: db.env
    ports: ["5432:5432", {target: 5433}]
    expose: [9187]
    user: "999:999"
    working_dir: /var/lib/postgresql
    volumes: ["pgdata:/var/lib/postgresql/data", "/scratch"]
    healthcheck:
      test: ["CMD", "pg_isready", "-U", "postgres"]
      interval: 1m30s
      timeout: 500ms
      retries: 4
      start_period: 10s
    deploy:
      resources:
        limits: {cpus: "1.5", memory: 1g}
        reservations: {cpus: 0.25, memory: 256M}
volumes:
  pgdata:
""",
        **{"db.env": "# comment\nexport LANG='C.UTF-8'\nTZ=UTC\n"},
    )
    assert problems == []
    assert sidecars == [
        {
            "name": "db",
            "image": "postgres:16",
            "command": ["docker-entrypoint.sh"],
            "args": ["postgres", "-c", "fsync=off"],
            "env": {"LANG": "C.UTF-8", "TZ": "UTC", "POSTGRES_PASSWORD": "secret", "PORT": "2"},
            "ports": [5432, 5433, 9187],
            "workingDir": "/var/lib/postgresql",
            "runAsUser": 999,
            "runAsGroup": 999,
            "probe": {
                "command": "pg_isready -U postgres",
                "intervalSec": 90.0,
                "timeoutSec": 0.5,
                "retries": 4,
                "startPeriodSec": 10.0,
            },
            "volumes": [
                {"name": "pgdata", "mountPath": "/var/lib/postgresql/data", "key": "services.db.volumes[0]"},
                {"name": "db-anonymous-1", "mountPath": "/scratch", "key": "services.db.volumes[1]"},
            ],
            "resources": {
                "limits": {"cpu": "1500m", "memory": "1024Mi"},
                "requests": {"cpu": "250m", "memory": "256Mi"},
            },
        }
    ]


def test_task_image_variable_and_escapes() -> None:
    sidecars, problems, warnings = parse(
        "services:\n  api:\n    image: ${MAIN_IMAGE_NAME}\n"
        "    command: sh -c 'echo $$HOME ${MISSING:-fallback} ${UNSET}'\n"
        "    cpus: 0.5\n    mem_limit: 64m\n"
    )
    assert problems == []
    assert sidecars[0]["image"] is None  # the task's own image
    assert sidecars[0]["args"] == ["sh", "-c", "echo $HOME fallback "]
    assert sidecars[0]["resources"] == {"limits": {"cpu": "500m", "memory": "64Mi"}}
    assert any("${UNSET} is not set here" in warning for warning in warnings)


@pytest.mark.parametrize(
    ("service", "key", "fragment"),
    [
        ("build: .", "services.web.build.dockerfile", "environment/Dockerfile is not in the task folder"),
        ("build: ../../x", "services.web.build.context", "'../../x' leaves the task folder"),
        ("build: missing", "services.web.build.context", "environment/missing/ is not a folder of the task"),
        ("build: https://github.com/x/y.git", "services.web.build.context", "a remote context needs the network"),
        ("build: {context: ., dockerfile_inline: 'FROM x'}", "services.web.build.dockerfile_inline", "to a file"),
        ("command: x", "services.web.image", "a sidecar needs an `image` or a `build`"),
        ("image: x\n    network_mode: host", "services.web.network_mode", "share one network namespace"),
        ("image: x\n    privileged: true", "services.web.privileged", "without privilege"),
        (
            "image: x\n    volumes: ['/host:/data:ro']",
            "services.web.volumes[0]",
            "'/host' is a path of Harbor's host; a pod can bind only files of the task's environment/",
        ),
        ("image: x\n    user: postgres", "services.web.user", "must be numeric"),
        ("image: x\n    deploy: {replicas: 3}", "services.web.deploy.replicas", "exactly one container"),
        (
            'image: x\n    healthcheck: {test: [CMD, "true"], interval: soon}',
            "services.web.healthcheck.interval",
            "cannot read the duration",
        ),
        (
            "image: x\n    deploy: {resources: {limits: {memory: lots}}}",
            "services.web.deploy.resources.limits.memory",
            "cannot read the size",
        ),
        ("image: ${REGISTRY:?set it}/x", "services.web.image", "${REGISTRY} is required"),
        ("image: x\n    env_file: missing.env", "services.web.env_file", "not in the task folder"),
    ],
)
def test_what_a_pod_cannot_express_is_refused(service: str, key: str, fragment: str) -> None:
    _, problems, _ = parse(f"services:\n  web:\n    {service}\n")
    assert any(line.startswith(f"{COMPOSE}: {key}:") and fragment in line for line in problems), problems


def test_service_names_must_be_pod_hostnames() -> None:
    _, problems, _ = parse("services:\n  my_db:\n    image: x\n")
    assert problems == [
        f"{COMPOSE}: services.my_db: service name 'my_db' cannot be a pod host and container name "
        "(lowercase letters, digits and '-', at most 63 characters)"
    ]


def test_ignored_keys_and_profiles_warn() -> None:
    sidecars, problems, warnings = parse(
        "services:\n  web:\n    image: x\n    restart: always\n  debug:\n    image: y\n    profiles: [debug]\n"
        "  main:\n    image: ignored\n"
    )
    assert problems == [] and [s["name"] for s in sidecars] == ["web"]
    assert f"{COMPOSE}: services.web.restart: ignored in a pod" in warnings
    assert any("services.debug.profiles" in w for w in warnings)
    assert any("services.main.image" in w for w in warnings)


def test_broken_yaml_is_refused_with_the_file_named() -> None:
    result = check(single_step(files={COMPOSE: "services: [unclosed"}))
    assert any(p.file == COMPOSE and "YAML syntax error" in p.message for p in result.problems)


def test_sidecars_and_services_reach_the_plan() -> None:
    folder = single_step(
        'artifacts = [{ source = "/srv/x", service = "api" }]\n',
        {COMPOSE: "services:\n  main:\n    environment: [A=compose, B=compose]\n  api:\n    image: x\n"},
    )
    folder["task.toml"] += 'env = { B = "toml" }\n'
    plan = plan_of(folder)
    assert [sidecar.name for sidecar in plan.sidecars] == ["api"]
    assert plan.main_env == {"A": "compose", "B": "toml"}
    assert [a.service for a in plan.turns[0].artifacts] == ["main", "api"]


def test_older_compose_file_names_are_read_and_extra_ones_warned() -> None:
    result = check(
        single_step(
            files={
                "environment/compose.yml": "services:\n  api:\n    image: x\n",
                "environment/compose.yaml": "services: {}\n",
            }
        )
    )
    assert result.valid and result.task is not None
    assert result.task.compose.file == "environment/compose.yaml"
    assert any(w.file == "environment/compose.yml" for w in result.warnings)


def test_a_built_sidecar_keeps_its_context_and_is_not_the_task_image() -> None:
    """The issue's case: `build: ./api-server` was refused, then `depends_on` said "unknown service 'api'"."""
    sidecars, problems, _ = parse(
        "services:\n  main:\n    depends_on: [api]\n  api:\n    build: ./api-server\n"
        "  tool:\n    build:\n      context: tools\n      dockerfile: Dockerfile.tool\n"
        "      args: [VERSION=2]\n      target: runtime\n",
        **{"api-server/Dockerfile": "FROM python:3.12\n", "tools/Dockerfile.tool": "FROM x AS runtime\n"},
    )
    assert problems == []
    assert [(s["name"], s.get("image"), s["build"]) for s in sidecars] == [
        ("api", None, {"context": "environment/api-server", "dockerfile": "environment/api-server/Dockerfile"}),
        (
            "tool",
            None,
            {
                "context": "environment/tools",
                "dockerfile": "environment/tools/Dockerfile.tool",
                "args": {"VERSION": "2"},
                "target": "runtime",
            },
        ),
    ]


def test_a_built_sidecar_is_built_in_the_cluster_or_refused_naming_its_dockerfile() -> None:
    files = {
        "environment/docker-compose.yaml": "services:\n  api:\n    build: ./api-server\n",
        "environment/api-server/Dockerfile": "FROM python:3.12\n",
    }
    task = check(single_step(files=files)).task
    assert task is not None
    plan = resolve_plan(task)
    refused = plan_images(task, plan, image_override="x", policy=ImagePolicy())
    assert isinstance(refused, list)
    assert [problem.render() for problem in refused] == [
        "environment/api-server/Dockerfile: service 'api' is built from this Dockerfile, and this operator builds no "
        "images: give it an image, or run the operator with --build-registry"
    ]
    built = plan_images(task, plan, image_override="x", policy=ImagePolicy(build_repository="registry:5000/builds"))
    assert isinstance(built, ImagePlan)
    api = built.sidecars["api"]
    assert api.build is not None and api.build.source.context == "environment/api-server"
    assert api.image.startswith("registry:5000/builds:") and api.replay is None
    assert [build.role for build in built.builds()] == ["sidecar:api"]
