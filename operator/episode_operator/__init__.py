"""episode-operator: run Harbor task folders as Kubernetes ``Episode`` resources."""

__version__ = "0.1.0"
