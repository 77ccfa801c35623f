"""Toolchains without Kubernetes: each image's own root, chrooted in a network namespace with only the model."""
