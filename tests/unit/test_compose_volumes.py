"""Compose volumes, ``main``'s as every sidecar's: read as Compose reads them, refused naming the key
when a pod cannot honour them, and mounted as Docker mounts them (docs/harbor-layout.md).

The pod's side runs for real: :class:`MiniKubelet` gives each container of a manifest its image as
``/`` (a Debian-like one, or busybox's applets only) and its ``volumeMounts`` as bind mounts of the
pod's volumes in a bubblewrap namespace, runs the volume filler's own command, then looks from
``main`` and from a sidecar.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Literal

import pytest

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.kube.objects.pods import (
    COPIER,
    COPIER_BUSYBOX,
    COPIER_ROOT,
    ENVIRONMENT_ARCHIVE_KEY,
    VOLUME_FILLER,
    AgentImages,
    OwnerRef,
    SandboxPod,
    environment_files_config_map,
    sandbox_pod,
)
from episode_operator.kube.pod_sandbox import KubeProvider
from episode_operator.runtime.admission import NO_COPIER, Admission, Refusal, admit_task
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.compose import BOUND_ARCHIVE_LIMIT, binds_of, bound_archive, parse_compose
from episode_operator.taskfolder.plan import EpisodePlan
from episode_operator.taskfolder.task_toml import EnvironmentConfig
from tests.unit.folders import check, plan_of, single_step
from tests.unit.local_sandbox import MERGED_USR
from tests.unit.test_pod_identity import Pods
from tests.unit.tools import tool

COMPOSE = "environment/docker-compose.yaml"
EPISODE = OwnerRef("vols", "evals", "uid-v")
SPEC = EpisodeSpec.model_validate({"task": {"inline": {"files": {}}}, "agent": {"kind": "oracle"}})
FILES = {
    "environment/data/a.txt": "a\n",
    "environment/data/sub/run.sh": "#!/bin/sh\n",
    "environment/conf/app.ini": "x=1\n",
}
IMAGE_UID = 1234  # the owner of the image's own files under a mount path


def parse(main_volumes: str, top: str = "volumes: {cache: {}, evidence: {}}\n") -> tuple[Any, list[str], list[str]]:
    text = f"services:\n  main:\n    volumes: {main_volumes}\n{top}"
    spec, problems, warnings = parse_compose(TaskFiles.from_mapping({COMPOSE: text, **FILES}), EnvironmentConfig())
    return spec, [problem.render() for problem in problems], [warning.render() for warning in warnings]


def volume(name: str, path: str, **extra: object) -> dict[str, object]:
    return {"name": name, "mountPath": path, "key": "services.main.volumes[0]", **extra}


def bind(name: str, path: str, **extra: object) -> dict[str, object]:
    return volume(name, path, kind="bind", copyImageContent=False, **extra)


# --- reading ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("evidence:/startup", volume("evidence", "/startup")),
        ("/scratch", volume("main-anonymous-0", "/scratch")),
        ("cache:/cache/", volume("cache", "/cache")),
        ("cache:/cache:ro", volume("cache", "/cache", readOnly=True)),
        ("cache:/cache:nocopy", volume("cache", "/cache", copyImageContent=False)),
        ("'cache:/cache:rw,z'", volume("cache", "/cache")),
        ("{type: volume, target: /anon}", volume("main-anonymous-0", "/anon")),
        (
            "{type: volume, source: cache, target: /c, read_only: true, volume: {nocopy: true}}",
            volume("cache", "/c", readOnly=True, copyImageContent=False),
        ),
        ("./data:/data", bind("environment/data", "/data")),
        ("./conf/app.ini:/etc/app.ini:ro", bind("environment/conf/app.ini", "/etc/app.ini", readOnly=True)),
        (".:/env", bind("environment", "/env")),
        ("../environment/data:/d", bind("environment/data", "/d")),
        ("./missing:/m", bind("environment/missing", "/m")),  # the short syntax makes a missing folder
        (
            "{type: bind, source: ./data, target: /data, read_only: true}",
            bind("environment/data", "/data", readOnly=True),
        ),
        (
            "{type: bind, source: ./missing, target: /m, bind: {create_host_path: true}}",
            bind("environment/missing", "/m"),
        ),
    ],
)
def test_mains_volumes_are_read_as_compose_reads_them(entry: str, expected: dict[str, object]) -> None:
    spec, problems, _ = parse(f"[{entry}]")
    assert problems == []
    assert [v.model_dump(by_alias=True, exclude_defaults=True) for v in spec.main_volumes] == [expected]


@pytest.mark.parametrize(
    ("entries", "top", "key", "fragment"),
    [
        ("['/etc:/etc']", "", "services.main.volumes[0]", "'/etc' is a path of Harbor's host"),
        ("['~/cache:/cache']", "", "services.main.volumes[0]", "is a path of Harbor's host"),
        ("['../tests:/grading']", "", "services.main.volumes[0]", "'../tests' leaves environment/"),
        ("['../solution:/s']", "", "services.main.volumes[0]", "leaves environment/, the folder compose runs in"),
        (
            "[{type: bind, source: ./missing, target: /m}]",
            "",
            "services.main.volumes[0]",
            "environment/missing is not in the task folder (Compose refuses a missing bind source)",
        ),
        ("[{type: tmpfs, target: /t}]", "", "services.main.volumes[0]", "cannot mount a 'tmpfs' volume"),
        (
            "[{type: volume, source: v, target: /v, volume: {subpath: x}}]",
            "",
            "services.main.volumes[0].volume.subpath",
            "not supported",
        ),
        ("['cache:relative']", "", "services.main.volumes[0]", "the target must be an absolute path below /"),
        ("['cache:/']", "", "services.main.volumes[0]", "the target must be an absolute path below /"),
        ("['a:/b:ro:d']", "", "services.main.volumes[0]", "cannot read 'a:/b:ro:d'"),
        ("['cache:/x:rx']", "", "services.main.volumes[0]", "unknown volume mode 'rx'"),
        ("[42]", "", "services.main.volumes[0]", "must be a string or a mapping"),
        ("['cache:/x', './data:/x/']", "", "services.main.volumes[1]", "/x is mounted twice in main"),
        ("[]", "volumes: {v: {external: true}}\n", "volumes.v.external", "lives outside the task"),
        ("[]", "volumes: {v: {driver: nfs}}\n", "volumes.v.driver", "not a driver's"),
        ("[]", "volumes: {v: {driver_opts: {type: none, device: /x}}}\n", "volumes.v.driver_opts", "emptyDirs"),
        ("[]", "volumes: [v]\n", "volumes", "must be a mapping"),
    ],
)
def test_what_a_pod_cannot_honour_is_refused_naming_the_key(entries: str, top: str, key: str, fragment: str) -> None:
    _, problems, _ = parse(entries, top)
    assert any(line.startswith(f"{COMPOSE}: {key}:") and fragment in line for line in problems), problems


def test_what_means_nothing_in_a_pod_is_warned() -> None:
    spec, problems, warnings = parse(
        "[v:/v, 'cache:/c:ro,z', {type: bind, source: ./data, target: /d, bind: {propagation: rshared}}]",
        "volumes: {cache: {name: shared-cache, labels: {a: b}}}\n",
    )
    assert problems == [] and len(spec.main_volumes) == 3
    assert warnings == [
        f"{COMPOSE}: volumes.cache.labels: ignored: the volume is the pod's own",
        f"{COMPOSE}: volumes.cache.name: ignored: the volume is the pod's own",
        f"{COMPOSE}: services.main.volumes[0]: volume 'v' is not declared under the top-level `volumes:` "
        "(Compose refuses this)",
        f"{COMPOSE}: services.main.volumes[1]: mode 'z' ignored in a pod",
        f"{COMPOSE}: services.main.volumes[2].bind.propagation: ignored in a pod",
    ]


def test_mains_volumes_reach_the_plan_and_are_no_longer_ignored() -> None:
    folder = single_step(files={COMPOSE: "services:\n  main:\n    volumes: ['./data:/data']\n", **FILES})
    result = check(folder)
    assert result.valid, result.problems
    assert not any("services.main.volumes" in warning.render() for warning in result.warnings)
    assert [(v.name, v.mount_path, v.kind) for v in plan_of(folder).main_volumes] == [
        ("environment/data", "/data", "bind")
    ]


def test_binds_past_what_a_pod_can_be_given_are_refused() -> None:
    text = "services:\n  main:\n    volumes: ['./big.bin:/big']\n  web:\n    image: x\n    volumes: ['./data:/d']\n"
    files = TaskFiles.from_mapping({COMPOSE: text, **FILES, "environment/big.bin": "x" * BOUND_ARCHIVE_LIMIT})
    spec, problems, _ = parse_compose(files, EnvironmentConfig())
    size = len(bound_archive(files, spec.binds))
    assert size > BOUND_ARCHIVE_LIMIT
    assert [problem.render() for problem in problems] == [
        f"{COMPOSE}: services.main.volumes[0]: the files the binds (services.main.volumes[0], "
        f"services.web.volumes[0]) carry into the pod take {size} bytes packed, above the {BOUND_ARCHIVE_LIMIT} "
        "a pod can be given (bind less, or COPY them in a Dockerfile)"
    ]


def test_the_bound_files_are_those_the_binds_name_as_a_checkout_shows_them(tmp_path: Path) -> None:
    for path, content in {**FILES, "environment/Dockerfile": "FROM x\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    (tmp_path / "environment/data/sub/run.sh").chmod(0o755)
    (tmp_path / COMPOSE).write_text(
        "services:\n  main:\n    volumes: ['./data/sub:/s', './conf/app.ini:/a', './new:/n']\n"
        "  web:\n    image: x\n    volumes: ['./data:/d']\n"
    )
    files = TaskFiles.from_directory(tmp_path)
    spec, problems, _ = parse_compose(files, EnvironmentConfig())
    assert problems == []
    with tarfile.open(fileobj=io.BytesIO(bound_archive(files, spec.binds))) as archive:
        members = [(m.name, m.type, stat.S_IMODE(m.mode), m.uid, m.mtime) for m in archive]
    assert members == [
        ("conf", tarfile.DIRTYPE, 0o755, 0, 0),
        ("conf/app.ini", tarfile.REGTYPE, 0o644, 0, 0),
        ("data", tarfile.DIRTYPE, 0o755, 0, 0),
        ("data/a.txt", tarfile.REGTYPE, 0o644, 0, 0),
        ("data/sub", tarfile.DIRTYPE, 0o755, 0, 0),
        ("data/sub/run.sh", tarfile.REGTYPE, 0o755, 0, 0),
        ("new", tarfile.DIRTYPE, 0o755, 0, 0),
    ]
    assert bound_archive(files, spec.binds) == bound_archive(files, list(reversed(spec.binds)))


# --- what the operator keeps for itself --------------------------------------------------------------
def admit(compose: str) -> Admission | Refusal:
    folder = single_step(files={COMPOSE: compose, **FILES})
    return admit_task(SPEC, TaskFiles.from_mapping(folder))


@pytest.mark.parametrize(
    ("service", "entry", "reserved"),
    [
        ("main", "v:/tests", "/tests"),
        ("main", "./data:/tests/data", "/tests"),
        ("main", "v:/logs", "/logs/verifier"),
        ("main", "v:/logs/verifier", "/logs/verifier"),
        ("main", "v:/episode-operator/jobs", "/episode-operator"),
        ("main", "v:/opt/episode-operator", "/opt/episode-operator/toolchains"),
        ("web", "v:/episode-operator", "/episode-operator"),
    ],
)
def test_a_volume_over_the_operators_own_folders_is_refused_at_seed(service: str, entry: str, reserved: str) -> None:
    image = "" if service == "main" else "    image: x\n"
    refused = admit(f"services:\n  {service}:\n{image}    volumes: ['{entry}']\nvolumes: {{v: {{}}}}\n")
    assert isinstance(refused, Refusal) and refused.failure_kind == "harbor:seed_refused", refused
    assert f"{COMPOSE}: services.{service}.volumes[0]: cannot mount over {reserved}: " in refused.message


def test_volumes_elsewhere_are_admitted_a_sidecars_tests_being_its_own() -> None:
    admitted = admit(
        "services:\n  main:\n    volumes: ['v:/logs/agent', './data:/logs/artifacts/data']\n"
        "  web:\n    image: x\n    volumes: ['v:/tests']\nvolumes: {v: {}}\n"
    )
    assert isinstance(admitted, Admission), admitted


# --- the pod ---------------------------------------------------------------------------------------
SHARED = (
    "services:\n"
    "  main:\n"
    "    volumes:\n"
    "      - evidence:/startup\n"
    "      - fresh:/nothing-here\n"
    "      - cache:/opt/data:nocopy\n"
    "      - /logs/artifacts\n"
    "      - ./data:/data:ro\n"
    "      - ./conf/app.ini:/srv/app.ini\n"
    "      - evidence:/startup-again\n"
    "  reader:\n"
    "    image: x\n"
    "    volumes: ['evidence:/seen:ro', './data:/d', 'cache:/cache']\n"
    "volumes: {evidence: {}, fresh: {}, cache: {}}\n"
)


def shared_plan() -> tuple[EpisodePlan, TaskFiles]:
    folder = single_step(files={COMPOSE: SHARED, **FILES})
    return plan_of(folder), TaskFiles.from_mapping(folder)


def agent_pod(plan: EpisodePlan, files: TaskFiles) -> tuple[dict[str, Any], dict[str, Any]]:
    config_map = environment_files_config_map(EPISODE, bound_archive(files, binds_of(plan.main_volumes, plan.sidecars)))
    pod = SandboxPod(
        "agent",
        1,
        "task:1",
        plan.environment,
        sidecars=plan.sidecars,
        volumes=plan.main_volumes,
        environment_files=config_map["metadata"]["name"],
    )
    return sandbox_pod(EPISODE, SPEC, pod, extra_labels={}), config_map


def test_main_mounts_its_volumes_and_shares_them_by_name_with_the_sidecars() -> None:
    manifest, config_map = agent_pod(*shared_plan())
    spec = manifest["spec"]
    main, reader = spec["containers"]
    assert main["volumeMounts"][1:] == [
        {"name": "compose-evidence", "mountPath": "/startup", "readOnly": False},
        {"name": "compose-fresh", "mountPath": "/nothing-here", "readOnly": False},
        {"name": "compose-cache", "mountPath": "/opt/data", "readOnly": False},
        {"name": "compose-main-anonymous-3", "mountPath": "/logs/artifacts", "readOnly": False},
        {"name": "episode-operator-binds", "mountPath": "/data", "readOnly": True, "subPath": "data"},
        {"name": "episode-operator-binds", "mountPath": "/srv/app.ini", "readOnly": False, "subPath": "conf/app.ini"},
        {"name": "compose-evidence", "mountPath": "/startup-again", "readOnly": False},
    ]
    assert reader["volumeMounts"][1:] == [
        {"name": "compose-evidence", "mountPath": "/seen", "readOnly": True},
        {"name": "episode-operator-binds", "mountPath": "/d", "readOnly": False, "subPath": "data"},
        {"name": "compose-cache", "mountPath": "/cache", "readOnly": False},
    ]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    for name in (
        "compose-evidence",
        "compose-fresh",
        "compose-cache",
        "compose-main-anonymous-3",
        "episode-operator-binds",
    ):
        assert volumes[name] == {"name": name, "emptyDir": {}}
    assert volumes["episode-operator-binds-files"] == {
        "name": "episode-operator-binds-files",
        "configMap": {"name": config_map["metadata"]["name"]},
    }
    (filler,) = spec["initContainers"]
    assert (filler["name"], filler["image"], filler["securityContext"]["runAsUser"]) == (VOLUME_FILLER, "task:1", 0)
    assert filler["command"][4:] == [
        "/episode-operator-init/input/environment.tar",
        "/episode-operator-init/environment",
        *("/startup", "/episode-operator-init/volumes/compose-evidence", "new-copy", "-"),
        *("/nothing-here", "/episode-operator-init/volumes/compose-fresh", "new-copy", "-"),
        *("/opt/data", "/episode-operator-init/volumes/compose-cache", "new", "-"),
        *("/logs/artifacts", "/episode-operator-init/volumes/compose-main-anonymous-3", "new-copy", "0777"),
        *("/data", "/episode-operator-init/environment/data", "keep", "-"),
        *("/srv/app.ini", "/episode-operator-init/environment/conf/app.ini", "keep", "-"),
        # The same volume again: Docker copies into it only while it is still empty.
        *("/startup-again", "/episode-operator-init/volumes/compose-evidence", "copy", "-"),
    ]


def test_no_compose_name_takes_a_volume_of_the_operators() -> None:
    compose = (
        "services:\n  main:\n    volumes: ['episode-operator-binds:/a', 'environment:/b', './data:/c']\n"
        "volumes: {episode-operator-binds: {}, environment: {}}\n"
    )
    folder = single_step(files={COMPOSE: compose, **FILES})
    plan = plan_of(folder)
    pod = SandboxPod("agent", 1, "task:1", plan.environment, volumes=plan.main_volumes, environment_files="env")
    names = [volume["name"] for volume in sandbox_pod(EPISODE, SPEC, pod, extra_labels={})["spec"]["volumes"]]
    assert len(names) == len(set(names)), names


def test_without_compose_volumes_the_pod_is_as_it_was_and_a_sidecars_bind_is_filled_by_mains_filler() -> None:
    folder = single_step(files={COMPOSE: "services:\n  web:\n    image: x\n    expose: [80]\n"})
    plan = plan_of(folder)
    pod = sandbox_pod(
        EPISODE, SPEC, SandboxPod("agent", 1, "task:1", plan.environment, sidecars=plan.sidecars), extra_labels={}
    )
    assert "initContainers" not in pod["spec"]
    assert [volume["name"] for volume in pod["spec"]["volumes"]] == ["episode-operator", "supervisor-web"]
    # A sidecar's bind is filled as main's are: the filler runs for it alone.
    folder = single_step(files={COMPOSE: "services:\n  web:\n    image: x\n    volumes: ['./data:/d']\n", **FILES})
    plan = plan_of(folder)
    bare = SandboxPod("agent", 1, "task:1", plan.environment, sidecars=plan.sidecars)
    with pytest.raises(ValueError, match="ConfigMap of their files"):
        sandbox_pod(EPISODE, SPEC, bare, extra_labels={})
    pod = sandbox_pod(EPISODE, SPEC, dataclasses.replace(bare, environment_files="env"), extra_labels={})
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [VOLUME_FILLER]


def test_the_bound_files_config_map_is_the_episodes_and_named_by_its_content() -> None:
    plan, files = shared_plan()
    archive = bound_archive(files, binds_of(plan.main_volumes, plan.sidecars))
    config_map = environment_files_config_map(EPISODE, archive)
    assert config_map["metadata"]["name"].startswith("vols-env-")
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == "uid-v"
    assert base64.b64decode(config_map["binaryData"][ENVIRONMENT_ARCHIVE_KEY]) == archive
    assert environment_files_config_map(EPISODE, archive + b"\0")["metadata"]["name"] != config_map["metadata"]["name"]
    with pytest.raises(ValueError):
        environment_files_config_map(EPISODE, b"\0" * (BOUND_ARCHIVE_LIMIT + 1))


class ConfigMapPods(Pods):
    """The API server's pods, and the ConfigMaps made before them."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[str] = []

    async def apply_config_map(self, manifest: dict[str, Any]) -> None:
        self.made.append(f"configmap {manifest['metadata']['name']}")

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        self.made.append(f"pod {manifest['metadata']['name']}")
        return self.make(manifest)


