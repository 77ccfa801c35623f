"""The Kubernetes permissions of the operator and of ``kubectl episode``, declared once, as data.

Least privilege only lasts if it is checked. The Helm chart renders its Role/ClusterRole rules
from the file this module writes (``helm/episode-operator/files/rbac.yaml``; run
``python -m episode_operator.kube.rbac --write`` after changing the lists), and
``tests/unit/test_rbac.py`` compares the lists with what the code does: the API calls of
``kube/client.py`` that the operator's code reaches (read with ``ast``), and the resources kopf
watches for the registered handlers. A new call without a declared permission, or a declared
permission nothing uses, fails that test.

When: ``namespaced`` rules are needed in every watched namespace (a Role there, or a
ClusterRole when the operator watches all namespaces or namespace globs, which RBAC cannot
express). ``scanning`` rules (cluster-scoped) only while kopf observes the cluster: watching all
namespaces or globs; with named namespaces only, the operator turns kopf's scanning off
(handlers.py) and needs no ClusterRole at all. ``namespace-globs`` rules only with globs.
``data-api`` rules (cluster-scoped) only while the operator serves the data API (the chart's
``dataApi.enabled``); its ConfigMap rule is cluster-wide but names the one ConfigMap that only
kube-system has, because a Role in kube-system would not survive kustomize's ``namespace:``.
``cluster``: a user's cluster-scoped permission. ``own-namespace`` rules only in the operator's own
namespace (a Role there): the member Leases of its replicas (kube/replicas.py);
``data-api-own-namespace`` there too, with the data API: its serving certificate's Secret.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.episodeset_resource import SET_PLURAL
from episode_operator.api.vocabulary import GROUP
from episode_operator.kube.data_api_registration import AUTHENTICATION_CONFIG_MAP
from episode_operator.runtime.data_api_server import API_SERVICE, DATA_GROUP, RESOURCE, SUBRESOURCES

RBAC_FILE = Path("helm/episode-operator/files/rbac.yaml")
# The data API's ClusterRole is named per release: the chart puts its name where this stands.
DATA_API_CLUSTER_ROLE = "DATA-API-CLUSTER-ROLE"

When = Literal[
    "namespaced", "scanning", "namespace-globs", "data-api", "cluster", "own-namespace", "data-api-own-namespace"
]


@dataclass(frozen=True)
class Permission:
    """Some verbs on one resource (``pods/exec`` names a subresource), and why they are needed;
    ``resource_names`` narrows them to those objects."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]
    when: When
    reason: str
    resource_names: tuple[str, ...] = ()

    def grants(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource, verb) triples, the unit the tests compare."""
        return {(self.api_group, self.resource, verb) for verb in self.verbs}


OPERATOR_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        GROUP,
        PLURAL,
        ("get", "list", "watch", "patch", "create", "delete"),
        "namespaced",
        "kopf watches Episodes and patches its annotations and finalizer; a replica claims the ones it "
        "drives; EpisodeSets create, hold and wake theirs; expired Episodes are deleted",
    ),
    Permission(GROUP, f"{PLURAL}/status", ("patch",), "namespaced", "the driver writes the whole status"),
    Permission(
        GROUP,
        SET_PLURAL,
        ("get", "list", "watch", "patch"),
        "namespaced",
        "kopf watches EpisodeSets and patches its annotations and finalizer; a replica claims the ones it runs",
    ),
    Permission(GROUP, f"{SET_PLURAL}/status", ("patch",), "namespaced", "an EpisodeSet's whole status"),
    Permission(
        "",
        "pods",
        ("create", "get", "list", "watch", "delete", "patch"),
        "namespaced",
        "agent and verifier pods; kopf watches them so that a driver reads a starting pod when it changes; a warm "
        "pool's pods are patched when marked fresh and when claimed",
    ),
    Permission("", "pods/exec", ("create", "get"), "namespaced", "jobs start and are polled by exec (websocket: get)"),
    Permission(
        "",
        "configmaps",
        ("get", "list", "create", "update"),
        "namespaced",
        "tasks packed by `kubectl episode pack`; build contexts of in-cluster builds; the tombstones of "
        "run-once Episodes their TTL deleted",
    ),
    Permission(
        "",
        "secrets",
        ("get",),
        "namespaced",
        "that a model endpoint's key Secret exists and has its key, before any pod starts (the key itself "
        "goes to the capture container through the pod's secretKeyRef); the Secrets of spec.agent.env/envFrom, "
        "whose values the operator gives to the agent's own jobs only",
    ),
    Permission(
        "",
        "services",
        ("get",),
        "namespaced",
        "the cluster IP of a model endpoint named by its Service, pinned for the capture proxy (kube/upstream.py); "
        "elsewhere the operator's resolver answers",
    ),
    Permission(
        "batch",
        "jobs",
        ("create", "get", "patch", "delete"),
        "namespaced",
        "in-cluster image builds, one Job per build context digest, annotated with the manifest digest it "
        "pushed (kube/builds.py)",
    ),
    Permission(
        "apps",
        "daemonsets",
        ("create", "get", "delete"),
        "namespaced",
        "an EpisodeSet's pre-pull: one DaemonSet per set, owned by it (kube/prepull.py)",
    ),
    Permission("", "pods/log", ("get",), "namespaced", "a failed build's log, kept and classified"),
    Permission(
        "",
        "events",
        ("create", "list"),
        "namespaced",
        "turn and outage Events, and kopf's own; a waiting pod's Events say why it does not start",
    ),
    Permission(
        "networking.k8s.io",
        "networkpolicies",
        ("create", "update", "delete", "deletecollection"),
        "namespaced",
        "the network policy of each sandbox pod",
    ),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("list", "watch"),
        "scanning",
        "kopf observes CRDs, so a CRD installed or upgraded while it runs is picked up",
    ),
    Permission(
        "",
        "namespaces",
        ("list", "watch"),
        "namespace-globs",
        "kopf matches namespace globs (e.g. eval-*) against the namespaces that exist",
    ),
    Permission(
        "authorization.k8s.io",
        "subjectaccessreviews",
        ("create",),
        "data-api",
        "the data API asks the API server whether the caller it forwarded may read what it asks for",
    ),
    Permission(
        "apiregistration.k8s.io",
        "apiservices",
        ("create",),
        "data-api",
        "the data API registers its APIService (RBAC cannot name an object that does not exist yet)",
    ),
    Permission(
        "apiregistration.k8s.io",
        "apiservices",
        ("get", "update", "delete"),
        "data-api",
        "the data API's own APIService: its Service and the caBundle of each start's certificate; removed at exit",
        resource_names=(API_SERVICE,),
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "clusterroles",
        ("get",),
        "data-api",
        "the uid of the data API's own ClusterRole, which owns the APIService (its name: the chart's)",
        resource_names=(DATA_API_CLUSTER_ROLE,),
    ),
    Permission(
        "",
        "configmaps",
        ("get",),
        "data-api",
        "the API server's front-proxy settings (in kube-system), to know the requests it forwards to the data API",
        resource_names=(AUTHENTICATION_CONFIG_MAP[1],),
    ),
    Permission(
        "",
        "secrets",
        ("get", "create"),
        "data-api-own-namespace",
        "the data API's serving certificate, one for all replicas: made by the first to start, read by the others",
    ),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("create", "list", "update", "delete"),
        "own-namespace",
        "each replica's member Lease: created, renewed, listed with the others', deleted when it stops "
        "(or by another replica once stale)",
    ),
)

# What a person running `kubectl episode` (and `episode-operator install-crd`) needs in a namespace;
# documented in the README, checked against kube/client.py like the operator's.
USER_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        GROUP, PLURAL, ("create", "get", "list", "watch"), "namespaced", "kubectl episode run, get [-w], describe"
    ),
    Permission(
        GROUP, SET_PLURAL, ("create", "get", "patch"), "namespaced", "kubectl episode eval; rerun sets spec.rerun"
    ),
    Permission(
        "",
        "configmaps",
        ("create", "get"),
        "namespaced",
        "kubectl episode pack; eval --registry configmap/NAME reads the catalogue",
    ),
    Permission(
        "", "pods/exec", ("create", "get"), "namespaced", "kubectl episode logs -f reads the running agent's output"
    ),
    *(
        Permission(
            DATA_GROUP,
            f"{RESOURCE}/{name}",
            ("get",),
            "namespaced",
            f"kubectl episode {name} (the operator's data API)",
        )
        for name in SUBRESOURCES
    ),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("create", "get", "update"),
        "cluster",
        "episode-operator install-crd (cluster admins only)",
    ),
)


def grants(permissions: tuple[Permission, ...], *when: When) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples of the permissions needed in the given cases."""
    return {grant for permission in permissions if permission.when in when for grant in permission.grants()}


