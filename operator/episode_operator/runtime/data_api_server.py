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
import json
import ssl
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote

from aiohttp import web

from episode_operator.runtime.episode_store import (
    BlobStore,
    EpisodeBlobs,
    export_artifacts,
    kept_logs,
    render_logs,
    turn_records,
)

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
Serve = Callable[[EpisodeBlobs, Mapping[str, str]], Awaitable[web.Response]]


async def _logs(blobs: EpisodeBlobs, query: Mapping[str, str]) -> web.Response:
    """The logs as ``kubectl episode logs`` prints them; with ``log=NAME``, the latest such log's own
    bytes, no header (what ``logs -f`` prints of an agent whose pod went before its end was read)."""
    turn = query.get("turn")
    attempt = int(query["attempt"]) if query.get("attempt", "").isdigit() else None
    name = query.get("log")
    logs = await kept_logs(blobs, turn=turn, attempt=attempt, name=name)
    if not logs:
        raise _status(404, "NotFound", "no logs kept" + (f" for turn {turn}" if turn else ""))
    if name is not None:
        return web.Response(body=logs[-1].data, content_type="application/octet-stream")
    return web.Response(body=render_logs(logs), content_type="text/plain")


async def _turns(blobs: EpisodeBlobs, query: Mapping[str, str]) -> web.Response:
    """Each turn's instruction, recorded model calls and trajectory (export, ``kubectl episode trajectory``)."""
    attempt = int(query["attempt"]) if query.get("attempt", "").isdigit() else None
    return web.json_response(await turn_records(blobs, attempt=attempt))


async def _artifacts(blobs: EpisodeBlobs, _: Mapping[str, str]) -> web.Response:
    """The artifacts as a gzipped tar, made in a scratch file and streamed from it (they may be GiBs)."""
    with tempfile.TemporaryDirectory() as scratch:
        if not (await export_artifacts(blobs, Path(scratch))).written:
            raise _status(404, "NotFound", "no artifacts kept")
        body = await asyncio.to_thread(_gzip_tar, Path(scratch))
    return web.Response(body=body, content_type="application/gzip")  # aiohttp reads it in chunks, then closes it


def _gzip_tar(folder: Path) -> BinaryIO:
    """A gzipped tar of ``folder``'s children, in an unnamed temporary file read from its start."""
    file = tempfile.TemporaryFile()  # noqa: SIM115 - the response reads it, then closes it
    with tarfile.open(fileobj=file, mode="w:gz") as archive:
        for child in sorted(folder.iterdir()):
            archive.add(child, arcname=child.name)
    file.seek(0)
    return file


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


def application(front_proxy: FrontProxy, authorize: Authorizer, store: BlobStore) -> web.Application:
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
        uid = request.query.get("uid")
        blobs = (
            store.episode(access.namespace, access.name, uid)
            if uid
            else await store.latest_episode(access.namespace, access.name)
        )
        if blobs is None or not await blobs.kept():
            raise _status(404, "NotFound", f"nothing kept for {access.namespace}/{access.name}")
        return await entry.serve(blobs, request.query)

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
    store: BlobStore,
    context: ssl.SSLContext,
    host: str,
    port: int,
) -> web.AppRunner:
    """Start serving over TLS; the caller keeps the runner and cleans it up at shutdown."""
    runner = web.AppRunner(application(front_proxy, authorize, store), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    return runner
