"""The operator's request counter names requests as the API server's apiserver_request_total does."""

from __future__ import annotations

import pytest

from episode_operator.kube.client import request_kind

HOST = "https://198.18.255.1:6443"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods/p", None, ("GET", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", [("labelSelector", "a=b")], ("LIST", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", [("watch", True)], ("WATCH", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods/p/exec", [("command", "sh")], ("GET", "pods/exec")),
        ("POST", "/api/v1/namespaces/ns/events", None, ("POST", "events")),
        (
            "DELETE",
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies",
            None,
            ("DELETECOLLECTION", "networkpolicies"),
        ),
        (
            "PATCH",
            "/apis/episode-operator.dev/v1alpha1/namespaces/ns/episodes/e/status",
            None,
            ("PATCH", "episodes/status"),
        ),
        ("GET", "/apis/episode-operator.dev/v1alpha1/episodes", None, ("LIST", "episodes")),
        ("GET", "/api/v1/namespaces/ns/services/web/proxy/a/b", None, ("GET", "services/proxy")),
        ("GET", "/api/v1/namespaces/ns", None, ("GET", "namespaces")),
        ("PUT", "/apis/apiregistration.k8s.io/v1/apiservices/v1.x", None, ("PUT", "apiservices")),
        ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", None, ("POST", "subjectaccessreviews")),
    ],
)
def test_a_request_is_named_by_verb_and_resource(
    method: str, path: str, query: list[tuple[str, object]] | None, expected: tuple[str, str]
) -> None:
    assert request_kind(method, HOST + path, query) == expected
