"""Task folders in an OCI registry: pushed by ``kubectl episode pack``/``run``, fetched by the operator.

The distribution API calls for one artifact are few — HEAD/PUT a manifest by digest, HEAD/POST/PUT a
blob, GET both — so they are made here with aiohttp (already the operator's HTTP client) rather than
through a registry library: none of them bounds what it downloads or verifies it as it streams, and
both matter here. What a manifest must be is ``taskfolder/oci_artifact.py``'s (pure).

The operator's side, :class:`TaskArtifacts`, treats a fetched artifact as hostile:

- only registries the operator was started with are fetched from (``--task-registry``): an Episode
  cannot make the operator call any other address;
- the manifest is read up to 64 KiB and must hash to the reference's digest; its one layer must declare
  at most ``--task-artifact-limit`` bytes;
- the layer is streamed to a file in the cache directory, never held whole in memory, hashed as it
  arrives, and refused when it sends more bytes than its manifest declared or hashes to another digest;
- only a verified layer enters the cache (by an atomic rename), named by the manifest's digest: the same
  reference is fetched once, and what the cache holds is what was verified;
- the folder is then read from it by ``TaskFiles.from_tar`` with the very limits of a ConfigMap's
  (files, bytes, depth, links counted as the files they become).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import aiohttp

from episode_operator.taskfolder.oci_artifact import (
    CONFIG_BYTES,
    CONFIG_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    MAX_MANIFEST_BYTES,
    ArtifactError,
    Layer,
    TaskReference,
    TaskRepository,
    sha256_digest,
    task_layer,
    task_manifest,
)

CHUNK = 64 * 1024
DEFAULT_ARTIFACT_LIMIT = 512 * 1024 * 1024  # SourceLimits.max_total_bytes: a folder's bytes, unpacked
DEFAULT_CACHE_LIMIT = 2 * 1024 * 1024 * 1024
# A registry that stops sending is given this long between bytes, and a whole fetch this long.
READ_TIMEOUT_SEC = 30.0
FETCH_TIMEOUT_SEC = 600.0


class ArtifactMissing(Exception):
    """The registry does not (yet) hold the artifact, or could not be reached: worth waiting for."""


def _timeout(total: float | None = FETCH_TIMEOUT_SEC) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, sock_connect=10.0, sock_read=READ_TIMEOUT_SEC)


def _url(registry: str, insecure: bool, path: str) -> str:
    return f"{'http' if insecure else 'https'}://{registry}/v2/{path}"


@dataclass(frozen=True)
class TaskArtifactSettings:
    """``--task-registry`` (host → plain HTTP?), ``--task-artifact-limit`` and the cache's place and size."""

    registries: Mapping[str, bool] = field(default_factory=dict)
    cache_dir: Path = Path("/var/lib/episode-operator/data/task-artifacts")
    max_layer_bytes: int = DEFAULT_ARTIFACT_LIMIT
    max_cache_bytes: int = DEFAULT_CACHE_LIMIT

    @staticmethod
    def parse_registry(text: str) -> tuple[str, bool]:
        """``[http://|https://]HOST[:PORT]`` as (host, plain HTTP?)."""
        scheme, sep, host = text.partition("://")
        if not sep:
            scheme, host = "https", text
        parsed = TaskRepository.parse(f"{scheme}://{host.rstrip('/')}/x")  # the same host rules as a repository
        return parsed.registry, parsed.insecure


