"""The data API in the cluster: its front proxy, its serving certificate, its authorizer.

``start_data_api`` (called once at startup) reads where the chart's APIService points, issues a
self-signed serving certificate for that Service's name, starts ``runtime/dataapi.py`` over TLS and
only then writes the certificate into the APIService's ``caBundle``, so the API server verifies
whom it talks to and a new certificate is trusted only once it is served. The certificate lives
as long as the process: a restarted operator issues and registers a new one.
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from episode_operator.kube.client import KubeClient, KubeError
from episode_operator.runtime.dataapi import (
    API_SERVICE,
    Access,
    Caller,
    Decision,
    FrontProxy,
    serve,
    server_context,
)

# Where the API server publishes its --requestheader-* settings for aggregated API servers.
AUTHENTICATION_CONFIG_MAP = ("kube-system", "extension-apiserver-authentication")
CERTIFICATE_DAYS = 3650  # pinned by caBundle and replaced at every start: expiry protects nothing here


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


def service_hostnames(api_service: dict[str, Any]) -> list[str]:
    """The names the API server checks our certificate against: ``<service>.<namespace>.svc``."""
    service = (api_service.get("spec") or {}).get("service") or {}
    if not service.get("name") or not service.get("namespace"):
        raise DataApiUnavailable(f"apiservice {API_SERVICE} names no Service (spec.service)")
    base = f"{service['name']}.{service['namespace']}.svc"
    return [base, f"{base}.cluster.local"]


async def start_data_api(
    client: KubeClient, data_dir: Path, host: str, port: int, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> web.AppRunner | None:
    """Serve the data API and register its certificate; None (and an error logged) when it cannot."""
    try:
        api_service = await client.get_api_service(API_SERVICE)
        hostnames = service_hostnames(api_service)
        authentication = await client.get_config_map(*AUTHENTICATION_CONFIG_MAP)
        front_proxy = front_proxy_from(authentication.data)
        certificate, key = self_signed_certificate(hostnames)
        runner = await serve(
            front_proxy,
            SubjectAccessReviewer(client),
            data_dir,
            server_context(certificate, key, front_proxy),
            host,
            port,
        )
        try:
            await client.set_api_service_ca_bundle(API_SERVICE, certificate)
        except BaseException:
            await runner.cleanup()
            raise
    except (KubeError, DataApiUnavailable) as error:
        logger.error(
            "the data API (logs and artifacts through the API server, apiservice %s) is off: %s", API_SERVICE, error
        )
        return None
    logger.info("serving the data API %s on port %d as %s", API_SERVICE, port, hostnames[0])
    return runner
