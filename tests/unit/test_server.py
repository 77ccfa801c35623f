"""The operator's two HTTP endpoints: open metrics, and the data API behind the API server's front proxy.

The data API is served here over real TLS on a local port; the "API server" is a client that
presents a certificate of a front-proxy CA made for the test, as kube-apiserver does with
--proxy-client-cert-file, and anyone else is a client without it (or with a certificate of
another CA, or of a name the API server does not use).
"""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import os
import ssl
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from episode_operator.kube.data_api_registration import front_proxy_from, self_signed_certificate
from episode_operator.runtime import data_api_server
from episode_operator.runtime.archive import tar_bytes
from episode_operator.runtime.data_api_server import Access, Caller, Decision, FrontProxy, serve, server_context
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.metrics import Metrics
from episode_operator.runtime.sandbox_protocol import ArchiveFile
from episode_operator.runtime.server import application
from tests.ports import free_port

LOG_PATH = "/apis/data.episode-operator.dev/v1alpha1/namespaces/ns/episodes/ep/log"


def test_metrics_are_open_and_include_the_process() -> None:
    metrics = Metrics()
    metrics.episode_finished("Graded", None, 0.5)

    async def scenario() -> None:
        async with TestClient(TestServer(application(metrics))) as http:
            answer = await http.get("/metrics")
            assert answer.status == 200
            text = await answer.text()
            assert 'episode_operator_episodes_total{failure_kind="",outcome="Graded"} 1.0' in text
            for family in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
                assert f"\n{family} " in text, family
            assert "python_gc_objects_collected_total" in text
            assert (await http.get(LOG_PATH)).status == 404  # no data on the open port

    asyncio.run(scenario())


# The data API -----------------------------------------------------------------------------------------
Authority = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def issue(common_name: str, key: ec.EllipticCurvePrivateKey, signer: Authority | None) -> x509.Certificate:
    """A CA certificate (no signer: self-signed) or a client certificate the signer's CA signs."""
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = x509.CertificateBuilder(
        issuer_name=signer[1].subject if signer else subject,
        subject_name=subject,
        public_key=key.public_key(),
        serial_number=x509.random_serial_number(),
        not_valid_before=now - datetime.timedelta(minutes=1),
        not_valid_after=now + datetime.timedelta(days=1),
    )
    if signer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(signer[0] if signer else key, hashes.SHA256())


def certificate_authority(name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    return key, issue(name, key, None)


def client_certificate(authority: Authority, common_name: str, directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = issue(common_name, key, authority)
    cert_path, key_path = directory / f"{common_name}-{os.urandom(3).hex()}.crt", directory / f"{common_name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class RecordingAuthorizer:
    """Stands in for SubjectAccessReview: allows the (user, access) pairs it is given, records every question."""

    allowed: set[tuple[str, Access]] = field(default_factory=set)
    asked: list[tuple[Caller, Access]] = field(default_factory=list)

    async def __call__(self, caller: Caller, access: Access) -> Decision:
        self.asked.append((caller, access))
        if (caller.user, access) in self.allowed:
            return Decision(True)
        return Decision(False, "no RBAC rule allows it")


@dataclass
class DataApi:
    url: str
    server_ca: Path  # the serving certificate (self-signed: its own CA)
    proxy_ca: Authority
    authorizer: RecordingAuthorizer
    directory: Path

    def client(self, certificate: tuple[Path, Path] | None) -> aiohttp.ClientSession:
        context = ssl.create_default_context(cafile=str(self.server_ca))
        if certificate is not None:
            context.load_cert_chain(*certificate)
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))


