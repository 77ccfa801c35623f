"""The one gateway to the Kubernetes API: configuration, typed errors and exec.

Everything the operator does to the cluster goes through :class:`KubeClient`, built on
``kubernetes_asyncio`` so hundreds of episodes share one event loop without a thread per
exec. API errors are mapped once here (404 → :class:`NotFound`, 409 → :class:`Conflict`);
callers never see the client library's exception types.

Exec speaks the websocket v4 protocol a 1.20 API server offers. It cannot half-close
stdin, so commands given ``stdin`` must read exactly its length (the supervisor's verbs
do, with ``head -c``). Transport failures are retried with backoff: every command the
operator sends is idempotent (jobs are started by id), so a retry never runs work twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url, netrc_from_env
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.stream import WsApiClient
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential
from yarl import URL

from episode_operator import __version__
from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.episodeset_resource import SET_PLURAL
from episode_operator.api.vocabulary import FIELD_MANAGER, GROUP, VERSION
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.kubeconfig import KubeconfigError, Target, locate
from episode_operator.runtime.data_api_server import DATA_GROUP, DATA_VERSION
from episode_operator.runtime.limits import AnswerSink, OutputLimitExceeded
from episode_operator.runtime.metrics import Metrics
from episode_operator.runtime.sandbox_protocol import ArchiveFile

STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
FRAME = 256 * 1024
# An exec's exit status (a small JSON document on the error channel) past this is not one.
STATUS_LIMIT = 64 * 1024


# Connections to the API server: for requests, and for execs (each held for its whole run).
REQUEST_CONNECTIONS = 16
EXEC_CONNECTIONS = 100
# How long opening an exec stream may take (its calls have their own bounds).
EXEC_CONNECT_TIMEOUT_SEC = 30.0
# How long closing an exec stream's handshake may take before its connection is dropped.
CLOSE_TIMEOUT_SEC = 5.0
# At exit, how long Events still queued (held back by the rate limit) may take to post.
EVENTS_CLOSE_TIMEOUT_SEC = 5.0


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 for transport failures)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    """410: a watch's resourceVersion is too old; list again."""


class ExecTransportError(KubeError):
    """The exec websocket failed (could not connect, dropped, timed out)."""


@contextlib.contextmanager
def _api_call(what: str) -> Iterator[None]:
    """Translate the client library's errors about ``what`` into this module's."""
    try:
        yield
    except ApiException as error:
        raise _api_error(error, what) from error


def _api_error(error: ApiException, what: str) -> KubeError:
    reason = error.reason
    try:
        body = json.loads(error.body or "{}")
        reason = body.get("message") or reason
    except (ValueError, TypeError):
        pass
    message = f"{what}: {reason}"
    if error.status == 404:
        return NotFound(message, status=404)
    if error.status == 409:
        return Conflict(message, status=409)
    return KubeError(message, status=error.status or 0)


async def _json(response: Any) -> Any:
    """The JSON body of a call made with ``_preload_content=False``; an error status raises as
    the generated client would. Pods are read this way: building their model objects (every
    timestamp parsed by dateutil) was a fifth of a busy operator's CPU."""
    body = await _body(response)
    return json.loads(body) if body else None


async def _body(response: Any) -> bytes:
    """The raw body of a call made with ``_preload_content=False``; an error status raises."""
    body = await response.read()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body.decode("utf-8", "replace")
        raise error
    return bytes(body)


async def _configuration(kubeconfig: str | None, context: str | None = None) -> k8s.Configuration:
    """Where and how to log in, as kubectl would (:mod:`episode_operator.kube.kubeconfig`): the kubeconfig
    files and context, else inside a pod its service account; a missing or broken one is a :class:`KubeError`."""
    configuration = k8s.Configuration()
    try:
        location = locate(Target(kubeconfig, context))
        if location.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await k8s_config.load_kube_config(
                config_file=os.pathsep.join(location.files),
                context=location.context,
                client_configuration=configuration,
            )
    except (KubeconfigError, ConfigException) as error:
        raise KubeError(str(error)) from error
    return configuration


@dataclass(frozen=True)
class Login:
    """The API server and credentials :meth:`KubeClient.connect` would use, for another client (kopf's)."""

    server: str
    ca_path: str | None
    insecure: bool
    scheme: str | None
    token: str | None
    certificate_path: str | None
    private_key_path: str | None
    username: str | None
    password: str | None
    proxy_url: str | None


async def login_for(kubeconfig: str | None = None) -> Login:
    """Where and how :meth:`KubeClient.connect` logs in with ``kubeconfig`` (same resolution)."""
    configuration = await _configuration(kubeconfig)
    header = await configuration.get_api_key_with_prefix("BearerToken")
    scheme, _, token = header.rpartition(" ") if header else ("", "", "")
    return Login(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        username=configuration.username or None,
        password=configuration.password or None,
        proxy_url=configuration.proxy,
    )


