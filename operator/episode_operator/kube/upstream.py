"""Where the capture proxy sends the model key: ``spec.agent.model.baseURL``'s host, resolved by the operator.

The proxy never resolves the hostname itself: it shares the pod's ``/etc/hosts`` and
``/etc/resolv.conf`` with the agent, who is root in its own container and could point the name at
a listener of its own. So the operator pins the addresses when it makes the pod
(``capture-proxy --upstream-address``), by the first of these that answers:

- an IP address: as it is;
- a Service name -- ``svc`` (in the Episode's namespace), ``svc.ns``, ``svc.ns.svc`` or
  ``svc.ns.svc.cluster.local`` -- its cluster IPs, read from the API (neither the operator run
  outside the cluster nor the sandbox pods need DNS for them);
- anything else, and a Service-shaped name the API does not answer for (``example.com`` is also
  ``svc.ns``; a headless Service has no cluster IP; a Service outside the namespaces the operator
  may read is forbidden to it): the operator's own resolver -- except a name that says ``.svc``
  of a Service the API says does not exist, which no cluster DNS would resolve either.

None answers: the Episode is refused before any pod, naming ``spec.agent.model.baseURL`` and why.
The addresses are resolved each time the operator starts driving an Episode and are fixed for the
life of each pod made then: a DNS change during an episode reaches the pods of later attempts after
an operator restart, never a running pod (its calls to an address that stopped answering fail as
``upstream_unreachable``, an outage).
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol
from urllib.parse import urlsplit

from episode_operator.capture.wire import is_ip_address
from episode_operator.kube.client import KubeClient, KubeError, NotFound
from episode_operator.kube.objects.pods import AgentImages
from episode_operator.runtime.agents.model import CaptureBounds, SandboxNeeds

FIELD = "spec.agent.model.baseURL"
CLUSTER_DOMAIN = "cluster.local"
# A Service's name is a DNS-1035 label, a namespace's a DNS-1123 label.
SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

# A hostname and port → its addresses (the operator's resolver: getaddrinfo).
HostResolver = Callable[[str, int], Awaitable[Sequence[str]]]


class ServiceReader(Protocol):
    async def service_cluster_ips(self, namespace: str, name: str) -> list[str]: ...


class Unresolvable(Exception):
    """The model endpoint's host has no address the operator can pin (the message names the field)."""


@dataclass(frozen=True)
class ServiceName:
    namespace: str
    name: str
    explicit: bool  # ``….svc[.cluster.local]``: a Service's, and nothing else's

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int


def upstream_of(base_url: str) -> Upstream:
    parts = urlsplit(base_url)
    if not parts.hostname:
        raise Unresolvable(f"{FIELD}: {base_url!r} names no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        raise Unresolvable(f"{FIELD}: {base_url!r}: {error}") from None
    return Upstream(parts.hostname.rstrip("."), port)


def service_of(host: str, namespace: str) -> ServiceName | None:
    """The Service ``host`` names as pods' DNS reads it (``namespace``: the Episode's), if it is shaped so."""
    labels = host.lower().split(".")
    explicit = labels[2:] in (["svc"], ["svc", *CLUSTER_DOMAIN.split(".")])
    if explicit or len(labels) == 2:
        service, namespace = labels[0], labels[1]
    elif len(labels) == 1:
        service = labels[0]
    else:
        return None
    if SERVICE_NAME.match(service) and NAMESPACE_NAME.match(namespace):
        return ServiceName(namespace, service, explicit)
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    """The operator's own resolver (its pod's DNS, or the machine's)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def pin_upstream(
    services: ServiceReader, namespace: str, base_url: str, resolve: HostResolver = system_resolver
) -> tuple[str, ...]:
    """The addresses the capture proxy of an Episode in ``namespace`` may send its key to."""
    upstream = upstream_of(base_url)
    if is_ip_address(upstream.host):
        return (upstream.host,)
    causes = []
    service = service_of(upstream.host, namespace)
    if service is not None:
        try:
            addresses = await services.service_cluster_ips(service.namespace, service.name)
        except NotFound as error:
            if service.explicit:
                raise Unresolvable(f"{FIELD}: cannot resolve {upstream.host}: service {service}: {error}") from None
            causes.append(f"service {service}: {error}")
        except KubeError as error:
            causes.append(f"service {service}: {error}")
        else:
            if addresses:
                return tuple(addresses)
            causes.append(f"service {service} has no cluster IP (headless or ExternalName)")
    try:
        resolved = await resolve(upstream.host, upstream.port)
    except OSError as error:
        causes.append(f"the operator's resolver: {error}")
    else:
        if resolved:
            return tuple(dict.fromkeys(resolved))  # in order, once each
        causes.append("the operator's resolver: no address")
    raise Unresolvable(f"{FIELD}: cannot resolve {upstream.host}: {'; '.join(causes)}")


async def model_problem(client: KubeClient, namespace: str, needs: SandboxNeeds, images: AgentImages) -> str | None:
    """What stops an agent pod of ``needs`` in ``namespace`` from calling its model (None: nothing): the
    operator's capture image, the key's Secret and key. An Episode is refused at seed with it; a warm pool
    makes no pods (they would never start)."""
    if needs.capture is None:
        return None
    if images.capture is None:
        return (
            "spec.agent.model: this operator has no capture image (episode-operator run "
            "--capture-image, the chart sets it to its own image)"
        )
    secret = needs.capture.secret
    if secret is None:
        return None
    field_name = "spec.agent.model.apiKeySecretRef"
    try:
        keys = await client.secret_keys(namespace, secret.name)
    except NotFound:
        return f"{field_name}: secret {namespace}/{secret.name} not found"
    except KubeError as error:
        return f"{field_name}: cannot read secret {secret.name}: {error}"
    if secret.key not in keys:
        return (
            f"{field_name}: secret {namespace}/{secret.name} has no key {secret.key!r} "
            f"(keys: {', '.join(sorted(keys)) or 'none'})"
        )
    return None


async def pinned_needs(
    client: KubeClient, namespace: str, needs: SandboxNeeds, bounds: CaptureBounds, resolve: HostResolver
) -> SandboxNeeds:
    """``needs`` with the capture proxy's upstream pinned and its settings, as an attempt's agent pod and a
    warm pool's pod both get them (so their pod specs, and keys, are equal). Raises :class:`Unresolvable`."""
    if needs.capture is None:
        return needs
    addresses = await pin_upstream(client, namespace, needs.capture.upstream, resolve)
    return replace(needs, capture=replace(needs.capture, upstream_addresses=addresses, bounds=bounds))
