"""The agent's env/envFrom reach the agent's own jobs and nothing else (issue 23).

On the main container's environment they were inherited by the task's own setup.sh, ENTRYPOINT
and shared test.sh; now the operator reads them (kube/objects/env.py, as a kubelet would) and
gives them to the agent's jobs only, on the exec's stdin rather than in its URL.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import pytest

from episode_operator.api.episode_resource import EpisodeStatus
from episode_operator.kube.client import NotFound
from episode_operator.kube.driver import DriverSettings, drive_episode, read_agent_env
from episode_operator.kube.event_recorder import EventRecorder
from episode_operator.kube.objects.env import Sources, referenced, resolve_agent_env, secret_data
from episode_operator.runtime import supervisor
from episode_operator.runtime.episode_store import BlobStore
from episode_operator.runtime.sandbox_protocol import JobSpec
from tests.unit.episodes import run
from tests.unit.fake_sandbox import World
from tests.unit.folders import multi_step, single_step, steps_toml

SOURCES = Sources(
    secrets={"keys": {"API_TOKEN": "s3cret", "OTHER": "o", "bad-name": "x"}},
    config_maps={"settings": {"MODE": "fast", "API_TOKEN": "from-configmap"}},
)


@pytest.mark.parametrize(
    ("env", "env_from", "values", "problems"),
    [
        ([], [{"secretRef": {"name": "keys"}}], {"API_TOKEN": "s3cret", "OTHER": "o"}, []),
        # Sources in order, then env over them.
        (
            [{"name": "MODE", "value": "slow"}],
            [{"secretRef": {"name": "keys"}}, {"configMapRef": {"name": "settings"}}],
            {"API_TOKEN": "from-configmap", "OTHER": "o", "MODE": "slow"},
            [],
        ),
        ([], [{"prefix": "K_", "secretRef": {"name": "keys"}}], {"K_API_TOKEN": "s3cret", "K_OTHER": "o"}, []),
        (
            [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "API_TOKEN"}}}],
            [],
            {"T": "s3cret"},
            [],
        ),
        (
            [{"name": "M", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "MODE"}}}],
            [],
            {"M": "fast"},
            [],
        ),
        # $(NAME) of what was defined before (the container's [environment].env too), $$ literal, unknown kept.
        (
            [{"name": "A", "value": "a"}, {"name": "B", "value": "$(A)-$(BASE)-$$(A)-$(NOPE)"}],
            [],
            {"A": "a", "B": "a-base-$(A)-$(NOPE)"},
            [],
        ),
        # The pod's own fields stay on the container.
        ([{"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}], [], {}, []),
        # Missing and optional: nothing; missing and not: refused, naming the field.
        ([], [{"secretRef": {"name": "gone", "optional": True}}], {}, []),
        ([], [{"secretRef": {"name": "gone"}}], {}, ["spec.agent.envFrom[0]: secret 'gone' not found"]),
        (
            [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "NOPE"}}}],
            [],
            {},
            ["spec.agent.env[0].valueFrom.secretKeyRef: secret 'keys' has no key 'NOPE'"],
        ),
        (
            [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "NOPE", "optional": True}}}],
            [],
            {},
            [],
        ),
        ([{"name": "1X", "value": "v"}], [], {}, ["spec.agent.env[0]: name '1X' is no variable name"]),
    ],
)
def test_the_agents_env_reads_as_the_kubelet_reads_it(
    env: list[dict[str, Any]], env_from: list[dict[str, Any]], values: dict[str, str], problems: list[str]
) -> None:
    resolved = resolve_agent_env(env, env_from, SOURCES, {"BASE": "base"})
    assert (resolved.values, resolved.problems) == (values, problems)


def test_a_key_that_is_no_variable_name_is_skipped_and_said() -> None:
    resolved = resolve_agent_env([], [{"secretRef": {"name": "keys"}}], SOURCES, {})
    assert resolved.skipped == ["spec.agent.envFrom[0]: secret 'keys' key 'bad-name' is no variable name"]


def test_what_is_read_is_named_once_and_decoded_as_the_api_sends_it() -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "K"}}}]
    assert referenced(env, [{"secretRef": {"name": "keys"}}, {"configMapRef": {"name": "c"}}]) == {
        ("secret", "keys"),
        ("configmap", "c"),
    }
    assert secret_data({"data": {"K": base64.b64encode(b"v").decode()}, "stringData": {"S": "s"}}) == {
        "K": "v",
        "S": "s",
    }


# --- the runner: only the agent's own jobs ------------------------------------------------------
SAW = "[$API_TOKEN]"


def test_only_the_agents_jobs_get_its_env_and_they_carry_it_privately() -> None:
    """setup.sh, test.sh (shared) and the oracle's fellow task code never see the agent's token."""
    folder = multi_step(
        steps_toml("a"),
        ["a"],
        {
            "steps/a/workdir/setup.sh": f"write /app/setup-saw.txt {SAW}",
            "steps/a/tests/test.sh": f"write /app/test-saw.txt {SAW}\nreward 1",
        },
    )
    agent = {
        "kind": "command",
        "command": f"write /app/agent-saw.txt {SAW}",
        "setup": f"write /app/setup-agent.txt {SAW}",
    }
    world = World()
    status = run(folder, agent=agent, world=world, agent_env={"API_TOKEN": "s3cret"})[0]
    assert status.reward == 1.0, status.message
    files = world.sandboxes["pod-a1"].files["main"]
    assert files["/app/agent-saw.txt"] == files["/app/setup-agent.txt"] == b"[s3cret]"
    assert files["/app/setup-saw.txt"] == files["/app/test-saw.txt"] == b"[]"
    pod = world.sandboxes["pod-a1"]
    assert pod.job("a1.t1.agent").spec.private and not pod.job("a1.t1.verify").spec.private


def test_a_private_jobs_arguments_never_travel_in_the_exec_url() -> None:
    spec = JobSpec(id="a1.t1.agent", command="run", timeout_sec=5, env={"API_TOKEN": "s3cret"}, private=True)
    command = supervisor.start(spec)
    assert command.argv[:3] == ["sh", supervisor.SUPERVISOR_PATH, "--argv-stdin"]
    assert not any("s3cret" in arg for arg in command.argv) and command.stdin is not None and b"s3cret" in command.stdin
    public = supervisor.start(JobSpec(id="a1.t1.verify", command="run", timeout_sec=5, env={"K": "v"}))
    assert "K=v" in public.argv  # the control: a job without secrets stays in the URL (cheaper)


# --- the driver: read once, refused before any pod -----------------------------------------------
class Api:
    """The API as the driver meets it: one Secret, no ConfigMap."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.event_recorder = EventRecorder(self.create_event)
        self.pods: list[Any] = []
        self.read: list[str] = []

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        self.read.append(name)
        if name != "keys":
            raise NotFound(f"secret {namespace}/{name} not found", status=404)
        return {"data": {"API_TOKEN": base64.b64encode(b"s3cret").decode()}}

    async def get_config_map(self, namespace: str, name: str) -> Any:
        raise NotFound(f"configmap {namespace}/{name} not found", status=404)

    async def replace_episode_status(
        self, namespace: str, name: str, status: dict[str, Any], *, guard: object = None
    ) -> None:
        self.statuses.append(status)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        pass

    async def create_pod(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.pods.append(manifest)


def test_a_missing_secret_refuses_the_episode_before_any_pod_naming_the_field() -> None:
    spec = {
        "task": {"inline": {"files": single_step()}},
        "agent": {
            "kind": "command",
            "command": "true",
            "envFrom": [{"secretRef": {"name": "keys"}}, {"secretRef": {"name": "gone"}}],
        },
    }
    body = {"metadata": {"name": "e", "namespace": "eval", "uid": "u"}, "spec": spec}
    api = Api()
    status = asyncio.run(drive_episode(api, body, DriverSettings(store=BlobStore.memory()), logging.getLogger("t")))  # type: ignore[arg-type]
    assert isinstance(status, EpisodeStatus)
    assert (status.phase, status.failure_kind) == ("Failed", "harbor:seed_refused")
    assert status.message == "refused at seed: spec.agent.envFrom[1]: secret 'gone' not found"
    assert api.pods == [] and sorted(api.read) == ["gone", "keys"]


def test_the_driver_reads_each_named_source_once() -> None:
    api = Api()
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "API_TOKEN"}}}]
    resolved = asyncio.run(read_agent_env(api, "eval", env, [{"secretRef": {"name": "keys"}}], {}))  # type: ignore[arg-type]
    assert (resolved.values, resolved.problems, api.read) == ({"API_TOKEN": "s3cret", "T": "s3cret"}, [], ["keys"])
