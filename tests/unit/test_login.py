"""``episode-operator run --kubeconfig``: kopf logs in with that kubeconfig, as our own client does.

kopf's own logins read only ``$KUBECONFIG`` (or ~/.kube/config): without the operator's login
handler its watches went to another cluster than its client, or to none.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import kopf
import pytest
import yaml

# kopf's authentication activity, as the operator runs it before any watch: the test goes
# through kopf's own choice of login handlers (ours, or its fallbacks), not around it.
from kopf._cogs.structs.credentials import ConnectionInfo, Vault
from kopf._core.engines.activities import authenticate
from kopf._core.engines.indexing import OperatorIndexers

from episode_operator.handlers import OperatorOptions


def kubeconfig(path: Path, server: str, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def kopf_login(options: OperatorOptions) -> list[ConnectionInfo]:
    async def scenario() -> list[ConnectionInfo]:
        vault = Vault()
        await authenticate(
            registry=kopf.get_default_registry(),
            settings=kopf.OperatorSettings(),
            indices=OperatorIndexers().indices,
            vault=vault,
            memo=kopf.Memo(options=options),
        )
        return [info async for _, info in vault if isinstance(info, ConnectionInfo)]

    return asyncio.run(scenario())


def test_kopf_logs_in_with_the_given_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = kubeconfig(tmp_path / "given", "https://198.18.0.10:6443", "given-token")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "ambient", "https://198.18.0.99:6443", "other")))
    monkeypatch.setenv("HOME", str(tmp_path))
    [info] = kopf_login(OperatorOptions(kubeconfig=str(given)))
    assert (info.server, info.scheme, info.token, info.insecure) == (
        "https://198.18.0.10:6443",
        "Bearer",
        "given-token",
        True,
    )


def test_without_a_kubeconfig_kopf_logs_in_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "ambient", "https://198.18.0.99:6443", "ambient")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    [info] = kopf_login(OperatorOptions())
    assert (info.server, info.token) == ("https://198.18.0.99:6443", "ambient")