def test_the_provider_makes_the_config_map_before_each_pod_that_runs_the_compose_file() -> None:
    """The agent pod, and a separate verifier's pod when Harbor's verifier environment is environment/:
    its compose file runs there too (the same services and volumes, new ones in the new pod, main's
    environment from it under the verifier's own). A verifier with an image of its own gets none."""
    plan, files = shared_plan()
    separate = plan.turns[0].verifier.model_copy(
        update={"mode": "separate", "environment": plan.environment.model_copy(update={"env": {"V": "mine"}})}
    )
    in_environment = separate.model_copy(update={"compose": True})
    plan = plan.model_copy(
        update={
            "turns": [plan.turns[0].model_copy(update={"verifier": in_environment})] * 2,
            "compose_env": {"FROM_COMPOSE": "1", "V": "compose's"},
        }
    )
    archive = bound_archive(files, binds_of(plan.main_volumes, plan.sidecars))
    pods = ConfigMapPods()
    provider = KubeProvider(pods, EPISODE, SPEC, plan, "task:1", {}, bound_files=archive)  # type: ignore[arg-type]
    asyncio.run(provider.agent(1))
    asyncio.run(provider.verifier(1, 1, in_environment))
    asyncio.run(provider.verifier(1, 0, separate))
    name = environment_files_config_map(EPISODE, archive)["metadata"]["name"]
    assert pods.made == [f"configmap {name}", "pod vols-a1", f"configmap {name}", "pod vols-a1-v2", "pod vols-a1-v1"]
    agent, beside, alone = (pods.pods[pod]["spec"] for pod in ("vols-a1", "vols-a1-v2", "vols-a1-v1"))
    assert [c["name"] for c in beside["containers"]] == ["main", "reader"]
    assert beside["containers"][1:] == agent["containers"][1:]  # the same sidecars, from their images
    assert beside["containers"][0]["volumeMounts"] == agent["containers"][0]["volumeMounts"]
    assert beside["containers"][0]["env"] == [{"name": "FROM_COMPOSE", "value": "1"}, {"name": "V", "value": "mine"}]
    assert beside["hostAliases"] == agent["hostAliases"]
    # Its volumes are its own pod's emptyDirs, and the Episode's ConfigMap of the task's files: nothing of
    # the agent's pod (where the agent wrote) reaches it.
    assert all("emptyDir" in v or v.get("configMap") == {"name": name} for v in beside["volumes"])
    (filler,) = beside["initContainers"]
    # Harbor's ensure_dirs in a verifier environment makes /logs/verifier alone 0777: /logs/artifacts is left.
    assert filler["command"][4:][filler["command"][4:].index("/logs/artifacts") + 3] == "-"
    assert [c["name"] for c in alone["containers"]] == ["main"]
    assert [m["mountPath"] for m in alone["containers"][0]["volumeMounts"]] == ["/episode-operator"]
    assert "initContainers" not in alone and "hostAliases" not in alone


