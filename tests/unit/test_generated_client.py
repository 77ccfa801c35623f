"""The generated Kubernetes client loads its classes on first use, and is otherwise the library's own.

Each check runs in a fresh interpreter: what is imported is the point, and this test process has
long since imported the whole library.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from tests.conftest import REPO

GENERATED = ("kubernetes_asyncio.client.models.", "kubernetes_asyncio.client.api.")


def run(code: str) -> Any:
    """Run ``code`` in a fresh interpreter; what it prints last, as JSON."""
    command = [sys.executable, "-c", textwrap.dedent(code)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_operator_imports_kopf_and_its_handlers_without_the_generated_classes() -> None:
    loaded = run(
        """
        import json, sys
        from episode_operator.cli.operator_main import import_handlers
        import_handlers()
        import episode_operator.kube.client, episode_operator.kube.data_api_registration
        print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
        """
    )
    assert "kopf" in loaded and "kubernetes_asyncio.config" in loaded  # kopf did import the library
    # kopf's own two (kopf/_cogs/helpers/thirdparty.py: it recognises these models in a handler's objects).
    assert [name for name in loaded if name.startswith(GENERATED)] == [
        "kubernetes_asyncio.client.models.v1_object_meta",
        "kubernetes_asyncio.client.models.v1_owner_reference",
    ]
    assert "kubernetes" not in loaded  # the synchronous client, hidden from kopf


def test_a_client_uses_only_the_classes_it_names() -> None:
    loaded = run(
        """
        import asyncio, json, sys
        from episode_operator.kube.client import KubeClient
        from kubernetes_asyncio.client import ApiClient, Configuration

        async def main():
            configuration = Configuration(host="https://198.18.255.1:6443")
            api = ApiClient(configuration)
            KubeClient(api, api)  # its API classes
            await api.close()

        asyncio.run(main())
        generated = ("kubernetes_asyncio.client.models.", "kubernetes_asyncio.client.api.")
        print(json.dumps(sorted(name for name in sys.modules if name.startswith(generated))))
        """
    )
    assert loaded == ["kubernetes_asyncio.client.api.core_v1_api", "kubernetes_asyncio.client.api.custom_objects_api"]


def test_every_name_of_the_generated_packages_is_the_librarys_own() -> None:
    """Each name the library's client, api and models packages offer resolves, lazily, to the same class."""
    listing = """
        import json, importlib
        import kubernetes_asyncio.client as client
        packages = ("kubernetes_asyncio.client", "kubernetes_asyncio.client.api", "kubernetes_asyncio.client.models")
        print(json.dumps({
            package: {name: getattr(importlib.import_module(package), name).__module__ for name in
                      importlib.import_module(package).__all__}
            for package in packages
        }))
        """
    eager = run(listing)
    lazy = run("import episode_operator.kube\n" + textwrap.dedent(listing))
    assert lazy == eager
    assert len(eager["kubernetes_asyncio.client.models"]) > 500  # the whole OpenAPI document, not a table of ours


def test_a_response_deserializes_into_the_librarys_models() -> None:
    pod = run(
        """
        import asyncio, json
        import episode_operator.kube
        from kubernetes_asyncio.client import ApiClient, V1Pod

        class Response:
            data = json.dumps({
                "metadata": {"name": "p", "creationTimestamp": "2026-12-02T10:00:00Z"},
                "spec": {"containers": [{"name": "main", "image": "debian"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            })

        async def main():
            api = ApiClient()
            try:
                pod = api.deserialize(Response(), "V1Pod")
            finally:
                await api.close()
            assert isinstance(pod, V1Pod)
            return [pod.metadata.name, pod.metadata.creation_timestamp.isoformat(), pod.spec.containers[0].image,
                    pod.status.conditions[0].type, type(pod.status.conditions[0]).__name__]

        print(json.dumps(asyncio.run(main())))
        """
    )
    assert pod == ["p", "2026-12-02T10:00:00+00:00", "debian", "Ready", "V1PodCondition"]


def test_an_already_imported_library_is_left_as_it_is() -> None:
    installed = run(
        """
        import json
        import kubernetes_asyncio
        from episode_operator.kube.generated import install
        print(json.dumps([install(), type(kubernetes_asyncio.client).__name__]))
        """
    )
    assert installed == [False, "module"]
