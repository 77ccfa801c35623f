"""Pydantic models of ``task.toml``, mirroring Harbor's schema 1.4 as NeMo Gym reads it.

Field names are the TOML keys (snake_case) so an error location is the key the author
wrote. Validation is Gym's: lax types as pydantic reads TOML, no NaN or infinity, the
``> 0`` bounds Gym adds to Harbor's fields, legacy spellings read and normalized. Keys
these models do not declare are ignored, as Harbor and Gym ignore them;
:func:`unknown_keys` lists them so the loader can warn.

Rules that span several keys of one table live on that table's model, so pydantic reports
them together with every other error of the file. Rules that need the folder's files
(step folders, ``tests/``, compose services) live in :mod:`episode_operator.taskfolder.loader`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar, Literal, Self, get_args

from pydantic import (
    AliasGenerator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

MAIN_SERVICE = "main"
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
SERVICE_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
STEP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PACKAGE_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
HOST_LABEL_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
TPU_TOPOLOGY_PATTERN = re.compile(r"^[1-9]\d*(x[1-9]\d*)+$")
MANIFEST_NAME = "manifest.json"

# Written by these names in camelCase (JSON, Kubernetes objects); read by their own names.
CAMEL_OUTPUT = AliasGenerator(serialization_alias=to_camel)

NetworkMode = Literal["public", "no-network", "allowlist"]
EnvironmentMode = Literal["shared", "separate"]
RewardStrategy = Literal["mean", "final"]


def _user(value: Any) -> Any:
    if value is None or (isinstance(value, str | int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"must be a user name or a numeric UID, not {value!r}")


def _min_reward(value: Any) -> Any:
    def number(item: Any) -> bool:
        return isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item)

    if value is None or number(value):
        return value
    if isinstance(value, dict) and all(isinstance(k, str) and number(v) for k, v in value.items()):
        return value
    raise ValueError(f"must be a number or a table of numbers (e.g. {{ reward = 0.5 }}), not {value!r}")


User = Annotated[str | int | None, BeforeValidator(_user)]
MinReward = Annotated[float | dict[str, float] | None, BeforeValidator(_min_reward)]


def _size_to_mb(raw: Any, key: str) -> int:
    text = str(raw).strip().upper()
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not text or text[-1] not in units:
        raise ValueError(f"{key} = {raw!r}: expected a number followed by K, M or G (e.g. '2G')")
    try:
        amount = float(text[:-1])
    except ValueError:
        raise ValueError(f"{key} = {raw!r}: expected a number followed by K, M or G (e.g. '2G')") from None
    return int(amount * units[text[-1]])


def is_address_entry(host: str) -> bool:
    """Whether a (normalized) ``allowed_hosts`` entry is an IP address or CIDR range, not a hostname."""
    try:
        ipaddress.ip_network(host, strict=False)
    except ValueError:
        return False
    return True


def normalize_allowed_hosts(hosts: list[str]) -> list[str]:
    """Validate ``allowed_hosts`` entries as Harbor does; lowercased, trailing dot removed."""
    normalized: list[str] = []
    for raw in hosts:
        host = raw.strip().lower().rstrip(".")
        if not host:
            raise ValueError("allowed_hosts entries must be non-empty")
        if "/" in host or ":" in host:
            try:
                network = ipaddress.ip_network(host, strict=True) if "/" in host else ipaddress.ip_address(host)
            except ValueError:
                raise ValueError(
                    f"allowed_hosts entry {raw!r} must be a hostname, IP address or CIDR range, not a URL, port or path"
                ) from None
            if "%" in host:
                raise ValueError(f"allowed_hosts entry {raw!r} must not carry a zone index")
            normalized.append(network.compressed)
            continue
        if "[" in host or "]" in host:
            raise ValueError(f"allowed_hosts entry {raw!r} must not use brackets")
        name = host
        if host.startswith("*."):
            name = host[2:]
            try:
                ipaddress.ip_address(name)
            except ValueError:
                pass
            else:
                raise ValueError(f"allowed_hosts wildcard {raw!r} must target a hostname, not an IP address")
        elif "*" in host:
            raise ValueError(f"allowed_hosts entry {raw!r}: a wildcard must be a leading '*.'")
        if not all(HOST_LABEL_PATTERN.match(label) for label in name.split(".")):
            raise ValueError(f"allowed_hosts entry {raw!r} is not a valid hostname (letters, digits, hyphens and dots)")
        normalized.append(host)
    return normalized


class TaskSettings(BaseModel):
    """Base of every ``task.toml`` table: unknown keys ignored, NaN and infinity refused.

    Read by TOML key; written (``by_alias=True``) in camelCase, as everything the operator
    puts in JSON or in a Kubernetes object.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, alias_generator=CAMEL_OUTPUT)

    # Keys a `before` validator reads and renames: accepted, not unknown.
    legacy_keys: ClassVar[frozenset[str]] = frozenset()