class TaskArtifacts:
    """The operator's fetcher of task artifacts: allowed registries only, bounded, verified, cached."""

    def __init__(self, settings: TaskArtifactSettings) -> None:
        self.settings = settings
        self.fetches = 0  # layers downloaded (not answered from the cache): what a test counts

    def cached(self, reference: TaskReference) -> Path:
        return self.settings.cache_dir / "sha256" / (reference.digest.removeprefix("sha256:") + ".tar.gz")

    async def fetch(self, text: str) -> Path:
        """The verified gzipped tar of the artifact ``text`` names, as a file of the cache.

        Raises :class:`ArtifactError` for what no waiting mends (a registry this operator does not
        fetch from, a manifest or layer that is not what the reference says) and :class:`ArtifactMissing`
        for what may (not found yet, the registry unreachable)."""
        reference = TaskReference.parse(text)
        if reference.registry not in self.settings.registries:
            allowed = ", ".join(sorted(self.settings.registries)) or "none: the operator has no --task-registry"
            raise ArtifactError(
                f"{reference}: the registry {reference.registry} is not one this operator fetches tasks from "
                f"(--task-registry: {allowed})"
            )
        path = self.cached(reference)
        if path.is_file():
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: the last the cache evicts
            return path
        insecure = self.settings.registries[reference.registry]
        async with aiohttp.ClientSession(timeout=_timeout()) as session:
            manifest = await self._manifest(session, reference, insecure)
            layer = task_layer(manifest, reference, self.settings.max_layer_bytes)
            await self._download(session, reference, layer, insecure, path)
        self.fetches += 1
        await asyncio.to_thread(self._evict, keep=path)
        return path

    async def _manifest(self, session: aiohttp.ClientSession, reference: TaskReference, insecure: bool) -> bytes:
        url = _url(reference.registry, insecure, f"{reference.repository}/manifests/{reference.digest}")
        async with _get(session, url, reference, {"Accept": MANIFEST_MEDIA_TYPE}) as answer:
            return await _bounded(answer, MAX_MANIFEST_BYTES, f"{reference}: the manifest")

    async def _download(
        self, session: aiohttp.ClientSession, reference: TaskReference, layer: Layer, insecure: bool, path: Path
    ) -> None:
        url = _url(reference.registry, insecure, f"{reference.repository}/blobs/{layer.digest}")
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".fetch-")
        try:
            hasher, received = hashlib.sha256(), 0
            with os.fdopen(handle, "wb") as out:
                async with _get(session, url, reference, {}) as answer:
                    async for chunk in answer.content.iter_chunked(CHUNK):
                        received += len(chunk)
                        if received > layer.size:
                            raise ArtifactError(
                                f"{reference}: the registry sent more than the {layer.size} bytes its manifest "
                                "declares for the layer; refused"
                            )
                        hasher.update(chunk)
                        out.write(chunk)
            if received != layer.size:
                raise ArtifactError(
                    f"{reference}: the registry sent {received} of the layer's {layer.size} bytes; refused"
                )
            if (actual := "sha256:" + hasher.hexdigest()) != layer.digest:
                raise ArtifactError(
                    f"{reference}: the layer fetched hashes to {actual}, not the {layer.digest} its manifest "
                    "names: tampered with or corrupt; refused"
                )
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    def _evict(self, keep: Path) -> None:
        """Oldest-used first, until the cache holds at most its limit (the entry just fetched stays)."""
        entries = []
        for entry in keep.parent.glob("*.tar.gz"):
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat()
                entries.append((info.st_mtime, info.st_size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries):
            if total <= self.settings.max_cache_bytes:
                break
            if entry != keep:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                total -= size


@contextlib.asynccontextmanager
async def _get(
    session: aiohttp.ClientSession, url: str, reference: TaskReference, headers: dict[str, str]
) -> AsyncIterator[aiohttp.ClientResponse]:
    try:
        async with session.get(url, headers=headers, max_redirects=3) as answer:
            if answer.status == 404:
                raise ArtifactMissing(f"{reference}: not found in the registry")
            if answer.status in (401, 403):
                raise ArtifactError(
                    f"{reference}: the registry answered {answer.status}: it asks for credentials, and the "
                    "operator fetches tasks only from registries that do not"
                )
            if answer.status >= 500:
                raise ArtifactMissing(f"{reference}: the registry answered {answer.status}")
            if answer.status != 200:
                raise ArtifactError(f"{reference}: the registry answered {answer.status} to GET {url}")
            yield answer
    except (aiohttp.ClientError, TimeoutError) as error:
        raise ArtifactMissing(
            f"{reference}: cannot fetch from {reference.registry}: {error or type(error).__name__}"
        ) from error


async def _bounded(answer: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    body = bytearray()
    async for chunk in answer.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > limit:
            raise ArtifactError(f"{what} is over {limit} bytes; refused")
    return bytes(body)


# --- the pushing side (kubectl episode pack/run) ---------------------------------------------------------
@dataclass(frozen=True)
class Pushed:
    reference: TaskReference
    uploaded: bool  # False: the registry held the artifact already (the same folder): nothing was sent


async def push_task(repository: TaskRepository, archive: bytes) -> Pushed:
    """Push ``archive`` (``pack_tar``'s) as a task artifact to ``repository``, unless it is there already.

    Content-addressed: the same folder packs to the same bytes, the same manifest and the same digest,
    and a manifest the registry holds is not sent again (nor are blobs it holds)."""
    layer = Layer(sha256_digest(archive), len(archive))
    manifest = task_manifest(layer)
    reference = TaskReference(repository.registry, repository.repository, sha256_digest(manifest))
    base = _url(repository.registry, repository.insecure, repository.repository)
    try:
        async with aiohttp.ClientSession(timeout=_timeout(None)) as session:
            if await _exists(session, f"{base}/manifests/{reference.digest}", MANIFEST_MEDIA_TYPE):
                return Pushed(reference, uploaded=False)
            await _push_blob(session, base, CONFIG_BYTES, CONFIG_MEDIA_TYPE)
            await _push_blob(session, base, archive, "application/octet-stream")
            async with session.put(
                f"{base}/manifests/{reference.digest}", data=manifest, headers={"Content-Type": MANIFEST_MEDIA_TYPE}
            ) as answer:
                await _expect(answer, (200, 201), "PUT the manifest")
    except aiohttp.ClientError as error:
        raise ArtifactError(f"cannot push to {repository.registry}: {error}") from error
    return Pushed(reference, uploaded=True)


async def _exists(session: aiohttp.ClientSession, url: str, accept: str) -> bool:
    async with session.head(url, headers={"Accept": accept}) as answer:
        if answer.status == 404:
            return False
        await _expect(answer, (200,), f"HEAD {url}")
        return True


async def _push_blob(session: aiohttp.ClientSession, base: str, data: bytes, media_type: str) -> None:
    digest = sha256_digest(data)
    if await _exists(session, f"{base}/blobs/{digest}", "*/*"):
        return
    async with session.post(f"{base}/blobs/uploads/") as answer:
        await _expect(answer, (202,), "start a blob upload")
        location = urljoin(f"{base}/", answer.headers.get("Location", ""))
    separator = "&" if "?" in location else "?"
    async with session.put(
        f"{location}{separator}digest={digest}", data=data, headers={"Content-Type": media_type}
    ) as answer:
        await _expect(answer, (201,), "upload a blob")


async def _expect(answer: aiohttp.ClientResponse, statuses: tuple[int, ...], what: str) -> None:
    if answer.status in statuses:
        return
    body = (await answer.content.read(500)).decode("utf-8", "replace").strip()
    hint = (
        " (the registry asks for credentials: only registries without them are supported)"
        if answer.status == 401
        else ""
    )
    raise ArtifactError(f"{answer.url.host}: {what}: the registry answered {answer.status}{hint}: {body}")