def environment_applies(server: str, *, proxied: bool = False) -> bool:
    """Whether aiohttp's ``trust_env`` (on in kubernetes_asyncio's sessions) can change a request to
    ``server``: a netrc file, or a proxy for it in the environment (``HTTPS_PROXY``, ``NO_PROXY``… as
    aiohttp reads them, for requests and for exec's websockets) unless ``proxied`` (the kubeconfig names
    one: the environment's is not consulted). When none does, :meth:`KubeClient.connect` turns the
    lookups off: aiohttp makes them on every request, each in a worker thread (~0.6 ms of CPU a request)."""
    if netrc_from_env() is not None:
        return True
    if proxied:
        return False
    for scheme in ("https", "wss", "http", "ws"):
        try:
            get_env_proxy_for_url(URL(server).with_scheme(scheme))
        except LookupError:
            continue
        return True
    return False


def user_agent(replica: str | None = None) -> str:
    """The User-Agent of the operator's requests, as kubectl's names the program and its version."""
    return f"episode-operator/{__version__}" + (f" (replica {replica})" if replica else "")


def request_kind(method: str, url: str, query: Sequence[tuple[str, Any]] | None = None) -> tuple[str, str]:
    """A request as the API server's ``apiserver_request_total`` names it: the verb (GET, LIST, WATCH,
    POST, PUT, PATCH, DELETE, DELETECOLLECTION) and the resource with its subresource (``pods/exec``)."""
    parts = urlsplit(url).path.strip("/").split("/")
    path = parts[2:] if parts[0] == "api" else parts[3:]  # after /api/v1 or /apis/<group>/<version>
    if path[:1] == ["namespaces"] and len(path) > 2:
        path = path[2:]  # a namespaced resource
    resource = "/".join(path[0:3:2])  # the resource, and its subresource after the name
    named = len(path) > 1
    verb = method.upper()
    if verb == "GET" and not named:
        verb = "WATCH" if any(key == "watch" and value for key, value in query or ()) else "LIST"
    elif verb == "DELETE" and not named:
        verb = "DELETECOLLECTION"
    return verb, resource


