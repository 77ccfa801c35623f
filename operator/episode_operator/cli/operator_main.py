"""``episode-operator``: run the operator."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from episode_operator.capture.capture_store import MAX_JOURNAL_BYTES, MAX_RECORD_BYTES
from episode_operator.cli.capture import COMMANDS as CAPTURE_COMMANDS
from episode_operator.runtime.allocator import release_free_memory_every, tune_allocator
from episode_operator.runtime.limits import LIMIT_FLAGS, OutputLimits, format_size, parse_size
from episode_operator.runtime.oci_tasks import DEFAULT_ARTIFACT_LIMIT, DEFAULT_CACHE_LIMIT, TaskArtifactSettings
from episode_operator.runtime.timing import DEFAULT_TIMING
from episode_operator.taskfolder.image_refs import ImageMirrors, InvalidImageReference

RELEASE_INTERVAL_SEC = 30.0
# The builder image `hack/cluster images` makes (buildah from Debian); elsewhere, build and push your own.
BUILDER_IMAGE = "episode-operator.local/builder:bookworm"
DEFAULT_BUILD_NAMESPACE = "episode-operator-builds"


def parse_image_mirrors(_context: click.Context, _parameter: click.Parameter, values: tuple[str, ...]) -> ImageMirrors:
    """``--image-mirror FROM=TO`` values as mirror rules; a bad one is a usage error naming it."""
    try:
        return ImageMirrors.parse(values)
    except InvalidImageReference as error:
        raise click.BadParameter(str(error)) from error


# A Kubernetes resource quantity (``10m``, ``64Mi``, ``1``), as --capture-requests/--capture-limits take them.
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")


MIB = 1024 * 1024


def parse_resources(_context: click.Context, parameter: click.Parameter, value: str) -> dict[str, str]:
    """``cpu=10m,memory=64Mi`` as a resource list; a bad entry is a usage error naming it."""
    resources: dict[str, str] = {}
    for entry in filter(None, (piece.strip() for piece in value.split(","))):
        name, _, quantity = entry.partition("=")
        if name not in RESOURCE_NAMES or not QUANTITY.match(quantity):
            raise click.BadParameter(
                f"{entry!r}: expected NAME=QUANTITY with NAME one of {', '.join(RESOURCE_NAMES)} (e.g. memory=64Mi)"
            )
        resources[name] = quantity
    return resources


def default_capture_resources(which: str) -> str:
    from episode_operator.runtime.agents import model

    quantities: dict[str, str] = getattr(model, which)
    return ",".join(f"{name}={quantity}" for name, quantity in quantities.items())


def limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One flag per bound of runtime/limits.py (``--answer-limit 4Mi`` …), from its table."""
    defaults = OutputLimits()
    for name, limit in reversed(LIMIT_FLAGS.items()):
        size = name.endswith("_bytes")
        default = getattr(defaults, name)
        command = click.option(
            limit.flag,
            name,
            default=format_size(default) if size else str(default),
            show_default=True,
            callback=_size,
            metavar="SIZE" if size else "N",
            help=limit.bounds
            + (" Bytes, or with Ki, Mi, Gi." if size else "")
            + ("" if name == "log_bytes" else " An agent's pod sending more fails its turn (agent:output_limit)."),
        )(command)
    return command


def _size(_context: click.Context, parameter: click.Parameter, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as error:
        raise click.BadParameter(str(error), param=parameter) from error


def size_option(flag: str, default: int, help_text: str) -> Callable[..., Any]:
    """A ``SIZE`` flag (``512Mi``), read as bytes."""
    return click.option(
        flag,
        default=format_size(default),
        show_default=True,
        callback=_size,
        metavar="SIZE",
        help=f"{help_text} Bytes, or with Ki, Mi, Gi.",
    )


def import_handlers() -> ModuleType:
    """The operator's kopf handlers, imported — with kopf — as the operator wants them.

    Imported on demand, not at the top: the capture container runs this program too, and needs
    neither kopf nor Kubernetes. kopf imports a Kubernetes client whenever one is installed, as its
    registry is made (to offer a login through it):
    - the synchronous one only to recognise its model objects, which the operator never hands it —
      the operator does not depend on it, but a development environment has it for the tests: hidden;
    - kubernetes_asyncio, which the kube layer uses: the kube layer's lazy stand-in for its generated
      classes must be in place first (kube/generated.py: 32 MiB of an idle operator).
    """
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    from episode_operator.kube.generated import install

    install()  # before kopf: see above
    import episode_operator.handlers

    return episode_operator.handlers


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="episode-operator")
def main() -> None:
    """The Episode operator."""


