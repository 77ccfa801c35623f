"""NetworkPolicies for tasks that restrict the network (``no-network``, ``allowlist``).

One policy per sandbox pod, selected by the pod's labels. ``no-network`` denies all
ingress and egress (containers of the pod still reach each other on 127.0.0.1);
``allowlist`` allows egress to the listed IP addresses and CIDR ranges. A NetworkPolicy
cannot name hosts, so a task whose allowlist names a hostname is refused at seed
(``taskfolder/plan.py``, ``hostname_refusals``) and never reaches this module. Enforcement of
any NetworkPolicy needs a policy-capable CNI; the project's test cluster (a plain bridge)
stores them but does not enforce them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from episode_operator.api.vocabulary import EPISODE_LABEL
from episode_operator.kube.objects.pods import OwnerRef, label_value
from episode_operator.taskfolder.plan import NetworkPolicy
from episode_operator.taskfolder.task_toml import is_address_entry


def ip_entries(policy: NetworkPolicy) -> list[str]:
    """The allowlist's addresses and ranges, as CIDRs."""
    return [
        ipaddress.ip_network(host, strict=False).with_prefixlen
        for host in policy.allowed_hosts
        if is_address_entry(host)
    ]


def network_policy(
    episode: OwnerRef, name: str, pod_labels: Mapping[str, str], policy: NetworkPolicy
) -> dict[str, Any] | None:
    """The NetworkPolicy of one sandbox pod, or None for the public network."""
    if policy.mode == "public":
        return None
    egress: list[dict[str, Any]] = []
    if policy.mode == "allowlist":
        cidrs = ip_entries(policy)
        if cidrs:
            egress.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": episode.namespace,
            "labels": {"app.kubernetes.io/managed-by": "episode-operator", EPISODE_LABEL: label_value(episode.name)},
            "ownerReferences": [episode.owner_reference()],
        },
        "spec": {
            "podSelector": {"matchLabels": dict(pod_labels)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
