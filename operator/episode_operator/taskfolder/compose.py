"""Compose sidecars: ``environment/docker-compose.yaml`` read as containers of one pod.

Harbor runs a compose task as a group of containers; the operator runs it as one pod
whose main container is the agent's sandbox and whose other containers are the compose
services, reachable by their service names through ``hostAliases`` (127.0.0.1). What a
pod cannot express (host networking, host paths, privileged containers…) is refused with
the service and key named; what a pod does not need (``restart``, ``container_name``, port
publishing…) is ignored with a warning. A sidecar with ``build:`` keeps its build context
and Dockerfile (:class:`SidecarBuild`): its image comes from replaying or building that
Dockerfile, never from the task's own image.

Volumes (:class:`ComposeVolume`), ``main``'s as every sidecar's: a named or anonymous volume is
one ``emptyDir`` shared by every service naming it; a bind of a path of ``environment/`` (the
folder Harbor runs compose in) is that path of one ``emptyDir`` holding the bound files, so
services binding the same files share what they write there, as on Harbor's host
(``kube/objects/pods.py`` says how they are filled before any container starts).
"""

from __future__ import annotations

import io
import posixpath
import re
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from episode_operator.taskfolder.errors import Problem
from episode_operator.taskfolder.sources import TaskFiles
from episode_operator.taskfolder.task_toml import CAMEL_OUTPUT, MAIN_SERVICE, EnvironmentConfig

# Harbor reads docker-compose.yaml; the older Gym loader also took these spellings.
COMPOSE_FILES = (
    "environment/docker-compose.yaml",
    "environment/docker-compose.yml",
    "environment/compose.yaml",
    "environment/compose.yml",
)
# The variable Harbor sets to the task's own image; it resolves to that image at seed.
TASK_IMAGE = "${MAIN_IMAGE_NAME}"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
VARIABLE = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")

REFUSED_KEYS = {
    "network_mode": "all containers of a pod share one network namespace",
    "privileged": "sidecars run without privilege",
    "cap_add": "sidecars run with the default capabilities",
    "devices": "a pod cannot mount host devices",
    "pid": "a pod cannot share the host's PID namespace",
    "ipc": "a pod cannot share the host's IPC namespace",
    "extends": "`extends` is not supported; write the service out",
    "volumes_from": "use a named volume instead",
    "links": "services reach each other by name already",
    "external_links": "services reach each other by name already",
    "runtime": "the runtime class is set on the Episode, not per container",
}
IGNORED_KEYS = frozenset(
    {
        "restart",
        "container_name",
        "hostname",
        "labels",
        "networks",
        "stop_grace_period",
        "stop_signal",
        "logging",
        "init",
        "tty",
        "stdin_open",
        "platform",
        "pull_policy",
        "ulimits",
        "sysctls",
        "tmpfs",
        "shm_size",
        "security_opt",
        "cap_drop",
        "dns",
        "dns_search",
        "extra_hosts",
        "domainname",
        "mac_address",
        "oom_score_adj",
        "read_only",
        "x-harbor",
    }
)
MAIN_KEYS = frozenset({"depends_on", "environment", "env_file", "volumes"})
# The folder the compose file's relative paths start from, and the only one a bind may name:
# Harbor runs compose with environment/ as its project directory; tests/ and solution/ reach the
# sandbox only when Harbor places them.
ENVIRONMENT = "environment"
# Short-syntax volume modes (`SOURCE:TARGET:MODE`, comma-separated) that mean nothing in a pod:
# SELinux relabelling, mount propagation, macOS file-sharing consistency.
IGNORED_VOLUME_MODES = frozenset(
    {"z", "Z", "shared", "rshared", "slave", "rslave", "private", "rprivate", "cached", "delegated", "consistent"}
)
# Top-level `volumes:` keys a pod's emptyDir cannot honour, and why.
REFUSED_VOLUME_KEYS = {
    "external": "an external volume lives outside the task, and a pod's volumes are its own",
    "driver_opts": "a pod's volumes are emptyDirs: a driver's options cannot apply",
}
IGNORED_VOLUME_KEYS = frozenset({"name", "labels"})
CAMEL_FROZEN = ConfigDict(frozen=True, alias_generator=CAMEL_OUTPUT)
# The bound files' archive travels into the pod in a ConfigMap (kube/objects/pods.py),
# which holds 1 MiB, base64 in etcd: so at most this many bytes.
BOUND_ARCHIVE_LIMIT = 700 * 1024


