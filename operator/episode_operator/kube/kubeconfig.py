"""Which cluster, context and namespace: kubectl's rules, so ``kubectl episode`` goes where ``kubectl`` goes.

- the kubeconfig: ``--kubeconfig FILE``, else every existing file of ``$KUBECONFIG`` (colon-separated),
  else ``~/.kube/config``; when none exists, inside a pod, the pod's service account;
- the context: ``--context``, else the first ``current-context`` set by those files (kubectl merges
  files first-wins, field by field);
- the namespace: ``-n``, else the context's ``namespace``, else the pod's (in a pod), else ``default``.

A missing kubeconfig or context is a :class:`KubeconfigError` naming what was looked for: a user's
mistake, answered in one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_KUBECONFIG = "~/.kube/config"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "default"


class KubeconfigError(Exception):
    """No usable kubeconfig, context or in-cluster configuration (the client raises it as a KubeError)."""


@dataclass(frozen=True)
class Target:
    """What a command was told to talk to (``--kubeconfig``, ``--context``); None: kubectl's defaults."""

    kubeconfig: str | None = None
    context: str | None = None


@dataclass(frozen=True)
class Location:
    """Where the client connects: kubeconfig files and a context, or (both None) the pod's service account."""

    files: tuple[str, ...]
    context: str | None
    namespace: str | None

    @property
    def in_cluster(self) -> bool:
        return not self.files


def locate(target: Target, environ: Mapping[str, str] | None = None) -> Location:
    """The kubeconfig files, context and namespace kubectl would use for ``target``."""
    environ = os.environ if environ is None else environ
    files, looked = _kubeconfig_files(target.kubeconfig, environ)
    if not files:
        if environ.get("KUBERNETES_SERVICE_HOST") and target.context is None:
            return Location((), None, _in_cluster_namespace())
        raise KubeconfigError("no kubeconfig: " + "; ".join(looked) + "; pass --kubeconfig FILE or set KUBECONFIG")
    documents = [_read(path) for path in files]
    context = target.context or next((d["current-context"] for d in documents if d.get("current-context")), None)
    shown = ", ".join(files)
    if not context:
        raise KubeconfigError(f"{shown}: no current-context; pass --context NAME")
    contexts = _contexts(documents)
    if context not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise KubeconfigError(f"{shown}: no context {context!r} (contexts: {known})")
    namespace = contexts[context].get("namespace")
    return Location(tuple(files), context, namespace if isinstance(namespace, str) and namespace else None)


def current_namespace(target: Target, environ: Mapping[str, str] | None = None) -> str:
    """The namespace a command without ``-n`` works in."""
    return locate(target, environ).namespace or DEFAULT_NAMESPACE


def _kubeconfig_files(explicit: str | None, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(existing kubeconfig files in kubectl's order, what was looked for, for the error message)."""
    if explicit:
        if not Path(explicit).expanduser().is_file():
            raise KubeconfigError(f"--kubeconfig {explicit}: no such file")
        return [str(Path(explicit).expanduser())], []
    listed = [path for path in environ.get("KUBECONFIG", "").split(os.pathsep) if path]
    if listed:
        existing = [str(Path(path).expanduser()) for path in listed if Path(path).expanduser().is_file()]
        return existing, [f"$KUBECONFIG names no existing file ({', '.join(listed)})"]
    default = Path(DEFAULT_KUBECONFIG).expanduser()
    if default.is_file():
        return [str(default)], []
    return [], ["$KUBECONFIG is not set", f"{default} does not exist", "not in a pod (no KUBERNETES_SERVICE_HOST)"]


def _read(path: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise KubeconfigError(f"kubeconfig {path}: {error}") from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (a mapping is expected)")
    return document


def _contexts(documents: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Context name -> its ``context`` mapping; the first file defining a name wins, as in kubectl."""
    found: dict[str, Mapping[str, Any]] = {}
    for document in documents:
        for entry in document.get("contexts") or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                found.setdefault(entry["name"], entry.get("context") or {})
    return found


def _in_cluster_namespace() -> str | None:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or None
    except OSError:
        return None