@main.command()
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch this namespace (repeatable; globs like 'eval-*' work). Default: all namespaces.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=lambda: os.environ.get("EPISODE_OPERATOR_DATA_DIR", "/var/lib/episode-operator/data"),
    show_default="$EPISODE_OPERATOR_DATA_DIR or /var/lib/episode-operator/data",
    help="Where episodes' logs and artifacts are kept.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Kubeconfig to use outside a cluster (default: $KUBECONFIG).",
)
@click.option(
    "--pull-grace",
    "pull_grace_sec",
    type=float,
    default=DEFAULT_TIMING.pull_grace_sec,
    show_default=True,
    help="Seconds an image may fail to pull before the attempt counts as an outage.",
)
@click.option(
    "--poll-interval",
    "poll_interval_sec",
    type=float,
    default=DEFAULT_TIMING.poll_interval_sec,
    show_default=True,
    help="Longest single wait for a job (a bounded long poll).",
)
@click.option("--liveness", "liveness_endpoint", default=None, help="e.g. http://0.0.0.0:8081/healthz")
@click.option(
    "--metrics-port",
    type=int,
    default=8080,
    show_default=True,
    help="Port of /metrics (open to anyone who reaches it); 0 turns it off.",
)
@click.option(
    "--data-api-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Port (TLS) of the data API: kept logs and artifacts, served to the callers the API server forwards and "
    "authorizes; the operator registers the APIService v1alpha1.data.episode-operator.dev for it; 0: off.",
)
@click.option(
    "--data-api-service",
    default="episode-operator",
    show_default=True,
    help="The Service the APIService sends the data API's requests to (port 443 to --data-api-port): NAME in the "
    "operator's namespace, or NAMESPACE/NAME.",
)
@click.option(
    "--data-api-owner",
    default="",
    help="The ClusterRole granting the data API's rights: it owns the APIService, so that removing the install "
    "removes the registration too (the Helm chart passes its own).",
)
@click.option(
    "--gym-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Port of NeMo Gym's environment-server protocol (POST /run, POST /aggregate_metrics; docs/gym.md); 0: off.",
)
@click.option(
    "--gym-settings",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="With --gym-port: a YAML file naming the namespace, the agent and the retry owner of the tries' Episodes.",
)
@click.option(
    "--gym-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="With --gym-port: the file holding the token every request must carry (else $EPISODE_GYM_TOKEN).",
)
@click.option(
    "--max-active-episodes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Drive at most this many Episodes at once (0: no limit); the rest wait Pending, oldest first.",
)
@click.option(
    "--image-mirror",
    "image_mirrors",
    multiple=True,
    metavar="FROM=TO",
    callback=parse_image_mirrors,
    help="Pull FROM from TO instead (repeatable): a reference (ubuntu:24.04=registry.internal/library/ubuntu:24.04), "
    "a repository (python=registry.internal/python) or a prefix ending in / "
    "(docker.io/library/=registry.internal/library/). Applies to task, FROM, sidecar and verifier images.",
)
@click.option(
    "--store-url",
    default=lambda: os.environ.get("EPISODE_OPERATOR_STORE_URL") or None,
    show_default="$EPISODE_OPERATOR_STORE_URL",
    metavar="s3://BUCKET[/PREFIX]",
    help="Keep logs and artifacts in this S3-compatible bucket instead of --data-dir, so that every replica "
    "serves them and none is lost with a replica. Credentials: $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY.",
)
@click.option(
    "--store-endpoint", default=None, help="The S3-compatible server, e.g. http://minio.minio:9000 (default: AWS)."
)
@click.option("--store-region", default=None, help="The bucket's region.")
@click.option(
    "--store-allow-http", is_flag=True, help="Allow a plain-HTTP --store-endpoint (a server inside the cluster)."
)
@click.option(
    "--lease-namespace",
    default=lambda: os.environ.get("EPISODE_OPERATOR_LEASE_NAMESPACE") or None,
    show_default="$EPISODE_OPERATOR_LEASE_NAMESPACE",
    help="Run as one of several replicas: each holds a Lease here and they share the Episodes out "
    "(docs/replicas.md). Without it this process drives everything and must be the only one.",
)
@click.option(
    "--replica-group",
    default="episode-operator",
    show_default=True,
    help="Which operator the replicas in the Lease namespace belong to (e.g. the Helm release).",
)
@click.option(
    "--replica-name",
    default=None,
    show_default="$POD_NAME, else <host>-<pid>",
    help="This replica's name, hashed to share the Episodes out (a restarted pod keeps its share).",
)
@click.option("--lease-duration", "lease_duration_sec", type=float, default=10.0, show_default=True,
              help="Seconds after a replica's last renewal until the others take over its Episodes.")  # fmt: skip
