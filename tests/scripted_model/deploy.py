"""Deploy the scripted model server into a test namespace: a ConfigMap, a pod and a Service.

The server's code and script travel in a ConfigMap and run on the sandbox image's python3, so
the test cluster needs no image of its own for it. Tests reach the server through the API
server's pod proxy (as they would on any cluster, kind included); pods reach it through its
Service's cluster IP (the project's cluster runs no DNS, and sandboxes must not need one).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

SERVER_SOURCE = Path(__file__).resolve().parent / "server.py"
PORT = 8080
READY_TIMEOUT = 120


class ScriptedModel:
    """A running scripted model server in a namespace, as tests drive it."""

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str, cluster_ip: str) -> None:
        self.core = core
        self.namespace = namespace
        self.name = name
        self.cluster_ip = cluster_ip

    @property
    def base_url(self) -> str:
        """The server's root as a pod reaches it (harnesses append /v1/... or take it as given)."""
        return f"http://{self.cluster_ip}:{PORT}"

    def _proxy(self, method: str, path: str, body: Any = None) -> Any:
        """Call the server's control endpoint through the API server's pod proxy."""
        api = self.core.api_client
        serialized = api.param_serialize(
            method=method,
            resource_path=f"/api/v1/namespaces/{self.namespace}/pods/{self.name}:{PORT}/proxy/{path}",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = api.call_api(*serialized, _request_timeout=30)
        response.read()
        if response.status >= 400:
            raise ValueError(f"{method} {path}: {response.status} {response.data[:300]!r}")
        return json.loads(response.data)

    def requests(self) -> list[dict[str, Any]]:
        """Every model request the server received, in order (see server.py for the fields)."""
        result: list[dict[str, Any]] = self._proxy("GET", "_scripted/requests")
        return result

    def model_requests(self) -> list[dict[str, Any]]:
        """The requests that reached a model endpoint (not a models listing)."""
        return [record for record in self.requests() if record.get("dialect")]

    def clear(self) -> None:
        self._proxy("DELETE", "_scripted/requests")

    def set_script(self, script: dict[str, Any]) -> None:
        """Replace the script (and reset its counters)."""
        self._proxy("PUT", "_scripted/script", script)


def deploy_scripted_model(
    core: client.CoreV1Api, namespace: str, script: dict[str, Any], image: str, name: str = "scripted-model"
) -> ScriptedModel:
    """Create the server's ConfigMap, pod and Service in `namespace` and wait until it answers."""
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name),
            data={"server.py": SERVER_SOURCE.read_text(), "script.json": json.dumps(script)},
        ),
    )
    labels = {"app.kubernetes.io/name": name}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "server",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-u", "/scripted/server.py", "--script", "/scripted/script.json"],
                    "args": ["--port", str(PORT)],
                    "ports": [{"containerPort": PORT}],
                    "volumeMounts": [{"name": "code", "mountPath": "/scripted", "readOnly": True}],
                    "readinessProbe": {
                        "httpGet": {"path": "/_scripted/health", "port": PORT},
                        "periodSeconds": 1,
                    },
                }
            ],
            "volumes": [{"name": "code", "configMap": {"name": name}}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    service = core.create_namespaced_service(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": labels, "ports": [{"port": PORT, "targetPort": PORT}]},
        },
    )
    model = ScriptedModel(core, namespace, name, service.spec.cluster_ip)
    wait_until_answering(model)
    return model


def wait_until_answering(model: ScriptedModel, timeout: float = READY_TIMEOUT) -> None:
    """Wait for the pod to be Ready and its control endpoint to answer through the proxy."""
    deadline = time.monotonic() + timeout
    last = "not started"
    while time.monotonic() < deadline:
        pod = model.core.read_namespaced_pod(model.name, model.namespace)
        if pod.status.phase in ("Failed", "Succeeded"):
            log = model.core.read_namespaced_pod_log(model.name, model.namespace, tail_lines=20)
            raise RuntimeError(f"scripted model pod {pod.status.phase}:\n{log}")
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if ready:
            try:
                model.requests()
                return
            except (ApiException, ValueError) as error:
                last = str(error)
        time.sleep(0.3)
    raise TimeoutError(f"scripted model {model.namespace}/{model.name} not answering after {timeout} s: {last}")
