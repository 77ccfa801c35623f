"""The cluster options every ``kubectl episode`` command shares, read as kubectl reads them.

``--kubeconfig``, ``--context`` and ``-n/--namespace`` become one :class:`Cluster`: the namespace
defaults to the kubeconfig context's (not ``default``), and every failure to reach the API server —
no kubeconfig, an unknown context, an API error — is one line on stderr and exit code 1.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import click

from episode_operator.kube.client import KubeClient, KubeError
from episode_operator.kube.kubeconfig import KubeconfigError, Target, current_namespace

T = TypeVar("T")


@dataclass(frozen=True)
class Cluster:
    """Where a command works: kubectl's ``--kubeconfig``, ``--context`` and ``-n``."""

    target: Target
    namespace_flag: str | None = None

    @functools.cached_property
    def namespace(self) -> str:
        """``-n``, else the kubeconfig context's namespace, else the pod's, else ``default``."""
        if self.namespace_flag:
            return self.namespace_flag
        try:
            return current_namespace(self.target)
        except KubeconfigError as error:
            raise click.ClickException(str(error)) from error

    def run(self, action: Callable[[KubeClient], Awaitable[T]]) -> T:
        """Run ``action`` with a connected client; API and configuration errors become one line and exit 1."""

        async def main() -> T:
            client = await KubeClient.connect(self.target.kubeconfig, context=self.target.context)
            try:
                return await action(client)
            finally:
                await client.close()

        try:
            return asyncio.run(main())
        except KubeError as error:
            raise click.ClickException(str(error)) from error
        except aiohttp.ClientError as error:  # refused, reset, a name that does not resolve, a bad certificate
            raise click.ClickException(f"cannot reach the API server: {error}") from error


def cluster_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``-n``, ``--kubeconfig`` and ``--context``; the command receives them as ``cluster``."""

    @functools.wraps(command)
    def with_cluster(
        *args: Any, namespace: str | None, kubeconfig: str | None, context: str | None, **kwargs: Any
    ) -> Any:
        return command(*args, cluster=Cluster(Target(kubeconfig, context), namespace), **kwargs)

    with_cluster = click.option(
        "-n", "--namespace", default=None, help="Namespace (default: the kubeconfig context's namespace)."
    )(with_cluster)
    with_cluster = click.option(
        "--kubeconfig", default=None, help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."
    )(with_cluster)
    return click.option("--context", default=None, help="Kubeconfig context (default: its current-context).")(
        with_cluster
    )