def test_pinned_images_replace_the_built_tags_in_every_pod_the_provider_makes() -> None:
    """Seed once: after the builds, the agent pod, a separate verifier's pod and a built sidecar name each
    built image by its manifest digest (pin_images), never by the tag anyone who reaches the registry moves."""
    plan, files = shared_plan()
    built = "registry.test/builds:abc"
    sidecars = [plan.sidecars[0].model_copy(update={"image": built}), *plan.sidecars[1:]]
    verifier = plan.turns[0].verifier.model_copy(
        update={"mode": "separate", "environment": plan.environment, "compose": True, "image": built}
    )
    plan = plan.model_copy(
        update={"sidecars": sidecars, "turns": [plan.turns[0].model_copy(update={"verifier": verifier})]}
    )
    archive = bound_archive(files, binds_of(plan.main_volumes, plan.sidecars))
    pods = ConfigMapPods()
    provider = KubeProvider(pods, EPISODE, SPEC, plan, built, {}, bound_files=archive)  # type: ignore[arg-type]
    digest = "registry.test/builds@sha256:" + "d" * 64
    provider.pin_images({built: digest})
    asyncio.run(provider.agent(1))
    asyncio.run(provider.verifier(1, 0, verifier))
    for pod in ("vols-a1", "vols-a1-v1"):
        images = [container["image"] for container in pods.pods[pod]["spec"]["containers"]]
        assert images[0] == digest and images[1] == digest and built not in images, (pod, images)