def unknown_keys(model: type[TaskSettings], data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the keys in ``data`` that no field of ``model``'s tree declares."""
    if not isinstance(data, dict):
        return []
    found: list[str] = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            if key not in model.legacy_keys:
                found.append(f"{prefix}{key}")
            continue
        nested = _nested_settings(field.annotation)
        if nested is None:
            continue
        if isinstance(value, list):
            for index, item in enumerate(value):
                found += unknown_keys(nested, item, f"{prefix}{key}[{index}].")
        else:
            found += unknown_keys(nested, value, f"{prefix}{key}.")
    return found


def _nested_settings(annotation: Any) -> type[TaskSettings] | None:
    if isinstance(annotation, type) and issubclass(annotation, TaskSettings):
        return annotation
    for argument in get_args(annotation):
        nested = _nested_settings(argument)
        if nested is not None:
            return nested
    return None


class NetworkChecks(TaskSettings):
    """The ``network_mode`` / ``allowed_hosts`` rules shared by environments and phase overrides."""

    @field_validator("allowed_hosts", check_fields=False)
    @classmethod
    def _hosts(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else normalize_allowed_hosts(value)

    @model_validator(mode="after")
    def _network(self) -> Self:
        if getattr(self, "allowed_hosts", None) is not None and getattr(self, "network_mode", None) != "allowlist":
            raise ValueError('allowed_hosts is only valid with network_mode = "allowlist"')
        return self


class Healthcheck(TaskSettings):
    """``[environment.healthcheck]`` and ``[steps.healthcheck]``: Docker HEALTHCHECK semantics, unbounded."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3

    def worst_case_sec(self) -> float:
        """The longest a check can take before it fails (docs/task-format.md §3.4.3)."""
        counted = max(self.retries, 1)
        return (
            self.start_period_sec
            + self.start_interval_sec
            + self.timeout_sec
            + counted * self.timeout_sec
            + (counted - 1) * self.interval_sec
        )


class McpServer(TaskSettings):
    """One ``[[environment.mcp_servers]]`` entry."""

    name: str
    transport: Literal["stdio", "sse", "streamable-http"] = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)

    @field_validator("transport", mode="before")
    @classmethod
    def _http_alias(cls, value: Any) -> Any:
        return "streamable-http" if value == "http" else value

    @model_validator(mode="after")
    def _endpoint(self) -> McpServer:
        if self.transport == "stdio" and not self.command:
            raise ValueError(f"MCP server {self.name!r}: transport 'stdio' needs `command`")
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"MCP server {self.name!r}: transport {self.transport!r} needs `url`")
        return self


class TpuSpec(TaskSettings):
    """``[environment.tpu]`` (Harbor only)."""

    type: str = Field(min_length=1)
    topology: str

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str) -> str:
        if not TPU_TOPOLOGY_PATTERN.match(value.strip()):
            raise ValueError(f"invalid TPU topology {value!r}: expected e.g. '2x4' or '2x2x1'")
        return value.strip()


class EnvironmentConfig(NetworkChecks):
    """``[environment]``, and the same schema for a verifier environment."""

    legacy_keys: ClassVar[frozenset[str]] = frozenset({"image", "memory", "storage", "allow_internet"})

    docker_image: str | None = None
    build_timeout_sec: float = Field(default=600.0, gt=0)
    os: Literal["linux", "windows"] = "linux"
    cpus: int | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, ge=0)
    gpu_types: list[str] | None = None
    tpu: TpuSpec | None = None
    network_mode: NetworkMode = "public"
    allowed_hosts: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    skills_dir: str | None = None
    mcp_servers: list[McpServer] = Field(default_factory=list)
    healthcheck: Healthcheck | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "image" in data:
            image = data.pop("image")
            if data.get("docker_image") not in (None, image):
                raise ValueError(f"image = {image!r} conflicts with docker_image = {data['docker_image']!r}; keep one")
            data["docker_image"] = image
        for legacy, current in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy in data:
                raw = data.pop(legacy)
                size = _size_to_mb(raw, legacy)
                if current in data and data[current] != size:
                    raise ValueError(f"{legacy} = {raw!r} ({size} MB) conflicts with {current} = {data[current]!r}")
                data[current] = size
        allow_internet = data.pop("allow_internet", None)
        if allow_internet is not None and "network_mode" not in data and data.get("allowed_hosts") is None:
            if not isinstance(allow_internet, bool):
                raise ValueError(f"allow_internet must be true or false, not {allow_internet!r}")
            data["network_mode"] = "public" if allow_internet else "no-network"
        return data

    @field_validator("os", mode="before")
    @classmethod
    def _lowercase_os(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class PhaseNetwork(NetworkChecks):
    """Network override for one phase (``[agent]``, ``[verifier]`` and their step tables)."""

    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    @property
    def restricts_network(self) -> bool:
        """True when this phase asks for anything but the public network."""
        return self.network_mode not in (None, "public") or self.allowed_hosts is not None


class AgentConfig(PhaseNetwork):
    """``[agent]`` and ``[steps.agent]``. ``timeout_sec`` unset resolves in the plan."""

    timeout_sec: float | None = Field(default=None, gt=0)
    user: User = None


class CollectHook(TaskSettings):
    """One ``[[verifier.collect]]`` / ``[[steps.verifier.collect]]`` hook."""

    command: str
    service: str = MAIN_SERVICE
    timeout_sec: float = Field(default=60.0, gt=0)
    user: User = None

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        value = value.strip()
        if not SERVICE_NAME_PATTERN.match(value):
            raise ValueError(f"invalid compose service name {value!r}")
        return value


class VerifierConfig(PhaseNetwork):
    """``[verifier]`` and ``[steps.verifier]``; both default ``timeout_sec`` to 600."""

    timeout_sec: float = Field(default=DEFAULT_VERIFIER_TIMEOUT_SEC, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: User = None
    environment_mode: EnvironmentMode | None = None
    environment: EnvironmentConfig | None = None
    collect: list[CollectHook] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shared_without_environment(self) -> VerifierConfig:
        if self.environment_mode == "shared" and self.environment is not None:
            raise ValueError(
                'environment_mode = "shared" conflicts with a verifier environment table; '
                'drop the table or set environment_mode = "separate"'
            )
        return self


class ArtifactConfig(TaskSettings):
    """One ``artifacts`` entry; a bare string is its ``source``."""

    source: str
    destination: str | None = None
    exclude: list[str] = Field(default_factory=list)
    service: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"source": data} if isinstance(data, str) else data

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if not value:
            raise ValueError("artifact source must not be empty")
        if ".." in PurePosixPath(value).parts:
            raise ValueError(f"artifact source {value!r} must not contain '..'")
        if "\\" in value:
            raise ValueError(f"artifact source {value!r} must use '/' separators")
        return value

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if not value:
            return None
        if "\\" in value:
            raise ValueError(f"artifact destination {value!r} must use '/' separators")
        path = PurePosixPath(value)
        if path.is_absolute():
            raise ValueError(f"artifact destination {value!r} must be relative to the artifacts folder")
        if ".." in path.parts:
            raise ValueError(f"artifact destination {value!r} must not contain '..'")
        if value.rstrip("/") == MANIFEST_NAME:
            raise ValueError(f"artifact destination {MANIFEST_NAME!r} is reserved for the collection manifest")
        return value

    @field_validator("service")
    @classmethod
    def _service(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not SERVICE_NAME_PATTERN.match(value):
            raise ValueError(f"invalid compose service name {value!r}")
        return value

    @model_validator(mode="after")
    def _sidecar_source_absolute(self) -> ArtifactConfig:
        if self.effective_service != MAIN_SERVICE and not self.source.startswith("/"):
            raise ValueError(f"artifact source {self.source!r} from service {self.service!r} must be an absolute path")
        return self

    @property
    def effective_service(self) -> str:
        """The compose service collected from; ``main`` is the agent's container."""
        return self.service or MAIN_SERVICE

    @property
    def effective_destination(self) -> str:
        """Where the entry lands under the artifacts folder: the source without its root."""
        if self.destination:
            return self.destination
        parts = [part for part in PurePosixPath(self.source).parts if part not in ("/", "..")]
        return "/".join(parts) or "."


class Author(TaskSettings):
    name: str
    email: str | None = None


class PackageInfo(TaskSettings):
    """``[task]``: package identity, only checked, never used as the task ID."""

    name: str
    version: str | None = Field(default=None, min_length=1)
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _org_slash_name(cls, value: str) -> str:
        if not PACKAGE_NAME_PATTERN.match(value) or ".." in value:
            raise ValueError(f"must be 'org/name' (letters, digits, '.', '_', '-'; no '..'), not {value!r}")
        return value


class SolutionConfig(TaskSettings):
    """``[solution]``: environment of the oracle's ``solve.sh``."""

    env: dict[str, str] = Field(default_factory=dict)


class StepConfig(TaskSettings):
    """One ``[[steps]]`` table."""

    name: str
    agent: AgentConfig = Field(default_factory=AgentConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    min_reward: MinReward = None
    healthcheck: Healthcheck | None = None
    artifacts: list[ArtifactConfig] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        if not STEP_NAME_PATTERN.match(value):
            raise ValueError(
                f"step name {value!r} must be letters, digits, '.', '_' and '-', starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _no_step_network_restriction(self) -> StepConfig:
        # Gym refuses these at load: a step cannot change the network policy of a phase.
        restricted = [
            table
            for table, phase in (("[steps.agent]", self.agent), ("[steps.verifier]", self.verifier))
            if phase.restricts_network
        ]
        environment = self.verifier.environment
        if environment is not None and (environment.network_mode != "public" or environment.allowed_hosts is not None):
            restricted.append("[steps.verifier.environment]")
        if restricted:
            raise ValueError(
                f"step {self.name!r}: network restrictions are not allowed on {', '.join(restricted)}; "
                "set them on [environment] or [verifier.environment]"
            )
        return self


class TaskConfig(TaskSettings):
    """A whole ``task.toml``."""

    legacy_keys: ClassVar[frozenset[str]] = frozenset({"version", "multi_step_reward_mode"})

    schema_version: str = "1.4"
    source: str | None = None
    multi_step_reward_strategy: RewardStrategy | None = None
    artifacts: list[ArtifactConfig] = Field(default_factory=list)
    steps: list[StepConfig] | None = None
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)

    @model_validator(mode="before")
    @classmethod
    def _legacy_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "version" in data:
            version = data.pop("version")
            data.setdefault("schema_version", str(version))
        data.pop("multi_step_reward_mode", None)
        return data

    @model_validator(mode="after")
    def _steps_consistent(self) -> TaskConfig:
        steps = self.steps or []
        counts = Counter(step.name for step in steps)
        duplicates = sorted(name for name, count in counts.items() if count > 1)
        if duplicates:
            raise ValueError(f"duplicate step names: {', '.join(duplicates)}")
        if steps and self.verifier.restricts_network:
            shared = [step.name for step in steps if self.step_verifier_mode(step) == "shared"]
            if shared:
                raise ValueError(
                    "a [verifier] network restriction is not allowed while a step verifies shared "
                    f"(steps: {', '.join(shared)})"
                )
        return self

    @property
    def is_multi_step(self) -> bool:
        """A non-empty ``[[steps]]`` array makes a task multi-step; an empty one does not."""
        return bool(self.steps)

    def task_verifier_mode(self) -> EnvironmentMode:
        """The task's mode: ``environment_mode``, else separate with an environment, else shared."""
        if self.verifier.environment_mode is not None:
            return self.verifier.environment_mode
        return "separate" if self.verifier.environment is not None else "shared"

    def step_verifier_mode(self, step: StepConfig) -> EnvironmentMode:
        """A step's mode (docs/task-format.md §3.5): its own setting, else its environment, else the task's."""
        if step.verifier.environment_mode is not None:
            return step.verifier.environment_mode
        if step.verifier.environment is not None:
            return "separate"
        return self.task_verifier_mode()
