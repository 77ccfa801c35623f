"""Kubernetes objects, built and read without I/O: pod, NetworkPolicy, Event, ConfigMap and child
Episode manifests, and what a pod's state means.

Pure functions of their inputs, so every manifest is a golden-file or table test. An import
contract (``pyproject.toml``) keeps this package away from the Kubernetes clients and from the
rest of ``kube/``, which does the I/O.
"""
