"""Where the capture proxy may send the key: the operator pins spec.agent.model.baseURL's host (kube/upstream.py),
and an Episode whose host resolves nowhere is refused before any pod, naming the field."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.kube.client import KubeError, NotFound
from episode_operator.kube.driver import DriverSettings, drive_episode
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.objects.pods import AgentImages
from episode_operator.kube.upstream import ServiceName, Unresolvable, pin_upstream, service_of
from episode_operator.runtime.agents.model import CAPTURE_CONTAINER, CaptureBounds
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.timing import Timing
from tests.unit.folders import single_step


class Services:
    """The API as kube/upstream.py reads it: Services by (namespace, name)."""

    def __init__(self, services: dict[tuple[str, str], list[str] | KubeError] | None = None) -> None:
        self.services = services or {}
        self.asked: list[tuple[str, str]] = []

    async def service_cluster_ips(self, namespace: str, name: str) -> list[str]:
        self.asked.append((namespace, name))
        found = self.services.get((namespace, name), NotFound(f"service {namespace}/{name} not found", status=404))
        if isinstance(found, KubeError):
            raise found
        return found


class Resolver:
    def __init__(self, answers: dict[str, Sequence[str]] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return self.answers[host]


def pin(base_url: str, services: Services | None = None, resolver: Resolver | None = None) -> tuple[str, ...]:
    return asyncio.run(pin_upstream(services or Services(), "eval", base_url, resolver or Resolver()))


@pytest.mark.parametrize(
    ("host", "service"),
    [
        ("vllm", ServiceName("eval", "vllm", explicit=False)),
        ("vllm.models", ServiceName("models", "vllm", explicit=False)),
        ("vllm.models.svc", ServiceName("models", "vllm", explicit=True)),
        ("vllm.models.svc.cluster.local", ServiceName("models", "vllm", explicit=True)),
        ("VLLM.Models.svc", ServiceName("models", "vllm", explicit=True)),
        ("api.openai.com", None),
        ("vllm.models.svc.cluster", None),
        ("a.b.c.d.e.f", None),
        ("under_score.models", None),
        ("9lives.models", None),  # a Service name starts with a letter
    ],
)
def test_which_hosts_are_read_as_service_names(host: str, service: ServiceName | None) -> None:
    assert service_of(host, "eval") == service


def test_an_ip_address_is_pinned_as_it_is_and_nothing_is_asked() -> None:
    services, resolver = Services(), Resolver()
    assert pin("http://198.19.0.9:8000/v1", services, resolver) == ("198.19.0.9",)
    assert pin("http://[2001:db8::9]:8000/v1", services, resolver) == ("2001:db8::9",)
    assert services.asked == [] and resolver.asked == []


def test_a_service_name_is_pinned_to_its_cluster_ips_through_the_api() -> None:
    services = Services({("models", "vllm"): ["10.96.0.7", "fd00::7"], ("eval", "scripted"): ["10.96.0.8"]})
    resolver = Resolver()
    assert pin("http://vllm.models.svc.cluster.local:8000/v1", services, resolver) == ("10.96.0.7", "fd00::7")
    assert pin("http://scripted:8080/v1", services, resolver) == ("10.96.0.8",)
    assert resolver.asked == []  # no DNS needed, none asked


def test_a_name_no_service_answers_for_goes_to_the_operators_resolver() -> None:
    resolver = Resolver({"example.com": ["198.18.0.5", "198.18.0.5", "198.18.0.6"], "headless.models": ["198.18.0.7"]})
    services = Services({("models", "headless"): [], ("com", "example"): NotFound("not found", status=404)})
    assert pin("https://example.com/v1", services, resolver) == ("198.18.0.5", "198.18.0.6")
    assert pin("http://headless.models:8000/v1", services, resolver) == ("198.18.0.7",)
    assert resolver.asked == [("example.com", 443), ("headless.models", 8000)]
    assert pin("https://api.example.org/v1", Services(), Resolver({"api.example.org": ["198.18.0.9"]})) == (
        "198.18.0.9",
    )


@pytest.mark.parametrize(
    ("base_url", "services", "cause"),
    [
        ("http://vllm.models:8000/v1", {}, "service models/vllm: service models/vllm not found"),
        (
            "http://vllm.models.svc:8000/v1",
            {("models", "vllm"): KubeError("forbidden", status=403)},
            "service models/vllm: forbidden",
        ),
        ("http://vllm.models.svc:8000/v1", {("models", "vllm"): []}, "has no cluster IP (headless or ExternalName)"),
        ("https://model.invalid/v1", {}, "the operator's resolver: [Errno -2] Name or service not known"),
    ],
)
def test_a_host_nothing_resolves_is_refused_naming_the_field_and_each_cause(
    base_url: str, services: dict[tuple[str, str], Any], cause: str
) -> None:
    resolver = Resolver()
    with pytest.raises(Unresolvable) as refused:
        pin(base_url, Services(services), resolver)
    message = str(refused.value)
    assert message.startswith("spec.agent.model.baseURL: cannot resolve ") and cause in message
    assert "the operator's resolver" in message and resolver.asked  # the fallback was tried and said why not


def test_a_service_the_api_says_does_not_exist_is_refused_without_asking_dns() -> None:
    """``….svc`` names a Service and nothing else: if there is none, no DNS would find one."""
    resolver = Resolver({"gone.models.svc": ["198.18.0.1"]})
    with pytest.raises(Unresolvable, match="service models/gone: service models/gone not found"):
        pin("http://gone.models.svc.cluster.local:8000/v1", Services(), resolver)
    assert resolver.asked == []


class RefusingClient:
    """The API where an Episode is refused at seed: a key Secret that exists, a Service that does not."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.event_recorder = EventRecorder(self.create_event)
        self.pods: list[Any] = []

    async def secret_keys(self, namespace: str, name: str) -> set[str]:
        return {"api-key"}

    async def service_cluster_ips(self, namespace: str, name: str) -> list[str]:
        raise NotFound(f"service {namespace}/{name} not found", status=404)

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.statuses.append(status)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        pass

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.pods.append(manifest)