class SidecarProbe(BaseModel):
    """A compose ``healthcheck``, in seconds; ``command`` runs through ``sh -c``."""

    model_config = CAMEL_FROZEN

    command: str
    interval_sec: float = 30.0
    timeout_sec: float = 30.0
    retries: int = 3
    start_period_sec: float = 0.0


VolumeKind = Literal["volume", "bind"]


class ComposeVolume(BaseModel):
    """One ``volumes:`` entry of a service, as a mount of its container.

    ``volume``: a named or anonymous volume, ``name`` its compose name: one ``emptyDir`` shared by
    every service naming it. ``bind``: ``name`` is the bound path of the task folder (a file or
    folder of ``environment/``; missing, a folder Compose would create): a path of the one
    ``emptyDir`` holding the bound files, which every bind of the same files shares.
    """

    model_config = CAMEL_FROZEN

    name: str
    mount_path: str
    read_only: bool = False
    kind: VolumeKind = "volume"
    # Docker fills a new, empty volume with what the image has at the mount path (``nocopy`` says not to).
    copy_image_content: bool = True
    key: str = Field(description="The compose key of the entry (services.main.volumes[0]), for later refusals.")


class SidecarBuild(BaseModel):
    """A compose ``build:``: the build context and Dockerfile as paths of the task folder."""

    model_config = CAMEL_FROZEN

    context: str = Field(description="The build context, a folder of the task (e.g. environment/api-server).")
    dockerfile: str = Field(description="The Dockerfile, a file of the task.")
    args: dict[str, str] = Field(default_factory=dict)
    target: str | None = Field(default=None, description="The stage to build (multi-stage Dockerfiles).")


# Keys of a compose `build:` mapping that a build from the task folder cannot honour, and why.
REFUSED_BUILD_KEYS = {
    "dockerfile_inline": "write the Dockerfile to a file of the build context",
    "additional_contexts": "a build sees only its own context from the task folder",
    "secrets": "build secrets are not available to in-cluster builds",
    "ssh": "build SSH agents are not available to in-cluster builds",
}


class Sidecar(BaseModel):
    """One compose service other than ``main``, as a container of the agent pod."""

    model_config = CAMEL_FROZEN

    name: str = Field(description="Compose service name; also the container and host name.")
    image: str | None = Field(
        description="Image; null means the task's own image (${MAIN_IMAGE_NAME}), unless `build` gives one."
    )
    build: SidecarBuild | None = Field(default=None, description="Where the image comes from when it is built.")
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[int] = Field(default_factory=list)
    working_dir: str | None = None
    run_as_user: int | None = None
    run_as_group: int | None = None
    probe: SidecarProbe | None = None
    volumes: list[ComposeVolume] = Field(default_factory=list)
    resources: dict[str, dict[str, str]] = Field(default_factory=dict)


class ComposeSpec(BaseModel):
    """What the task's compose file asks of the pod."""

    model_config = CAMEL_FROZEN

    file: str | None = None
    sidecars: list[Sidecar] = Field(default_factory=list)
    main_env: dict[str, str] = Field(default_factory=dict)
    main_depends_on: list[str] = Field(default_factory=list)
    main_volumes: list[ComposeVolume] = Field(default_factory=list)

    @property
    def service_names(self) -> frozenset[str]:
        """Every service name, ``main`` included."""
        return frozenset({MAIN_SERVICE, *(sidecar.name for sidecar in self.sidecars)})

    @property
    def binds(self) -> list[ComposeVolume]:
        """Every service's binds, ``main``'s first."""
        return binds_of(self.main_volumes, self.sidecars)

    def mount_refusals(self, reserved: Mapping[str, str], reserved_in_main: Mapping[str, str]) -> list[Problem]:
        """Mounts at, above or below a path the operator keeps for itself (path → why): ``reserved``
        in every container, ``reserved_in_main`` in ``main`` only. The paths come from the runtime,
        which owns the sandbox's layout."""
        problems: list[Problem] = []
        mounts = [(volume, reserved_in_main) for volume in self.main_volumes] + [
            (volume, {}) for sidecar in self.sidecars for volume in sidecar.volumes
        ]
        for volume, extra in mounts:
            for path, reason in {**reserved, **extra}.items():
                if _overlaps(volume.mount_path, path):
                    problems.append(
                        Problem(self.file or COMPOSE_FILES[0], volume.key, f"cannot mount over {path}: {reason}")
                    )
        return problems


