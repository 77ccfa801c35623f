"""The Helm chart, linted and rendered by the real Helm library (helm-python-sdk), and what is
generated from it or must agree with it: its CRDs, its RBAC rules, manifests/install, the image."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from episode_operator.api.vocabulary import DEFAULT_AGENT_OUTCOMES
from episode_operator.kube import data_api_registration as kube_dataapi
from episode_operator.kube import rbac
from episode_operator.kube.objects.pods import SandboxRequests
from tests.chart import CHART, CRDS, INSTALL, chart_crds, find, hack_chart, install_manifests, lint, notes, render
from tests.conftest import REPO


def rules_of(objects: list[dict[str, Any]], kind: str) -> dict[str | None, set[tuple[str, str, str]]]:
    """(apiGroup, resource, verb) granted by each Role/ClusterRole, by namespace."""
    granted: dict[str | None, set[tuple[str, str, str]]] = {}
    for role in find(objects, kind):
        grants = granted.setdefault(role["metadata"].get("namespace"), set())
        for rule in role["rules"]:
            grants |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return granted


def test_the_chart_lints_strictly() -> None:
    for values in ({}, {"watchNamespaces": ["a", "eval-*"], "persistence": {"enabled": True}}):
        report = lint(values)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_charts_crds_are_the_generated_ones() -> None:
    committed = {path.name: path.read_text() for path in sorted(CRDS.glob("*.yaml"))}
    assert "episodes.episode-operator.dev.yaml" in committed
    assert chart_crds() == committed, "run: python -m episode_operator.kube.objects.crds --write"


def test_manifests_install_is_the_chart_with_its_defaults() -> None:
    on_disk = {path.name: path.read_text() for path in sorted(INSTALL.glob("*"))}
    assert on_disk == install_manifests(), "run: hack/generate"


# The replicas' Leases: a Role in the operator's own namespace, whatever it watches; with the data
# API, also its serving certificate's Secret there.
LEASES = {"episode-operator-system": rbac.grants(rbac.OPERATOR_PERMISSIONS, "own-namespace")}
OWN_NAMESPACE = {
    "episode-operator-system": rbac.grants(rbac.OPERATOR_PERMISSIONS, "own-namespace", "data-api-own-namespace")
}


def test_all_namespaces_get_one_cluster_role() -> None:
    objects = render({"dataApi": {"enabled": False}})
    assert rules_of(objects, "Role") == LEASES and len(find(objects, "RoleBinding")) == 1
    assert rules_of(objects, "ClusterRole") == {None: rbac.grants(rbac.OPERATOR_PERMISSIONS, "namespaced", "scanning")}
    (binding,) = find(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "episode-operator", "namespace": "episode-operator-system"}
    ]


def test_named_namespaces_get_a_role_each_and_nothing_cluster_wide_but_the_data_apis() -> None:
    objects = render({"watchNamespaces": ["team-a", "team-b"]})
    (data_api_role,) = find(objects, "ClusterRole")
    assert data_api_role["metadata"]["name"].endswith("-data-api")
    assert rules_of(objects, "ClusterRole") == {None: rbac.grants(rbac.OPERATOR_PERMISSIONS, "data-api")}
    assert [rule.get("resourceNames") for rule in data_api_role["rules"]] == [
        None,  # subjectaccessreviews: created, never named
        None,  # the APIService's create
        ["v1alpha1.data.episode-operator.dev"],
        [data_api_role["metadata"]["name"]],  # itself: the APIService's owner
        ["extension-apiserver-authentication"],
    ]
    (container,) = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert f"--data-api-owner={data_api_role['metadata']['name']}" in container["args"]
    objects = render({"watchNamespaces": ["team-a", "team-b"], "dataApi": {"enabled": False}})
    assert find(objects, "ClusterRole") == [] and find(objects, "ClusterRoleBinding") == []
    namespaced = rbac.grants(rbac.OPERATOR_PERMISSIONS, "namespaced")
    assert rules_of(objects, "Role") == {"team-a": namespaced, "team-b": namespaced, **LEASES}
    bound = sorted(b["metadata"]["namespace"] for b in find(objects, "RoleBinding"))
    assert bound == ["episode-operator-system", "team-a", "team-b"]
    args = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


@pytest.mark.parametrize("pattern", ["eval-*", "team-?", "!kube-*", "a,b"])
def test_namespace_globs_need_cluster_wide_rules_and_namespace_listing(pattern: str) -> None:
    objects = render({"watchNamespaces": ["named", pattern]})
    assert rules_of(objects, "Role") == OWN_NAMESPACE
    assert rules_of(objects, "ClusterRole") == {
        None: rbac.grants(rbac.OPERATOR_PERMISSIONS, "namespaced", "scanning", "namespace-globs", "data-api")
    }


def test_the_deployment_is_one_hardened_replica() -> None:
    (deployment,) = find(render(), "Deployment")
    spec = deployment["spec"]
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert (spec["replicas"], spec["strategy"]) == (1, rolling)
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts == {"/var/lib/episode-operator/data": "data", "/tmp": "tmp"}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}} and volumes["data"] == {"name": "data", "emptyDir": {}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8080,
        "healthz": 8081,
        "data-api": 8443,
    }
    assert "--liveness=http://0.0.0.0:8081/healthz" in container["args"]
    assert {"--metrics-port=8080", "--data-api-port=8443"} <= set(container["args"])
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_values_reach_the_operator() -> None:
    values = {
        "maxActiveEpisodes": 8,
        "pullGrace": 45,
        "logLevel": "verbose",
        "dataDir": "/data",
        "extraArgs": ["--poll-interval=10"],
        "podLabels": {"team": "evals"},
        "image": {"repository": "registry.example/episode-operator", "tag": "0.1.0", "pullPolicy": "Always"},
        "persistence": {"enabled": True, "size": "50Gi", "storageClassName": "fast"},
    }
    objects = render(values)
    (deployment,) = find(objects, "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"][0] == "run"
    assert {"--max-active-episodes=8", "--pull-grace=45", "--data-dir=/data", "--poll-interval=10"} <= set(
        container["args"]
    )
    assert container["env"][0] == {"name": "EPISODE_OPERATOR_VERBOSE", "value": "1"}
    assert (container["image"], container["imagePullPolicy"]) == ("registry.example/episode-operator:0.1.0", "Always")
    assert pod["metadata"]["labels"]["team"] == "evals"
    (claim,) = find(objects, "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    data = next(v for v in pod["spec"]["volumes"] if v["name"] == "data")
    assert data == {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        # The issue's three: a misspelled key, a count that is not one, a tag that is no string.
        ({"maxActiveEpisode": 20}, "additional properties 'maxActiveEpisode' not allowed"),
        ({"maxActiveEpisodes": "lots"}, "at '/maxActiveEpisodes': got string, want integer"),
        ({"image": {"tag": 1.2}}, "at '/image/tag': got number, want string"),
        ({"image": {"tga": "0.1.0"}}, "at '/image': additional properties 'tga' not allowed"),
        ({"maxActiveEpisodes": -1}, "at '/maxActiveEpisodes'"),
        ({"logLevel": "debug"}, "at '/logLevel'"),
        ({"pullGrace": 0}, "at '/pullGrace'"),
        ({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array"),
        ({"resources": {"limits": {"memory": "lots"}}}, "at '/resources/limits/memory'"),
        ({"persistence": {"enabled": "yes"}}, "at '/persistence/enabled': got string, want boolean"),
        ({"dataApi": {"enable": False}}, "at '/dataApi': additional properties 'enable' not allowed"),
        ({"service": {"port": 0}}, "at '/service/port'"),
        ({"extraArgs": ["poll-interval=10"]}, "at '/extraArgs/0'"),
    ],
)
def test_the_schema_refuses_unknown_keys_and_wrong_types(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        render(values)
    assert complaint in str(refused.value)
    assert lint(values)["errors"], "helm lint passes what install refuses"


@pytest.mark.parametrize("tag", ["", None])
def test_an_empty_or_null_image_tag_is_the_charts_app_version(tag: str | None) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    (deployment,) = find(render({"image": {"tag": tag}}), "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/episode-operator/episode-operator:{app_version}"
    assert f"ghcr.io/episode-operator/sandbox:{app_version}" in notes({"sandboxImage": {"tag": tag}})


def test_the_chart_says_where_it_comes_from() -> None:
    metadata = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert metadata["home"].startswith("https://") and metadata["home"] in metadata["sources"]
    assert metadata["maintainers"] and all(m["name"] for m in metadata["maintainers"])
    assert {"harbor", "nemo-gym", "operator"} <= set(metadata["keywords"])
    images = yaml.safe_load(metadata["annotations"]["artifacthub.io/images"])
    assert {i["image"] for i in images} == {
        f"ghcr.io/episode-operator/{name}:{metadata['appVersion']}" for name in ("episode-operator", "sandbox")
    }


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["evals"]}, {"watchNamespaces": ["eval-*"]}])
def test_the_notes_point_at_nothing_outside_the_cluster(values: dict[str, Any]) -> None:
    """What NOTES print is all a user needs: no file of this repository (tests/cluster runs each command)."""
    text = notes(values)
    assert not re.search(r"\b(manifests|examples|helm|hack|crds)/|\.ya?ml\b|README", text), text
    assert "kubectl -n episode-operator-system rollout status deployment/episode-operator" in text
    if values.get("watchNamespaces") == ["eval-*"]:
        assert "kubectl -n eval-*" not in text  # a glob is no namespace to run the example in
    else:
        namespace = (values.get("watchNamespaces") or ["default"])[0]
        assert f"kubectl -n {namespace} apply -f - <<'EOF'" in text
        assert f"/apis/data.episode-operator.dev/v1alpha1/namespaces/{namespace}/episodes/hello/log" in text


def test_the_service_is_where_the_operator_registers_its_data_api() -> None:
    """The operator registers the APIService itself (kube/data_api_registration.py), for the Service the chart makes."""
    objects = render(release="ops", namespace="episode-operator-system")
    (service,) = find(objects, "Service")
    assert service["metadata"]["name"] == "episode-operator"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
        {"name": "data-api", "port": 443, "targetPort": "data-api", "protocol": "TCP"},
    ]
    assert kube_dataapi.SERVICE_PORT == 443
    (container,) = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert {"--data-api-port=8443", "--data-api-service=episode-operator"} <= set(container["args"])
    assert find(objects, "APIService") == [], "Helm 4 applies server-side, which a 1.20 API server refuses for it"


def test_the_data_api_can_be_left_to_another_release() -> None:
    objects = render({"dataApi": {"enabled": False}})
    assert find(objects, "APIService") == []
    (container,) = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--data-api")]
    assert [p["name"] for p in container["ports"]] == ["http", "healthz"]
    assert [p["name"] for p in find(objects, "Service")[0]["spec"]["ports"]] == ["http"]


def test_the_service_monitor_is_a_toggle() -> None:
    assert find(render(), "ServiceMonitor") == []
    (monitor,) = find(render({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}), "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_two_releases_do_not_share_cluster_scoped_names() -> None:
    """The data API is one per cluster (its operator registers it); a second release turns it off."""
    first = {(o["kind"], o["metadata"]["name"]) for o in render(namespace="one") if "namespace" not in o["metadata"]}
    second = {
        (o["kind"], o["metadata"]["name"])
        for o in render({"dataApi": {"enabled": False}}, namespace="two")
        if "namespace" not in o["metadata"]
    }
    assert {kind for kind, _ in first} == {"ClusterRole", "ClusterRoleBinding"}
    assert second and not first & second


def test_the_dockerfile_and_the_test_clusters_image_agree() -> None:
    """Same user, venv, entrypoint and default arguments; the chart runs as that user."""
    dockerfile = (REPO / "Dockerfile").read_text()
    loader = SourceFileLoader("hack_cluster", str(REPO / "hack" / "cluster"))
    spec = importlib.util.spec_from_loader("hack_cluster", loader)
    assert spec is not None
    cluster = importlib.util.module_from_spec(spec)
    sys.modules["hack_cluster"] = cluster  # its dataclasses look their module up
    try:
        loader.exec_module(cluster)
    finally:
        del sys.modules["hack_cluster"]
    image = cluster.IMAGES[cluster.OPERATOR_IMAGE]
    assert re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M).groups() == tuple(image.user.split(":"))  # type: ignore[union-attr]
    assert re.search(r'^ENTRYPOINT \["([^"]+)"\]$', dockerfile, re.M).group(1) == image.entrypoint[0]  # type: ignore[union-attr]
    assert re.search(r'^CMD \["([^"]+)"\]$', dockerfile, re.M).group(1) == image.cmd[0]  # type: ignore[union-attr]
    assert f"python -m venv {cluster.OPERATOR_VENV}" in dockerfile
    (deployment,) = find(render(), "Deployment")
    assert str(deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]) == image.user.split(":")[0]
    local = hack_chart.TEST_CLUSTER_VALUES
    assert f"{local['image']['repository']}:{local['image']['tag']}" == cluster.OPERATOR_IMAGE
    assert f"{local['sandboxImage']['repository']}:{local['sandboxImage']['tag']}" == cluster.SANDBOX_IMAGE


def test_output_limits_become_flags_the_operator_accepts() -> None:
    from episode_operator.cli.operator_main import main
    from episode_operator.runtime.limits import LIMIT_FLAGS, OutputLimits

    def limits_of(values: dict[str, Any]) -> OutputLimits:
        (deployment,) = find(render(values), "Deployment")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        flags = [arg for arg in args if arg.split("=")[0] in {limit.flag for limit in LIMIT_FLAGS.values()}]
        assert len(flags) == len(LIMIT_FLAGS)
        params = main.commands["run"].make_context("run", flags).params
        return OutputLimits(**{name: params[name] for name in LIMIT_FLAGS})

    assert limits_of({}) == OutputLimits()  # the chart's defaults are the operator's
    chosen = limits_of(
        {
            "outputLimits": {
                "answer": "8Mi",
                "log": 4096,
                "artifact": "2Gi",
                "artifactMembers": 500,
                "turnArtifacts": "3Gi",
            }
        }
    )
    assert chosen == OutputLimits(8 << 20, 4096, 2 << 30, 500, 3 << 30)
    with pytest.raises(helm.HelmValuesError) as refused:
        render({"outputLimits": {"answer": "4MB"}})
    assert "at '/outputLimits" in str(refused.value)


def test_image_mirrors_become_flags_the_operator_accepts() -> None:
    from click.testing import CliRunner

    from episode_operator.cli.operator_main import main

    mirrors = {"docker.io/library/": "registry.internal/library/", "ubuntu:24.04": "registry.internal/u:24.04"}
    (deployment,) = find(render({"imageMirrors": mirrors}), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [arg for arg in args if arg.startswith("--image-mirror=")]
    assert flags == [
        "--image-mirror=docker.io/library/=registry.internal/library/",
        "--image-mirror=ubuntu:24.04=registry.internal/u:24.04",
    ]
    # The operator parses exactly these (a bad one is a usage error naming it).
    run_context = main.commands["run"].make_context("run", flags)
    assert run_context.params["image_mirrors"].apply("ubuntu:24.04") == "registry.internal/u:24.04"
    result = CliRunner().invoke(main, ["run", "--image-mirror=ubuntu=x:1"])
    assert result.exit_code == 2 and "a repository maps to a repository" in result.output


def test_replicas_share_a_store_lease_in_the_release_namespace_and_keep_a_disruption_budget() -> None:
    values = {
        "replicas": 3,
        "sharding": {"leaseDuration": 12, "renewDeadline": 8, "retryPeriod": 3},
        "objectStore": {"url": "s3://evals/kept", "endpoint": "http://minio:9000", "allowHttp": True,
                        "credentialsSecret": "minio-credentials"},
    }  # fmt: skip
    objects = render(values, namespace="ops")
    (deployment,) = find(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 3
    assert {
        "--replica-group=episode-operator",
        "--lease-duration=12",
        "--renew-deadline=8",
        "--retry-period=3",
        "--store-url=s3://evals/kept",
        "--store-endpoint=http://minio:9000",
        "--store-allow-http",
    } <= set(container["args"])
    assert container["envFrom"] == [{"secretRef": {"name": "minio-credentials"}}]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    lease_namespace = {"fieldRef": {"fieldPath": "metadata.namespace"}}  # the pod's: kustomize may move it
    assert {"name": "EPISODE_OPERATOR_LEASE_NAMESPACE", "valueFrom": lease_namespace} in container["env"]
    (budget,) = find(objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    (role,) = [r for r in find(objects, "Role") if r["metadata"]["namespace"] == "ops"]
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "list", "update", "delete"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},  # the data API's certificate
    ]
    assert not find(render(), "PodDisruptionBudget")  # one replica: nothing to budget


def test_several_replicas_without_a_shared_store_are_refused() -> None:
    with pytest.raises(Exception, match=r"objectStore\.url"):
        render({"replicas": 2})
    with pytest.raises(Exception, match="ReadWriteMany"):
        render({"replicas": 2, "persistence": {"enabled": True}})
    shared = render({"replicas": 2, "persistence": {"enabled": True, "accessModes": ["ReadWriteMany"]}})
    (deployment,) = find(shared, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    (single,) = find(render({"persistence": {"enabled": True}}), "Deployment")
    assert single["spec"]["strategy"] == {"type": "Recreate"}  # a ReadWriteOnce volume: never two pods
    with pytest.raises(Exception, match="replicas"):
        render({"replicas": 0})  # the values schema: minimum 1


def test_builds_become_flags_the_operator_accepts_and_their_namespace_gets_a_role() -> None:
    builds = {"registry": "registry.internal:5000", "namespace": "builds", "insecure": True}
    objects = render({"watchNamespaces": ["team-a"], "builds": builds, "unschedulableTimeout": 900})
    (deployment,) = find(objects, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [arg for arg in args if arg.startswith(("--build", "--unschedulable"))]
    assert flags == [
        "--build-registry=registry.internal:5000",
        "--build-namespace=builds",
        "--builder-image=episode-operator.local/builder:bookworm",
        "--build-registry-insecure",
        "--unschedulable-timeout=900",
    ]
    options = main_command_params(flags)
    assert (options["build_registry"], options["build_namespace"], options["unschedulable_timeout_sec"]) == (
        "registry.internal:5000",
        "builds",
        900.0,
    )
    # Beside the watched namespace's and the replicas' Leases' (the release namespace), one for builds.
    release = "episode-operator-system"
    assert sorted(role["metadata"]["namespace"] for role in find(objects, "Role")) == ["builds", release, "team-a"]
    # Without a registry: no build flags, no Role for builds.
    plain = render({"watchNamespaces": ["team-a"]})
    (deployment,) = find(plain, "Deployment")
    assert not [arg for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"] if "--build" in arg]
    assert sorted(role["metadata"]["namespace"] for role in find(plain, "Role")) == [release, "team-a"]


def cpu_request_flags(values: dict[str, Any]) -> list[str]:
    (deployment,) = find(render(values), "Deployment")
    return [arg for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"] if "--cpu-request" in arg]


def test_a_cpu_request_fraction_becomes_the_flag_and_null_leaves_the_operators_default() -> None:
    flags = cpu_request_flags({"cpuRequestFraction": 0.25})
    assert flags == ["--cpu-request-fraction=0.25"]
    assert main_command_params(flags)["cpu_request_fraction"] == 0.25
    assert cpu_request_flags({}) == cpu_request_flags({"cpuRequestFraction": None}) == []


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, 1, 0.05])
def test_the_schema_takes_the_cpu_request_fractions_the_operator_takes(fraction: float) -> None:
    """One rule, two places it is checked: at install (the values schema) and by the operator (SandboxRequests)."""
    try:
        SandboxRequests(cpu_fraction=fraction)
    except ValueError:
        with pytest.raises(helm.HelmValuesError, match="at '/cpuRequestFraction'"):
            render({"cpuRequestFraction": fraction})
    else:
        assert cpu_request_flags({"cpuRequestFraction": fraction}) == [f"--cpu-request-fraction={fraction}"]


def test_the_operator_refuses_a_cpu_request_fraction_out_of_range_as_a_usage_error(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "episode-operator"
    result = subprocess.run(
        [str(script), "run", "--cpu-request-fraction=1.5", "--metrics-port=0", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Invalid value for --cpu-request-fraction: a CPU request fraction is above 0 and at most 1, not 1.5" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def main_command_params(flags: list[str]) -> dict[str, Any]:
    from episode_operator.cli.operator_main import main

    params: dict[str, Any] = main.commands["run"].make_context("run", flags).params
    return params


def test_the_charts_default_timing_is_the_operators() -> None:
    """values.yaml restates --pull-grace and --unschedulable-timeout; both must be runtime/timing.py's defaults,
    or a Helm install and `episode-operator run` wait differently."""
    from episode_operator.runtime.timing import DEFAULT_TIMING

    (deployment,) = find(render(), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    timing_flags = [arg for arg in args if arg.startswith(("--pull-grace", "--unschedulable", "--poll"))]
    options = main_command_params(timing_flags)
    timed = {name: options[name] for name in ("pull_grace_sec", "poll_interval_sec", "unschedulable_timeout_sec")}
    assert timed == {name: getattr(DEFAULT_TIMING, name) for name in timed}


GYM_VALUES: dict[str, Any] = {
    "watchNamespaces": ["evals"],
    "gym": {
        "enabled": True,
        "tokenSecret": {"name": "gym-token"},
        "settings": {"namespace": "evals", "agent": {"kind": "command", "command": "true"}, "retryOwner": "gym"},
    },
}


def test_the_gym_server_runs_in_every_replica_with_the_settings_the_operator_reads() -> None:
    from episode_operator.runtime.gym_server import load_settings

    objects = render(GYM_VALUES)
    (settings,) = find(objects, "ConfigMap", "episode-operator-gym")
    loaded = load_settings(settings["data"]["gym.yaml"], "token", "gym.yaml")  # the operator's own parser
    assert (loaded.namespace, loaded.agent.kind, loaded.retry_owner) == ("evals", "command", "gym")
    (deployment,) = find(objects, "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert {"--gym-port=8090", "--gym-settings=/etc/episode-operator/gym/gym.yaml"} <= set(container["args"])
    token = next(e for e in container["env"] if e["name"] == "EPISODE_GYM_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "gym-token", "key": "token"}
    assert {"name": "gym", "containerPort": 8090} in container["ports"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "gym-settings")
    assert mount["mountPath"] == "/etc/episode-operator/gym" and mount["readOnly"]
    assert pod["metadata"]["annotations"]["episode-operator.dev/gym-settings"]  # a settings change rolls the pods
    (service,) = find(objects, "Service")
    assert {"name": "gym", "port": 8090, "targetPort": "gym", "protocol": "TCP"} in service["spec"]["ports"]
    # Off by default: nothing of it renders.
    plain = render()
    assert not find(plain, "ConfigMap", "episode-operator-gym")
    assert not any(
        "gym" in arg for arg in find(plain, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_the_gym_settings_keys_are_the_operators() -> None:
    """values.schema.json lists the settings file's keys: exactly GymServerFile's fields, camelCase."""
    import json

    from episode_operator.runtime.gym_server import GymServerFile

    schema = json.loads((CHART / "values.schema.json").read_text())
    keys = set(schema["properties"]["gym"]["properties"]["settings"]["properties"])
    assert keys == {field.alias or name for name, field in GymServerFile.model_fields.items()}


@pytest.mark.parametrize(
    ("gym", "complaint"),
    [
        ({"enabled": True, "settings": GYM_VALUES["gym"]["settings"]}, "gym.tokenSecret.name"),
        ({"enabled": True, "tokenSecret": {"name": "t"}, "settings": {"namespace": "evals"}}, "gym.settings.agent"),
        ({"settings": {"namespace": "evals", "agnet": {}}}, "agnet"),
        ({"settings": {"retryOwner": "both"}}, "retryOwner"),
    ],
    ids=["no-token", "no-agent", "misspelled-key", "bad-retry-owner"],
)
def test_a_gym_block_that_cannot_serve_is_refused_naming_the_key(gym: dict[str, Any], complaint: str) -> None:
    with pytest.raises(Exception, match=re.escape(complaint)):
        render({"gym": gym})


def gym_yaml(values: dict[str, Any]) -> str:
    """The --gym-settings file the chart renders for ``values``."""
    (settings,) = find(render(values), "ConfigMap", "episode-operator-gym")
    text: str = settings["data"]["gym.yaml"]
    return text


def with_harbor(harbor: dict[str, Any]) -> dict[str, Any]:
    settings = GYM_VALUES["gym"]["settings"] | {"harbor": harbor}
    return GYM_VALUES | {"gym": GYM_VALUES["gym"] | {"settings": settings}}


def test_the_charts_harbor_settings_are_harbor_settings_defaults() -> None:
    """values.yaml restates each of Gym's harbor server settings at HarborSettings' default (the seed's, an
    Episode's own), and a release that sets none of them gives every try exactly those."""
    from episode_operator.api.episode_resource import HarborSettings
    from episode_operator.runtime.gym_server import load_settings

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["gym"]["settings"]["harbor"] == HarborSettings().model_dump(by_alias=True)
    assert load_settings(gym_yaml(GYM_VALUES), "token", "gym.yaml").harbor == HarborSettings()


def test_the_schema_types_each_harbor_setting_as_the_operator_does() -> None:
    """Each setting's type and bounds in values.schema.json are HarborSettings' own (its JSON schema); the
    schema adds only the prompt template's placeholder, which the operator checks in a validator."""
    import json

    from episode_operator.api.episode_resource import HarborSettings

    def helm_form(declared: dict[str, Any]) -> dict[str, Any]:
        variants = declared.get("anyOf", [declared])
        types = [variant["type"] for variant in variants]
        bounds = {key: value for variant in variants for key, value in variant.items() if key != "type"}
        return {"type": types[0] if len(types) == 1 else types, **bounds}

    schema = json.loads((CHART / "values.schema.json").read_text())
    harbor = schema["properties"]["gym"]["properties"]["settings"]["properties"]["harbor"]
    assert harbor["additionalProperties"] is False
    models = HarborSettings.model_json_schema(by_alias=True)["properties"]
    stated = {key: {k: v for k, v in given.items() if k != "pattern"} for key, given in harbor["properties"].items()}
    assert stated == {
        key: helm_form({k: v for k, v in declared.items() if k not in ("default", "description", "title")})
        for key, declared in models.items()
    }
    assert harbor["properties"]["promptTemplate"]["pattern"] == re.escape("{instruction}")


def test_each_harbor_setting_of_the_release_reaches_every_try() -> None:
    from episode_operator.api.episode_resource import HarborSettings
    from episode_operator.runtime.gym_protocol import parse_run
    from episode_operator.runtime.gym_server import load_settings, try_manifest

    chosen = {
        "stepSetupTimeoutSec": 45,
        "verifierGraceSec": 5,
        "enforceTaskTimeouts": False,
        "defaultEpisodeTimeoutSec": 900,
        "separateVerifierForArtifacts": True,
        "promptTemplate": "Work in /app.\n{instruction}",
        "agentOutcomePolicy": {**DEFAULT_AGENT_OUTCOMES, "timeout": "retry", "model_auth": "measure"},
    }
    assert set(chosen) == {field.alias for field in HarborSettings.model_fields.values()}  # every one of them
    settings = load_settings(gym_yaml(with_harbor(chosen)), "token", "gym.yaml")
    row = {"instance_id": "examples::hello", "_ng_task_index": 0, "_ng_rollout_index": 0}
    manifest = try_manifest(settings, "run-1", parse_run(row), {"configMap": {"name": "task-hello"}})
    assert manifest["spec"]["harbor"] == chosen


@pytest.mark.parametrize(
    ("harbor", "key"),
    [
        ({"verifierGraceSec": -1}, "verifierGraceSec"),
        ({"stepSetupTimeoutSec": 0}, "stepSetupTimeoutSec"),
        ({"defaultEpisodeTimeoutSec": 10**7}, "defaultEpisodeTimeoutSec"),
        ({"enforceTaskTimeouts": "yes"}, "enforceTaskTimeouts"),
        ({"separateVerifierForArtifacts": "no"}, "separateVerifierForArtifacts"),
        ({"promptTemplate": "Solve it."}, "promptTemplate"),
        ({"verifierGrace": 1}, "verifierGrace"),
    ],
)
def test_a_bad_harbor_setting_is_refused_by_the_chart_and_the_operator_naming_the_key(
    harbor: dict[str, Any], key: str
) -> None:
    from episode_operator.runtime.gym_server import load_settings

    with pytest.raises(helm.HelmValuesError, match=re.escape("'/gym/settings/harbor")) as refused:
        render(with_harbor(harbor))
    assert key in str(refused.value)
    # The operator refuses the same file at start (a release made without the schema, a hand-written file).
    text = yaml.safe_dump({"namespace": "evals", "agent": {"kind": "command", "command": "true"}, "harbor": harbor})
    with pytest.raises(ValueError, match=re.escape(f"gym.yaml: harbor.{key}")):
        load_settings(text, "token", "gym.yaml")


def test_task_artifact_registries_become_flags_the_operator_accepts() -> None:
    values = {"taskArtifacts": {"registries": ["http://198.18.255.1:5000", "registry.internal"], "limit": "64Mi"}}
    (deployment,) = find(render(values), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [arg for arg in args if arg.startswith("--task-")]
    assert flags == [
        "--task-registry=http://198.18.255.1:5000",
        "--task-registry=registry.internal",
        "--task-artifact-limit=64Mi",
        "--task-cache-limit=2Gi",
    ]
    options = main_command_params(flags)
    assert options["task_registries"] == ("http://198.18.255.1:5000", "registry.internal")
    assert (options["task_artifact_limit"], options["task_cache_limit"]) == (64 << 20, 2 << 30)
    with pytest.raises(Exception, match="registries"):
        render({"taskArtifacts": {"registries": ["ftp://x"]}})  # the values schema
