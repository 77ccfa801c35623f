"""Seed once: an EpisodeSet's attempts of one Dockerfile task start from one build, by its digest.

With ``--build-registry`` the operator builds a set child's ``environment/Dockerfile`` once (the
content-addressed build Job of kube/builds.py) and every attempt's pod runs the image by the
manifest digest the push wrote; no attempt replays. The control beside it: the same set on an
operator without a build registry replays the Dockerfile in every pod. The attacker: an agent
(root in its pod, which reaches the registry) writes into the image's directories and pushes a
tampered manifest under the build's tag; the next attempt still starts from the digest, clean,
while a pod that names the tag gets the tampered image (the control, which shows the push worked).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import textwrap
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from episode_operator.kube.objects.buildjobs import MANIFEST_DIGEST_ANNOTATION
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.buildcontext import BuildSource, pack_build_context
from episode_operator.taskfolder.image_refs import ImageMirrors
from tests.cluster.conftest import delete_namespace_while_watched, namespace_name, namespace_prefix
from tests.cluster.harness import (
    CRD_DIGEST_ANNOTATION,
    CRD_PATH,
    GROUP,
    SET_CRD_PATH,
    SIDE_BY_SIDE_CPU_REQUEST_FRACTION,
    VERSION,
    OperatorProcess,
    context_kubeconfig,
    install_crd,
    read_episode,
)
from tests.cluster.test_seed import (
    MIRRORS,
    REGISTRY,
    REGISTRY_SANDBOX,
    SETS,
    PodWatch,
    build_jobs,
    building_operator,
    episode_exists,
    kubectl_episode,
    make_namespace,
    operator_with,
    poll_until,
    wait_all,
)

REPOSITORY = "episode-operator/builds"
README = Path(__file__).resolve().parents[2] / "README.md"
MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


def readme_command(name: str) -> str:
    """The README's ``sh`` block between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` (in a list item:
    indented), as printed."""
    block = README.read_text().split(f"<!-- BEGIN {name} -->\n")[1].split(f"<!-- END {name} -->")[0]
    lines = textwrap.dedent(block).splitlines()
    assert lines[0] == "```sh" and lines[-1] == "```", block
    return "\n".join(lines[1:-1]) + "\n"


def dockerfile_task(marker: str, solve: str | None = None) -> dict[str, str]:
    """A task replay can apply (one stage, RUN and COPY): replayed today, built once for a set."""
    return {
        "task.toml": 'schema_version = "1.4"\n[agent]\ntimeout_sec = 120.0\n',
        "environment/Dockerfile": f"FROM ubuntu:24.04\nRUN echo {marker} > /built.txt\nCOPY hello.txt /app/hello.txt\n",
        "environment/hello.txt": "hello\n",
        "instruction.md": "Copy /built.txt to /tmp/answer.txt.\n",
        "solution/solve.sh": solve or "#!/bin/bash\ncp /built.txt /tmp/answer.txt\n",
        "tests/test.sh": f"#!/bin/bash\ngrep -qx {marker} /tmp/answer.txt && echo 1 > /logs/verifier/reward.txt "
        "|| echo 0 > /logs/verifier/reward.txt\n",
    }


def build_tag(files: dict[str, str]) -> str:
    """The build's tag (its context digest), as the operator of these tests packs it (with its mirrors)."""
    mirrors = ImageMirrors.parse([mirror.removeprefix("--image-mirror=") for mirror in MIRRORS])
    packed = pack_build_context(
        TaskFiles.from_mapping(files), BuildSource("environment/Dockerfile", "environment"), mirrors
    )
    return packed.hex


