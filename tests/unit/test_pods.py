"""Pod manifests (pure builders): what every sandbox pod must and must not carry."""

from __future__ import annotations

import pytest

from episode_operator.api.episode_resource import EpisodeSpec
from episode_operator.kube.objects.network import network_policy
from episode_operator.kube.objects.pods import (
    RESERVATION_CONTAINER,
    OwnerRef,
    SandboxPod,
    SandboxRequests,
    agent_pod_name,
    released,
    resources_of,
    sandbox_pod,
    short_name,
    verifier_reservation,
)
from episode_operator.runtime.sandbox_protocol import KEEP_ALIVE
from episode_operator.taskfolder import TaskFiles, load_task, resolve_plan
from episode_operator.taskfolder.compose import Sidecar
from episode_operator.taskfolder.plan import NetworkPolicy
from tests.conftest import EXAMPLE_TASKS

EPISODE = OwnerRef("ledger", "evals", "uid-1")
FULL = SandboxRequests()  # the operator's default: requests = limits
SPEC = EpisodeSpec.model_validate(
    {
        "task": {"inline": {"files": {}}},
        "agent": {
            "kind": "command",
            "command": "run",
            "env": [
                {"name": "API_TOKEN", "value": "secret"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "envFrom": [{"secretRef": {"name": "model-key"}}],
        },
        "nodeSelector": {"pool": "eval"},
        "runtimeClassName": "gvisor",
    }
)


def sidecar_plan():  # type: ignore[no-untyped-def]
    return resolve_plan(load_task(TaskFiles.from_directory(EXAMPLE_TASKS / "sidecar-lookup")))


def test_agent_pod() -> None:
    plan = sidecar_plan()
    pod = sandbox_pod(
        EPISODE,
        SPEC,
        SandboxPod("agent", 1, "img:1", plan.environment, {"A": "1"}, plan.sidecars),
        extra_labels={"kueue.x-k8s.io/queue-name": "evals"},
    )
    spec = pod["spec"]
    assert pod["metadata"]["ownerReferences"][0] == {
        "apiVersion": "episode-operator.dev/v1alpha1",
        "kind": "Episode",
        "name": "ledger",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "evals"
    assert (spec["restartPolicy"], spec["automountServiceAccountToken"], spec["enableServiceLinks"]) == (
        "Never",
        False,
        False,
    )
    assert spec["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["api"]}]
    assert (spec["nodeSelector"], spec["runtimeClassName"]) == ({"pool": "eval"}, "gvisor")
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    main, api = spec["containers"]
    assert "command" not in main  # the image's ENTRYPOINT is kept; the keep-alive is its argument
    assert main["args"][0] == "sh"
    # The agent's secrets reach its own jobs only (runtime/agents/base.py with_agent_env): not the main
    # container's environment, which setup.sh, the ENTRYPOINT and test.sh inherit, nor the sidecars.
    # Only what names the pod itself stays there.
    for container in (main, api):
        assert "envFrom" not in container and all(entry["name"] != "API_TOKEN" for entry in container["env"])
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in main["env"]
    for container in (main, api):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["NET_RAW"]}
    # Each container its own supervisor folder: main's job records out of the sidecars' reach.
    assert {"name": "episode-operator", "mountPath": "/episode-operator"} in main["volumeMounts"]
    assert {"name": "supervisor-api", "mountPath": "/episode-operator"} in api["volumeMounts"]
    assert {"name": "supervisor-api", "emptyDir": {}} in spec["volumes"]
    assert api["image"] == "img:1"  # ${MAIN_IMAGE_NAME}
    assert api["readinessProbe"]["exec"]["command"][:2] == ["sh", "-c"]
    assert api["resources"] == {"limits": {"cpu": "500m", "memory": "128Mi"}}


def test_verifier_pod_gets_no_agent_secrets() -> None:
    plan = resolve_plan(load_task(TaskFiles.from_directory(EXAMPLE_TASKS / "separate-verifier-handoff")))
    verifier = plan.turns[1].verifier
    assert verifier.environment is not None
    pod = sandbox_pod(
        EPISODE, SPEC, SandboxPod("verifier", 1, "img:1", verifier.environment, {}, turn=1), extra_labels={}
    )
    main = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "ledger-a1-v2"
    assert pod["metadata"]["labels"]["episode-operator.dev/turn"] == "2"
    assert "envFrom" not in main and main["env"] == []
    assert main["resources"] == {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}


@pytest.mark.parametrize("name", ["a", "x" * 63, "y" * 200])
def test_names_fit_a_label(name: str) -> None:
    pod_name = agent_pod_name(name, 12)
    assert len(pod_name) <= 63 and pod_name.endswith("-a12")
    assert short_name("x" * 200, "a1") != short_name("x" * 199 + "z", "a1")  # cut names stay distinct


def test_network_policies() -> None:
    labels = {"episode-operator.dev/episode": "ledger"}
    assert network_policy(EPISODE, "p", labels, NetworkPolicy()) is None
    closed = network_policy(EPISODE, "p", labels, NetworkPolicy(mode="no-network"))
    assert closed is not None and closed["spec"]["egress"] == [] and closed["spec"]["ingress"] == []
    allow = network_policy(
        EPISODE, "p", labels, NetworkPolicy(mode="allowlist", allowed_hosts=["10.1.2.3", "::1", "10.8.0.0/16"])
    )
    assert allow is not None
    cidrs = [{"ipBlock": {"cidr": cidr}} for cidr in ("10.1.2.3/32", "::1/128", "10.8.0.0/16")]
    assert allow["spec"]["egress"] == [{"to": cidrs}]  # addresses only: a hostname is refused at seed


def test_the_agent_pod_reserves_what_its_separate_verifiers_use_and_they_run_on_it() -> None:
    """docs/runtime.md, "Pods that wait, and capacity": the rule that keeps separate verifiers from deadlocking."""
    handoff = resolve_plan(load_task(TaskFiles.from_directory(EXAMPLE_TASKS / "separate-verifier-handoff")))
    # Its last turn verifies separately (cpus = 1, 256 MB): that pod starts after the agent pod is gone.
    assert [turn.verifier.mode for turn in handoff.turns] == ["shared", "separate"]
    assert verifier_reservation(handoff, FULL) == {}
    # Both turns separate: turn 1's verifier lives beside the agent pod.
    separate = handoff.turns[1].verifier
    plan = handoff.model_copy(
        update={"turns": [handoff.turns[0].model_copy(update={"verifier": separate}), handoff.turns[1]]}
    )
    first = plan.turns[0].verifier.environment
    assert first is not None
    assert verifier_reservation(plan, FULL) == {"cpu": "1", "memory": "256Mi"} == resources_of(first, FULL)["requests"]
    agent = sandbox_pod(
        EPISODE,
        SPEC,
        SandboxPod("agent", 1, "img:1", plan.environment, reservation=verifier_reservation(plan, FULL)),
        extra_labels={},
    )
    main, reservation = agent["spec"]["containers"]
    assert "nodeName" not in agent["spec"] and "resources" not in main  # the agent's own requests are its own
    assert reservation["name"] == RESERVATION_CONTAINER and reservation["image"] == "img:1"
    assert reservation["command"] == list(KEEP_ALIVE)
    assert reservation["resources"] == {"requests": dict(verifier_reservation(plan, FULL))} | {
        "limits": dict(verifier_reservation(plan, FULL))
    }
    pinned = sandbox_pod(
        EPISODE, SPEC, SandboxPod("verifier", 1, "img:1", first, turn=0, node_name="node-a"), extra_labels={}
    )
    assert pinned["spec"]["nodeName"] == "node-a"
    requests = resources_of(first, FULL)["requests"]
    assert pinned["spec"]["containers"][0]["resources"] == {
        "requests": {name: "0" for name in requests},
        "limits": requests,
    }


def test_a_released_pod_keeps_its_gpus_and_a_single_turn_reserves_nothing() -> None:
    assert released({"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}) == {
        "requests": {"cpu": "0", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "1", "nvidia.com/gpu": "1"},
    }
    assert verifier_reservation(sidecar_plan(), FULL) == {}


def two_separate_verifiers():  # type: ignore[no-untyped-def]
    """separate-verifier-handoff with turn 1 verifying separately too (cpus = 1, 256 MB), beside the agent pod."""
    handoff = resolve_plan(load_task(TaskFiles.from_directory(EXAMPLE_TASKS / "separate-verifier-handoff")))
    separate = handoff.turns[1].verifier
    return handoff.model_copy(
        update={"turns": [handoff.turns[0].model_copy(update={"verifier": separate}), handoff.turns[1]]}
    )


def test_a_cpu_request_fraction_asks_for_a_share_of_the_cpus_and_keeps_every_limit() -> None:
    """--cpu-request-fraction: Harbor's cpus stays the CPU limit (a quota, as Docker's --cpus); the
    scheduler is asked for the fraction of it, in millicores; memory is requested in full."""
    plan = two_separate_verifiers()
    verifier = plan.turns[0].verifier.environment
    assert verifier is not None
    tenth = SandboxRequests(cpu_fraction=0.1)
    assert resources_of(verifier, tenth) == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    assert SandboxRequests(cpu_fraction=0.25).cpu(6) == "1500m"
    assert SandboxRequests(cpu_fraction=0.0001).cpu(1) == "1m"  # never a request of nothing
    # A pod limited so (here the agent's) requests the share; what it reserves for its verifier is the
    # share that verifier would have requested: the rule that keeps them from deadlocking holds at any fraction.
    agent = sandbox_pod(
        EPISODE,
        SPEC,
        SandboxPod("agent", 1, "img:1", verifier, reservation=verifier_reservation(plan, tenth), requests=tenth),
        extra_labels={},
    )
    main, reservation = agent["spec"]["containers"]
    assert main["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    assert reservation["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}


def test_the_largest_reservation_is_compared_in_the_units_requests_are_written_in() -> None:
    """A fraction writes millicores: 2 CPUs' share (200m) is larger than 1 CPU's (100m), whatever the strings say."""
    plan = two_separate_verifiers()
    first = plan.turns[0].verifier
    assert first.environment is not None
    small = first.model_copy(update={"environment": first.environment.model_copy(update={"cpus": 1})})
    large = first.model_copy(update={"environment": first.environment.model_copy(update={"cpus": 2})})
    three = plan.model_copy(
        update={
            "turns": [
                plan.turns[0].model_copy(update={"verifier": large}),
                plan.turns[0].model_copy(update={"verifier": small}),
                plan.turns[1],
            ]
        }
    )
    assert verifier_reservation(three, SandboxRequests(cpu_fraction=0.1))["cpu"] == "200m"
    assert verifier_reservation(three, FULL)["cpu"] == "2"


@pytest.mark.parametrize("fraction", [0, -0.5, 1.01, 2])
def test_a_cpu_request_fraction_outside_0_to_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="above 0 and at most 1"):
        SandboxRequests(cpu_fraction=fraction)


def test_a_verifier_beside_the_compose_services_reserves_and_releases_their_requests_with_mains() -> None:
    """A verifier pod on the agent pod's node runs on what the agent pod reserved: its sidecars' requests
    (their limits where they name none, as Kubernetes makes them) are reserved and released with main's."""
    plan = two_separate_verifiers()  # turn 1 of 2 verifies separately: cpus = 1, 256 MB
    sidecars = [
        Sidecar(name="db", image="db:1", resources={"limits": {"cpu": "500m", "memory": "512Mi"}}),
        Sidecar(name="cache", image="c:1", resources={"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}),
    ]
    alone = plan.model_copy(update={"sidecars": sidecars})
    assert verifier_reservation(alone, FULL) == {"cpu": "1", "memory": "256Mi"}  # its services are not there
    beside = plan.turns[0].verifier.model_copy(update={"compose": True})
    together = alone.model_copy(
        update={"turns": [plan.turns[0].model_copy(update={"verifier": beside}), plan.turns[1]]}
    )
    assert verifier_reservation(together, FULL) == {"cpu": "1750m", "memory": "768Mi"}
    assert beside.environment is not None
    pinned = SandboxPod("verifier", 1, "img:1", beside.environment, sidecars=sidecars, turn=0, node_name="node-a")
    _, db, cache = sandbox_pod(EPISODE, SPEC, pinned, extra_labels={})["spec"]["containers"]
    assert db["resources"] == {"requests": {"cpu": "0", "memory": "0"}, "limits": {"cpu": "500m", "memory": "512Mi"}}
    assert cache["resources"] == {"requests": {"cpu": "0"}, "limits": {"cpu": "1"}}
    # The control: the same services in the agent pod ask for what they name.
    agent = SandboxPod("agent", 1, "img:1", beside.environment, sidecars=sidecars)
    _, db, cache = sandbox_pod(EPISODE, SPEC, agent, extra_labels={})["spec"]["containers"]
    assert (db["resources"], cache["resources"]) == (sidecars[0].resources, sidecars[1].resources)
