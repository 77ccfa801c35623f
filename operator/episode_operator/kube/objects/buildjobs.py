"""Manifests of in-cluster image builds (pure builders, no API calls).

One build is a ConfigMap holding the packed context (:mod:`episode_operator.taskfolder.buildcontext`)
and a Job that runs buildah on it and pushes the image, both named by the context's digest so
that every Episode needing the same image finds the same Job.

Why buildah: BuildKit and kaniko need their own images, which an air-gapped cluster (and this
project's test machines) cannot pull, while buildah is a Debian package, so the builder image is
made like the project's other images; it builds Dockerfiles as BuildKit does (multi-stage,
``COPY --from``, build arguments, targets) without a daemon. It runs with ``--isolation chroot``
and the ``vfs`` storage driver, which work inside an unprivileged-looking container only with
privilege: the build pod is privileged, so builds belong in a namespace of their own.

The push writes the manifest digest it pushed to the container's termination message
(``buildah push --digestfile``): the coordinator records it on the Job, and pods run the image by
that digest, never by the tag (which anyone who can push to the registry can move).

The build script tells the outcome by its exit code, so the coordinator classifies failures
without parsing prose: the context cannot be unpacked, a base image cannot be pulled, the
Dockerfile fails to build, or the image cannot be pushed.
"""

from __future__ import annotations

import base64
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from episode_operator.api.vocabulary import BUILD_LABEL, MANAGED_BY

CONTEXT_KEY = "context.tar.gz"
# The ConfigMap limit is 1 MiB of data in all; base64 and the object's own fields need the rest.
MAX_CONTEXT_BYTES = 700 * 1024
STORAGE = "/var/lib/containers"

# Exit codes of the build script, and what each means.
EXIT_CONTEXT = 30
EXIT_PULL = 21
EXIT_BUILD = 10
EXIT_PUSH = 20
# Where the push writes the manifest digest it pushed: the container's termination message.
DIGEST_FILE = "/dev/termination-log"
# The Job's record of that digest, once the coordinator read it (the build pod may be gone later).
MANIFEST_DIGEST_ANNOTATION = "episode-operator.dev/manifest-digest"


@dataclass(frozen=True)
class BuildJobSpec:
    """One build: its names, the image to push, how to push it, and its bound."""

    namespace: str
    digest_hex: str
    image: str
    builder_image: str
    timeout_sec: float
    base_images: tuple[str, ...] = ()
    args: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None
    tls_verify: bool = True
    dockerfile: str = ".episode-operator.Dockerfile"

    @property
    def name(self) -> str:
        """The Job's (and ConfigMap's) name: the context digest, shortened; 80 bits make collisions moot."""
        return f"build-{self.digest_hex[:20]}"

    @property
    def labels(self) -> dict[str, str]:
        return {**MANAGED_BY, BUILD_LABEL: self.digest_hex[:20]}


def context_config_map(spec: BuildJobSpec, archive: bytes) -> dict[str, Any]:
    """The ConfigMap carrying the packed context to the build pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": spec.labels},
        "binaryData": {CONTEXT_KEY: base64.b64encode(archive).decode()},
    }


def build_script(spec: BuildJobSpec) -> str:
    """Unpack, pull the base images, build, push; each stage exits with its own code."""
    buildah = f"buildah --storage-driver=vfs --root={STORAGE}/storage --runroot={STORAGE}/run"
    verify = f"--tls-verify={'true' if spec.tls_verify else 'false'}"
    build = [
        *shlex.split(buildah),
        "build",
        "--isolation=chroot",
        "--layers=false",
        "--network=host",
        "-f",
        f"/workspace/context/{spec.dockerfile}",
        "-t",
        spec.image,
    ]
    for name, value in spec.args.items():
        build += ["--build-arg", f"{name}={value}"]
    if spec.target:
        build += ["--target", spec.target]
    build.append("/workspace/context")
    lines = [
        "set -u",
        f"mkdir -p /workspace/context && tar -xzf /input/{CONTEXT_KEY} -C /workspace/context || exit {EXIT_CONTEXT}",
    ]
    for image in spec.base_images:
        lines.append(f"{buildah} pull {verify} {shlex.quote(image)} || exit {EXIT_PULL}")
    lines += [
        f"{shlex.join(build)} || exit {EXIT_BUILD}",
        f"{buildah} push {verify} --digestfile {DIGEST_FILE} {shlex.quote(spec.image)} "
        f"{shlex.quote('docker://' + spec.image)} || exit {EXIT_PUSH}",
    ]
    return "\n".join(lines)


def build_job(spec: BuildJobSpec) -> dict[str, Any]:
    """The Job: one pod, never retried (a failure is classified, not repeated), bounded by the build timeout."""
    container = {
        "name": "build",
        "image": spec.builder_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", build_script(spec)],
        "securityContext": {"privileged": True},
        "terminationMessagePath": DIGEST_FILE,
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {"name": "context", "mountPath": "/input", "readOnly": True},
            {"name": "storage", "mountPath": STORAGE},
            {"name": "workspace", "mountPath": "/workspace"},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": spec.labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, math.ceil(spec.timeout_sec)),
            "template": {
                "metadata": {"labels": spec.labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [
                        {"name": "context", "configMap": {"name": spec.name}},
                        {"name": "storage", "emptyDir": {}},
                        {"name": "workspace", "emptyDir": {}},
                    ],
                },
            },
        },
    }
