"""The operator's data API: each Episode's kept logs and artifacts, as an aggregated Kubernetes API.

Why aggregated: the API server authenticates the caller (any method: client certificate, token,
OIDC, exec plugin), authorizes the request with RBAC on ``episodes/log`` or ``episodes/artifacts``
of the group ``data.episode-operator.dev``, and forwards it here over TLS with its front-proxy
client certificate and the caller's identity in ``X-Remote-*`` headers. A proxied Service (the
API server's ``services/proxy``) would hide who is asking: the API server drops the caller's
credentials before proxying, and client-certificate users have no token to pass on. So:

- a request without the front proxy's certificate (e.g. from any pod of the cluster, straight to
  this port) is answered 401;
- a request with it carries the caller; the operator asks the API server again with a
  SubjectAccessReview (the delegated authorization every extension API server does) and answers
  403 when it is not allowed;
- ``/metrics`` and the health endpoint are not here: they stay open on their own port.

Paths, as the API server forwards them (``kubectl get --raw`` works too)::

    /apis/data.episode-operator.dev/v1alpha1                                         discovery
    /apis/data.episode-operator.dev/v1alpha1/namespaces/NS/episodes/NAME/log         ?turn=&attempt=&uid=
    /apis/data.episode-operator.dev/v1alpha1/namespaces/NS/episodes/NAME/artifacts   a .tar.gz
    /apis/data.episode-operator.dev/v1alpha1/namespaces/NS/episodes/NAME/turns       ?attempt= (JSON: each
                                                   turn's instruction, model calls, trajectory)

A new kind of kept data is one more entry of ``SUBRESOURCES``: its route, its discovery entry and
its RBAC subresource follow from that entry.

This module knows no Kubernetes client: the caller of :func:`serve` passes the front proxy's
settings (from the ``extension-apiserver-authentication`` ConfigMap) and the authorizer.
"""

from __future__ import annotations

import asyncio
import io
import json
import ssl
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from aiohttp import web

from episode_operator.runtime.store import episode_store_root, export_artifacts, stored_logs, turn_records

DATA_GROUP = "data.episode-operator.dev"
DATA_VERSION = "v1alpha1"
API_SERVICE = f"{DATA_VERSION}.{DATA_GROUP}"
RESOURCE = "episodes"
PREFIX = f"/apis/{DATA_GROUP}/{DATA_VERSION}"


@dataclass(frozen=True)
class Caller:
    """Who the API server says is asking."""

    user: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class Access:
    """What is asked: ``get`` of one subresource of one Episode (a SubjectAccessReview's resourceAttributes)."""

    namespace: str
    name: str
    subresource: str
    verb: str = "get"
    group: str = DATA_GROUP
    version: str = DATA_VERSION
    resource: str = RESOURCE


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class Authorizer(Protocol):
    async def __call__(self, caller: Caller, access: Access) -> Decision: ...


