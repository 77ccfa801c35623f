"""In-cluster image builds: "ensure the image of context digest D exists", once per digest.

:class:`BuildCoordinator` packs a build context (pure, :mod:`episode_operator.taskfolder.buildcontext`),
and then either finds the build of that digest — a Job named by it, in the build namespace —
or creates it (a ConfigMap with the context, a Job running buildah, :mod:`episode_operator.kube.objects.buildjobs`),
and waits for it. So a dataset of 1,000 attempts of one task builds once: the first caller
creates the Job, every later one finds it succeeded, and callers that come while it runs wait
for that one Job (in this operator they share one wait; across operator restarts the Job is the
record). A build that failed for the task's reason stays failed — its Job is the cached
verdict; one that failed for an outage is deleted and built again by the next caller.

A build's image is handed out by the manifest digest its push wrote (``buildah push --digestfile``
into the build pod's termination message), recorded on the Job as an annotation the first time a
caller reads it: ``repository@sha256:…``. The tag (the context digest) only finds the build; a pod
never names it, so nobody who can push to the registry — an agent in a pod can reach it — can change
what a later attempt starts from. A succeeded Job with no digest recorded and no pod left to read it
from (a build of an older operator) is built again.

Failures are classified from the build script's exit code (:mod:`episode_operator.kube.objects.buildjobs`):
a Dockerfile that fails to build, a base image that does not exist or a build past its
``build_timeout_sec`` is the task's failure (terminal); a registry that cannot be reached for
a pull or a push, a builder that cannot start, or an API that fails is an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.buildjobs import (
    EXIT_BUILD,
    EXIT_CONTEXT,
    EXIT_PULL,
    EXIT_PUSH,
    MANIFEST_DIGEST_ANNOTATION,
    MAX_CONTEXT_BYTES,
    BuildJobSpec,
    build_job,
    context_config_map,
)
from episode_operator.kube.objects.pod_state import pod_verdict
from episode_operator.runtime.sandbox_images import BuildFailed, BuildOutage, BuildOutcome, BuildReady
from episode_operator.runtime.sandbox_protocol import Waiting, WaitingReport
from episode_operator.taskfolder.buildcontext import BuildSource, base_images, pack_build_context
from episode_operator.taskfolder.image_refs import ImageMirrors
from episode_operator.taskfolder.sources import TaskFiles

LOG_LIMIT = 256 * 1024
# Past the Job's own deadline, how long to wait for Kubernetes to say it failed.
DEADLINE_MARGIN_SEC = 60.0
# Words of a pull error that mean "could not reach the registry", not "no such image".
UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|network is unreachable|TLS handshake|"
    r"server gave HTTP response to HTTPS client|connection reset|dial tcp",
    re.IGNORECASE,
)
MANIFEST_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Pod waiting reasons that mean the builder image will not start.
BUILDER_UNSTARTABLE = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}


@dataclass(frozen=True)
class BuildSettings:
    """Where builds run and push.

    ``registry`` is where the build pod pushes; ``pull_registry`` the same registry as the
    cluster's nodes name it (default: the same name). ``tls_verify`` False for a plain-HTTP registry.
    """

    namespace: str
    registry: str
    builder_image: str
    repository: str = "episode-operator/builds"
    pull_registry: str | None = None
    tls_verify: bool = True
    mirrors: ImageMirrors = field(default_factory=ImageMirrors)
    poll_first_sec: float = 0.5
    poll_max_sec: float = 5.0

    @property
    def pull_repository(self) -> str:
        """Where the cluster's nodes pull built images from: ``<pull registry>/<repository>``."""
        return f"{self.pull_registry or self.registry}/{self.repository}"

    def image(self, digest_hex: str, *, pull: bool) -> str:
        return f"{self.pull_repository if pull else f'{self.registry}/{self.repository}'}:{digest_hex}"

    def pinned(self, manifest_digest: str) -> str:
        """The built image as the nodes pull it, by the manifest digest the build pushed."""
        return f"{self.pull_repository}@{manifest_digest}"


JobVerdict = Literal["succeeded", "failed", "running"]


