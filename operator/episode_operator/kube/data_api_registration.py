"""The data API in the cluster: its registration, its front proxy, its certificate, its authorizer.

``start_data_api`` (called once at startup) takes the serving certificate of the operator's Service
from a Secret beside it (``<service>-data-api-serving``; the first replica to start makes it, a
self-signed one, and every replica serves that one), starts ``runtime/data_api_server.py`` over TLS and
only then registers the APIService ``v1alpha1.data.episode-operator.dev`` for that Service with the
certificate as its ``caBundle``, so the API server verifies whom it talks to — whichever replica
the Service sends it to — and a certificate is trusted only once it is served. Deleting the
Secret and restarting the replicas makes a new certificate.
The operator, not the Helm chart, writes the APIService: a Kubernetes 1.20 API server panics on a
server-side apply of an APIService (kubernetes#89264), which is how Helm 4 installs, and the
certificate is the operator's. An APIService left pointing at nothing keeps its group
"unavailable", which holds up every namespace deletion of the cluster, so it never outlives the
install: its owner (and the Secret's) is the ClusterRole that grants the data API's rights
(``--data-api-owner``), and when an uninstall removes that, the garbage collector removes them,
whatever became of the operator. The last replica to stop also removes the registration (the
group is then absent, not unavailable, while it restarts); one stopping while another stays — a
rolling update, a scale-down — leaves it to that one. One operator per cluster serves the data
API; another one finding it served by a live operator logs why and serves none.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from episode_operator.api.vocabulary import MANAGED_BY
from episode_operator.kube.client import Conflict, KubeClient, KubeError, NotFound
from episode_operator.runtime.data_api_server import (
    API_SERVICE,
    DATA_GROUP,
    DATA_VERSION,
    Access,
    Caller,
    Decision,
    FrontProxy,
    serve,
    server_context,
)
from episode_operator.runtime.episode_store import BlobStore

# Where the API server publishes its --requestheader-* settings for aggregated API servers.
AUTHENTICATION_CONFIG_MAP = ("kube-system", "extension-apiserver-authentication")
# Pinned by caBundle, so expiry protects nothing here; a new one is made by deleting its Secret.
CERTIFICATE_DAYS = 3650
SERVING_SECRET_SUFFIX = "-data-api-serving"  # the Secret of the serving certificate: <service><suffix>
SERVICE_PORT = 443  # the Service's data-api port (the chart's)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class DataApiUnavailable(Exception):
    """The data API cannot start; the message says what to fix."""


def front_proxy_from(data: dict[str, str] | None) -> FrontProxy:
    """The front proxy's settings from the ``extension-apiserver-authentication`` ConfigMap's data."""
    data = data or {}
    client_ca = data.get("requestheader-client-ca-file", "")
    if not client_ca.strip():
        raise DataApiUnavailable(
            "the API server has no front proxy (kube-apiserver --requestheader-client-ca-file and "
            "--proxy-client-cert-file): it cannot forward requests to aggregated APIs such as the data API"
        )

    def listed(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(json.loads(data[key])) if data.get(key) else default

    return FrontProxy(
        client_ca=client_ca,
        allowed_names=listed("requestheader-allowed-names", ()),
        username_headers=listed("requestheader-username-headers", ("X-Remote-User",)),
        group_headers=listed("requestheader-group-headers", ("X-Remote-Group",)),
        extra_headers_prefixes=listed("requestheader-extra-headers-prefix", ("X-Remote-Extra-",)),
    )


def self_signed_certificate(hostnames: list[str]) -> tuple[bytes, bytes]:
    """A serving certificate (PEM) and its key for these DNS names."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in hostnames]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def owned_metadata(owner: tuple[str, str] | None, **fields: str) -> dict[str, Any]:
    """Metadata of what the data API writes: labelled as ours, owned by the ClusterRole ``owner``
    (name, uid) when there is one, so that an uninstall removes it."""
    metadata: dict[str, Any] = {**fields, "labels": dict(MANAGED_BY)}
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": owner[0], "uid": owner[1]}
        ]
    return metadata