def _rule_lines(permission: Permission) -> list[str]:
    lines = [
        f"  # {permission.reason}",
        f'  - apiGroups: ["{permission.api_group}"]',
        f"    resources: [{permission.resource}]",
    ]
    if permission.resource_names:
        lines.append(f"    resourceNames: [{', '.join(permission.resource_names)}]")
    return [*lines, f"    verbs: [{', '.join(permission.verbs)}]"]


def render_rules() -> str:
    """The operator's rules as the YAML the chart reads (``.Files.Get "files/rbac.yaml"``)."""
    sections: dict[str, list[Permission]] = {
        "namespaced": [p for p in OPERATOR_PERMISSIONS if p.when == "namespaced"],
        "scanning": [p for p in OPERATOR_PERMISSIONS if p.when == "scanning"],
        "namespaceGlobs": [p for p in OPERATOR_PERMISSIONS if p.when == "namespace-globs"],
        "dataApi": [p for p in OPERATOR_PERMISSIONS if p.when == "data-api"],
        "ownNamespace": [p for p in OPERATOR_PERMISSIONS if p.when == "own-namespace"],
        "dataApiOwnNamespace": [p for p in OPERATOR_PERMISSIONS if p.when == "data-api-own-namespace"],
    }
    lines = [
        "# Generated by `python -m episode_operator.kube.rbac --write` from kube/rbac.py. Do not edit.",
        "# namespaced: in every watched namespace (cluster-wide when watching all namespaces or globs);",
        "# scanning: cluster-wide, when watching all namespaces or globs;",
        "# namespaceGlobs: cluster-wide, when a watched namespace is a glob;",
        "# dataApi: cluster-wide, when the operator serves the data API;",
        "# ownNamespace: in the operator's own namespace (the replicas' Leases);",
        "# dataApiOwnNamespace: there too, when the operator serves the data API.",
    ]
    for section, permissions in sections.items():
        lines.append(f"{section}:")
        for permission in permissions:
            lines += _rule_lines(permission)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print or write the operator's RBAC rules for the Helm chart.")
    parser.add_argument("--write", type=Path, nargs="?", const=RBAC_FILE, help=f"Write this file ({RBAC_FILE}).")
    options = parser.parse_args(argv)
    text = render_rules()
    if options.write is None:
        sys.stdout.write(text)
        return
    options.write.parent.mkdir(parents=True, exist_ok=True)
    options.write.write_text(text)


if __name__ == "__main__":
    main()
