"""The kube layer: the only one that talks to Kubernetes."""

from episode_operator.kube.generated import install

# Before any module of this layer imports kubernetes_asyncio: its generated classes load on first use.
install()