@click.option("--renew-deadline", "renew_deadline_sec", type=float, default=7.0, show_default=True,
              help="Seconds without a renewal after which a replica stops acting (< --lease-duration).")  # fmt: skip
@click.option("--retry-period", "retry_period_sec", type=float, default=2.0, show_default=True,
              help="Seconds between a replica's renewals and listings of the others.")  # fmt: skip
@click.option(
    "--capture-image",
    envvar="EPISODE_CAPTURE_IMAGE",
    default=None,
    help="The operator's own image, which runs the model-call capture proxy in agent pods and lends sandbox "
    "pods its static busybox to fill compose volumes only sidecars mount ($EPISODE_CAPTURE_IMAGE; the chart "
    "sets it). Without it, Episodes with a model endpoint or such a volume are refused.",
)
@click.option(
    "--capture-requests",
    default=lambda: default_capture_resources("CAPTURE_REQUESTS"),
    callback=parse_resources,
    help='The capture container\'s resource requests, NAME=QUANTITY,… (default: README, "Run a real agent").',
)
@click.option(
    "--capture-limits",
    default=lambda: default_capture_resources("CAPTURE_LIMITS"),
    callback=parse_resources,
    help='The capture container\'s resource limits, NAME=QUANTITY,… (default: README, "Run a real agent").',
)
@click.option(
    "--capture-max-record-mib",
    type=click.IntRange(min=1),
    default=MAX_RECORD_BYTES // MIB,
    show_default=True,
    help="A model call's request or response body past this many MiB is forwarded whole and recorded cut.",
)
@click.option(
    "--capture-max-journal-mib",
    type=click.IntRange(min=1),
    default=MAX_JOURNAL_BYTES // MIB,
    show_default=True,
    help="An attempt's recorded model calls, at most; past it the capture proxy answers the agent's calls "
    "itself and the turn fails (agent:capture_limit).",
)
@click.option(
    "--toolchain-repository",
    default="episode-operator.local",
    show_default=True,
    help="Harness toolchain images are <repository>/toolchain-<name>:<version>.",
)
@click.option(
    "--build-registry",
    metavar="HOST[:PORT]",
    default=None,
    help="Build the images of Dockerfiles replay cannot apply, and of compose services with build:, in the "
    "cluster (buildah Jobs) and push them here. Without it such tasks are refused.",
)
@click.option(
    "--build-pull-registry",
    metavar="HOST[:PORT]",
    default=None,
    help="The build registry as the cluster's nodes name it, when that differs (default: --build-registry).",
)
@click.option(
    "--build-namespace",
    default=None,
    help="Namespace of the build Jobs (their pods are privileged: give builds a namespace of their own). "
    "Default: $POD_NAMESPACE, else episode-operator-builds.",
)
@click.option(
    "--builder-image",
    default=BUILDER_IMAGE,
    show_default=True,
    help="The image with buildah the build Jobs run.",
)
@click.option(
    "--build-registry-insecure",
    is_flag=True,
    help="The build registry speaks plain HTTP (or a certificate the builder does not check).",
)
@click.option(
    "--task-registry",
    "task_registries",
    multiple=True,
    metavar="[http://]HOST[:PORT]",
    help="Fetch spec.task.oci artifacts (task folders too big for a ConfigMap, pushed by kubectl episode pack) "
    "from this registry (repeatable; https unless http:// says plain HTTP). An artifact of any other registry "
    "is refused: an Episode cannot make the operator call an address of its choosing.",
)
@size_option(
    "--task-artifact-limit",
    DEFAULT_ARTIFACT_LIMIT,
    "A task artifact's packed folder declaring or sending more bytes is refused (the unpacked folder has "
    "a ConfigMap's limits).",
)
@size_option(
    "--task-cache-limit",
    DEFAULT_CACHE_LIMIT,
    "Verified task artifacts kept under <data-dir>/task-artifacts, by digest; past this the least recently used go.",
)
@click.option(
    "--unschedulable-timeout",
    "unschedulable_timeout_sec",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMING.unschedulable_timeout_sec,
    show_default=True,
    help="Seconds a sandbox pod the scheduler cannot place is waited for before the attempt counts as an outage.",
)
@click.option(
    "--cpu-request-fraction",
    type=float,
    default=None,
    metavar="F",
    help="Sandbox pods request this fraction (above 0, at most 1) of the CPUs [environment] cpus limits them to, "
    "and keep that limit: tasks that mostly wait fit a node side by side. Memory is requested in full. "
    "Default: requests = limits.",
)
@limit_options
def run(
    namespaces: tuple[str, ...],
    data_dir: Path,
    kubeconfig: str | None,
    pull_grace_sec: float,
    poll_interval_sec: float,
    liveness_endpoint: str | None,
    metrics_port: int,
    data_api_port: int,
    data_api_service: str,
    data_api_owner: str,
    gym_port: int,
    gym_settings: Path | None,
    gym_token_file: Path | None,
    max_active_episodes: int,
    image_mirrors: ImageMirrors,
    lease_namespace: str | None,
    replica_group: str,
    replica_name: str | None,
    lease_duration_sec: float,
    renew_deadline_sec: float,
    retry_period_sec: float,
    store_url: str | None,
    store_endpoint: str | None,
    store_region: str | None,
    store_allow_http: bool,
    capture_image: str | None,
    capture_requests: dict[str, str],
    capture_limits: dict[str, str],
    capture_max_record_mib: int,
    capture_max_journal_mib: int,
    toolchain_repository: str,
    build_registry: str | None,
    build_pull_registry: str | None,
    build_namespace: str | None,
    builder_image: str,
    build_registry_insecure: bool,
    task_registries: tuple[str, ...],
    task_artifact_limit: int,
    task_cache_limit: int,
    unschedulable_timeout_sec: float,
    cpu_request_fraction: float | None,
    **limits: int,
) -> None:
    """Run the operator until interrupted."""
    handlers = import_handlers()
    from episode_operator.kube.builds import BuildSettings
    from episode_operator.kube.objects.pods import SandboxRequests
    from episode_operator.kube.replicas import ReplicaSettings
    from episode_operator.runtime.agents.model import CaptureBounds
    from episode_operator.runtime.episode_store import StoreSettings

    builds = None
    if build_registry:
        builds = BuildSettings(
            namespace=build_namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_BUILD_NAMESPACE,
            registry=build_registry,
            builder_image=builder_image,
            pull_registry=build_pull_registry,
            tls_verify=not build_registry_insecure,
        )
    elif build_pull_registry or build_namespace or build_registry_insecure:
        raise click.UsageError(
            "--build-pull-registry, --build-namespace and --build-registry-insecure need --build-registry"
        )

    try:
        sandbox_requests = SandboxRequests() if cpu_request_fraction is None else SandboxRequests(cpu_request_fraction)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--cpu-request-fraction") from error

    if store_url is not None and not store_url.startswith(("s3://", "s3a://")):
        raise click.BadParameter(f"{store_url!r} is not an s3://BUCKET[/PREFIX] URL", param_hint="--store-url")

    try:
        registries = dict(TaskArtifactSettings.parse_registry(value) for value in task_registries)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--task-registry") from error
    task_artifacts = TaskArtifactSettings(
        registries=registries,
        cache_dir=data_dir / "task-artifacts",
        max_layer_bytes=task_artifact_limit,
        max_cache_bytes=task_cache_limit,
    )

    replicas = ReplicaSettings(
        namespace=lease_namespace,
        group=replica_group,
        lease_duration_sec=lease_duration_sec,
        renew_deadline_sec=renew_deadline_sec,
        retry_period_sec=retry_period_sec,
        **({"name": replica_name} if replica_name else {}),
    )
    if problems := replicas.problems():
        raise click.UsageError("; ".join(problems))

    gym = None
    if gym_port:
        from episode_operator.runtime.gym_server import load_settings

        if gym_settings is None:
            raise click.UsageError("--gym-port needs --gym-settings")
        token = gym_token_file.read_text().strip() if gym_token_file else os.environ.get("EPISODE_GYM_TOKEN", "")
        try:
            gym = load_settings(gym_settings.read_text(), token, str(gym_settings))
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--gym-settings") from error
    elif gym_settings or gym_token_file:
        raise click.UsageError("--gym-settings and --gym-token-file need --gym-port")

    # What a burst of Episodes took is given back once it is over (runtime/allocator.py).
    tune_allocator()
    release_free_memory_every(RELEASE_INTERVAL_SEC)
    handlers.run_operator(
        handlers.OperatorOptions(
            namespaces=namespaces,
            data_dir=data_dir,
            kubeconfig=kubeconfig,
            timing=replace(
                DEFAULT_TIMING,
                pull_grace_sec=pull_grace_sec,
                poll_interval_sec=poll_interval_sec,
                unschedulable_timeout_sec=unschedulable_timeout_sec,
            ),
            liveness_endpoint=liveness_endpoint,
            metrics_port=metrics_port or None,
            data_api_port=data_api_port or None,
            data_api_service=data_api_service,
            data_api_owner=data_api_owner,
            gym=gym,
            gym_port=gym_port,
            max_active_episodes=max_active_episodes,
            image_mirrors=image_mirrors,
            replicas=replicas,
            store=StoreSettings(store_url, store_endpoint, store_region, store_allow_http),
            capture_image=capture_image,
            capture_bounds=CaptureBounds(
                requests=capture_requests,
                limits=capture_limits,
                max_record_bytes=capture_max_record_mib * MIB,
                max_journal_bytes=capture_max_journal_mib * MIB,
            ),
            toolchain_repository=toolchain_repository,
            builds=builds,
            sandbox_requests=sandbox_requests,
            limits=OutputLimits(**limits),
            task_artifacts=task_artifacts,
        )
    )


@main.command()
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Kubeconfig to use (default: $KUBECONFIG).",
)
def install_crd(kubeconfig: str | None) -> None:
    """Create or update the Episode and EpisodeSet CRDs (generated from this version's models) until served."""
    from episode_operator.kube.client import KubeClient, KubeError
    from episode_operator.kube.objects.crds import episode_crd, episodeset_crd

    manifests = [episode_crd(), episodeset_crd()]

    async def apply() -> list[str]:
        client = await KubeClient.connect(kubeconfig)
        try:
            return [await client.apply_crd(manifest) for manifest in manifests]
        finally:
            await client.close()

    try:
        actions = asyncio.run(apply())
    except KubeError as error:
        raise click.ClickException(str(error)) from error
    for manifest, action in zip(manifests, actions, strict=True):
        click.echo(f"customresourcedefinition/{manifest['metadata']['name']} {action}")


for command in CAPTURE_COMMANDS:
    main.add_command(command)