def parse_compose(files: TaskFiles, environment: EnvironmentConfig) -> tuple[ComposeSpec, list[Problem], list[Problem]]:
    """Read the task's compose file, if any; returns ``(spec, problems, warnings)``."""
    present = [name for name in COMPOSE_FILES if files.has_file(name)]
    if not present:
        return ComposeSpec(), [], []
    reader = _ComposeReader(files, present[0], environment)
    warnings = [Problem(extra, None, f"ignored: {present[0]} takes precedence") for extra in present[1:]]
    spec = reader.read()
    return spec, reader.problems, warnings + reader.warnings


class _ComposeReader:
    def __init__(self, files: TaskFiles, file: str, environment: EnvironmentConfig) -> None:
        self.files = files
        self.file = file
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        # The names the top-level `volumes:` declares.
        self.declared: frozenset[str] = frozenset()
        self.variables = {
            "MAIN_IMAGE_NAME": TASK_IMAGE,
            "PREBUILT_IMAGE_NAME": TASK_IMAGE,
            "CPUS": str(environment.cpus or 1),
            "MEMORY": f"{environment.memory_mb}M" if environment.memory_mb else "",
            "CONTEXT_DIR": ".",
        }

    def refuse(self, key: str | None, message: str) -> None:
        self.problems.append(Problem(self.file, key, message))

    def warn(self, key: str | None, message: str) -> None:
        self.warnings.append(Problem(self.file, key, message))

    def read(self) -> ComposeSpec:
        try:
            text = self.files[self.file].data.decode("utf-8")
            document = yaml.safe_load(text)
        except UnicodeDecodeError:
            self.refuse(None, "not valid UTF-8")
            return ComposeSpec(file=self.file)
        except yaml.YAMLError as error:
            self.refuse(None, f"YAML syntax error: {error}")
            return ComposeSpec(file=self.file)
        if document is None:
            return ComposeSpec(file=self.file)
        if not isinstance(document, dict):
            self.refuse(None, "must be a mapping with a `services` table")
            return ComposeSpec(file=self.file)
        document = self.interpolate(document, "")
        services = document.get("services") or {}
        if not isinstance(services, dict):
            self.refuse("services", "must be a mapping of service name to service")
            return ComposeSpec(file=self.file)
        self.declared = self.volume_declarations(document.get("volumes"))
        sidecars: list[Sidecar] = []
        main_env: dict[str, str] = {}
        main_depends_on: list[str] = []
        main_volumes: list[ComposeVolume] = []
        for raw_name, service in services.items():
            name = str(raw_name)
            key = f"services.{name}"
            if not isinstance(service, dict):
                self.refuse(key, "must be a mapping")
                continue
            if name == MAIN_SERVICE:
                main_env = self.environment(service, key)
                main_depends_on = self.depends_on(service, key)
                main_volumes = self.volumes(service.get("volumes"), f"{key}.volumes", name)
                for extra in sorted(set(service) - MAIN_KEYS):
                    self.warn(f"{key}.{extra}", "ignored: the operator supplies main's image, command and resources")
                continue
            if service.get("profiles"):
                self.warn(f"{key}.profiles", "service has profiles, so compose does not start it; skipped")
                continue
            sidecar = self.sidecar(name, service, key)
            if sidecar is not None:
                sidecars.append(sidecar)
        known = {sidecar.name for sidecar in sidecars} | {MAIN_SERVICE}
        for dependency in main_depends_on:
            if dependency not in known:
                self.refuse("services.main.depends_on", f"unknown service {dependency!r}")
        spec = ComposeSpec(
            file=self.file,
            sidecars=sidecars,
            main_env=main_env,
            main_depends_on=main_depends_on,
            main_volumes=main_volumes,
        )
        binds = spec.binds
        if binds and (size := len(bound_archive(self.files, binds))) > BOUND_ARCHIVE_LIMIT:
            self.refuse(
                binds[0].key,
                f"the files the binds ({', '.join(bind.key for bind in binds)}) carry into the pod take "
                f"{size} bytes packed, above the {BOUND_ARCHIVE_LIMIT} a pod can be given (bind less, or COPY "
                "them in a Dockerfile)",
            )
        return spec

    # Interpolation -------------------------------------------------------------------
    def interpolate(self, value: Any, key: str) -> Any:
        if isinstance(value, str):
            return VARIABLE.sub(lambda match: self.substitute(match, key), value)
        if isinstance(value, dict):
            return {k: self.interpolate(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.interpolate(item, key) for item in value]
        return value

    def substitute(self, match: re.Match[str], key: str) -> str:
        if match.group(0) == "$$":
            return "$"
        expression = match.group("braced") if match.group("braced") is not None else match.group("bare")
        name, operator, default = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-?]?)(.*)", expression or "").groups()  # type: ignore[union-attr]
        value = self.variables.get(name)
        if value is not None and (value or ":" not in operator):
            return value
        if operator.endswith("-"):
            return default
        if operator.endswith("?"):
            self.refuse(key or None, f"${{{name}}} is required: {default or 'not set'}")
            return ""
        self.warn(key or None, f"${{{name}}} is not set here; it reads as an empty string")
        return ""

    # Services ------------------------------------------------------------------------
    def sidecar(self, name: str, service: dict[str, Any], key: str) -> Sidecar | None:
        before = len(self.problems)
        if not DNS_LABEL.match(name) or len(name) > 63:
            self.refuse(
                key,
                f"service name {name!r} cannot be a pod host and container name "
                "(lowercase letters, digits and '-', at most 63 characters)",
            )
        for refused, reason in REFUSED_KEYS.items():
            if refused in service:
                self.refuse(f"{key}.{refused}", f"a pod cannot express this: {reason}")
        if "build" in service and "image" in service:
            self.warn(f"{key}.build", "ignored: the prebuilt `image` is used")
        for ignored in sorted(set(service) & IGNORED_KEYS):
            self.warn(f"{key}.{ignored}", "ignored in a pod")
        replicas = _table(service, "deploy").get("replicas")
        if service.get("scale", 1) not in (0, 1) or replicas not in (None, 0, 1):
            self.refuse(f"{key}.deploy.replicas", "a sidecar runs as exactly one container")
        image = service.get("image")
        build = self.build(service.get("build"), f"{key}.build") if "build" in service and not image else None
        if not isinstance(image, str) or not image:
            if "build" not in service:
                self.refuse(f"{key}.image", "a sidecar needs an `image` or a `build`")
            image = None
        elif "${" in image.replace(TASK_IMAGE, ""):
            self.refuse(f"{key}.image", f"cannot resolve image {image!r}")
        elif TASK_IMAGE in image and image != TASK_IMAGE:
            self.refuse(f"{key}.image", "only the whole ${MAIN_IMAGE_NAME} can name the task image")
        command = self.words(service.get("entrypoint"), f"{key}.entrypoint")
        args = self.words(service.get("command"), f"{key}.command")
        user, group = self.user(service.get("user"), f"{key}.user")
        sidecar = Sidecar(
            name=name,
            image=None if image in (None, TASK_IMAGE) else image,
            build=build,
            command=command,
            args=args,
            env=self.environment(service, key),
            ports=self.ports(service, key),
            working_dir=service.get("working_dir") if isinstance(service.get("working_dir"), str) else None,
            run_as_user=user,
            run_as_group=group,
            probe=self.probe(service.get("healthcheck"), f"{key}.healthcheck"),
            volumes=self.volumes(service.get("volumes"), f"{key}.volumes", name),
            resources=self.resources(service, key),
        )
        self.depends_on(service, key)
        return sidecar if len(self.problems) == before else None

    def build(self, raw: Any, key: str) -> SidecarBuild | None:
        """``build: DIR`` or ``build: {context, dockerfile, args, target}``, as paths of the task folder."""
        table: dict[str, Any] = {"context": raw} if isinstance(raw, str) else raw if isinstance(raw, dict) else {}
        if not isinstance(raw, str | dict):
            self.refuse(key, "must be a build context folder or a mapping with `context`")
            return None
        for refused, reason in REFUSED_BUILD_KEYS.items():
            if refused in table:
                self.refuse(f"{key}.{refused}", f"not supported: {reason}")
        context_value = table.get("context", ".")
        if not isinstance(context_value, str) or re.match(r"^[a-z]+://|^git@|\.git(#.*)?$", context_value):
            self.refuse(f"{key}.context", "must be a folder of the task (a remote context needs the network)")
            return None
        base = posixpath.dirname(self.file)
        context = posixpath.normpath(posixpath.join(base, context_value))
        if context_value.startswith("/") or context == ".." or context.startswith("../"):
            self.refuse(f"{key}.context", f"{context_value!r} leaves the task folder")
            return None
        dockerfile_value = table.get("dockerfile", "Dockerfile")
        if not isinstance(dockerfile_value, str) or not dockerfile_value:
            self.refuse(f"{key}.dockerfile", "must name a file of the build context")
            return None
        dockerfile = posixpath.normpath(posixpath.join(context, dockerfile_value))
        if not self.files.has_dir(context) and context != ".":
            self.refuse(f"{key}.context", f"{context}/ is not a folder of the task")
            return None
        if not self.files.has_file(dockerfile):
            self.refuse(f"{key}.dockerfile", f"{dockerfile} is not in the task folder")
            return None
        args = table.get("args") or {}
        if isinstance(args, list):
            args = dict(str(item).partition("=")[::2] for item in args)
        if not isinstance(args, dict):
            self.refuse(f"{key}.args", "must be a mapping or a list of NAME=value")
            args = {}
        target = table.get("target")
        return SidecarBuild(
            context=context,
            dockerfile=dockerfile,
            args={str(name): "" if value is None else str(value) for name, value in args.items()},
            target=str(target) if target is not None else None,
        )

    def words(self, value: Any, key: str) -> list[str] | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as error:
                self.refuse(key, f"cannot split into words: {error}")
                return None
        if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
            return [str(item) for item in value]
        self.refuse(key, "must be a string or a list of strings")
        return None

    def environment(self, service: Mapping[str, Any], key: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for env_file in self.env_files(service.get("env_file"), f"{key}.env_file"):
            env.update(env_file)
        raw = service.get("environment")
        if raw is None:
            return env
        if isinstance(raw, dict):
            for name, value in raw.items():
                if value is None:
                    self.warn(f"{key}.environment.{name}", "has no value (taken from the host in compose); skipped")
                else:
                    env[str(name)] = str(value).lower() if isinstance(value, bool) else str(value)
        elif isinstance(raw, list):
            for item in raw:
                name, sep, value = str(item).partition("=")
                if sep:
                    env[name] = value
                else:
                    self.warn(f"{key}.environment", f"{name} has no value (taken from the host in compose); skipped")
        else:
            self.refuse(f"{key}.environment", "must be a mapping or a list of NAME=value")
        return env

    def env_files(self, raw: Any, key: str) -> list[dict[str, str]]:
        if raw is None:
            return []
        entries = raw if isinstance(raw, list) else [raw]
        loaded: list[dict[str, str]] = []
        for entry in entries:
            path = entry.get("path") if isinstance(entry, dict) else entry
            required = entry.get("required", True) if isinstance(entry, dict) else True
            if not isinstance(path, str):
                self.refuse(key, "must name files relative to environment/")
                continue
            relative = "/".join(part for part in f"environment/{path}".split("/") if part not in ("", "."))
            if ".." in relative.split("/") or path.startswith("/"):
                self.refuse(key, f"{path!r} must stay inside environment/")
                continue
            if not self.files.has_file(relative):
                if required:
                    self.refuse(key, f"{path!r} is not in the task folder")
                continue
            values: dict[str, str] = {}
            for line in self.files[relative].data.decode("utf-8", "replace").splitlines():
                line = line.strip()
                if not line or line.startswith("#") or "=" not in line:
                    continue
                name, _, value = line.removeprefix("export ").partition("=")
                values[name.strip()] = value.strip().strip("'\"")
            loaded.append(values)
        return loaded

    def ports(self, service: Mapping[str, Any], key: str) -> list[int]:
        ports: list[int] = []
        for field in ("ports", "expose"):
            raw = service.get(field) or []
            if not isinstance(raw, list):
                self.refuse(f"{key}.{field}", "must be a list")
                continue
            for item in raw:
                target: Any = item.get("target") if isinstance(item, dict) else str(item).split("/")[0].split(":")[-1]
                try:
                    port = int(str(target).split("-")[0])
                except ValueError:
                    self.refuse(f"{key}.{field}", f"cannot read a container port from {item!r}")
                    continue
                if not 0 < port < 65536:
                    self.refuse(f"{key}.{field}", f"port {port} is out of range")
                elif port not in ports:
                    ports.append(port)
        return ports

    def user(self, raw: Any, key: str) -> tuple[int | None, int | None]:
        if raw is None:
            return None, None
        user, _, group = str(raw).partition(":")
        if not user.isdigit() or (group and not group.isdigit()):
            self.refuse(key, f"user {raw!r} must be numeric (UID[:GID]) in a pod")
            return None, None
        return int(user), int(group) if group else None

    def probe(self, raw: Any, key: str) -> SidecarProbe | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            self.refuse(key, "must be a mapping")
            return None
        if raw.get("disable"):
            return None
        test = raw.get("test")
        if isinstance(test, str):
            command = test
        elif isinstance(test, list) and test and test[0] == "NONE":
            return None
        elif isinstance(test, list) and len(test) >= 2 and test[0] == "CMD-SHELL":
            command = " ".join(str(part) for part in test[1:])
        elif isinstance(test, list) and len(test) >= 2 and test[0] == "CMD":
            command = shlex.join(str(part) for part in test[1:])
        else:
            self.refuse(f"{key}.test", "must be a string or a list starting with CMD, CMD-SHELL or NONE")
            return None
        retries = raw.get("retries", 3)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            self.refuse(f"{key}.retries", f"must be a non-negative integer, not {retries!r}")
            retries = 3
        return SidecarProbe(
            command=command,
            interval_sec=self.duration(raw.get("interval"), f"{key}.interval", 30.0),
            timeout_sec=self.duration(raw.get("timeout"), f"{key}.timeout", 30.0),
            start_period_sec=self.duration(raw.get("start_period"), f"{key}.start_period", 0.0),
            retries=retries,
        )

    def duration(self, raw: Any, key: str, default: float) -> float:
        if raw is None:
            return default
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        text = str(raw).strip()
        parts = DURATION_PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            self.refuse(key, f"cannot read the duration {raw!r} (e.g. '10s', '1m30s')")
            return default
        scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(number) * scale[unit] for number, unit in parts)

    def volume_declarations(self, raw: Any) -> frozenset[str]:
        """The top-level ``volumes:`` table: each an ``emptyDir``, so only what one can be is taken."""
        if raw is None:
            return frozenset()
        if not isinstance(raw, dict):
            self.refuse("volumes", "must be a mapping of volume name to its settings")
            return frozenset()
        for name, settings in raw.items():
            key = f"volumes.{name}"
            if settings is None:
                continue
            if not isinstance(settings, dict):
                self.refuse(key, "must be a mapping (or empty)")
                continue
            for refused, reason in REFUSED_VOLUME_KEYS.items():
                if settings.get(refused):
                    self.refuse(f"{key}.{refused}", f"a pod cannot express this: {reason}")
            if settings.get("driver", "local") != "local":
                self.refuse(f"{key}.driver", "a pod cannot express this: its volumes are emptyDirs, not a driver's")
            for ignored in sorted(set(settings) & IGNORED_VOLUME_KEYS):
                self.warn(f"{key}.{ignored}", "ignored: the volume is the pod's own")
        return frozenset(str(name) for name in raw)

    def volumes(self, raw: Any, key: str, service: str) -> list[ComposeVolume]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.refuse(key, "must be a list")
            return []
        mounts: list[ComposeVolume] = []
        for index, item in enumerate(raw):
            mount = self.volume(item, f"{key}[{index}]", f"{service}-anonymous-{index}")
            if mount is None:
                continue
            if any(other.mount_path == mount.mount_path for other in mounts):
                self.refuse(mount.key, f"{mount.mount_path} is mounted twice in {service}")
                continue
            mounts.append(mount)
        return mounts

    def volume(self, item: Any, key: str, anonymous: str) -> ComposeVolume | None:
        """One entry, short (``[SOURCE:]TARGET[:MODE]``) or long syntax, as Compose reads it."""
        copy_content, create_missing = True, True
        if isinstance(item, dict):
            kind, source, target = item.get("type", "volume"), item.get("source"), item.get("target")
            read_only = bool(item.get("read_only", False))
            volume_options, bind_options = _table(item, "volume"), _table(item, "bind")
            copy_content = not volume_options.get("nocopy", False)
            if volume_options.get("subpath"):
                self.refuse(f"{key}.volume.subpath", "not supported: mount the whole volume")
                return None
            # Compose refuses a missing bind source in the long syntax unless told to create it.
            create_missing = bool(bind_options.get("create_host_path", False))
            if "consistency" in item:
                self.warn(f"{key}.consistency", "ignored in a pod")
            for option in sorted({"propagation", "selinux"} & set(bind_options)):
                self.warn(f"{key}.bind.{option}", "ignored in a pod")
        elif isinstance(item, str):
            fields = item.split(":")
            if len(fields) > 3:
                self.refuse(key, f"cannot read {item!r} as [SOURCE:]TARGET[:MODE]")
                return None
            source, target = (None, fields[0]) if len(fields) == 1 else (fields[0], fields[1])
            kind = "bind" if source is not None and source.startswith((".", "/", "~")) else "volume"
            modes = fields[2].split(",") if len(fields) == 3 else []
            read_only = "ro" in modes
            copy_content = "nocopy" not in modes
            for mode in modes:
                if mode in IGNORED_VOLUME_MODES:
                    self.warn(key, f"mode {mode!r} ignored in a pod")
                elif mode not in ("ro", "rw", "nocopy"):
                    self.refuse(key, f"unknown volume mode {mode!r}")
                    return None
        else:
            self.refuse(key, "must be a string or a mapping")
            return None
        if not isinstance(target, str) or not target.startswith("/") or posixpath.normpath(target) in ("/", "//"):
            self.refuse(key, f"a pod cannot mount {item!r}: the target must be an absolute path below /")
            return None
        mount_path = posixpath.normpath(target)
        if kind == "volume":
            name = str(source) if source else anonymous
            if source and name not in self.declared:
                self.warn(key, f"volume {name!r} is not declared under the top-level `volumes:` (Compose refuses this)")
            return ComposeVolume(
                name=name, mount_path=mount_path, read_only=read_only, copy_image_content=copy_content, key=key
            )
        if kind != "bind":
            self.refuse(key, f"a pod cannot mount a {kind!r} volume: only named or anonymous volumes and binds")
            return None
        bound = self.bind_source(source, key, create_missing)
        if bound is None:
            return None
        return ComposeVolume(
            name=bound, mount_path=mount_path, read_only=read_only, kind="bind", copy_image_content=False, key=key
        )

    def bind_source(self, source: Any, key: str, create_missing: bool) -> str | None:
        """A bind's source as a path of the task folder inside ``environment/``."""
        if not isinstance(source, str) or not source:
            self.refuse(key, "a bind needs a source")
            return None
        if source.startswith(("/", "~")):
            self.refuse(
                key,
                f"{source!r} is a path of Harbor's host; a pod can bind only files of the task's {ENVIRONMENT}/",
            )
            return None
        path = posixpath.normpath(posixpath.join(posixpath.dirname(self.file), source))
        if path != ENVIRONMENT and not path.startswith(f"{ENVIRONMENT}/"):
            self.refuse(
                key,
                f"{source!r} leaves {ENVIRONMENT}/, the folder compose runs in; a pod can bind only its files",
            )
            return None
        exists = self.files.has_file(path) or self.files.has_dir(path) or path == ENVIRONMENT
        if not exists and not create_missing:
            self.refuse(key, f"{path} is not in the task folder (Compose refuses a missing bind source)")
            return None
        return path  # a missing one is made a folder, as Compose makes it on the host

    def resources(self, service: Mapping[str, Any], key: str) -> dict[str, dict[str, str]]:
        declared = _table(_table(service, "deploy"), "resources")
        result: dict[str, dict[str, str]] = {}
        for compose_name, kube_name in (("limits", "limits"), ("reservations", "requests")):
            table = declared.get(compose_name)
            if not isinstance(table, dict):
                continue
            quantities = self.quantities(
                table.get("cpus"), table.get("memory"), f"{key}.deploy.resources.{compose_name}"
            )
            if quantities:
                result[kube_name] = quantities
        if not result:
            legacy = self.quantities(service.get("cpus"), service.get("mem_limit"), key)
            if legacy:
                result["limits"] = legacy
        return result

    def quantities(self, cpus: Any, memory: Any, key: str) -> dict[str, str]:
        quantities: dict[str, str] = {}
        if cpus is not None:
            try:
                value = float(cpus)
            except (TypeError, ValueError):
                value = -1.0
            if value <= 0:
                self.refuse(f"{key}.cpus", f"must be a positive number, not {cpus!r}")
            else:
                quantities["cpu"] = f"{round(value * 1000)}m"
        if memory is not None:
            mebibytes = _memory_mib(memory)
            if mebibytes is None:
                self.refuse(f"{key}.memory", f"cannot read the size {memory!r} (e.g. '512m', '2g')")
            else:
                quantities["memory"] = f"{mebibytes}Mi"
        return quantities

    def depends_on(self, service: Mapping[str, Any], key: str) -> list[str]:
        raw = service.get("depends_on")
        if raw is None:
            return []
        if isinstance(raw, list):
            return [str(item) for item in raw]
        if isinstance(raw, dict):
            return [str(item) for item in raw]
        self.refuse(f"{key}.depends_on", "must be a list or a mapping")
        return []