class BuildCoordinator:
    """Ensures images of build contexts exist in the registry; one per operator."""

    def __init__(
        self, client: KubeClient, settings: BuildSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock
        self._waits: dict[str, asyncio.Task[BuildOutcome]] = {}
        # Who hears why a build's pod waits: every caller waiting for that digest.
        self._listeners: dict[str, list[WaitingReport]] = {}

    async def ensure_image(
        self, files: TaskFiles, source: BuildSource, *, timeout_sec: float, waiting: WaitingReport | None = None
    ) -> BuildOutcome:
        """The image of ``source``'s context, built once per digest; never raises for a build's failure.

        ``waiting`` hears why the build's pod waits (unschedulable, its image not pulled…), and None
        once it runs; the log of a build this call made comes back with :class:`BuildReady`.
        """
        packed = pack_build_context(files, source, self.settings.mirrors)
        if len(packed.archive) > MAX_CONTEXT_BYTES:
            return BuildFailed(
                packed.digest,
                f"{source.context}/: the packed build context is {len(packed.archive)} bytes; in-cluster builds "
                f"take at most {MAX_CONTEXT_BYTES} (a ConfigMap carries it)",
            )
        spec = BuildJobSpec(
            namespace=self.settings.namespace,
            digest_hex=packed.hex,
            image=self.settings.image(packed.hex, pull=False),
            builder_image=self.settings.builder_image,
            timeout_sec=timeout_sec,
            base_images=base_images(packed.dockerfile_text, source.args),
            args=dict(source.args),
            target=source.target,
            tls_verify=self.settings.tls_verify,
        )
        running = self._waits.get(packed.digest)
        if running is None or running.done():
            running = asyncio.ensure_future(self._ensure(spec, packed.digest, packed.archive))
            self._waits[packed.digest] = running
        listeners = self._listeners.setdefault(packed.digest, [])
        if waiting is not None:
            listeners.append(waiting)
        try:
            # Shielded: one caller giving up (its Episode deleted) must not cancel the others' wait.
            return await asyncio.shield(running)
        finally:
            if waiting is not None:
                listeners.remove(waiting)

    async def _tell(self, digest: str, report: Waiting | None) -> None:
        for listener in list(self._listeners.get(digest, ())):
            with contextlib.suppress(Exception):  # a listener's failure is its own Episode's, not the build's
                await listener(report)

    async def _ensure(self, spec: BuildJobSpec, digest: str, archive: bytes) -> BuildOutcome:
        try:
            job = await self._find(spec)
            built = False
            if job is not None and self._verdict(job) == "failed":
                outcome = await self._classify(spec, digest, job)
                if isinstance(outcome, BuildFailed):
                    return outcome  # the task's failure: the Job is the cached verdict
                await self.client.delete_job(spec.namespace, spec.name)  # an outage: build again
                await self._wait_gone(spec)
                job = None
            if job is None:
                built = await self._create(spec, archive)
            job = await self._wait(spec, digest)
            if self._verdict(job) == "succeeded":
                manifest = await self._manifest_digest(spec, job)
                if manifest is None:
                    if built:
                        return BuildOutage(digest, "build", f"build {spec.name} pushed no manifest digest")
                    # A build of an older operator, its pod gone: built again, its digest then recorded.
                    await self.client.delete_job(spec.namespace, spec.name)
                    await self._wait_gone(spec)
                    return await self._ensure(spec, digest, archive)
                log = await self._log(spec) if built else b""
                image = self.settings.image(spec.digest_hex, pull=True)
                return BuildReady(image, digest, built, self.settings.pinned(manifest), log)
            return await self._classify(spec, digest, job)
        except KubeError as error:
            return BuildOutage(digest, "api", f"build {spec.name}: {error}")

    async def _manifest_digest(self, spec: BuildJobSpec, job: dict[str, Any]) -> str | None:
        """The manifest digest the succeeded build pushed: the Job's record, else its pod's termination
        message (then recorded on the Job, so that it outlives the pod); None when neither says."""
        recorded = ((job.get("metadata") or {}).get("annotations") or {}).get(MANIFEST_DIGEST_ANNOTATION, "")
        if MANIFEST_DIGEST.fullmatch(recorded):
            return str(recorded)
        pod = await self._pod(spec)
        terminated = ((_container_status(pod).get("state") or {}).get("terminated") or {}) if pod else {}
        message = str(terminated.get("message") or "").strip()
        if not MANIFEST_DIGEST.fullmatch(message):
            return None
        await self.client.annotate_job(spec.namespace, spec.name, {MANIFEST_DIGEST_ANNOTATION: message})
        return message

    async def _find(self, spec: BuildJobSpec) -> dict[str, Any] | None:
        try:
            return await self.client.read_job(spec.namespace, spec.name)
        except NotFound:
            return None

    async def _create(self, spec: BuildJobSpec, archive: bytes) -> bool:
        """Create the ConfigMap and the Job; False when another caller created the Job first."""
        await self.client.apply_config_map(context_config_map(spec, archive))
        try:
            await self.client.create_job(build_job(spec))
        except Conflict:
            return False
        return True

    async def _wait_gone(self, spec: BuildJobSpec) -> None:
        pause = self.settings.poll_first_sec
        while await self._find(spec) is not None:
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.settings.poll_max_sec)

    async def _wait(self, spec: BuildJobSpec, digest: str) -> dict[str, Any]:
        """Poll the Job until it is done (it bounds itself with activeDeadlineSeconds); say why its pod waits."""
        deadline = self.clock() + spec.timeout_sec + DEADLINE_MARGIN_SEC
        pause = self.settings.poll_first_sec
        said: Waiting | None = None
        while True:
            job = await self.client.read_job(spec.namespace, spec.name)
            if self._verdict(job) != "running":
                return job
            pod = await self._pod(spec)
            if pod is not None:
                verdict = pod_verdict(pod)
                if verdict.reason is not None and (verdict.unscheduled or verdict.waiting):
                    report = Waiting(pod["metadata"]["name"], "build", verdict.reason, verdict.message)
                    if report != said:
                        said = report
                        await self._tell(digest, report)
                elif said is not None and not verdict.lost:
                    said = None
                    await self._tell(digest, None)
            waiting = _waiting_reason(pod) if pod is not None else None
            if waiting in BUILDER_UNSTARTABLE or self.clock() > deadline:
                return job
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.settings.poll_max_sec)

    @staticmethod
    def _verdict(job: dict[str, Any]) -> JobVerdict:
        status = job.get("status") or {}
        if status.get("succeeded"):
            return "succeeded"
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
        if status.get("failed") or "Failed" in conditions:
            return "failed"
        return "running"

    async def _pod(self, spec: BuildJobSpec) -> dict[str, Any] | None:
        pods = await self.client.list_pods(spec.namespace, f"job-name={spec.name}")
        return pods[-1] if pods else None

    async def _log(self, spec: BuildJobSpec, pod: dict[str, Any] | None = None) -> bytes:
        """The build pod's log (best effort: a log is never worth failing a build for)."""
        pod = pod or await self._pod(spec)
        if pod is None:
            return b""
        with contextlib.suppress(KubeError):
            return await self.client.read_pod_log(
                spec.namespace, pod["metadata"]["name"], "build", limit_bytes=LOG_LIMIT
            )
        return b""

    async def _classify(self, spec: BuildJobSpec, digest: str, job: dict[str, Any]) -> BuildOutcome:
        """What a failed (or stuck) build means, from the Job's condition and the script's exit code."""
        pod = await self._pod(spec)
        log = await self._log(spec, pod)
        waiting = _waiting_reason(pod) if pod is not None else None
        if waiting in BUILDER_UNSTARTABLE:
            message = f"build {spec.name}: the builder image cannot start ({waiting})"
            return BuildOutage(digest, "builder-image", message, log)
        conditions = (job.get("status") or {}).get("conditions") or []
        if any(condition.get("reason") == "DeadlineExceeded" for condition in conditions):
            return BuildFailed(digest, f"build {spec.name} ran past build_timeout_sec ({spec.timeout_sec:g} s)", log)
        code = _exit_code(pod) if pod is not None else None
        tail = _last_line(log)
        if code == EXIT_BUILD:
            return BuildFailed(digest, f"build {spec.name}: the Dockerfile failed to build: {tail}", log)
        if code == EXIT_PULL:
            if UNREACHABLE.search(log.decode("utf-8", "replace")):
                message = f"build {spec.name}: cannot reach a registry to pull: {tail}"
                return BuildOutage(digest, "registry", message, log)
            return BuildFailed(digest, f"build {spec.name}: a base image cannot be pulled: {tail}", log)
        if code == EXIT_PUSH:
            message = f"build {spec.name}: cannot push to {self.settings.registry}: {tail}"
            return BuildOutage(digest, "registry", message, log)
        if code == EXIT_CONTEXT:
            message = f"build {spec.name}: the build context could not be unpacked"
            return BuildOutage(digest, "build-context", message, log)
        return BuildOutage(digest, "build", f"build {spec.name} failed ({_describe_pod(pod)}): {tail}", log)


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _waiting_reason(pod: dict[str, Any]) -> str | None:
    reason = ((_container_status(pod).get("state") or {}).get("waiting") or {}).get("reason")
    return str(reason) if reason else None


def _exit_code(pod: dict[str, Any]) -> int | None:
    terminated = (_container_status(pod).get("state") or {}).get("terminated") or {}
    code = terminated.get("exitCode")
    return int(code) if code is not None else None


def _describe_pod(pod: dict[str, Any] | None) -> str:
    if pod is None:
        return "no build pod"
    code = _exit_code(pod)
    return f"exit code {code}" if code is not None else f"pod {(pod.get('status') or {}).get('phase', 'unknown')}"


def _last_line(log: bytes) -> str:
    lines = [line for line in log.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(no output)"