def registry_digest(tag: str) -> str:
    """What the registry answers for the tag now: the manifest digest it serves under it."""
    request = urllib.request.Request(
        f"http://{REGISTRY}/v2/{REPOSITORY}/manifests/{tag}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.headers["Docker-Content-Digest"])


def built_digest(api: client.ApiClient, build_namespace: str, job: str) -> tuple[str, str]:
    """The manifest digest a build Job recorded of its push, and the reference pods name its image by."""
    digest = (
        client.BatchV1Api(api)
        .read_namespaced_job(job, build_namespace)
        .metadata.annotations[MANIFEST_DIGEST_ANNOTATION]
    )
    return str(digest), f"{REGISTRY}/{REPOSITORY}@{digest}"


def create_set(
    api: client.ApiClient, namespace: str, name: str, files: dict[str, str], attempts: int, parallel: int
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EpisodeSet",
        "metadata": {"name": name},
        "spec": {
            "dataset": {"tasks": [{"name": "dockerfile", "inline": {"files": files}}]},
            "agent": {"kind": "oracle"},
            "attempts": attempts,
            "parallelism": parallel,
        },
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, SETS, body)


def set_children(
    api: client.ApiClient, namespace: str, name: str, attempts: int, operator: OperatorProcess
) -> dict[str, dict[str, Any]]:
    """Every child's final status."""
    children = [f"{name}-0-{attempt}" for attempt in range(1, attempts + 1)]
    # The set makes them as its parallelism allows: each is waited for once it exists.
    statuses: dict[str, dict[str, Any]] = {}
    for child in children:
        poll_until(lambda child=child: episode_exists(api, namespace, child), f"{child} created", operator, timeout=900)
        statuses.update(wait_all(api, namespace, [child], operator))
    return statuses


def installed_crds_are_ours(api: client.ApiClient) -> str | None:
    """None when the cluster serves this checkout's CRDs, else which are not (another checkout's tests
    installed theirs, which prune status.image: re-run then)."""
    extensions = client.ApiextensionsV1Api(api)
    wrong = []
    for path in (CRD_PATH, SET_CRD_PATH):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        served = (extensions.read_custom_resource_definition(name).metadata.annotations or {}).get(
            CRD_DIGEST_ANNOTATION
        )
        if served != hashlib.sha256(path.read_bytes()).hexdigest():
            wrong.append(f"{name} (digest {served})")
    return ", ".join(wrong) or None


def recorded_images(
    api: client.ApiClient, namespace: str, name: str, attempts: int, operator: OperatorProcess
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Each child's status.image, and the set's record of each child, once the set has them all."""
    children = [f"{name}-0-{attempt}" for attempt in range(1, attempts + 1)]
    images = {child: read_episode(api, namespace, child)["status"].get("image") for child in children}
    other = installed_crds_are_ours(api)
    assert all(images.values()) or other is None, f"status.image pruned: another checkout's CRDs are served: {other}"

    def recorded() -> bool:
        records = set_records(api, namespace, name)
        return len([record for record in records if record.get("image")]) == attempts

    poll_until(recorded, f"the set {name} records every child's image", operator, timeout=120)
    return images, set_records(api, namespace, name)


def set_records(api: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    body = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, SETS, name)
    return list((((body.get("status") or {}).get("tasks") or [{}])[0]).get("children") or [])


def seed_logs(kubeconfig: Path, operator: OperatorProcess, namespace: str, name: str) -> str:
    logs = kubectl_episode(
        kubeconfig, "logs", name, "--turn", "seed", "-n", namespace, "--data-dir", str(operator.data_dir)
    )
    return logs.stdout + logs.stderr


@pytest.fixture(scope="module")
def build_namespace(core: client.CoreV1Api) -> Iterator[str]:
    """Where this module's build Jobs run (privileged pods: a namespace of their own)."""
    name = make_namespace(core, f"img-{namespace_prefix()}once-{uuid.uuid4().hex[:6]}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def set_namespace(core: client.CoreV1Api, api_client: client.ApiClient, request: pytest.FixtureRequest) -> str:
    install_crd(api_client)
    return make_namespace(core, f"img-{namespace_name(request.node.name.removeprefix('test_'))}")


@pytest.fixture
def builder_operator(
    kubeconfig: Path, core: client.CoreV1Api, set_namespace: str, build_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    with building_operator(
        kubeconfig, core, set_namespace, build_namespace, tmp_path / "operator", SIDE_BY_SIDE_CPU_REQUEST_FRACTION
    ) as op:
        yield op


def test_an_episodeset_of_four_attempts_builds_once_and_every_attempt_starts_from_its_digest(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    kubeconfig: Path,
    set_namespace: str,
    builder_operator: OperatorProcess,
    build_namespace: str,
    tmp_path: Path,
) -> None:
    namespace = set_namespace
    files = dockerfile_task(f"once-{namespace}")
    tag = build_tag(files)
    before = build_jobs(api_client, build_namespace)
    pods = PodWatch(core, namespace)
    create_set(api_client, namespace, "once", files, attempts=4, parallel=4)
    statuses = set_children(api_client, namespace, "once", 4, builder_operator)
    pods.stop()
    assert [status["reward"] for status in statuses.values()] == [1.0] * 4, statuses

    # Exactly one build Job for the context, and it recorded the digest its push wrote.
    new = sorted(set(build_jobs(api_client, build_namespace)) - set(before))
    assert new == [f"build-{tag[:20]}"], new
    digest, pinned = built_digest(api_client, build_namespace, new[0])
    assert digest == registry_digest(tag)  # the registry serves that manifest under the tag

    # Every attempt's agent pod ran that digest, none the tag, none the FROM image a replay starts from.
    for name in statuses:
        (agent,) = pods.of(name, "agent")
        assert agent["main"] == pinned, (name, agent)
    # No replay ran: the seed logs hold the one build's log (the attempts that waited for it share it), no replay.
    logs = {name: seed_logs(kubeconfig, builder_operator, namespace, name) for name in statuses}
    assert not [name for name, text in logs.items() if "replay" in text], logs
    assert all("turn seed: build-environment <==" in text for text in logs.values()), logs
    # Each child's status and the set's record of it say which image it started from, and why.
    images, records = recorded_images(api_client, namespace, "once", 4, builder_operator)
    for image in images.values():
        assert image is not None and (image["ref"], image["made"]) == (pinned, "built"), image
        assert "built once for the EpisodeSet's attempts" in image["message"]
    assert [(r["image"]["ref"], r["image"]["made"]) for r in records] == [(pinned, "built")] * 4, records
    # The README's command, as printed (NAME: the set's), says the same for each child.
    shell_kubeconfig = context_kubeconfig(kubeconfig, tmp_path / "kubeconfig", {"work": namespace})
    command = readme_command("seed-once-images").replace("NAME", "once")
    printed = subprocess.run(
        ["sh", "-c", command],
        env={**os.environ, "KUBECONFIG": str(shell_kubeconfig)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert sorted(printed.splitlines()) == [f"once-0-{i} built {pinned}" for i in range(1, 5)], printed


def test_control_the_same_set_without_a_build_registry_replays_in_every_pod(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    kubeconfig: Path,
    set_namespace: str,
    build_namespace: str,
    tmp_path: Path,
) -> None:
    namespace = set_namespace
    files = dockerfile_task(f"replay-{namespace}")
    before = build_jobs(api_client, build_namespace)
    operator = operator_with(
        kubeconfig, tmp_path / "operator", namespace, cpu_request_fraction=SIDE_BY_SIDE_CPU_REQUEST_FRACTION
    )
    operator.start()
    try:
        pods = PodWatch(core, namespace)
        create_set(api_client, namespace, "replay", files, attempts=4, parallel=4)
        statuses = set_children(api_client, namespace, "replay", 4, operator)
        pods.stop()
        assert [status["reward"] for status in statuses.values()] == [1.0] * 4, statuses
        for name in statuses:
            (agent,) = pods.of(name, "agent")
            assert agent["main"] == REGISTRY_SANDBOX, agent  # the mirrored FROM image, the Dockerfile replayed in it
            assert "==> environment/Dockerfile:2: RUN echo" in seed_logs(kubeconfig, operator, namespace, name)
        assert build_jobs(api_client, build_namespace) == before  # nothing built
        images, records = recorded_images(api_client, namespace, "replay", 4, operator)
        for image in images.values():
            assert image is not None and (image["ref"], image["made"]) == (REGISTRY_SANDBOX, "replayed"), image
            assert "no build registry" in image["message"]
        assert [r["image"]["made"] for r in records] == ["replayed"] * 4, records
    finally:
        delete_namespace_while_watched(core, namespace)
        operator.stop()


# The attacker: root in attempt 1's pod, it writes into the image's directories and pushes a tampered
# manifest (a layer adding /app/pwned and /usr/local/bin/pwned) under the build's tag, through the
# registry's plain HTTP API. What each attempt started from goes to /tmp/answer.txt first.
PUSH = r"""
import gzip, hashlib, io, json, sys, tarfile, urllib.request
registry, repository, tag = sys.argv[1:4]
base = f"http://{registry}/v2/{repository}"
accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
def call(method, url, data=None, headers=None):
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    return urllib.request.urlopen(request, timeout=60)
answer = call("GET", f"{base}/manifests/{tag}", headers={"Accept": accept})
media_type, manifest = answer.headers["Content-Type"], json.loads(answer.read())
config = json.loads(call("GET", f"{base}/blobs/{manifest['config']['digest']}").read())
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w") as tar:
    for path in ("app", "app/pwned", "usr/local/bin/pwned"):
        data = b"" if path == "app" else b"pushed by attempt 1\n"
        info = tarfile.TarInfo(path)
        info.mode, info.size = 0o755, len(data)
        info.type = tarfile.DIRTYPE if path == "app" else tarfile.REGTYPE
        tar.addfile(info, io.BytesIO(data))
layer = gzip.compress(raw.getvalue())
def upload(blob):
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    location = call("POST", f"{base}/blobs/uploads/").headers["Location"]
    location = location if location.startswith("http") else f"http://{registry}{location}"
    joiner = "&" if "?" in location else "?"
    call("PUT", f"{location}{joiner}digest={digest}", blob, {"Content-Type": "application/octet-stream"})
    return digest
layer_type = manifest["layers"][-1]["mediaType"]
layer_digest = upload(layer)
config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(raw.getvalue()).hexdigest())
config_blob = json.dumps(config).encode()
manifest["config"] = {**manifest["config"], "digest": upload(config_blob), "size": len(config_blob)}
manifest["layers"].append({"mediaType": layer_type, "digest": layer_digest, "size": len(layer)})
pushed = call("PUT", f"{base}/manifests/{tag}", json.dumps(manifest).encode(), {"Content-Type": media_type})
print("pushed", pushed.headers.get("Docker-Content-Digest"))
"""


def attacker_solve(marker: str, tag: str) -> str:
    return (
        "#!/bin/bash\n"
        # What this attempt started from: the marker when clean, "tampered" when a pushed file is there.
        f"if [ -e /app/pwned ] || [ -e /usr/local/bin/pwned ]; then echo tampered; else echo {marker}; fi"
        " > /tmp/answer.txt\n"
        "echo written-by-the-agent > /app/pwned; echo written-by-the-agent > /usr/local/bin/pwned\n"
        f"python3 -c {shlex.quote(PUSH)} {REGISTRY} {REPOSITORY} {tag}\n"
    )


def test_attacker_an_agent_that_pushes_under_the_tag_cannot_change_what_the_next_attempt_starts_from(
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    kubeconfig: Path,
    set_namespace: str,
    builder_operator: OperatorProcess,
    build_namespace: str,
) -> None:
    namespace = set_namespace
    marker = f"clean-{namespace}"
    files = dockerfile_task(marker)
    tag = build_tag(files)  # the solution is outside environment/: the attacker's script leaves the tag unchanged
    files["solution/solve.sh"] = attacker_solve(marker, tag)
    assert build_tag(files) == tag
    pods = PodWatch(core, namespace)
    create_set(api_client, namespace, "attack", files, attempts=2, parallel=1)  # attempt 2 after attempt 1
    statuses = set_children(api_client, namespace, "attack", 2, builder_operator)
    pods.stop()
    (job,) = [name for name in build_jobs(api_client, build_namespace) if name == f"build-{tag[:20]}"]
    digest, pinned = built_digest(api_client, build_namespace, job)
    # The push worked: the registry serves another manifest under the tag now.
    tampered = registry_digest(tag)
    assert tampered != digest, "the agent's push did not land: the test shows nothing"
    # Both attempts started clean, from the digest the build pushed; attempt 2 after the push.
    first, second = statuses["attack-0-1"], statuses["attack-0-2"]
    assert (first["reward"], second["reward"]) == (1.0, 1.0), statuses
    assert [pods.of(name, "agent")[0]["main"] for name in statuses] == [pinned, pinned]

    # The control: a pod that names the tag (pulled afresh) starts from the tampered image.
    name = f"by-tag-{uuid.uuid4().hex[:6]}"
    container = client.V1Container(
        name="main",
        image=f"{REGISTRY}/{REPOSITORY}:{tag}",
        image_pull_policy="Always",
        command=["cat", "/app/pwned", "/usr/local/bin/pwned"],
    )
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(restart_policy="Never", containers=[container], automount_service_account_token=False),
    )
    core.create_namespaced_pod(namespace, pod)

    def ended() -> bool:
        return core.read_namespaced_pod(name, namespace).status.phase in ("Succeeded", "Failed")

    poll_until(ended, "the by-tag pod ended", builder_operator, timeout=180)
    assert core.read_namespaced_pod_log(name, namespace) == "pushed by attempt 1\n" * 2
    assert core.read_namespaced_pod(name, namespace).status.container_statuses[0].image_id.endswith(tampered)
    images, _ = recorded_images(api_client, namespace, "attack", 2, builder_operator)
    assert images["attack-0-2"] is not None and images["attack-0-2"]["ref"] == pinned
