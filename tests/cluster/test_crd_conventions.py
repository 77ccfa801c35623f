"""The API server enforces the CRDs' conventions: times RFC 3339, reasons as metav1.Condition's; and
takes the statuses the operator writes (microsecond times included). (A 1.20 API server does not yet
refuse two conditions of one type in a list-map; server-side apply merges them by type.)"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.harness import EXAMPLES, GROUP, PLURAL, VERSION, create_episode, episode_spec, install_crd

CONDITION = {"type": "Complete", "status": "True", "reason": "Graded", "lastTransitionTime": "2026-01-01T00:00:00Z"}


def write_status(api: client.ApiClient, namespace: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "held", {"status": status}
    )


@pytest.mark.parametrize(
    ("status", "refusal"),
    [
        ({"conditions": [{**CONDITION, "lastTransitionTime": "yesterday"}]}, "lastTransitionTime"),
        ({"conditions": [{**CONDITION, "reason": "outage:image-pull"}]}, "reason"),
        ({"startedAt": "2026-01-01 00:00"}, "startedAt"),
    ],
    ids=["not-a-time", "reason-pattern", "status-time"],
)
def test_the_api_server_refuses_what_the_conventions_forbid(
    api_client: client.ApiClient, namespace: str, status: dict[str, Any], refusal: str
) -> None:
    install_crd(api_client)  # this branch's CRDs: other sessions on the cluster may have installed theirs
    # Suspended and watched by no operator of this session's: nothing else writes its status.
    create_episode(api_client, namespace, "held", episode_spec(EXAMPLES / "hello", suspend=True))
    write_status(api_client, namespace, {"phase": "Pending", "startedAt": "2026-01-01T00:00:00.123456Z"})
    with pytest.raises(ApiException) as error:
        write_status(api_client, namespace, status)
    assert error.value.status == 422 and refusal in str(error.value.body), error.value.body