@asynccontextmanager
async def data_api(tmp_path: Path) -> AsyncIterator[DataApi]:
    proxy_ca = certificate_authority("front-proxy-ca")
    configmap = {
        "requestheader-client-ca-file": proxy_ca[1].public_bytes(serialization.Encoding.PEM).decode(),
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }
    front_proxy = front_proxy_from(configmap)
    certificate, key = self_signed_certificate(["localhost"])
    server_ca = tmp_path / "serving.crt"
    server_ca.write_bytes(certificate)
    authorizer = RecordingAuthorizer()
    port = free_port()
    runner = await serve(
        front_proxy,
        authorizer,
        BlobStore.local(tmp_path / "data"),
        server_context(certificate, key, front_proxy),
        "127.0.0.1",
        port,
    )
    try:
        yield DataApi(f"https://localhost:{port}", server_ca, proxy_ca, authorizer, tmp_path)
    finally:
        await runner.cleanup()


async def keep_some_data(data_dir: Path, uid: str) -> None:
    store = BlobStore.local(data_dir).episode("ns", "ep", uid)
    await store.save_log(1, "one", "agent", b"agent says hi\n")
    await store.save_log(1, "two", "verifier", f"verifier of {uid}\n".encode())
    kept = ArchiveFile.of_bytes(tar_bytes([("app/out/result.txt", b"42", 0o644)]))
    try:
        await store.save_artifact(1, "one", 0, kept)
    finally:
        kept.discard()
    manifest = {"source": "/app/out", "destination": "out", "type": "directory", "status": "ok"}
    await store.save_manifest(1, "one", [manifest | {"service": "main", "origin": "task"}])


def test_the_data_api_serves_the_callers_the_api_server_forwards_and_authorizes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with data_api(tmp_path) as api:
            await keep_some_data(tmp_path / "data", "uid-1")
            proxy = client_certificate(api.proxy_ca, "front-proxy-client", tmp_path)
            alice = {"X-Remote-User": "alice", "X-Remote-Group": "team-a", "X-Remote-Extra-Scopes%2Fx": "s1"}
            logs, artifacts = Access("ns", "ep", "log"), Access("ns", "ep", "artifacts")
            api.authorizer.allowed |= {("alice", logs), ("alice", artifacts)}
            async with api.client(proxy) as http:
                answer = await http.get(api.url + LOG_PATH, params={"turn": "two", "uid": "uid-1"}, headers=alice)
                assert (answer.status, await answer.text()) == (
                    200,
                    "==> attempt 1 turn two: verifier <==\nverifier of uid-1\n\n",
                )
                caller, access = api.authorizer.asked[-1]
                assert access == logs
                assert caller == Caller("alice", ("team-a",), {"scopes/x": ("s1",)})

                # One log's own bytes, no header (kubectl episode logs -f after the agent's pod went).
                one = {"turn": "one", "attempt": "1", "log": "agent", "uid": "uid-1"}
                answer = await http.get(api.url + LOG_PATH, params=one, headers=alice)
                assert (answer.status, await answer.read()) == (200, b"agent says hi\n")
                answer = await http.get(api.url + LOG_PATH, params=one | {"log": "verifier"}, headers=alice)
                assert answer.status == 404  # turn one has no verifier log kept

                answer = await http.get(api.url + LOG_PATH.replace("/log", "/artifacts"), headers=alice)
                assert answer.status == 200
                with tarfile.open(fileobj=io.BytesIO(await answer.read())) as archive:
                    assert "one/out/result.txt" in archive.getnames()

                api.authorizer.allowed.add(("alice", Access("ns", "ep", "turns")))
                answer = await http.get(api.url + LOG_PATH.replace("/log", "/turns"), headers=alice)
                assert answer.status == 200 and (await answer.json())["attempt"] == 1

                # Another user, same request: the authorizer's "no" is a Kubernetes 403 Status.
                answer = await http.get(api.url + LOG_PATH, headers={"X-Remote-User": "bob"})
                status = json.loads(await answer.text())
                assert (answer.status, status["kind"], status["reason"]) == (403, "Status", "Forbidden")
                assert 'User "bob" cannot get resource "episodes/log"' in status["message"]

                # Kept data of another Episode uid, or none at all, is a 404; so is an unknown subresource.
                answer = await http.get(api.url + LOG_PATH, params={"uid": "uid-0"}, headers=alice)
                assert answer.status == 404 and "nothing kept" in await answer.text()
                answer = await http.get(api.url + LOG_PATH.replace("/log", "/secrets"), headers=alice)
                assert answer.status == 404

                # Discovery is what the API server fetches to route the group (and check it is available).
                answer = await http.get(api.url + "/apis/data.episode-operator.dev/v1alpha1")
                resources = (await answer.json())["resources"]
                assert [r["name"] for r in resources] == ["episodes/log", "episodes/artifacts", "episodes/turns"]

    asyncio.run(scenario())


