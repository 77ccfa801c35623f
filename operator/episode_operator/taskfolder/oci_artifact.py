"""Task folders as OCI artifacts: references, the manifest ``kubectl episode pack`` pushes, and what a
fetched manifest must be. Pure: no I/O (the registry calls are ``runtime/oci_tasks.py``'s).

A task too big for a ConfigMap is pushed to a registry as one OCI artifact: a manifest whose one
layer is the folder packed as ``pack_tar`` packs it (reproducible, so the same folder is the same
layer digest and the same manifest digest), and whose config is ``{}``. It is named by the digest of
its manifest (``HOST[:PORT]/REPOSITORY@sha256:HEX``), never by a tag: what an Episode names cannot
change under it, and the operator checks every byte it fetched against that digest.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

ARTIFACT_TYPE = "application/vnd.episode-operator.task.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.episode-operator.task.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_BYTES = b"{}"
# A manifest of one layer is a few hundred bytes: a bigger answer is not one of ours, and is not read on.
MAX_MANIFEST_BYTES = 64 * 1024
LAYER_TITLE = "task.tar.gz"

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# The distribution spec's repository name: lowercase path components separated by / (at most 255 in all).
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
# A registry host: a DNS name or an IPv4 address, with an optional port (no scheme, no path).
_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(?::[0-9]{1,5})?$")
REFERENCE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.:-]*(/[a-z0-9._-]+)+@sha256:[0-9a-f]{64}$"


class ArtifactError(ValueError):
    """A reference, manifest or blob that is not a task artifact; the message says what and where."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class TaskReference:
    """``HOST[:PORT]/REPOSITORY@sha256:HEX``: a task artifact named by its manifest's digest."""

    registry: str
    repository: str
    digest: str

    @classmethod
    def parse(cls, text: str) -> TaskReference:
        name, at, digest = text.partition("@")
        if not at or not _DIGEST.match(digest):
            raise ArtifactError(f"{text!r} is not HOST[:PORT]/REPOSITORY@sha256:<64 hex digits>")
        registry, slash, repository = name.partition("/")
        looks_like_host = "." in registry or ":" in registry or registry == "localhost"
        if not slash or not _HOST.match(registry) or not looks_like_host:
            raise ArtifactError(f"{text!r}: {registry!r} is not a registry host (HOST[:PORT], with a dot or a port)")
        if len(repository) > 255 or not _REPOSITORY.match(repository):
            raise ArtifactError(f"{text!r}: {repository!r} is not a repository name (lowercase path components)")
        return cls(registry, repository, digest)

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"


@dataclass(frozen=True)
class TaskRepository:
    """Where ``pack`` pushes: ``[http://|https://]HOST[:PORT]/REPOSITORY`` (https unless http:// says so)."""

    registry: str
    repository: str
    insecure: bool = False

    @classmethod
    def parse(cls, text: str) -> TaskRepository:
        scheme, sep, rest = text.partition("://")
        if not sep:
            scheme, rest = "https", text
        if scheme not in ("http", "https"):
            raise ArtifactError(f"{text!r}: the scheme is http:// or https://, not {scheme}://")
        registry, slash, repository = rest.rstrip("/").partition("/")
        if not _HOST.match(registry):
            raise ArtifactError(f"{text!r}: {registry!r} is not a registry host (HOST[:PORT])")
        if not slash or len(repository) > 200 or not _REPOSITORY.match(repository):
            raise ArtifactError(f"{text!r}: give a repository after the host (HOST[:PORT]/REPOSITORY, lowercase)")
        return cls(registry, repository, scheme == "http")

    def child(self, task: str) -> TaskRepository:
        """The repository of one task: ``REPOSITORY/<task as a repository component>``."""
        stem = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")[:40].strip("-") or "task"
        return TaskRepository(self.registry, f"{self.repository}/{stem}", self.insecure)


@dataclass(frozen=True)
class Layer:
    """The one layer of a task artifact: the gzipped tar of the folder."""

    digest: str
    size: int


def descriptor(media_type: str, data_digest: str, size: int, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": data_digest, "size": size, **extra}


def task_manifest(layer: Layer) -> bytes:
    """The manifest of a task artifact, as bytes (its digest is the artifact's name): canonical JSON, so the
    same layer is always the same manifest."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": descriptor(CONFIG_MEDIA_TYPE, sha256_digest(CONFIG_BYTES), len(CONFIG_BYTES)),
        "layers": [
            descriptor(
                LAYER_MEDIA_TYPE,
                layer.digest,
                layer.size,
                annotations={"org.opencontainers.image.title": LAYER_TITLE},
            )
        ],
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def task_layer(manifest: bytes, reference: TaskReference, max_layer_bytes: int) -> Layer:
    """The layer a fetched manifest names, once the manifest is checked: its digest is the reference's,
    it is an image manifest of exactly one gzipped-tar layer, and that layer declares at most
    ``max_layer_bytes``. Anything else raises :class:`ArtifactError` naming what is wrong."""
    if len(manifest) > MAX_MANIFEST_BYTES:
        raise ArtifactError(f"{reference}: the manifest is over {MAX_MANIFEST_BYTES} bytes; not a task artifact")
    if (actual := sha256_digest(manifest)) != reference.digest:
        raise ArtifactError(
            f"{reference}: the registry answered a manifest whose digest is {actual}, not the reference's"
        )
    try:
        document = json.loads(manifest)
    except ValueError as error:
        raise ArtifactError(f"{reference}: the manifest is not JSON ({error})") from error
    if not isinstance(document, dict) or document.get("mediaType", MANIFEST_MEDIA_TYPE) != MANIFEST_MEDIA_TYPE:
        raise ArtifactError(f"{reference}: not an OCI image manifest (an index or another kind of document)")
    layers = document.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        count = len(layers) if isinstance(layers, list) else "no"
        raise ArtifactError(f"{reference}: a task artifact has exactly one layer, this one has {count}")
    (layer,) = layers
    media_type, digest, size = layer.get("mediaType"), layer.get("digest"), layer.get("size")
    if media_type != LAYER_MEDIA_TYPE:
        raise ArtifactError(f"{reference}: its layer is {media_type!r}, not {LAYER_MEDIA_TYPE} (a packed task folder)")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ArtifactError(f"{reference}: its layer's digest {digest!r} is not sha256:<64 hex digits>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ArtifactError(f"{reference}: its layer's size {size!r} is not a byte count")
    if size > max_layer_bytes:
        raise ArtifactError(
            f"{reference}: its layer is {size} bytes, over the operator's limit of {max_layer_bytes} "
            "(--task-artifact-limit)"
        )
    return Layer(digest, size)