# --- the pod, run --------------------------------------------------------------------------------------
Flavour = Literal["debian", "busybox"]


class MiniKubelet:
    """The containers of one pod manifest, each a bubblewrap namespace: its image (a folder, copied
    for each container as a runtime gives each its own root) as ``/``, its ``volumeMounts`` as
    binds of the pod's volumes (an ``emptyDir`` a fresh 0777 folder, a ConfigMap its keys' files).
    The image is a Debian one (the host's /usr and /etc) or busybox's applets alone; a bare image has
    only the files a test puts in it (no shell, no libc)."""

    def __init__(self, root: Path, manifest: dict[str, Any], config_maps: dict[str, dict[str, Any]], flavour: Flavour):
        self.root, self.manifest, self.flavour = root, manifest, flavour
        self.bwrap = tool("bwrap")
        self.bare: set[Path] = set()
        for spec in manifest["spec"]["volumes"]:
            folder = root / "volumes" / spec["name"]
            folder.mkdir(parents=True)
            if "emptyDir" in spec:
                folder.chmod(0o777)
            for key, value in (
                (config_maps.get((spec.get("configMap") or {}).get("name", "")) or {}).get("binaryData", {}).items()
            ):
                (folder / key).write_bytes(base64.b64decode(value))

    def image(self, name: str, *, bare: bool = False) -> Path:
        """A new image folder: what the flavour needs to run ``sh`` (nothing when ``bare``); a test adds its files."""
        image = self.root / "images" / name
        image.mkdir(parents=True)
        if bare:
            self.bare.add(image)
        elif self.flavour == "debian":
            for link in MERGED_USR:
                (image / link).symlink_to(f"usr/{link}")
        else:
            (image / "bin").mkdir()
            busybox = shutil.copy(tool("busybox"), image / "bin" / "busybox")
            applets = subprocess.run([busybox, "--list"], capture_output=True, check=True, text=True).stdout.split()
            for applet in applets:
                (image / "bin" / applet).symlink_to("busybox")
            for link in ("lib", "lib64"):
                (image / link).symlink_to(f"usr/{link}")
        return image

    def run(self, container: str, image: Path, command: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        spec = self.manifest["spec"]
        found = next(c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == container)
        rootfs = self.root / "rootfs" / container
        if not rootfs.exists():
            rootfs.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", str(image), str(rootfs)], check=True)
        system = (
            []
            if image in self.bare
            else ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
            if self.flavour == "debian"
            else ["--ro-bind", "/usr/lib", "/usr/lib", "--ro-bind", "/usr/lib64", "/usr/lib64"]
        )
        path = "/usr/sbin:/usr/bin:/sbin:/bin" if self.flavour == "debian" else "/bin"
        env = [arg for entry in found.get("env", []) for arg in ("--setenv", entry["name"], entry["value"])]
        mounts: list[str] = []
        for mount in found.get("volumeMounts", []):
            source = self.root / "volumes" / mount["name"] / mount.get("subPath", "")
            mounts += ["--ro-bind" if mount.get("readOnly") else "--bind", str(source), mount["mountPath"]]
        argv = [
            self.bwrap,
            *("--bind", str(rootfs), "/"),
            *system,
            *("--proc", "/proc", "--dev", "/dev", "--cap-add", "ALL", "--clearenv", "--setenv", "PATH", path, *env),
            *mounts,
            "--",
            *(command or found["command"]),
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flavour", ["debian", "busybox"])
def test_the_filler_fills_mains_volumes_as_docker_fills_new_ones_and_the_services_share_them(
    tmp_path: Path, flavour: Flavour
) -> None:
    plan, files = shared_plan()
    manifest, config_map = agent_pod(plan, files)
    kubelet = MiniKubelet(tmp_path, manifest, {config_map["metadata"]["name"]: config_map}, flavour)
    task = kubelet.image("task")
    # The image's own files under main's mount paths: Docker copies /startup's into the new volume,
    # owners and modes with it (the folder's too); `nocopy` leaves /opt/data's out.
    (task / "startup" / "deep").mkdir(parents=True)
    (task / "startup" / "seed.txt").write_text("from the image\n")
    (task / "startup" / "seed.txt").chmod(0o640)
    (task / "startup" / "link").symlink_to("seed.txt")
    for path in (task / "startup", task / "startup" / "seed.txt", task / "startup" / "deep"):
        os.lchown(path, IMAGE_UID, IMAGE_UID)
    (task / "startup").chmod(0o750)
    (task / "opt" / "data").mkdir(parents=True)
    (task / "opt" / "data" / "left-out").write_text("x")

    filled = kubelet.run(VOLUME_FILLER, task)
    assert filled.returncode == 0, filled.stderr

    look = (
        "stat -c '%u %g %a %n' /startup /startup/seed.txt /startup/deep /startup-again /nothing-here /opt/data "
        "/logs/artifacts /data /data/sub/run.sh /srv/app.ini; readlink /startup/link; cat /startup/seed.txt; "
        'echo "$(ls -A /opt/data)|$(ls -A /nothing-here)"; echo written > /startup/by-main.txt'
    )
    seen = kubelet.run("main", task, ["sh", "-c", look])
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.splitlines() == [
        f"{IMAGE_UID} {IMAGE_UID} 750 /startup",
        f"{IMAGE_UID} {IMAGE_UID} 640 /startup/seed.txt",
        f"{IMAGE_UID} {IMAGE_UID} 755 /startup/deep",
        f"{IMAGE_UID} {IMAGE_UID} 750 /startup-again",  # the same volume: filled once, by the first mount
        "0 0 755 /nothing-here",  # nothing in the image there: a new volume, root's
        "0 0 755 /opt/data",  # nocopy
        "0 0 777 /logs/artifacts",  # a layout folder: Harbor's ensure_dirs makes it 0777
        "0 0 755 /data",
        "0 0 644 /data/sub/run.sh",
        "0 0 644 /srv/app.ini",
        "seed.txt",
        "from the image",
        "|",
    ]
    reader = kubelet.image("reader")
    shared = kubelet.run(
        "reader",
        reader,
        [
            "sh",
            "-c",
            "cat /seen/by-main.txt /seen/seed.txt; (echo x > /seen/no) 2>/dev/null || echo read-only; "
            "echo from-reader > /d/new.txt; echo x > /cache/c",
        ],
    )
    assert (shared.returncode, shared.stdout) == (0, "written\nfrom the image\nread-only\n"), shared.stderr
    back = kubelet.run(
        "main", task, ["sh", "-c", "cat /data/new.txt /opt/data/c; (echo x > /data/no) 2>/dev/null || echo read-only"]
    )
    assert back.stdout == "from-reader\nx\nread-only\n", back.stderr


# --- a volume only sidecars mount ----------------------------------------------------------------------
SIDECARS_ONLY = (
    "services:\n"
    "  main:\n"
    "    volumes: ['shared:/shared']\n"
    "  seeder:\n"
    "    image: seed:1\n"
    "    volumes: ['seed:/srv/seed', 'quiet:/srv/quiet:nocopy', 'shared:/shared']\n"
    "  reader:\n"
    "    image: read:1\n"
    "    volumes: ['seed:/seen:ro', 'quiet:/srv/quiet', 'late:/late']\n"
    "volumes: {seed: {}, quiet: {}, shared: {}, late: {}}\n"
)
SEEDER_FILLER, READER_FILLER = f"{VOLUME_FILLER}-seeder", f"{VOLUME_FILLER}-reader"


def seen(name: str) -> str:
    """Where a filler sees the volume ``name``."""
    return f"/episode-operator-init/volumes/compose-{name}"


def sidecars_only_pod(images: AgentImages | None) -> dict[str, Any]:
    plan = plan_of(single_step(files={COMPOSE: SIDECARS_ONLY}))
    pod = SandboxPod("agent", 1, "task:1", plan.environment, sidecars=plan.sidecars, volumes=plan.main_volumes)
    return sandbox_pod(EPISODE, SPEC, pod, extra_labels={}, images=images)


def test_a_volume_only_sidecars_mount_is_filled_from_their_images_with_the_operators_copier() -> None:
    with pytest.raises(ValueError, match="the operator's own image"):
        sidecars_only_pod(None)
    spec = sidecars_only_pod(AgentImages(capture="operator:9"))["spec"]
    assert [c["name"] for c in spec["initContainers"]] == [VOLUME_FILLER, COPIER, SEEDER_FILLER, READER_FILLER]
    mains, copier, seeder, reader = spec["initContainers"]
    # The volume main mounts is main's to fill, from the task's image, whoever else names it.
    assert mains["command"][6:] == ["/shared", seen("shared"), "new-copy", "-"]
    # The copier: the operator's own image lends its static busybox, with a link per applet.
    assert (copier["image"], copier["command"][:3], copier["command"][5:]) == (
        "operator:9",
        [COPIER_BUSYBOX, "sh", "-c"],
        [COPIER_BUSYBOX, COPIER_ROOT],
    )
    assert copier["volumeMounts"] == [{"name": COPIER, "mountPath": COPIER_ROOT}]
    assert {"name": COPIER, "emptyDir": {}} in spec["volumes"]
    for filler, image in ((seeder, "seed:1"), (reader, "read:1")):
        # The sidecar's image as root, running the lent busybox alone: nothing of the image runs.
        assert (filler["image"], filler["securityContext"]["runAsUser"], filler["env"]) == (
            image,
            0,
            [{"name": "PATH", "value": COPIER_ROOT}],
        )
        assert filler["command"][:2] == [f"{COPIER_ROOT}/sh", "-c"]
        assert filler["volumeMounts"][0] == {"name": COPIER, "mountPath": COPIER_ROOT, "readOnly": True}
    # Docker's order: the first mount makes the volume new (and copies unless nocopy); a later one
    # copies into a volume still empty. No layout folder is ensured in a sidecar.
    assert seeder["command"][4:] == [
        *("", ""),
        *("/srv/seed", seen("seed"), "new-copy", "-"),
        *("/srv/quiet", seen("quiet"), "new", "-"),
    ]
    assert reader["command"][4:] == [
        *("", ""),
        *("/seen", seen("seed"), "copy", "-"),
        *("/srv/quiet", seen("quiet"), "copy", "-"),
        *("/late", seen("late"), "new-copy", "-"),
    ]


def test_the_lent_copier_fills_them_as_docker_does_from_images_without_a_shell(tmp_path: Path) -> None:
    kubelet = MiniKubelet(tmp_path, sidecars_only_pod(AgentImages(capture="operator:9")), {}, "debian")
    operator = kubelet.image("operator", bare=True)
    (operator / "bin").mkdir()
    shutil.copy(tool("busybox-static"), operator / "bin" / "busybox")
    # The sidecars' images: their files alone, no shell and no libc to copy with.
    seed = kubelet.image("seed", bare=True)
    (seed / "srv" / "seed" / "deep").mkdir(parents=True)
    (seed / "srv" / "seed" / "seed.txt").write_text("from the seeder's image\n")
    (seed / "srv" / "seed" / "seed.txt").chmod(0o640)
    for path in (seed / "srv" / "seed", seed / "srv" / "seed" / "seed.txt", seed / "srv" / "seed" / "deep"):
        os.lchown(path, IMAGE_UID, IMAGE_UID)
    (seed / "srv" / "seed").chmod(0o750)
    (seed / "srv" / "quiet").mkdir()
    (seed / "srv" / "quiet" / "left-out").write_text("nocopy\n")
    read = kubelet.image("read", bare=True)
    (read / "seen").mkdir()
    (read / "seen" / "too-late").write_text("the seeder filled it first\n")
    (read / "srv" / "quiet").mkdir(parents=True)
    (read / "srv" / "quiet" / "from-reader").write_text("still empty when the reader mounted it\n")
    assert kubelet.run(READER_FILLER, read, ["/bin/sh", "-c", "true"]).returncode != 0  # no shell of its own
    for container, image in ((COPIER, operator), (SEEDER_FILLER, seed), (READER_FILLER, read)):
        ran = kubelet.run(container, image)
        assert ran.returncode == 0, f"{container}: {ran.stderr}"

    def shown(volume: str) -> list[str]:
        root = tmp_path / "volumes" / f"compose-{volume}"
        paths = [root, *sorted(root.rglob("*"))]
        return [f"{p.relative_to(root)} {p.lstat().st_uid} {stat.S_IMODE(p.lstat().st_mode):o}" for p in paths]

    assert shown("seed") == [f". {IMAGE_UID} 750", f"deep {IMAGE_UID} 755", f"seed.txt {IMAGE_UID} 640"]
    assert (tmp_path / "volumes" / "compose-seed" / "seed.txt").read_text() == "from the seeder's image\n"
    assert shown("quiet") == [". 0 755", "from-reader 0 644"]  # nocopy first, then Docker's copy into it
    assert shown("late") == [". 0 755"]  # nothing in the image there: a new volume, root's


def test_an_operator_without_its_own_image_refuses_a_volume_only_sidecars_mount_naming_each_mount() -> None:
    files = TaskFiles.from_mapping(single_step(files={COMPOSE: SIDECARS_ONLY}))
    refused = admit_task(SPEC, files, lends_copier=False)
    assert isinstance(refused, Refusal) and refused.failure_kind == "harbor:seed_refused", refused
    keys = ["services.seeder.volumes[0]", "services.seeder.volumes[1]", "services.reader.volumes[0]"]
    keys += ["services.reader.volumes[1]", "services.reader.volumes[2]"]
    assert refused.message == "refused at seed: " + "; ".join(f"{COMPOSE}: {key}: {NO_COPIER}" for key in keys)
    # The control: with the operator's own image to lend its copier, the same task is admitted.
    assert isinstance(admit_task(SPEC, files), Admission)