def serving_secret_manifest(
    name: tuple[str, str], certificate: bytes, key: bytes, owner: tuple[str, str] | None
) -> dict[str, Any]:
    """The Secret (namespace, name) holding the serving certificate, owned like the APIService."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": owned_metadata(owner, name=name[1], namespace=name[0]),
        "data": {"tls.crt": base64.b64encode(certificate).decode(), "tls.key": base64.b64encode(key).decode()},
    }


def certificate_of(secret: dict[str, Any], hostnames: list[str]) -> tuple[bytes, bytes]:
    """The serving certificate and key a Secret holds; :class:`DataApiUnavailable` naming the Secret
    and what is wrong when it holds none for ``hostnames``."""
    where = f"Secret {secret['metadata']['namespace']}/{secret['metadata']['name']}"
    data = secret.get("data") or {}
    try:
        certificate, key = (base64.b64decode(data[field]) for field in ("tls.crt", "tls.key"))
        parsed = x509.load_pem_x509_certificate(certificate)
        private = serialization.load_pem_private_key(key, password=None)
        names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        served = set(names.get_values_for_type(x509.DNSName))
    except (KeyError, ValueError, TypeError, x509.ExtensionNotFound) as error:
        raise DataApiUnavailable(
            f"{where} holds no serving certificate (tls.crt, tls.key): {error!r}; delete it and restart the "
            "operator to have a new one made"
        ) from error
    if private.public_key() != parsed.public_key():
        raise DataApiUnavailable(f"{where}: tls.key is not the key of tls.crt; delete it and restart the operator")
    if missing := sorted(set(hostnames) - served):
        raise DataApiUnavailable(
            f"{where}: its certificate is not for {', '.join(missing)}; delete it and restart the operator"
        )
    return certificate, key


async def shared_certificate(
    client: KubeClient, service: tuple[str, str], hostnames: list[str], owner: tuple[str, str] | None
) -> tuple[bytes, bytes]:
    """The serving certificate every replica of ``service`` serves: read from its Secret, or made
    and stored there by the first replica to look (another one creating it first wins)."""
    name = (service[0], f"{service[1]}{SERVING_SECRET_SUFFIX}")
    while True:
        try:
            return certificate_of(await client.get_secret(*name), hostnames)
        except NotFound:
            pass
        certificate, key = self_signed_certificate(hostnames)
        try:
            await client.create_secret(serving_secret_manifest(name, certificate, key, owner))
        except Conflict:
            continue  # another replica stored one a moment ago: serve that one
        return certificate, key


@dataclass(frozen=True)
class SubjectAccessReviewer:
    """Delegated authorization: the API server's own answer for the caller it forwarded."""

    client: KubeClient

    async def __call__(self, caller: Caller, access: Access) -> Decision:
        attributes = {
            "namespace": access.namespace,
            "name": access.name,
            "verb": access.verb,
            "group": access.group,
            "version": access.version,
            "resource": access.resource,
            "subresource": access.subresource,
        }
        extra = {key: list(values) for key, values in (caller.extra or {}).items()}
        try:
            allowed, reason = await self.client.review_access(caller.user, caller.groups, extra, attributes)
        except KubeError as error:
            return Decision(False, f"authorization could not be checked: {error}")
        return Decision(allowed, reason)


def api_service_manifest(service: tuple[str, str], ca_bundle: bytes, owner: tuple[str, str] | None) -> dict[str, Any]:
    """The APIService that sends the data API's group to ``service`` (namespace, name), port 443,
    owned by the ClusterRole ``owner`` (name, uid) when there is one."""
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": owned_metadata(owner, name=API_SERVICE),
        "spec": {
            "group": DATA_GROUP,
            "version": DATA_VERSION,
            "service": {"namespace": service[0], "name": service[1], "port": SERVICE_PORT},
            "caBundle": base64.b64encode(ca_bundle).decode(),
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
        },
    }


def _points_at(api_service: dict[str, Any], service: tuple[str, str]) -> bool:
    target = (api_service.get("spec") or {}).get("service") or {}
    return (target.get("namespace"), target.get("name")) == service