def binds_of(main_volumes: Sequence[ComposeVolume], sidecars: Sequence[Sidecar]) -> list[ComposeVolume]:
    """Every service's binds, ``main``'s first."""
    volumes = [*main_volumes, *(volume for sidecar in sidecars for volume in sidecar.volumes)]
    return [volume for volume in volumes if volume.kind == "bind"]


def sidecar_only_volumes(main_volumes: Sequence[ComposeVolume], sidecars: Sequence[Sidecar]) -> list[ComposeVolume]:
    """The sidecars' mounts of the named or anonymous volumes ``main`` does not mount, in the compose
    file's order: each is filled from a sidecar's own image (``kube/objects/pods.py``), as Docker fills
    a new volume from the container that mounts it."""
    mains = {volume.name for volume in main_volumes if volume.kind == "volume"}
    return [
        volume
        for sidecar in sidecars
        for volume in sidecar.volumes
        if volume.kind == "volume" and volume.name not in mains
    ]


def bound_archive(files: TaskFiles, binds: Sequence[ComposeVolume]) -> bytes:
    """The files ``binds`` name, as a tar named relative to ``environment/``: each bound file, each
    bound folder with what is below it, a missing source as an empty folder (Compose makes it).
    Deterministic (sorted, zero times) and root's, folders 0755, files with their modes — as a
    checkout on Harbor's host would show them to a root container."""
    paths: set[str] = set()
    for bind in binds:
        paths.add(bind.name)
        paths.update(path for path in (*files, *files.directories) if path.startswith(f"{bind.name}/"))
    for path in list(paths):
        while (path := posixpath.dirname(path)) not in ("", ENVIRONMENT):
            paths.add(path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(paths - {ENVIRONMENT}):
            info = tarfile.TarInfo(posixpath.relpath(path, ENVIRONMENT))
            if files.has_file(path):
                info.size, info.mode = len(files[path].data), files[path].mode
                archive.addfile(info, io.BytesIO(files[path].data))
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
    return buffer.getvalue()


def _overlaps(mount_path: str, path: str) -> bool:
    """Whether a mount at ``mount_path`` is ``path``, inside it or holds it."""
    return mount_path == path or mount_path.startswith(f"{path}/") or path.startswith(f"{mount_path.rstrip('/')}/")


def _table(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``mapping[key]`` when it is a mapping, else an empty one (compose leaves most keys optional)."""
    value = mapping.get(key)
    return value if isinstance(value, dict) else {}


def _memory_mib(raw: Any) -> int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return max(1, raw // (1024 * 1024))
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*", str(raw).lower())
    if match is None:
        return None
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1 / (1024 * 1024), "b": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1.0, "g": 1024.0}[unit]
    return max(1, int(number * scale))