def test_an_episode_whose_model_host_resolves_nowhere_is_refused_before_any_pod() -> None:
    model = {"name": "m", "baseURL": "http://gone.models.svc:8000/v1", "apiKeySecretRef": {"name": "model-key"}}
    spec = {
        "task": {"inline": {"files": single_step()}},
        "agent": {"kind": "command", "command": "true", "model": model},
    }
    body = {"metadata": {"name": "e", "namespace": "eval", "uid": "u"}, "spec": spec}
    client = RefusingClient()
    settings = DriverSettings(
        store=BlobStore.memory(), agent_images=AgentImages(capture="operator:9"), resolve_host=Resolver()
    )
    status = asyncio.run(drive_episode(client, body, settings, logging.getLogger("test")))  # type: ignore[arg-type]
    assert isinstance(status, EpisodeStatus)
    assert (status.phase, status.outcome, status.failure_kind) == ("Failed", "TerminalFailure", "harbor:seed_refused")
    assert status.message is not None
    assert status.message.startswith("refused at seed: spec.agent.model.baseURL: cannot resolve gone.models.svc")
    assert "service models/gone" in status.message and client.pods == []
    assert "the operator's resolver" not in status.message  # a .svc name no Service has: no DNS asked


class PodCatcher(RefusingClient):
    """The API where the Service answers: the agent pod is made (and kept here), then the API fails."""

    async def service_cluster_ips(self, namespace: str, name: str) -> list[str]:
        return ["10.96.0.7"]

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise NotFound(f"pod {namespace}/{name} not found", status=404)

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.pods.append(manifest)
        raise KubeError("the test stops here", status=500)

    def __getattr__(self, name: str) -> Any:
        async def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise KubeError(f"{name}: the test stops here", status=500)

        return unavailable


def test_the_agent_pods_proxy_gets_the_address_the_driver_pinned() -> None:
    """The control: the same Episode with a Service that answers gets a pod whose proxy connects there only."""
    model = {"name": "m", "baseURL": "http://scripted.models.svc:8000/v1", "apiKeySecretRef": {"name": "model-key"}}
    spec = {
        "task": {"inline": {"files": single_step()}},
        "agent": {"kind": "command", "command": "true", "model": model},
        "retries": {"outages": 0},
    }
    body = {"metadata": {"name": "e", "namespace": "eval", "uid": "u"}, "spec": spec}
    client = PodCatcher()
    settings = DriverSettings(
        store=BlobStore.memory(),
        agent_images=AgentImages(capture="operator:9"),
        resolve_host=Resolver(),
        timing=Timing(backoff_base_sec=0),
        capture_bounds=CaptureBounds(max_journal_bytes=4096),
    )
    asyncio.run(drive_episode(client, body, settings, logging.getLogger("test")))  # type: ignore[arg-type]
    (pod, *_) = client.pods
    capture = next(c for c in pod["spec"]["containers"] if c["name"] == CAPTURE_CONTAINER)
    args = capture["args"]
    assert args[args.index("--upstream-address") + 1] == "10.96.0.7" and args.count("--upstream-address") == 1
    assert args[args.index("--max-journal-bytes") + 1] == "4096"