def _available(api_service: dict[str, Any]) -> bool:
    conditions = (api_service.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


async def register(
    client: KubeClient, service: tuple[str, str], ca_bundle: bytes, owner: tuple[str, str] | None
) -> None:
    """Create or take over the APIService for ``service``; refuse while another operator serves it."""
    manifest = api_service_manifest(service, ca_bundle, owner)
    try:
        current = await client.get_api_service(API_SERVICE)
    except NotFound:
        await client.create_api_service(manifest)
        return
    if not _points_at(current, service) and _available(current):
        other = current["spec"]["service"]
        raise DataApiUnavailable(
            f"it is served by the operator of Service {other['namespace']}/{other['name']}: one operator per "
            "cluster serves it (the Helm chart's dataApi.enabled=false turns it off in the others)"
        )
    owners = manifest["metadata"].get("ownerReferences")
    if current.get("spec") == manifest["spec"] and current["metadata"].get("ownerReferences") == owners:
        return  # another replica registered it as this one would (the certificate is shared)
    manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await client.replace_api_service(manifest)


async def unregister(client: KubeClient, service: tuple[str, str]) -> None:
    """Remove the APIService if it still sends the group to ``service`` (and nobody changed it since)."""
    with contextlib.suppress(NotFound, Conflict):
        current = await client.get_api_service(API_SERVICE)
        if _points_at(current, service):
            await client.delete_api_service(API_SERVICE, current["metadata"]["resourceVersion"])


def pod_namespace() -> str:
    """The namespace this pod runs in (its service account's), where its Service is."""
    return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()


async def nobody_else() -> list[str]:
    """A sole replica: no other replica serves the data API when this one stops."""
    return []


@dataclass
class DataApi:
    """The running data API: stop it with ``cleanup`` (unregister unless another replica stays,
    then stop serving)."""

    runner: web.AppRunner
    client: KubeClient
    service: tuple[str, str]
    others_staying: Callable[[], Awaitable[list[str]]]
    logger: logging.Logger | logging.LoggerAdapter[Any]

    async def cleanup(self) -> None:
        staying = await self.others_staying()
        if staying:
            self.logger.info("the data API stays registered: replicas %s serve it", ", ".join(staying))
        else:  # on failure the registration stays; the next operator to start takes it over
            with contextlib.suppress(KubeError):
                await unregister(self.client, self.service)
        await self.runner.cleanup()


async def start_data_api(
    client: KubeClient,
    store: BlobStore,
    host: str,
    port: int,
    service_name: str,
    owner_name: str,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    others_staying: Callable[[], Awaitable[list[str]]] = nobody_else,
) -> DataApi | None:
    """Serve the data API and register it for the Service ``service_name`` (``NAMESPACE/NAME``, or
    ``NAME`` in this pod's namespace), owned by the ClusterRole ``owner_name`` ("": none); None (and an
    error logged) when it cannot. ``others_staying`` names, as this one stops, the other replicas
    that go on serving it."""
    try:
        namespace, _, name = service_name.rpartition("/")
        service = (namespace or pod_namespace(), name)
        owner = (owner_name, await client.get_cluster_role_uid(owner_name)) if owner_name else None
        hostnames = [f"{service[1]}.{service[0]}.svc", f"{service[1]}.{service[0]}.svc.cluster.local"]
        authentication = await client.get_config_map(*AUTHENTICATION_CONFIG_MAP)
        front_proxy = front_proxy_from(authentication.data)
        certificate, key = await shared_certificate(client, service, hostnames, owner)
        context = server_context(certificate, key, front_proxy)
        runner = await serve(front_proxy, SubjectAccessReviewer(client), store, context, host, port)
        try:
            await register(client, service, certificate, owner)
        except BaseException:
            await runner.cleanup()
            raise
    except (KubeError, DataApiUnavailable, OSError) as error:
        logger.error(
            "the data API (apiservice %s: logs and artifacts through the API server) is off: %s", API_SERVICE, error
        )
        return None
    logger.info("serving the data API %s on port %d for Service %s/%s", API_SERVICE, port, *service)
    return DataApi(runner, client, service, others_staying, logger)