class _Counted(k8s.ApiClient):
    """The generated client, each request counted where it leaves for the network (retries included),
    and each that got no answer counted again as a failure."""

    def __init__(
        self,
        configuration: k8s.Configuration,
        count: Callable[[str, str], None],
        failed: Callable[[str, str], None] = lambda _verb, _resource: None,
        timeout_sec: float | None = None,
    ) -> None:
        super().__init__(configuration)
        self._count = count
        self._failed = failed
        self._timeout_sec = timeout_sec

    async def request(self, method: str, url: str, query_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        kind = request_kind(method, url, query_params)
        self._count(*kind)
        if self._timeout_sec is not None and kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self._timeout_sec
        try:
            return await super().request(method, url, query_params, *args, **kwargs)
        except TimeoutError:
            self._failed(*kind)
            if self._timeout_sec is None:
                raise
            raise KubeError(f"{kind[0]} {kind[1]}: no answer within {self._timeout_sec:g} s") from None
        except (aiohttp.ClientConnectionError, OSError):
            self._failed(*kind)
            raise


class _CountedWs(WsApiClient):
    """The websocket client (exec), each connection counted as the API server counts it (a GET)."""

    def __init__(self, configuration: k8s.Configuration, count: Callable[[str, str], None]) -> None:
        super().__init__(configuration)
        self._count = count

    def request(self, method: str, url: str, query_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        self._count(*request_kind(method, url, query_params))
        return super().request(method, url, query_params, *args, **kwargs)


class KubeClient:
    """Typed access to the few resources the operator uses."""

    def __init__(self, api: k8s.ApiClient, ws_api: WsApiClient, *, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self.api = api
        self.ws_api = ws_api
        # Typed as Any: the generated client accepts plain dicts and lists where its hints
        # name model classes, and this module is the only one that touches it.
        self.core: Any = k8s.CoreV1Api(api)
        self.custom: Any = k8s.CustomObjectsApi(api)
        self.core_ws: Any = k8s.CoreV1Api(ws_api)
        # Every Event the operator posts goes through this one recorder: one rate limit per operator.
        self.event_recorder = EventRecorder(
            self.create_event, expected_errors=(KubeError,), already_posted=(Conflict,), metrics=metrics
        )

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        metrics: Metrics | None = None,
        request_timeout_sec: float | None = None,
        replica: str | None = None,
    ) -> KubeClient:
        """Connect as kubectl would (see :func:`_configuration`); every request is counted in ``metrics``
        (``episode_operator_api_requests_total``). ``request_timeout_sec`` bounds each request (not the
        execs) with a :class:`KubeError`; without it a request waits as long as the API server does.
        ``replica`` names the replica in the User-Agent, so the API server's audit log tells replicas apart."""
        configuration = await _configuration(kubeconfig, context)
        agent = user_agent(replica)

        def count(verb: str, resource: str) -> None:
            if metrics is not None:
                metrics.api_requests.labels(verb, resource).inc()

        def failed(verb: str, resource: str) -> None:
            if metrics is not None:
                metrics.api_errors.labels(verb, resource).inc()

        # Each connection costs a 256 KiB TLS read buffer: a burst of Episodes opened the whole pool
        # of 100. Requests are short, so a few connections carry them (queueing, never failing);
        # an exec holds its websocket connection for a whole long poll, so those keep the default.
        configuration.connection_pool_maxsize = REQUEST_CONNECTIONS
        api = _Counted(configuration, count, failed, request_timeout_sec)
        configuration.connection_pool_maxsize = EXEC_CONNECTIONS
        ws_api = _CountedWs(configuration, count)
        api.user_agent = ws_api.user_agent = agent
        if not environment_applies(str(configuration.host), proxied=bool(configuration.proxy)):
            for client in (api, ws_api):
                client.rest_client.pool_manager._trust_env = False
        return cls(api, ws_api, metrics=metrics)

    async def close(self) -> None:
        await self.event_recorder.close(EVENTS_CLOSE_TIMEOUT_SEC)
        await self.api.close()
        await self.ws_api.close()

    # Episodes ----------------------------------------------------------------------------
    async def get_episode(self, namespace: str, name: str) -> dict[str, Any]:
        with _api_call(f"episode {namespace}/{name}"):
            result: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        return result

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: Guard | None = None
    ) -> None:
        """Write the whole status (a JSON patch ``add /status`` replaces it, lists and maps included).

        With a ``guard`` the API server writes it only while that annotation has that value (a
        JSON patch ``test``): the fence of kube/replicas.py, at no extra request; else 422."""
        with _api_call(f"status of episode {namespace}/{name}"):
            await _body(  # the reply (the whole object) is not read: not parsed either
                await self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    _guarded([{"op": "add", "path": "/status", "value": status}], guard),
                    _content_type="application/json-patch+json",
                    _preload_content=False,
                )
            )

    async def create_episode(self, manifest: dict[str, Any]) -> dict[str, Any]:
        namespace = manifest["metadata"]["namespace"]
        with _api_call(f"episode in {namespace}"):
            created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, manifest
            )
        return created

    async def delete_episode(self, namespace: str, name: str) -> None:
        """Delete an Episode; one already gone is fine."""
        try:
            with _api_call(f"episode {namespace}/{name}"):
                await self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except NotFound:
            pass

    async def list_episodes(self, namespace: str | None, selector: str | None = None) -> list[dict[str, Any]]:
        return (await self.list_episodes_at(namespace, selector))[0]

    async def list_episodes_at(
        self, namespace: str | None, selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """The Episodes (every namespace for None) and the list's resourceVersion, where a watch starts."""
        return await self.list_objects_at(PLURAL, namespace, selector)

    async def list_objects_at(
        self, plural: str, namespace: str | None, selector: str | None = None, *, fields: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Objects of one of the operator's kinds (``episodes``, ``episodesets``; every namespace for
        None) and the list's resourceVersion, where a watch starts. ``fields``: a field selector
        (``metadata.name=NAME``)."""
        selectors = {"label_selector": selector, **({"field_selector": fields} if fields else {})}
        with _api_call(plural):
            if namespace is None:
                result = await self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **selectors)
            else:
                result = await self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **selectors)
        return list(result.get("items", [])), str((result.get("metadata") or {}).get("resourceVersion", ""))

    def watch_episodes(
        self, namespace: str | None, selector: str | None, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self.watch_objects(PLURAL, namespace, selector, resource_version)

    async def watch_objects(
        self,
        plural: str,
        namespace: str | None,
        selector: str | None,
        resource_version: str,
        *,
        fields: str | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The changes after ``resource_version`` as (ADDED|MODIFIED|DELETED, object), until the API
        server ends the watch; a resourceVersion too old to watch from is :class:`Gone`.

        Events are read as whole lines of any length (an inline task makes an Episode large)."""
        selectors = {"label_selector": selector, **({"field_selector": fields} if fields else {})}
        with _api_call(plural):
            if namespace is None:
                response = await self.custom.list_cluster_custom_object(
                    GROUP, VERSION, plural, watch=True, resource_version=resource_version,
                    _preload_content=False, **selectors,
                )  # fmt: skip
            else:
                response = await self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, watch=True, resource_version=resource_version,
                    _preload_content=False, **selectors,
                )  # fmt: skip
            if response.status != 200:
                await _json(response)  # raises with the API server's message
        try:
            pending = b""
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        message = f"watch of {plural}: {status.get('message') or status}"
                        raise (Gone if status.get("code") == 410 else KubeError)(message, status=status.get("code", 0))
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        yield event["type"], event["object"]
        except aiohttp.ClientError as error:
            raise KubeError(f"watch of {plural}: {type(error).__name__}: {error}") from error
        finally:
            response.release()

    async def apply_crd(self, manifest: dict[str, Any], *, timeout_sec: float = 60.0) -> str:
        """Create or update a CustomResourceDefinition and wait until it is served; says which."""
        extensions: Any = k8s.ApiextensionsV1Api(self.api)
        name = manifest["metadata"]["name"]
        with _api_call(f"customresourcedefinition {name}"):
            try:
                await extensions.create_custom_resource_definition(manifest)
                action = "created"
            except ApiException as error:
                if error.status != 409:
                    raise
                current = await extensions.read_custom_resource_definition(name)
                metadata = {**manifest["metadata"], "resourceVersion": current.metadata.resource_version}
                await extensions.replace_custom_resource_definition(name, {**manifest, "metadata": metadata})
                action = "updated"
            deadline = asyncio.get_running_loop().time() + timeout_sec
            while asyncio.get_running_loop().time() < deadline:
                crd = await extensions.read_custom_resource_definition(name)
                if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
                    return action
                await asyncio.sleep(0.2)
        raise KubeError(f"customresourcedefinition {name} not established after {timeout_sec:.0f} s")

    async def patch_episode(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of an Episode (spec.suspend, annotations)."""
        with _api_call(f"episode {namespace}/{name}"):
            await _body(
                await self.custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    patch,
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
            )

    # EpisodeSets ---------------------------------------------------------------------------
    async def get_episodeset(self, namespace: str, name: str) -> dict[str, Any]:
        with _api_call(f"episodeset {namespace}/{name}"):
            result: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, SET_PLURAL, name
            )
        return result

    async def replace_episodeset_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: Guard | None = None
    ) -> None:
        """Write the whole status of an EpisodeSet (as :meth:`replace_episode_status`)."""
        with _api_call(f"status of episodeset {namespace}/{name}"):
            await _body(  # the reply (the whole object) is not read: not parsed either
                await self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    SET_PLURAL,
                    name,
                    _guarded([{"op": "add", "path": "/status", "value": status}], guard),
                    _content_type="application/json-patch+json",
                    _preload_content=False,
                )
            )

    async def patch_episodeset(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of an EpisodeSet (its annotations)."""
        with _api_call(f"episodeset {namespace}/{name}"):
            await _body(
                await self.custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    SET_PLURAL,
                    name,
                    patch,
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
            )

    async def create_episodeset(self, manifest: dict[str, Any]) -> dict[str, Any]:
        namespace = manifest["metadata"]["namespace"]
        with _api_call(f"episodeset in {namespace}"):
            created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, SET_PLURAL, manifest
            )
        return created

    # ConfigMaps, events --------------------------------------------------------------------
    async def apply_config_map(self, manifest: dict[str, Any]) -> None:
        """Create a ConfigMap, or leave it: packed tasks are content-addressed, so one that exists is the same."""
        with contextlib.suppress(Conflict):
            await self.create_config_map(manifest)

    async def create_config_map(self, manifest: dict[str, Any]) -> None:
        """Create a ConfigMap; one that exists is :class:`Conflict`."""
        with _api_call(f"configmap {manifest['metadata']['namespace']}/{manifest['metadata']['name']}"):
            await self.core.create_namespaced_config_map(manifest["metadata"]["namespace"], manifest)

    async def replace_config_map(self, manifest: dict[str, Any]) -> None:
        """Replace a ConfigMap; a ``metadata.resourceVersion`` other than the stored one is :class:`Conflict`."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"configmap {namespace}/{name}"):
            await self.core.replace_namespaced_config_map(name, namespace, manifest)

    async def get_config_map(self, namespace: str, name: str) -> Any:
        with _api_call(f"configmap {namespace}/{name}"):
            return await self.core.read_namespaced_config_map(name, namespace)

    async def secret_keys(self, namespace: str, name: str) -> set[str]:
        """The data keys of a Secret (its values are read and dropped at once: the operator keeps no key)."""
        with _api_call(f"secret {namespace}/{name}"):
            secret = await self.core.read_namespaced_secret(name, namespace)
        return set(secret.data or {}) | set(secret.string_data or {})

    async def service_cluster_ips(self, namespace: str, name: str) -> list[str]:
        """A Service's cluster IPs (none for a headless or ExternalName Service): where a model endpoint
        named by its Service is pinned for the capture proxy (kube/upstream.py)."""
        with _api_call(f"service {namespace}/{name}"):
            service = await _json(await self.core.read_namespaced_service(name, namespace, _preload_content=False))
        spec = service.get("spec") or {}
        addresses = spec.get("clusterIPs") or [spec.get("clusterIP")]
        return [str(address) for address in addresses if address and address != "None"]

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """A Secret as the API's JSON (the data API's serving certificate; never a model key)."""
        with _api_call(f"secret {namespace}/{name}"):
            result: dict[str, Any] = await _json(
                await self.core.read_namespaced_secret(name, namespace, _preload_content=False)
            )
        return result

    async def create_secret(self, manifest: dict[str, Any]) -> None:
        """Create a Secret; one that exists is :class:`Conflict`."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"secret {namespace}/{name}"):
            await _json(await self.core.create_namespaced_secret(namespace, manifest, _preload_content=False))

    async def list_config_maps(self, namespace: str, selector: str) -> list[Any]:
        with _api_call(f"configmaps {selector} in {namespace}"):
            result = await self.core.list_namespaced_config_map(namespace, label_selector=selector)
        return list(result.items)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        with _api_call("event"):
            # The reply is not read: deserialised into model objects it cost more CPU than the request.
            await _body(await self.core.create_namespaced_event(namespace, event, _preload_content=False))

    async def list_pod_events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        """The Events of one pod (what the scheduler and the kubelet said of it), as the API's JSON."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod}"
        with _api_call(f"events of pod {namespace}/{pod}"):
            events = await _json(
                await self.core.list_namespaced_event(namespace, field_selector=selector, _preload_content=False)
            )
        return list(events.get("items") or [])

    # Pods ---------------------------------------------------------------------------------
    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create a pod; the pod as created (its uid among the API's JSON)."""
        with _api_call(f"pod {namespace}/{manifest['metadata']['name']}"):
            created: dict[str, Any] = await _json(
                await self.core.create_namespaced_pod(namespace, manifest, _preload_content=False)
            )
        return created

    async def create_pool_pod(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create a warm pool's pod under the operator's field manager (a field of any other manager is a touch)."""
        with _api_call(f"pod {namespace}/{manifest['metadata']['name']}"):
            created: dict[str, Any] = await _json(
                await self.core.create_namespaced_pod(
                    namespace, manifest, field_manager=FIELD_MANAGER, _preload_content=False
                )
            )
        return created

    async def patch_pool_pod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch of a pool pod under the operator's field manager: its mark, or its claim. A patch whose
        ``test`` of the resourceVersion fails (someone changed the pod first) raises :class:`Conflict`."""
        try:
            with _api_call(f"pod {namespace}/{name}"):
                patched: dict[str, Any] = await _json(
                    await self.core.patch_namespaced_pod(
                        name,
                        namespace,
                        patch,
                        field_manager=FIELD_MANAGER,
                        _content_type="application/json-patch+json",
                        _preload_content=False,
                    )
                )
        except KubeError as error:
            if error.status == 422:  # the test op failed: the pod is not the version the patch was made for
                raise Conflict(str(error), status=409) from error
            raise
        return patched

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the API's JSON (camelCase keys), not a model object."""
        with _api_call(f"pod {namespace}/{name}"):
            pod: dict[str, Any] = await _json(
                await self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            )
        return pod

    async def delete_pod(self, namespace: str, name: str, *, grace_seconds: int = 1) -> None:
        """Delete a pod; a pod that is already gone is fine."""
        try:
            with _api_call(f"pod {namespace}/{name}"):
                await _json(
                    await self.core.delete_namespaced_pod(
                        name, namespace, grace_period_seconds=grace_seconds, _preload_content=False
                    )
                )
        except NotFound:
            pass

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods as the API's JSON (camelCase keys), not model objects."""
        with _api_call(f"pods {selector} in {namespace}"):
            pods = await _json(
                await self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
            )
        return list(pods.get("items") or [])

    async def read_pod_log(self, namespace: str, name: str, container: str, *, limit_bytes: int) -> bytes:
        """The end of a container's log (the first ``limit_bytes`` the API returns)."""
        with _api_call(f"log of pod {namespace}/{name}"):
            response = await self.core.read_namespaced_pod_log(
                name, namespace, container=container, limit_bytes=limit_bytes, _preload_content=False
            )
            return await _body(response)

    # DaemonSets (an EpisodeSet's pre-pull, docs/prepull.md) ---------------------------------------
    async def create_daemon_set(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create a DaemonSet; :class:`Conflict` when one of that name exists."""
        apps: Any = k8s.AppsV1Api(self.api)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"daemonset {namespace}/{name}"):
            created: dict[str, Any] = await _json(
                await apps.create_namespaced_daemon_set(namespace, manifest, _preload_content=False)
            )
        return created

    async def read_daemon_set(self, namespace: str, name: str) -> dict[str, Any]:
        """The DaemonSet as the API's JSON; :class:`NotFound` when there is none."""
        apps: Any = k8s.AppsV1Api(self.api)
        with _api_call(f"daemonset {namespace}/{name}"):
            found: dict[str, Any] = await _json(
                await apps.read_namespaced_daemon_set(name, namespace, _preload_content=False)
            )
        return found

    async def delete_daemon_set(self, namespace: str, name: str) -> None:
        """Delete a DaemonSet and, in the background, its pods; one already gone is fine."""
        apps: Any = k8s.AppsV1Api(self.api)
        try:
            with _api_call(f"daemonset {namespace}/{name}"):
                await _json(
                    await apps.delete_namespaced_daemon_set(
                        name, namespace, propagation_policy="Background", _preload_content=False
                    )
                )
        except NotFound:
            pass

    # Jobs (in-cluster builds) -------------------------------------------------------------------
    async def create_job(self, manifest: dict[str, Any]) -> None:
        """Create a Job; :class:`Conflict` when one of that name exists."""
        batch: Any = k8s.BatchV1Api(self.api)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"job {namespace}/{name}"):
            await _json(await batch.create_namespaced_job(namespace, manifest, _preload_content=False))

    async def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        """The Job as the API's JSON; :class:`NotFound` when there is none."""
        batch: Any = k8s.BatchV1Api(self.api)
        with _api_call(f"job {namespace}/{name}"):
            job: dict[str, Any] = await _json(await batch.read_namespaced_job(name, namespace, _preload_content=False))
        return job

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into the Job's; :class:`NotFound` when there is none."""
        batch: Any = k8s.BatchV1Api(self.api)
        patch = {"metadata": {"annotations": annotations}}
        with _api_call(f"job {namespace}/{name}"):
            await _json(
                await batch.patch_namespaced_job(
                    name, namespace, patch, _content_type="application/merge-patch+json", _preload_content=False
                )
            )

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and its pods; one that is already gone is fine."""
        batch: Any = k8s.BatchV1Api(self.api)
        try:
            with _api_call(f"job {namespace}/{name}"):
                await _json(
                    await batch.delete_namespaced_job(
                        name, namespace, propagation_policy="Background", _preload_content=False
                    )
                )
        except NotFound:
            pass

    # NetworkPolicies ------------------------------------------------------------------------
    async def apply_network_policy(self, manifest: dict[str, Any]) -> None:
        """Create a NetworkPolicy, or replace the one of the same name."""
        networking: Any = k8s.NetworkingV1Api(self.api)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"networkpolicy {namespace}/{name}"):
            try:
                await networking.create_namespaced_network_policy(namespace, manifest)
            except ApiException as error:
                if error.status != 409:
                    raise
                await networking.replace_namespaced_network_policy(name, namespace, manifest)

    async def delete_network_policies(self, namespace: str, selector: str) -> None:
        networking: Any = k8s.NetworkingV1Api(self.api)
        with _api_call(f"networkpolicies {selector} in {namespace}"):
            await networking.delete_collection_namespaced_network_policy(namespace, label_selector=selector)

    async def delete_network_policy(self, namespace: str, name: str) -> None:
        networking: Any = k8s.NetworkingV1Api(self.api)
        try:
            with _api_call(f"networkpolicy {namespace}/{name}"):
                await networking.delete_namespaced_network_policy(name, namespace)
        except NotFound:
            pass

    # Leases (the operator replicas' membership, kube/replicas.py) -------------------------------
    async def list_leases(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The Leases as the API's JSON (camelCase keys)."""
        coordination: Any = k8s.CoordinationV1Api(self.api)
        with _api_call(f"leases {selector} in {namespace}"):
            leases = await _json(
                await coordination.list_namespaced_lease(namespace, label_selector=selector, _preload_content=False)
            )
        return list(leases.get("items") or [])

    async def create_lease(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create a Lease; :class:`Conflict` when one of that name exists."""
        coordination: Any = k8s.CoordinationV1Api(self.api)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"lease {namespace}/{name}"):
            created: dict[str, Any] = await _json(
                await coordination.create_namespaced_lease(namespace, manifest, _preload_content=False)
            )
        return created

    async def replace_lease(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Replace a Lease; its ``metadata.resourceVersion`` is a precondition (:class:`Conflict`)."""
        coordination: Any = k8s.CoordinationV1Api(self.api)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with _api_call(f"lease {namespace}/{name}"):
            replaced: dict[str, Any] = await _json(
                await coordination.replace_namespaced_lease(name, namespace, manifest, _preload_content=False)
            )
        return replaced

    async def delete_lease(self, namespace: str, name: str, resource_version: str) -> None:
        """Delete a Lease if it is still at ``resource_version``; one already gone is fine."""
        coordination: Any = k8s.CoordinationV1Api(self.api)
        options = {"preconditions": {"resourceVersion": resource_version}}
        try:
            with _api_call(f"lease {namespace}/{name}"):
                await _json(
                    await coordination.delete_namespaced_lease(name, namespace, body=options, _preload_content=False)
                )
        except NotFound:
            pass

    # The data API ----------------------------------------------------------------------------
    async def get_cluster_role_uid(self, name: str) -> str:
        """The uid of a ClusterRole (the owner of the data API's APIService)."""
        rbac: Any = k8s.RbacAuthorizationV1Api(self.api)
        with _api_call(f"clusterrole {name}"):
            role = await _json(await rbac.read_cluster_role(name, _preload_content=False))
        return str(role["metadata"]["uid"])

    async def get_api_service(self, name: str) -> dict[str, Any]:
        """An APIService as the API's JSON (the data API's: where it points, its caBundle)."""
        registration: Any = k8s.ApiregistrationV1Api(self.api)
        with _api_call(f"apiservice {name}"):
            result: dict[str, Any] = await _json(await registration.read_api_service(name, _preload_content=False))
        return result

    async def create_api_service(self, manifest: dict[str, Any]) -> None:
        registration: Any = k8s.ApiregistrationV1Api(self.api)
        with _api_call(f"apiservice {manifest['metadata']['name']}"):
            await _json(await registration.create_api_service(manifest, _preload_content=False))

    async def replace_api_service(self, manifest: dict[str, Any]) -> None:
        """PUT, with the resourceVersion read before (never server-side apply: a 1.20 API server
        panics on an apply of an APIService)."""
        registration: Any = k8s.ApiregistrationV1Api(self.api)
        name = manifest["metadata"]["name"]
        with _api_call(f"apiservice {name}"):
            await _json(await registration.replace_api_service(name, manifest, _preload_content=False))

    async def delete_api_service(self, name: str, resource_version: str) -> None:
        """Delete an APIService unless it changed since ``resource_version`` was read (409)."""
        registration: Any = k8s.ApiregistrationV1Api(self.api)
        options = {"preconditions": {"resourceVersion": resource_version}}
        with _api_call(f"apiservice {name}"):
            await _json(await registration.delete_api_service(name, body=options, _preload_content=False))

    async def review_access(
        self, user: str, groups: Sequence[str], extra: dict[str, list[str]], attributes: dict[str, str]
    ) -> tuple[bool, str]:
        """Ask the API server whether ``user`` may do what ``attributes`` say (a SubjectAccessReview)."""
        authorization: Any = k8s.AuthorizationV1Api(self.api)
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": list(groups), "extra": extra, "resourceAttributes": attributes},
        }
        with _api_call(f"subjectaccessreview of {user}"):
            answer = await _json(await authorization.create_subject_access_review(review, _preload_content=False))
        status = answer.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")

    async def get_episode_data(self, namespace: str, name: str, subresource: str, query: dict[str, str]) -> bytes:
        """GET an Episode's kept data from the operator's data API, through the API server (which
        authenticates the caller and authorizes ``get`` on ``episodes/<subresource>``)."""
        what = f"{subresource} of episode {namespace}/{name}"
        with _api_call(what):
            response = await self.api.call_api(
                f"/apis/{DATA_GROUP}/{DATA_VERSION}/namespaces/{namespace}/episodes/{name}/{subresource}",
                "GET",
                query_params=list(query.items()),
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
            return await _body(response)

    async def served_resources(self, group: str, version: str) -> set[str]:
        """The resources the API server's discovery lists for ``group/version`` (none: an empty set).
        Discovery is open to every authenticated client (the system:discovery role): no grant needed."""
        try:
            with _api_call(f"discovery of {group}/{version}"):
                response = await self.api.call_api(
                    f"/apis/{group}/{version}",
                    "GET",
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                )
                document = await _json(response)
        except NotFound:
            return set()
        return {str(resource["name"]) for resource in (document or {}).get("resources", [])}

    # Exec ---------------------------------------------------------------------------------
    async def exec(
        self,
        namespace: str,
        pod: str,
        container: str,
        argv: Sequence[str],
        *,
        stdout: AnswerSink,
        stderr: AnswerSink,
        stdin: bytes | None = None,
        stdin_file: ArchiveFile | None = None,
        timeout_sec: float = 60.0,
        attempts: int = 4,
    ) -> int:
        """Run ``argv`` in a container; its exit code, its stdout and stderr written to the sinks.

        ``stdin`` is sent, then ``stdin_file`` streamed in frames. The sinks bound the answer: one
        that passes its bound raises :class:`~episode_operator.runtime.limits.OutputLimitExceeded`
        and the exec is closed at once, not retried. Transport failures are retried
        (``attempts`` in all, the sinks emptied first); a missing pod is :class:`NotFound` at once.
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=0.2, max=3.0),
            retry=retry_if_exception_type(ExecTransportError),
            before_sleep=self._count_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                stdout.reset()
                stderr.reset()
                return await self._exec_once(
                    namespace, pod, container, argv, stdin, stdin_file, stdout, stderr, timeout_sec
                )
        raise AssertionError("unreachable")

    async def exec_stream(self, namespace: str, pod: str, container: str, argv: Sequence[str]) -> WebsocketExec:
        """Start ``argv`` in a container and keep its exec open, stdin included (a session).

        A missing pod is :class:`NotFound`; any other failure :class:`ExecTransportError`. Not
        retried: a caller of a stream falls back to :meth:`exec`.
        """
        with _exec_errors(namespace, pod, container, EXEC_CONNECT_TIMEOUT_SEC):
            async with asyncio.timeout(EXEC_CONNECT_TIMEOUT_SEC):
                websocket = await (await self._exec_connection(namespace, pod, container, argv, stdin=True))
        return WebsocketExec(websocket, f"{pod}/{container}")

    async def _exec_connection(
        self, namespace: str, pod: str, container: str, argv: Sequence[str], *, stdin: bool
    ) -> Any:
        """The exec's websocket, to be entered (``async with``) or awaited."""
        return await self.core_ws.connect_get_namespaced_pod_exec(
            pod,
            namespace,
            command=list(argv),
            container=container,
            stdin=stdin,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )

    def _count_retry(self, state: RetryCallState) -> None:
        if self.metrics is not None:
            error = state.outcome.exception() if state.outcome else None
            status = getattr(error, "status", 0)
            self.metrics.exec_errors.labels("handshake" if status else "transport").inc()

    async def _exec_once(
        self,
        namespace: str,
        pod: str,
        container: str,
        argv: Sequence[str],
        stdin: bytes | None,
        stdin_file: ArchiveFile | None,
        stdout: AnswerSink,
        stderr: AnswerSink,
        timeout_sec: float,
    ) -> int:
        with _exec_errors(namespace, pod, container, timeout_sec):
            async with asyncio.timeout(timeout_sec):
                has_stdin = stdin is not None or stdin_file is not None
                connection = await self._exec_connection(namespace, pod, container, argv, stdin=has_stdin)
                async with connection as websocket:
                    try:
                        status = await _exec_messages(websocket, pod, container, stdin, stdin_file, stdout, stderr)
                    except OutputLimitExceeded:
                        # Dropped before `async with` closes it: a handshake such a peer may never end.
                        _abort_connection(websocket)
                        raise
        if status is None:
            raise ExecTransportError(f"exec in {pod}/{container}: the connection closed without an exit status")
        return _exit_code(status, pod, container)


async def _exec_messages(
    websocket: aiohttp.ClientWebSocketResponse,
    pod: str,
    container: str,
    stdin: bytes | None,
    stdin_file: ArchiveFile | None,
    stdout: AnswerSink,
    stderr: AnswerSink,
) -> dict[str, Any] | None:
    """Send the exec's stdin, then its answer into the sinks; its exit status (None: none came)."""
    status: dict[str, Any] | None = None
    async for frame in stdin_frames(stdin, stdin_file):
        await websocket.send_bytes(bytes([STDIN]) + frame)
    async for message in websocket:
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
            break
        if message.type == aiohttp.WSMsgType.ERROR:
            raise ExecTransportError(f"exec in {pod}/{container}: websocket error {message.data!r}")
        data = message.data if isinstance(message.data, bytes) else message.data.encode()
        if not data:
            continue
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            stdout.write(payload)
        elif channel == STDERR:
            stderr.write(payload)
        elif channel == ERROR and payload:
            if len(payload) > STATUS_LIMIT:
                raise ExecTransportError(f"exec in {pod}/{container}: an oversized exit status")
            status = json.loads(payload)
    return status


def _abort_connection(websocket: aiohttp.ClientWebSocketResponse) -> None:
    """Drop an exec's connection now. aiohttp's ``close()`` is a handshake that reads the peer's
    messages until its close frame, its timeout restarted by each one: a peer that keeps sending
    (an agent's endless answer) never lets it end. No public call drops it: the response owns it."""
    websocket._response.close()


async def stdin_frames(data: bytes | None, file: ArchiveFile | None) -> AsyncIterator[bytes]:
    """``data``, then ``file`` read piece by piece (in a worker thread), in frames of at most FRAME bytes."""
    for start in range(0, len(data or b""), FRAME):
        yield (data or b"")[start : start + FRAME]
    if file is None:
        return
    with open(file.path, "rb") as stream:
        while piece := await asyncio.to_thread(stream.read, FRAME):
            yield piece


@contextlib.contextmanager
def _exec_errors(namespace: str, pod: str, container: str, timeout_sec: float) -> Iterator[None]:
    """An exec's failures as this module's errors: a missing pod is :class:`NotFound`, the rest transport."""
    where = f"{pod}/{container}"
    try:
        yield
    except aiohttp.WSServerHandshakeError as error:
        if error.status == 404:
            raise NotFound(f"pod {namespace}/{pod} not found", status=404) from error
        raise ExecTransportError(f"exec in {where}: {error.status} {error.message}", status=error.status) from error
    except ApiException as error:
        if error.status == 404:
            raise NotFound(f"pod {namespace}/{pod} not found", status=404) from error
        raise ExecTransportError(f"exec in {where}: {error.status} {error.reason}", status=error.status or 0) from error
    except (aiohttp.ClientError, OSError) as error:
        raise ExecTransportError(f"exec in {where}: {type(error).__name__}: {error}") from error
    except TimeoutError:
        raise ExecTransportError(f"exec in {where}: no answer within {timeout_sec:.0f} s") from None


@dataclass
class WebsocketExec:
    """An exec held open (a supervisor session, kube/session.py): stdin sent as it comes, its
    channels' messages read one at a time."""

    websocket: aiohttp.ClientWebSocketResponse
    where: str

    async def send(self, data: bytes, file: ArchiveFile | None = None) -> None:
        try:
            async for frame in stdin_frames(data, file):
                await self.websocket.send_bytes(bytes([STDIN]) + frame)
        except (aiohttp.ClientError, OSError, RuntimeError) as error:  # RuntimeError: sent after it closed
            raise ExecTransportError(f"exec in {self.where}: {type(error).__name__}: {error}") from error

    async def receive(self) -> tuple[int, bytes] | None:
        while True:
            try:
                message = await self.websocket.receive()
            except (aiohttp.ClientError, OSError) as error:
                raise ExecTransportError(f"exec in {self.where}: {type(error).__name__}: {error}") from error
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                return None
            if message.type == aiohttp.WSMsgType.ERROR:
                raise ExecTransportError(f"exec in {self.where}: websocket error {message.data!r}")
            data = message.data if isinstance(message.data, bytes) else str(message.data).encode()
            if data:
                return data[0], data[1:]

    async def close(self, *, abort: bool = False) -> None:
        """End the exec: a close handshake bounded in time (then dropped), or dropped at once."""
        if not abort:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_SEC):
                    await self.websocket.close()
                    return
        _abort_connection(self.websocket)


@dataclass(frozen=True)
class Guard:
    """A precondition of a status write: the object's annotation ``key`` has ``value``."""

    key: str
    value: str


def _guarded(patch: list[dict[str, Any]], guard: Guard | None) -> list[dict[str, Any]]:
    if guard is None:
        return patch
    path = "/metadata/annotations/" + guard.key.replace("~", "~0").replace("/", "~1")
    return [{"op": "test", "path": path, "value": guard.value}, *patch]


def _exit_code(status: dict[str, Any], pod: str, container: str) -> int:
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "1"))
    # No exit code: the command could not run at all (no such binary, container gone…).
    raise ExecTransportError(f"exec in {pod}/{container}: {status.get('message') or status}")