def test_without_the_front_proxys_certificate_nothing_is_served(tmp_path: Path) -> None:
    """A pod that reaches the port directly, whatever headers it sends, gets 401; so does a certificate
    the front-proxy CA signed for another name; one from another CA fails the handshake."""

    async def scenario() -> None:
        async with data_api(tmp_path) as api:
            await keep_some_data(tmp_path / "data", "uid-1")
            api.authorizer.allowed.add(("system:admin", Access("ns", "ep", "log")))
            forged = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}
            async with api.client(None) as http:
                for path in (LOG_PATH, "/apis/data.episode-operator.dev/v1alpha1"):
                    answer = await http.get(api.url + path, headers=forged | {"Authorization": "Bearer anything"})
                    assert answer.status == 401, path
                    assert (await answer.json())["reason"] == "Unauthorized"
            other_name = client_certificate(api.proxy_ca, "someone-else", tmp_path)
            async with api.client(other_name) as http:
                assert (await http.get(api.url + LOG_PATH, headers=forged)).status == 401
            other_ca = client_certificate(certificate_authority("another-ca"), "front-proxy-client", tmp_path)
            async with api.client(other_ca) as http:
                with pytest.raises(aiohttp.ClientError):
                    await http.get(api.url + LOG_PATH, headers=forged)
            # The front proxy's certificate without a user (its availability check) sees discovery only.
            proxy = client_certificate(api.proxy_ca, "front-proxy-client", tmp_path)
            async with api.client(proxy) as http:
                assert (await http.get(api.url + LOG_PATH)).status == 401
                assert (await http.get(api.url + "/apis/data.episode-operator.dev/v1alpha1")).status == 200
            assert api.authorizer.asked == []  # nobody unauthenticated even reached the authorizer

    asyncio.run(scenario())


def test_without_a_uid_the_newest_kept_episode_of_that_name_is_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with data_api(tmp_path) as api:
            await keep_some_data(tmp_path / "data", "uid-old")
            for kept in (tmp_path / "data" / "ns" / "ep" / "uid-old").rglob("*"):
                os.utime(kept, (1, 1))  # written long ago
            await keep_some_data(tmp_path / "data", "uid-new")
            api.authorizer.allowed.add(("alice", Access("ns", "ep", "log")))
            async with api.client(client_certificate(api.proxy_ca, "front-proxy-client", tmp_path)) as http:
                answer = await http.get(api.url + LOG_PATH, params={"turn": "two"}, headers={"X-Remote-User": "alice"})
                assert "verifier of uid-new" in await answer.text()

    asyncio.run(scenario())


def test_an_api_server_without_a_front_proxy_is_named() -> None:
    with pytest.raises(Exception, match="requestheader-client-ca-file"):
        front_proxy_from({"client-ca-file": "..."})


def test_every_subresource_is_routed_and_discovered() -> None:
    """A new kind of kept data is one entry of SUBRESOURCES: discovery and RBAC follow it."""
    names = [resource["name"] for resource in data_api_server.discovery()["resources"]]
    assert names == [f"episodes/{name}" for name in data_api_server.SUBRESOURCES]
    assert FrontProxy(client_ca="x").username_headers == ("X-Remote-User",)
