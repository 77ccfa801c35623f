"""The data API's registration across replicas, without a cluster: one serving certificate for all
of them (a Secret the first makes), an APIService written only when it would change, and removed
only by the last replica to stop.

The API is an in-memory stand-in that honours what the real one does for these calls: 409 for a
create of what exists and for a stale resourceVersion, 404 for what is missing, a new
resourceVersion on every write. Replicas racing to make the Secret are interleaved on purpose.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
from typing import Any

import pytest

from episode_operator.kube.client import Conflict, NotFound
from episode_operator.kube.data_api_registration import (
    SERVING_SECRET_SUFFIX,
    DataApi,
    DataApiUnavailable,
    register,
    self_signed_certificate,
    shared_certificate,
)
from episode_operator.runtime.data_api_server import API_SERVICE

SERVICE = ("ops", "episode-operator")
HOSTNAMES = ["episode-operator.ops.svc", "episode-operator.ops.svc.cluster.local"]
OWNER = ("ops-episode-operator-data-api", "uid-1")
LOG = logging.getLogger("test")


class Api:
    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.api_services: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []
        self.version = 0
        self.before_create: asyncio.Event | None = None  # a create waits for it: replicas interleave

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        if (namespace, name) not in self.secrets:
            raise NotFound(f"secret {namespace}/{name}", status=404)
        return copy.deepcopy(self.secrets[namespace, name])

    async def create_secret(self, manifest: dict[str, Any]) -> None:
        if self.before_create is not None:
            await self.before_create.wait()
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.secrets:
            raise Conflict("exists", status=409)
        self.writes.append("create secret")
        self.secrets[key] = self._stamp(copy.deepcopy(manifest))

    async def get_api_service(self, name: str) -> dict[str, Any]:
        if name not in self.api_services:
            raise NotFound(f"apiservice {name}", status=404)
        return copy.deepcopy(self.api_services[name])

    async def create_api_service(self, manifest: dict[str, Any]) -> None:
        if manifest["metadata"]["name"] in self.api_services:
            raise Conflict("exists", status=409)
        self.writes.append("create apiservice")
        self.api_services[manifest["metadata"]["name"]] = self._stamp(copy.deepcopy(manifest))

    async def replace_api_service(self, manifest: dict[str, Any]) -> None:
        current = self.api_services[manifest["metadata"]["name"]]
        if current["metadata"]["resourceVersion"] != manifest["metadata"]["resourceVersion"]:
            raise Conflict("changed", status=409)
        self.writes.append("replace apiservice")
        self.api_services[manifest["metadata"]["name"]] = self._stamp(copy.deepcopy(manifest))

    async def delete_api_service(self, name: str, resource_version: str) -> None:
        if name not in self.api_services:
            raise NotFound(name, status=404)
        if self.api_services[name]["metadata"]["resourceVersion"] != resource_version:
            raise Conflict("changed", status=409)
        self.writes.append("delete apiservice")
        del self.api_services[name]


def test_replicas_starting_together_serve_one_certificate_and_register_it_once() -> None:
    api = Api()

    async def scenario() -> None:
        api.before_create = asyncio.Event()
        starting = [asyncio.create_task(shared_certificate(api, SERVICE, HOSTNAMES, OWNER)) for _ in range(3)]  # type: ignore[arg-type]
        await asyncio.sleep(0)  # all three found no Secret and made a certificate of their own
        api.before_create.set()
        served = await asyncio.gather(*starting)
        assert len(set(served)) == 1 and api.writes == ["create secret"]  # the first stored wins
        secret = api.secrets[SERVICE[0], SERVICE[1] + SERVING_SECRET_SUFFIX]
        assert secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["ownerReferences"][0]["name"] == OWNER[0]  # an uninstall removes it
        assert base64.b64decode(secret["data"]["tls.crt"]) == served[0][0]
        for certificate, _key in served:
            await register(api, SERVICE, certificate, OWNER)  # type: ignore[arg-type]
        assert api.writes == ["create secret", "create apiservice"]  # the others found it as they'd write it
        restarted = await shared_certificate(api, SERVICE, HOSTNAMES, OWNER)  # type: ignore[arg-type]
        assert restarted == served[0]

    asyncio.run(scenario())


def tls_data(hostnames: list[str]) -> dict[str, str]:
    certificate, key = self_signed_certificate(hostnames)
    return {"tls.crt": base64.b64encode(certificate).decode(), "tls.key": base64.b64encode(key).decode()}


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda data: data.pop("tls.key"), "holds no serving certificate"),
        (lambda data: data.update({"tls.crt": base64.b64encode(b"not pem").decode()}), "holds no serving certificate"),
        (
            lambda data: data.update({"tls.key": base64.b64encode(self_signed_certificate(HOSTNAMES)[1]).decode()}),
            "tls.key is not the key of tls.crt",
        ),
        (
            lambda data: data.update(tls_data(["other.svc"])),
            "not for episode-operator.ops.svc",
        ),
    ],
)
def test_a_secret_that_holds_no_usable_certificate_is_named(edit: Any, named: str) -> None:
    api = Api()

    async def scenario() -> None:
        await shared_certificate(api, SERVICE, HOSTNAMES, OWNER)  # type: ignore[arg-type]
        edit(api.secrets[SERVICE[0], SERVICE[1] + SERVING_SECRET_SUFFIX]["data"])
        with pytest.raises(DataApiUnavailable, match=named) as refused:
            await shared_certificate(api, SERVICE, HOSTNAMES, OWNER)  # type: ignore[arg-type]
        assert f"Secret ops/episode-operator{SERVING_SECRET_SUFFIX}" in str(refused.value)
        assert "delete it" in str(refused.value)

    asyncio.run(scenario())


class Runner:
    def __init__(self) -> None:
        self.stopped = False

    async def cleanup(self) -> None:
        self.stopped = True


@pytest.mark.parametrize(("staying", "registered"), [([], False), (["b.1a2b3c"], True)])
def test_a_stopping_replica_unregisters_only_when_no_other_stays(staying: list[str], registered: bool) -> None:
    api = Api()

    async def others() -> list[str]:
        return staying

    async def scenario() -> None:
        certificate, _ = await shared_certificate(api, SERVICE, HOSTNAMES, OWNER)  # type: ignore[arg-type]
        await register(api, SERVICE, certificate, OWNER)  # type: ignore[arg-type]
        runner = Runner()
        await DataApi(runner, api, SERVICE, others, LOG).cleanup()  # type: ignore[arg-type]
        assert (API_SERVICE in api.api_services) == registered and runner.stopped

    asyncio.run(scenario())