@dataclass(frozen=True)
class FrontProxy:
    """How the API server forwards requests to aggregated APIs (its ``--requestheader-*`` flags)."""

    client_ca: str  # PEM: the CA that signed the API server's proxy client certificate
    allowed_names: tuple[str, ...] = ()  # empty: any certificate that CA signed
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_headers_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    def forwarded(self, request: web.Request) -> bool:
        """Whether the request came from the front proxy (with or without a user).

        The TLS handshake has already checked that a client certificate, if any, is signed by
        ``client_ca`` (the server's context trusts nothing else), so a certificate here is the
        front proxy's when its common name is allowed.
        """
        certificate = request.transport.get_extra_info("peercert") if request.transport else None
        if not certificate:
            return False
        names = {value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"}
        return not self.allowed_names or bool(names & set(self.allowed_names))

    def caller(self, request: web.Request) -> Caller | None:
        """The caller of a request forwarded by the front proxy, else None."""
        if not self.forwarded(request):
            return None
        user = next((request.headers[h] for h in self.username_headers if request.headers.get(h)), "")
        if not user:
            return None
        groups = tuple(group for header in self.group_headers for group in request.headers.getall(header, ()))
        extra: dict[str, tuple[str, ...]] = {}
        for header in request.headers:
            prefix = next((p for p in self.extra_headers_prefixes if header.lower().startswith(p.lower())), None)
            if prefix is not None:
                # Extra keys are percent-encoded in header names (X-Remote-Extra-Scopes%2Fa).
                extra[unquote(header[len(prefix) :].lower())] = tuple(request.headers.getall(header))
        return Caller(user, groups, extra)


# --- The kept data, one entry per subresource -----------------------------------------------------
Serve = Callable[[Path, Mapping[str, str]], Awaitable[web.Response]]


async def _logs(root: Path, query: Mapping[str, str]) -> web.Response:
    turn = query.get("turn")
    attempt = int(query["attempt"]) if query.get("attempt", "").isdigit() else None
    chunks: list[bytes] = []
    for log in await asyncio.to_thread(stored_logs, root, turn=turn, attempt=attempt):
        chunks.append(f"==> attempt {log.attempt} turn {log.turn}: {log.name} <==\n".encode())
        chunks.append(await asyncio.to_thread(log.path.read_bytes))
        chunks.append(b"\n")
    if not chunks:
        raise _status(404, "NotFound", "no logs kept" + (f" for turn {turn}" if turn else ""))
    return web.Response(body=b"".join(chunks), content_type="text/plain")


async def _turns(root: Path, query: Mapping[str, str]) -> web.Response:
    """Each turn's instruction, recorded model calls and trajectory (export, ``kubectl episode trajectory``)."""
    attempt = int(query["attempt"]) if query.get("attempt", "").isdigit() else None
    return web.json_response(await asyncio.to_thread(turn_records, root, attempt=attempt))


async def _artifacts(root: Path, _: Mapping[str, str]) -> web.Response:
    body = await asyncio.to_thread(_artifacts_tar, root)
    if body is None:
        raise _status(404, "NotFound", "no artifacts kept")
    return web.Response(body=body, content_type="application/gzip")


def _artifacts_tar(root: Path) -> bytes | None:
    with tempfile.TemporaryDirectory() as scratch:
        written = export_artifacts(root, Path(scratch))
        if not written:
            return None
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for child in sorted(Path(scratch).iterdir()):
                archive.add(child, arcname=child.name)
        return buffer.getvalue()


@dataclass(frozen=True)
class Subresource:
    """One kind of kept data: its handler and its discovery kind."""

    serve: Serve
    kind: str


SUBRESOURCES: dict[str, Subresource] = {
    "log": Subresource(_logs, "EpisodeLog"),
    "artifacts": Subresource(_artifacts, "EpisodeArtifacts"),
    "turns": Subresource(_turns, "EpisodeTurns"),
}


def discovery() -> dict[str, Any]:
    """The APIResourceList the API server fetches to serve (and check the availability of) the group."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{DATA_GROUP}/{DATA_VERSION}",
        "resources": [
            {"name": f"{RESOURCE}/{name}", "singularName": "", "namespaced": True, "kind": entry.kind, "verbs": ["get"]}
            for name, entry in SUBRESOURCES.items()
        ],
    }


def _status(code: int, reason: str, message: str) -> web.HTTPException:
    """An error as the Kubernetes Status object kubectl and the clients print."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body |= {"message": message, "reason": reason, "code": code}
    error = web.HTTPException(text=json.dumps(body), content_type="application/json")
    error.set_status(code)
    return error


def _kept_root(data_dir: Path, namespace: str, name: str, uid: str | None) -> Path:
    """The Episode's folder: the given uid's, else the most recently written one of that name."""
    if uid:
        return episode_store_root(data_dir, namespace, name, uid)
    parent = episode_store_root(data_dir, namespace, name, "x").parent
    folders = [child for child in parent.iterdir() if child.is_dir()] if parent.is_dir() else []
    return max(folders, key=lambda folder: folder.stat().st_mtime, default=parent / "-")


def application(front_proxy: FrontProxy, authorize: Authorizer, data_dir: Path) -> web.Application:
    """The aiohttp application (separate from serving it, for tests)."""

    def authenticated(request: web.Request) -> Caller:
        caller = front_proxy.caller(request)
        if caller is None:
            raise _status(401, "Unauthorized", f"not forwarded by the Kubernetes API server: ask it ({PREFIX}/...)")
        return caller

    async def show_discovery(request: web.Request) -> web.Response:
        # The API server's availability check has the front proxy's certificate but no user.
        if not front_proxy.forwarded(request):
            raise _status(401, "Unauthorized", f"not forwarded by the Kubernetes API server: ask it ({PREFIX})")
        return web.json_response(discovery())

    async def show_subresource(request: web.Request) -> web.Response:
        caller = authenticated(request)
        info = request.match_info
        entry = SUBRESOURCES.get(info["subresource"])
        if entry is None:
            raise _status(404, "NotFound", f"{RESOURCE} has no subresource {info['subresource']!r}")
        access = Access(info["namespace"], info["name"], info["subresource"])
        decision = await authorize(caller, access)
        if not decision.allowed:
            raise _status(
                403,
                "Forbidden",
                f'{RESOURCE}.{DATA_GROUP} "{access.name}" is forbidden: User "{caller.user}" cannot get '
                f'resource "{RESOURCE}/{access.subresource}" in API group "{DATA_GROUP}" in the namespace '
                f'"{access.namespace}"' + (f": {decision.reason}" if decision.reason else ""),
            )
        root = await asyncio.to_thread(_kept_root, data_dir, access.namespace, access.name, request.query.get("uid"))
        if not root.is_dir():
            raise _status(404, "NotFound", f"nothing kept for {access.namespace}/{access.name}")
        return await entry.serve(root, request.query)

    app = web.Application()
    app.router.add_get(PREFIX, show_discovery)
    app.router.add_get(PREFIX + "/namespaces/{namespace}/" + RESOURCE + "/{name}/{subresource}", show_subresource)
    return app


def server_context(certificate_pem: bytes, key_pem: bytes, front_proxy: FrontProxy) -> ssl.SSLContext:
    """TLS with our serving certificate; a client certificate is optional and must be the front proxy's CA's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # no default CAs: only client_ca may sign a client
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory() as scratch:
        certificate, key = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
        certificate.write_bytes(certificate_pem)
        key.write_bytes(key_pem)
        key.chmod(0o600)
        context.load_cert_chain(certificate, key)
    context.load_verify_locations(cadata=front_proxy.client_ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


async def serve(
    front_proxy: FrontProxy,
    authorize: Authorizer,
    data_dir: Path,
    context: ssl.SSLContext,
    host: str,
    port: int,
) -> web.AppRunner:
    """Start serving over TLS; the caller keeps the runner and cleans it up at shutdown."""
    runner = web.AppRunner(application(front_proxy, authorize, data_dir), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    return runner
