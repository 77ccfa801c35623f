"""The Kubernetes implementation of the runtime's sandbox: pods, exec and the supervisor.

:class:`KubeSandbox` turns each runtime operation into one call of a supervisor verb (the
command lines come from :mod:`episode_operator.runtime.supervisor`, so this module only ships
them): on the container's open session when it can take it (``kube/session.py``: a round trip
instead of an exec), else by an exec of its own. :class:`KubeProvider` creates an episode's
pods, waits until they can work —
telling an image that cannot be pulled from one that is still coming, and saying why a pod
waits (its state, else its latest Event) as soon as it says anything — places the supervisor
and removes the pods when the runtime lets them go.

A pod the scheduler cannot place waits up to the operator's ``--unschedulable-timeout``
(capacity other Episodes hold comes free as they finish); once placed, it must run within
``build_timeout_sec``. Past either bound the attempt is an outage that names the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from episode_operator.api.episode_resource import KIND, EpisodeSpec
from episode_operator.api.vocabulary import (
    ATTEMPT_LABEL,
    EPISODE_LABEL,
    POOL_CLAIMED_LABEL,
    ROLE_LABEL,
    TURN_LABEL,
    OutageKind,
)
from episode_operator.kube.client import ExecTransportError, KubeClient, KubeError, NotFound
from episode_operator.kube.objects.network import network_policy
from episode_operator.kube.objects.pod_state import latest_event, pod_verdict
from episode_operator.kube.objects.pods import (
    AgentImages,
    OwnerRef,
    SandboxPod,
    SandboxRequests,
    agent_pod_name,
    environment_files_config_map,
    episode_selector,
    label_value,
    sandbox_pod,
    verifier_pod_name,
    verifier_requests,
    verifier_reservation,
)
from episode_operator.kube.objects.prepull_plan import image_affinity, nodes_holding, prepull_selector
from episode_operator.kube.objects.warm_pool_plan import pool_placement
from episode_operator.kube.session import ExecStream, Session, SessionFailed
from episode_operator.kube.warm_pool import PoolRef, claim
from episode_operator.runtime import supervisor
from episode_operator.runtime.agents.model import CAPTURE_CONTAINER, SandboxNeeds
from episode_operator.runtime.limits import OutputLimits, Spool
from episode_operator.runtime.sandbox_protocol import (
    MAIN_CONTAINER,
    ArchiveFile,
    CommandFailed,
    FileContent,
    JobSpec,
    JobState,
    SandboxError,
    Upload,
    Waiting,
    WaitingReport,
)
from episode_operator.runtime.timing import DEFAULT_TIMING, Timing
from episode_operator.runtime.turn.context import SANDBOX_LAYOUT
from episode_operator.runtime.wakeups import Wakeups, nap
from episode_operator.taskfolder import EpisodePlan
from episode_operator.taskfolder.compose import Sidecar
from episode_operator.taskfolder.plan import NetworkPolicy, VerifierPlan, baseline_policy

PUBLIC = NetworkPolicy()


# Waiting reasons that never resolve by waiting; the others get a grace period first.
HOPELESS_WAITING = {"ErrImageNeverPull", "InvalidImageName"}
PULL_WAITING = {"ErrImagePull", "ImagePullBackOff"}
CONFIG_WAITING = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
EXEC_MARGIN_SEC = 30.0
# How long an exec that moves an archive may take.
UPLOAD_TIMEOUT_SEC = 300.0


@dataclass
class KubeSandbox:
    """One running pod, driven through its supervisor; every answer held to its bound (``limits``)."""

    client: KubeClient
    namespace: str
    name: str
    uid: str = ""
    workdir: str = "/"
    facts: dict[str, str] = field(default_factory=dict)
    # Per container, the session its calls go on when they can (kube/session.py).
    sessions: dict[str, Session] = field(default_factory=dict)
    limits: OutputLimits = field(default_factory=OutputLimits)

    def _session(self, container: str) -> Session:
        session = self.sessions.get(container)
        if session is None:

            async def opener() -> ExecStream:
                return await self.client.exec_stream(self.namespace, self.name, container, supervisor.serve().argv)

            session = self.sessions[container] = Session(opener)
        return session

    async def _call(self, command: supervisor.Command, container: str, timeout_sec: float, stdout: Spool) -> _Ran:
        """On the container's session if it takes the call, else (or when the session fails) by exec."""
        session = self._session(container)
        metrics = getattr(self.client, "metrics", None)
        if session.takes(command):
            with contextlib.suppress(SessionFailed):
                result = _Ran(*await session.call(command, timeout_sec, stdout))
                if metrics is not None:
                    metrics.sandbox_calls.labels("session").inc()
                return result
        if metrics is not None:
            metrics.sandbox_calls.labels("exec").inc()
        stderr = Spool(command.answer.stderr, f"the stderr with {command.answer.what}", "its bound")
        with stderr:
            exit_code = await self.client.exec(
                self.namespace,
                self.name,
                container,
                command.argv,
                stdout=stdout,
                stderr=stderr,
                stdin=command.stdin,
                stdin_file=command.stdin_file,
                timeout_sec=timeout_sec,
            )
            return _Ran(exit_code, stderr.getvalue())

    def open_session(self, container: str = MAIN_CONTAINER) -> None:
        """Open the container's session in the background, ahead of its first call (kube/session.py)."""
        self._session(container).open_ahead()

    async def close(self) -> None:
        """Close the sessions (the pod is going away, or this sandbox is no longer used)."""
        for session in self.sessions.values():
            await session.close()

    async def _run(
        self, command: supervisor.Command, *, container: str = MAIN_CONTAINER, timeout_sec: float = 60.0
    ) -> Spool:
        """The answer's stdout, bounded by the command's bound (close it when done)."""
        stdout = command.answer.spool()
        try:
            await self._checked(command, container, timeout_sec, stdout)
        except BaseException:
            stdout.close()
            raise
        return stdout

    async def _small(
        self, command: supervisor.Command, *, container: str = MAIN_CONTAINER, timeout_sec: float = 60.0
    ) -> bytes:
        """The answer's stdout in memory: for commands whose bound is small."""
        with await self._run(command, container=container, timeout_sec=timeout_sec) as stdout:
            return stdout.getvalue()

    async def _checked(self, command: supervisor.Command, container: str, timeout_sec: float, stdout: Spool) -> None:
        try:
            result = await self._call(command, container, timeout_sec, stdout)
        except NotFound as error:
            raise SandboxError(f"pod {self.name} is gone", kind="pod_lost") from error
        except ExecTransportError as error:
            kind, detail = await self._transport_kind()
            raise SandboxError(f"{error}; {detail}" if detail else str(error), kind=kind) from error
        except KubeError as error:
            raise SandboxError(str(error), kind="api") from error
        if result.exit_code >= 128:
            # Killed by a signal: the pod may be going away under the command.
            kind, detail = await self._transport_kind()
            if kind != "exec":
                raise SandboxError(
                    f"{command.argv[2] if len(command.argv) > 2 else command.argv[0]} was killed; {detail}", kind=kind
                )
        if result.exit_code != 0:
            detail = result.stderr.decode("utf-8", "replace").strip() or f"exit {result.exit_code}"
            raise CommandFailed(
                f"{command.argv[2] if len(command.argv) > 2 else command.argv[0]}: {detail}",
                step=supervisor.failed_step(result.stderr),
            )

    async def _transport_kind(self) -> tuple[OutageKind, str]:
        """After exec gave up: was the pod lost, a container killed (e.g. OOM), or only the connection?"""
        try:
            pod = await self.client.read_pod(self.namespace, self.name)
        except NotFound:
            return "pod_lost", f"pod {self.name} is gone"
        except KubeError:
            return "exec", ""
        verdict = pod_verdict(pod)
        if verdict.lost:
            kind: OutageKind = "container_exited" if verdict.message.startswith("container ") else "pod_lost"
            if ((pod.get("status") or {}).get("reason") or "") in ("Evicted", "NodeLost", "Shutdown", "Terminated"):
                kind = "pod_lost"
            return kind, f"pod {self.name}: {verdict.message}"
        return "exec", ""

    async def place_supervisor(self, sidecars: Sequence[str] = (), *, layout: Sequence[str] = ()) -> None:
        """Put the supervisor in the pod, make its ``layout`` folders, learn its working directory (idempotent).

        Placing it from a sidecar too records that container's own working directory, the
        default ``cwd`` of its collect hooks. A sidecar without ``sh`` cannot run hooks; its
        hooks then fail when they run, best effort as Gym treats them.
        """
        self.placed(await self._small(supervisor.placement(layout=layout, limits=self.limits)))
        for container in sidecars:
            with contextlib.suppress(CommandFailed, SandboxError):
                await self._small(supervisor.placement(limits=self.limits), container=container)

    def placed(self, answer: bytes) -> None:
        """Learn the facts (its working directory…) from the answer of the supervisor's placement in the main
        container, wherever it ran (:meth:`place_supervisor`, or with a claimed pool pod's probe)."""
        self.facts = supervisor.parse_probe(answer)
        self.workdir = self.facts.get("workdir") or "/"

    async def start_job(self, spec: JobSpec, *, wait_sec: float = 0.0, upload: Upload | None = None) -> JobState:
        command = supervisor.start(spec, wait_sec=wait_sec, upload=upload, limits=self.limits)
        timeout_sec = wait_sec + (UPLOAD_TIMEOUT_SEC if upload is not None else EXEC_MARGIN_SEC)
        with await self._run(command, container=spec.container, timeout_sec=timeout_sec) as answer:
            return await self._parsed(spec, answer)

    async def _parsed(self, spec: JobSpec, answer: Spool) -> JobState:
        """A start or wait answer read; one in a scratch file (a download, a big tail) by a worker thread."""
        if answer.in_memory:
            return supervisor.parse_answer(spec, answer, self.limits)
        return await asyncio.to_thread(supervisor.parse_answer, spec, answer, self.limits)

    async def wait_job(self, spec: JobSpec, *, max_wait_sec: float) -> JobState:
        command = supervisor.wait(spec, max_wait_sec, limits=self.limits)
        timeout_sec = max_wait_sec + (UPLOAD_TIMEOUT_SEC if spec.download_after else EXEC_MARGIN_SEC)
        with await self._run(command, container=spec.container, timeout_sec=timeout_sec) as answer:
            return await self._parsed(spec, answer)

    async def job_output(self, job_id: str, *, container: str = MAIN_CONTAINER, limit: int) -> bytes:
        return await self._small(supervisor.output(job_id, limit, limits=self.limits), container=container)

    async def upload(
        self,
        archive: bytes | ArchiveFile,
        destination: str,
        *,
        container: str = MAIN_CONTAINER,
        clear: Sequence[str] = (),
    ) -> None:
        command = supervisor.upload(archive, destination, clear=clear, limits=self.limits)
        await self._small(command, container=container, timeout_sec=UPLOAD_TIMEOUT_SEC)

    async def download(
        self, paths: Sequence[str], *, container: str = MAIN_CONTAINER, exclude: Sequence[str] = ()
    ) -> ArchiveFile:
        command = supervisor.download(paths, exclude, limits=self.limits)
        with await self._run(command, container=container, timeout_sec=UPLOAD_TIMEOUT_SEC) as answer:
            return answer.to_file()

    async def read_files(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> dict[str, FileContent]:
        with await self._run(supervisor.read_files(paths, limits=self.limits), container=container) as answer:
            return supervisor.parse_files(answer, paths, self.limits)

    async def clear(self, paths: Sequence[str], *, container: str = MAIN_CONTAINER) -> None:
        await self._small(supervisor.clear(paths, limits=self.limits), container=container)

    async def switch_user(self, user: str | int, workdir: str | None) -> None:
        await self._small(supervisor.chown_workdir(user, workdir or self.workdir, limits=self.limits))


@dataclass(frozen=True)
class _Ran:
    """How a call went: its exit code and its stderr (its stdout went to its spool)."""

    exit_code: int
    stderr: bytes


@dataclass
class KubeProvider:
    """Creates, re-attaches and removes one Episode's pods."""

    client: KubeClient
    episode: OwnerRef
    spec: EpisodeSpec
    plan: EpisodePlan
    image: str
    main_env: Mapping[str, str]
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    # What the agent kind adds to the agent pod (toolchains, the capture proxy), and from which images.
    needs: SandboxNeeds = field(default_factory=SandboxNeeds)
    images: AgentImages = field(default_factory=AgentImages)
    # How much of [environment]'s limits its pods request (--cpu-request-fraction).
    sandbox_requests: SandboxRequests = field(default_factory=SandboxRequests)
    # The files the task's compose binds name (compose.bound_archive), brought into the agent pod by a ConfigMap.
    bound_files: bytes | None = None
    # How long an image may fail to pull and a pod wait for the scheduler before the attempt is an outage.
    timing: Timing = DEFAULT_TIMING
    # A pod that waits this long without saying why is asked for its Events (and again as often).
    events_after_sec: float = 5.0
    # Woken when a pod of the episode changes (the operator's pod watch): a starting pod is
    # read then. Without them pod start is polled, quickly at first (most pods run within a
    # second), then less often; with them the poll only covers a missed event, so it starts
    # slow: a fast poll read the pod ~9 times per start where its changes need ~3 reads.
    wakeups: Wakeups | None = None
    poll_first_sec: float = 0.05
    poll_max_sec: float = 1.0
    watched_poll_first_sec: float = 1.0
    watched_poll_max_sec: float = 5.0
    clock: Callable[[], float] = time.monotonic
    # What the sandboxes' answers may hold (runtime/limits.py).
    limits: OutputLimits = field(default_factory=OutputLimits)
    # Whether a verifier of a turn before the last runs beside the attempt's agent pod, on the capacity it
    # reserved; a regrade (runtime/regrade.py) has no agent pod, and each verifier asks for its own.
    verifiers_beside_agent: bool = True
    # The set whose warm pool the agent pod may be claimed from (docs/warm-pools.md); None: always a fresh pod.
    pool: PoolRef | None = None
    # The set whose pre-pull DaemonSet shows which nodes hold the images (docs/prepull.md); None: no preference.
    prepull: PoolRef | None = None

    _applied: dict[str, NetworkPolicy] = field(default_factory=dict)
    # Built images' tags → the same images by manifest digest (pin_images): what pods name.
    _pins: dict[str, str] = field(default_factory=dict)
    # The sandboxes handed out, by pod: their sessions are closed before their pod is deleted.
    _sandboxes: dict[str, KubeSandbox] = field(default_factory=dict)
    # The agent pods claimed from the pool, by attempt (their names are the pool's, not agent_pod_name's).
    _claimed: dict[int, str] = field(default_factory=dict)
    # The attempts of a pooled Episode known to run in a pod of their own (agent_pod_name's): never listed again.
    _fresh: set[int] = field(default_factory=set)

    def pin_images(self, pins: Mapping[str, str]) -> None:
        self._pins.update(pins)

    def _pinned(self, image: str) -> str:
        return self._pins.get(image, image)

    def _pinned_sidecars(self, sidecars: Sequence[Sidecar]) -> list[Sidecar]:
        return [
            sidecar.model_copy(update={"image": self._pins[sidecar.image]})
            if sidecar.image is not None and sidecar.image in self._pins
            else sidecar
            for sidecar in sidecars
        ]

    async def apply_network(self, attempt: int, policy: NetworkPolicy) -> None:
        await self._network(agent_pod_name(self.episode.name, attempt), self._selector(attempt, "agent", None), policy)

    def _selector(self, attempt: int, role: str, turn: int | None) -> dict[str, str]:
        labels = {EPISODE_LABEL: label_value(self.episode.name), ATTEMPT_LABEL: str(attempt), ROLE_LABEL: role}
        if turn is not None:
            labels[TURN_LABEL] = str(turn + 1)
        return labels

    async def _network(self, name: str, selector: dict[str, str], policy: NetworkPolicy) -> None:
        """Create, replace or delete the pod's NetworkPolicy so that it says ``policy``."""
        if self._applied.get(name, PUBLIC) == policy:
            return
        manifest = network_policy(self.episode, name, selector, policy)
        try:
            if manifest is None:
                await self.client.delete_network_policy(self.episode.namespace, name)
            else:
                await self.client.apply_network_policy(manifest)
        except KubeError as error:
            raise SandboxError(f"cannot set the network policy of {name}: {error}", kind="api") from error
        self._applied[name] = policy

    async def agent(self, attempt: int, *, waiting: WaitingReport | None = None, uid: str | None = None) -> KubeSandbox:
        pod = SandboxPod(
            role="agent",
            attempt=attempt,
            image=self._pinned(self.image),
            environment=self.plan.environment,
            env=self.main_env,
            sidecars=self._pinned_sidecars(self.plan.sidecars),
            network=baseline_policy(self.plan.environment),
            needs=self.needs,
            reservation=verifier_reservation(self.plan, self.sandbox_requests),
            requests=self.sandbox_requests,
            volumes=self.plan.main_volumes,
            environment_files=await self._bound_files_config_map(),
        )
        return await self._ready(pod, waiting, uid)

    async def _bound_files_config_map(self) -> str | None:
        """The ConfigMap of the files the compose binds name, made if missing (it is named by its
        content, so one that exists holds them): its name, None for a task without binds."""
        if self.bound_files is None:
            return None
        manifest = environment_files_config_map(self.episode, self.bound_files)
        try:
            await self.client.apply_config_map(manifest)
        except KubeError as error:
            raise SandboxError(f"cannot make the ConfigMap of the bound files: {error}", kind="api") from error
        return str(manifest["metadata"]["name"])

    async def verifier(
        self,
        attempt: int,
        turn: int,
        plan: VerifierPlan,
        *,
        waiting: WaitingReport | None = None,
        uid: str | None = None,
    ) -> KubeSandbox:
        assert plan.environment is not None
        # Harbor's verifier environment is environment/: its compose file runs there too, in this new pod.
        sidecars = self._pinned_sidecars(self.plan.sidecars) if plan.compose else []
        node: str | None = None
        beside = self.verifiers_beside_agent and turn < len(self.plan.turns) - 1
        if beside and verifier_requests(plan, sidecars, self.sandbox_requests):
            node = await self._agent_node(attempt)
        pod = SandboxPod(
            role="verifier",
            attempt=attempt,
            image=self._pinned(plan.image or self.image),
            environment=plan.environment,
            env={**self.plan.compose_env, **plan.environment.env} if plan.compose else plan.environment.env,
            sidecars=sidecars,
            turn=turn,
            network=plan.network,
            node_name=node,
            requests=self.sandbox_requests,
            volumes=self.plan.main_volumes if plan.compose else (),
            environment_files=await self._bound_files_config_map() if plan.compose else None,
        )
        return await self._ready(pod, waiting, uid)

    async def _agent_name(self, attempt: int) -> str:
        """The attempt's agent pod's name: the pool pod it claimed, else the one it made."""
        if attempt not in self._claimed and attempt not in self._fresh and self.pool is not None:
            try:
                pooled = await self._pooled(attempt, None)
            except KubeError as error:
                raise SandboxError(str(error), kind="api") from error
            if pooled is not None:
                self._claimed[attempt] = pooled["metadata"]["name"]
        return self._claimed.get(attempt) or agent_pod_name(self.episode.name, attempt)

    async def _pooled(self, attempt: int, recorded: str | None) -> dict[str, Any] | None:
        """The pool pod this attempt claimed (the recorded one, when it recorded one), if it is there."""
        selector = ",".join(f"{k}={v}" for k, v in self._selector(attempt, "agent", None).items())
        for pod in await self.client.list_pods(self.episode.namespace, f"{selector},{POOL_CLAIMED_LABEL}"):
            metadata = pod.get("metadata") or {}
            if metadata.get("deletionTimestamp") or not _owned_by(pod, self.episode.uid):
                continue
            if recorded is None or metadata.get("uid") == recorded:
                return pod
        return None

    async def _agent_node(self, attempt: int) -> str:
        """The agent pod's node: a verifier beside it runs there, on the capacity it reserved."""
        name = await self._agent_name(attempt)
        try:
            node = (await self.client.read_pod(self.episode.namespace, name)).get("spec", {}).get("nodeName")
        except NotFound:
            raise SandboxError(f"pod {name} is gone: its verifier has no capacity to run on", kind="pod_lost") from None
        except KubeError as error:
            raise SandboxError(f"pod {name}: {error}", kind="api") from error
        if not node:
            raise SandboxError(f"pod {name} runs on no node", kind="pod_lost")
        return str(node)

    async def release_verifier(self, attempt: int, turn: int) -> None:
        await self._delete(verifier_pod_name(self.episode.name, attempt, turn))

    async def release_agent(self, attempt: int) -> None:
        await self._delete(await self._agent_name(attempt))

    async def release_all(self, *, keep: bool) -> None:
        if keep:
            return
        try:
            pods = await self.client.list_pods(self.episode.namespace, episode_selector(self.episode.name))
        except KubeError as error:
            raise SandboxError(str(error), kind="api") from error
        for pod in pods:
            await self._delete(pod["metadata"]["name"])
        if self._applied or self.plan.environment.network_mode != "public":
            try:
                await self.client.delete_network_policies(self.episode.namespace, episode_selector(self.episode.name))
            except KubeError as error:
                raise SandboxError(str(error), kind="api") from error
            self._applied.clear()

    async def _delete(self, name: str) -> None:
        sandbox = self._sandboxes.pop(name, None)
        if sandbox is not None:
            await sandbox.close()
        try:
            await self.client.delete_pod(self.episode.namespace, name)
        except KubeError as error:
            raise SandboxError(str(error), kind="api") from error

    async def _ready(self, pod: SandboxPod, waiting: WaitingReport | None, recorded: str | None) -> KubeSandbox:
        """The pod running, with the supervisor in place; created only when the attempt recorded none
        (``recorded``: its uid as the attempt saw it run). A recorded pod that is gone, or there with
        another uid (deleted and made again by someone), is lost: never created again under it."""
        manifest = sandbox_pod(self.episode, self.spec, pod, extra_labels=self.extra_labels, images=self.images)
        name = manifest["metadata"]["name"]
        # The policy exists before the pod, so a restricted sandbox is never briefly open.
        await self._network(name, self._selector(pod.attempt, pod.role, pod.turn), pod.network)
        registration = (
            self.wakeups.registered(self.episode.namespace, name)
            if self.wakeups is not None
            else contextlib.nullcontext(None)
        )
        pooling = pod.role == "agent" and self.pool is not None
        # An attempt known to run in a pod of its own has no claimed pod to look for (nor a pool to claim from).
        claimable = pooling and pod.attempt not in self._fresh
        placed: bytes | None = None  # the supervisor's placement's answer, when it ran with a claim's probe
        with registration as changed:
            try:
                existing = await self._pooled(pod.attempt, recorded) if claimable else None
                try:
                    if existing is None:
                        existing = await self._not_anothers(
                            await self.client.read_pod(self.episode.namespace, name),
                            changed,
                            pod.environment.build_timeout_sec,
                        )
                except NotFound:
                    if recorded is not None:
                        raise SandboxError(
                            f"pod {name} (uid {recorded}) is gone, and what the attempt did in it with it",
                            kind="pod_lost",
                        ) from None
                    if claimable:
                        assert self.pool is not None
                        # Placed with the claim's probe (one exec): a claimed pod has no sidecar to place into.
                        placement = pool_placement(self.limits)
                        claimed = await claim(self.client, self.episode, self.pool, manifest, placement=placement)
                        if claimed is not None:
                            existing, placed = claimed.pod, claimed.placed
                    if existing is None:
                        if pod.role == "agent" and self.prepull is not None:
                            manifest = await self._near_images(manifest, self.prepull)
                        existing = await self.client.create_pod(self.episode.namespace, manifest)
                if existing["metadata"]["name"] != name:
                    name = self._claimed[pod.attempt] = existing["metadata"]["name"]
                elif pooling:
                    self._fresh.add(pod.attempt)
                uid = str((existing.get("metadata") or {}).get("uid") or "")
                if recorded is not None and uid != recorded:
                    raise SandboxError(
                        f"pod {name} was replaced (uid {uid}, the attempt's was {recorded}): "
                        "what the attempt did in it is lost",
                        kind="pod_lost",
                    )
                await self._wait_running(
                    name, pod.role, pod.environment.build_timeout_sec, changed, waiting, uid, seen=existing
                )
            except KubeError as error:
                raise SandboxError(f"pod {name}: {error}", kind="api") from error
        sandbox = self._sandboxes.get(name)
        if sandbox is None or sandbox.uid != uid:
            sandbox = KubeSandbox(self.client, self.episode.namespace, name, uid, limits=self.limits)
        self._sandboxes[name] = sandbox
        if placed is not None and not pod.sidecars and pod.needs.capture is None:
            sandbox.placed(placed)
        else:
            try:
                await sandbox.place_supervisor(
                    [sidecar.name for sidecar in pod.sidecars]
                    + ([CAPTURE_CONTAINER] if pod.needs.capture is not None else []),
                    layout=SANDBOX_LAYOUT,
                )
            except CommandFailed as error:
                raise SandboxError(f"cannot place the supervisor in {name}: {error}", kind="supervisor") from error
        # The first job comes once the runner has written the pod's record and its stage: the exec that opens
        # the session runs meanwhile, not after.
        sandbox.open_session()
        return sandbox

    async def _near_images(self, manifest: dict[str, Any], prepull: PoolRef) -> dict[str, Any]:
        """A fresh pod preferring the nodes its set's pre-pull shows holding its images (the key a pool claim
        compares is taken before: a pool pod is never passed over for it). Unread, the pod goes as it is."""
        try:
            pods = await self.client.list_pods(self.episode.namespace, prepull_selector(prepull.name))
        except KubeError:
            return manifest
        return image_affinity(manifest, nodes_holding(pods))

    async def _not_anothers(
        self, existing: dict[str, Any], changed: asyncio.Event | None, timeout_sec: float
    ) -> dict[str, Any]:
        """``existing``, when it is this Episode's; NotFound once it is gone, when it is another's.

        Another Episode's pod of this name is an earlier Episode's of the same name (Gym's try sent
        again after its cancellation, a GitOps re-apply), deleted with it and still terminating. It is
        never adopted: what ran in it is not this Episode's.
        """
        name = existing["metadata"]["name"]
        pause = self.poll_first_sec
        deadline = self.clock() + timeout_sec
        while not _owned_by(existing, self.episode.uid):
            if self.clock() > deadline:
                raise SandboxError(
                    f"pod {name} of an earlier Episode of this name is still there after {timeout_sec:.0f} s",
                    kind="pod_lost",
                )
            if changed is None:
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.poll_max_sec)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.watched_poll_max_sec)
                changed.clear()
            existing = await self.client.read_pod(self.episode.namespace, name)  # NotFound once it is gone
        return existing

    async def _wait_running(
        self,
        name: str,
        role: str,
        start_timeout_sec: float,
        changed: asyncio.Event | None,
        waiting: WaitingReport | None,
        uid: str,
        *,
        seen: Mapping[str, Any] | None = None,
    ) -> None:
        """Until every container runs and the sidecars are ready; outages are told apart by reason.

        ``seen``: the pod as the caller just got it (created, read, or claimed: a claimed pool pod runs
        already); when it is this uid's and ready, the pod is not read again.

        The pod is read when ``changed`` is set (by the pod watch) or the poll comes due. Why it
        waits goes to ``waiting`` when the pod says (unschedulable, an image pull failing…) or,
        when it says nothing for ``events_after_sec``, from its latest Event; None once it runs.
        """
        report = _Reporter(name, role, waiting)
        if seen is not None and (seen.get("metadata") or {}).get("uid") == uid and pod_verdict(seen).ready:
            await report.running()
            return
        started = self.clock()
        unscheduled_since: float | None = None
        pulling_since: float | None = None
        events_due = started + self.events_after_sec
        pause, longest = (
            (self.poll_first_sec, self.poll_max_sec)
            if changed is None
            else (self.watched_poll_first_sec, self.watched_poll_max_sec)
        )
        while True:
            if changed is not None:
                changed.clear()  # before the read: a change after it wakes the nap below
            try:
                pod = await self.client.read_pod(self.episode.namespace, name)
            except NotFound:
                raise SandboxError(f"pod {name} was deleted while starting", kind="pod_lost") from None
            if (pod.get("metadata") or {}).get("uid") != uid:
                raise SandboxError(f"pod {name} was deleted and made again while starting", kind="pod_lost")
            verdict = pod_verdict(pod)
            if verdict.ready:
                await report.running()
                return
            if verdict.lost:
                raise SandboxError(f"pod {name}: {verdict.message}", kind="pod_lost")
            if verdict.waiting in HOPELESS_WAITING:
                raise SandboxError(f"pod {name}: {verdict.message}", kind="image_pull")
            now = self.clock()
            if verdict.unscheduled:
                unscheduled_since = unscheduled_since if unscheduled_since is not None else now
                started = now  # the start bound counts from the pod's placement
                if now - unscheduled_since > self.timing.unschedulable_timeout_sec:
                    raise SandboxError(
                        f"pod {name} could not be scheduled for {self.timing.unschedulable_timeout_sec:.0f} s: "
                        f"{verdict.message.removeprefix('not scheduled: ')}",
                        kind="unschedulable",
                    )
            if verdict.waiting in PULL_WAITING | CONFIG_WAITING:
                pulling_since = pulling_since if pulling_since is not None else now
                if now - pulling_since > self.timing.pull_grace_sec:
                    waited: OutageKind = "image_pull" if verdict.waiting in PULL_WAITING else "container_config"
                    raise SandboxError(f"pod {name}: {verdict.message}", kind=waited)
            else:
                pulling_since = None
            if verdict.unscheduled or verdict.waiting:
                assert verdict.reason is not None
                await report.waits(verdict.reason, verdict.message)
            elif now >= events_due:
                # Nothing in the pod's state says why: its Events do (pulling, a failed mount…).
                events_due = now + self.events_after_sec
                with contextlib.suppress(KubeError):
                    event = latest_event(await self.client.list_pod_events(self.episode.namespace, name))
                    if event is not None:
                        await report.waits(*event)
            if now - started > start_timeout_sec:
                raise SandboxError(
                    f"pod {name} not ready after {start_timeout_sec:.0f} s: {verdict.message}", kind="start_timeout"
                )
            await nap(changed, pause)
            pause = min(pause * 1.5, longest)


@dataclass
class _Reporter:
    """Tells ``waiting`` why a pod waits, once per change, and that it runs (the listener keeps the
    record of what it was told, so a restarted operator's first "runs" clears an old "waits")."""

    pod: str
    role: str
    waiting: WaitingReport | None
    said: tuple[str, str] | None = None

    async def waits(self, reason: str, message: str) -> None:
        if self.waiting is not None and (reason, message) != self.said:
            self.said = (reason, message)
            await self.waiting(Waiting(self.pod, self.role, reason, message))

    async def running(self) -> None:
        if self.waiting is not None:
            await self.waiting(None)


def _owned_by(pod: Mapping[str, Any], uid: str) -> bool:
    """Whether the pod is not another Episode's: no owner reference names an Episode of another uid."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return not any(ref.get("kind") == KIND and ref.get("uid") != uid for ref in owners)
