"""An agent's model endpoint, reached through the pod's capture proxy.

Every model call an agent makes goes to the capture proxy in its pod (``episode-operator
capture-proxy``, a container of the agent pod whose store is mounted in no other container),
which records the call and forwards it to ``spec.agent.model.baseURL`` with the real key.
The agent is given the proxy's address and a placeholder key: the key lives in the capture
container's environment only, so it appears in no log, status, Event, store or export.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from episode_operator.api.episode_resource import ModelEndpoint, SecretKeyRef
from episode_operator.capture.capture_store import MAX_JOURNAL_BYTES, MAX_RECORD_BYTES
from episode_operator.capture.wire import agent_base_url

# The capture container: its name in the agent pod, the loopback port its proxy listens on (an
# unlikely one: the pod's network is the task's too), and its store (an emptyDir only it mounts).
CAPTURE_CONTAINER: Final = "capture"
CAPTURE_PORT: Final = 47311
CAPTURE_STORE: Final = "/capture"
# What the agent holds instead of the key: the proxy writes the real one into every request.
PLACEHOLDER_KEY: Final = "episode-operator-capture-proxy-holds-the-key"


# Where the harnesses' toolchains are mounted in the main container, one folder each.
TOOLCHAINS: Final = "/opt/episode-operator/toolchains"


@dataclass(frozen=True)
class Toolchain:
    """A harness's self-contained tree, copied into the agent pod by an init container of its image."""

    name: str
    version: str

    @property
    def path(self) -> str:
        """Where the tree is mounted (read-only) in the main container."""
        return f"{TOOLCHAINS}/{self.name}"


# The capture container's resources by default (--capture-requests, --capture-limits): it asks for
# little (it mostly waits on the model); its memory limit holds a few calls at the proxy's largest
# request (32 MiB, parsed as JSON) with their records, far above what a long streamed session takes.
CAPTURE_REQUESTS: Final[Mapping[str, str]] = {"cpu": "10m", "memory": "64Mi"}
CAPTURE_LIMITS: Final[Mapping[str, str]] = {"cpu": "1", "memory": "1Gi"}


@dataclass(frozen=True)
class CaptureBounds:
    """What the operator gives every capture container (its settings): Kubernetes resource quantities,
    and what its proxy may store (a body in one record; all of an attempt's journal)."""

    requests: Mapping[str, str] = field(default_factory=lambda: dict(CAPTURE_REQUESTS))
    limits: Mapping[str, str] = field(default_factory=lambda: dict(CAPTURE_LIMITS))
    max_record_bytes: int = MAX_RECORD_BYTES
    max_journal_bytes: int = MAX_JOURNAL_BYTES


@dataclass(frozen=True)
class Capture:
    """The capture container an agent pod needs: where calls go, the key's Secret, what to record.

    ``upstream_addresses``: where the upstream's host was resolved to by the operator when it admitted
    the Episode (kube/upstream.py), the only addresses the proxy connects to; ``bounds``: its settings."""

    upstream: str
    secret: SecretKeyRef | None
    token_ids: bool
    upstream_addresses: tuple[str, ...] = ()
    bounds: CaptureBounds = field(default_factory=CaptureBounds)
    # spec.agent.model.params, which the proxy sets on every call (capture/wire.py, rewrite_request).
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxNeeds:
    """What an agent kind adds to the agent pod (rendered by ``kube/objects/pods.py``)."""

    toolchains: tuple[Toolchain, ...] = ()
    capture: Capture | None = None


def capture_of(model: ModelEndpoint | None, *, token_ids: bool) -> Capture | None:
    if model is None:
        return None
    return Capture(model.base_url, model.api_key_secret_ref, token_ids, params=dict(model.params))


def proxied_base_url(model: ModelEndpoint) -> str:
    """The base URL the agent uses: the capture proxy, with the endpoint's path (``/v1``…)."""
    return agent_base_url("127.0.0.1", CAPTURE_PORT, model.base_url)


def model_env(model: ModelEndpoint) -> dict[str, str]:
    """The model's coordinates for a ``command`` agent, in the variables common clients read."""
    base_url = proxied_base_url(model)
    env = {
        "EPISODE_MODEL": model.name,
        "EPISODE_MODEL_API": model.api,
        "EPISODE_MODEL_BASE_URL": base_url,
        "EPISODE_MODEL_API_KEY": PLACEHOLDER_KEY,
    }
    if model.api == "messages":
        env |= {"ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": PLACEHOLDER_KEY}
    else:
        env |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": PLACEHOLDER_KEY}
    return env
