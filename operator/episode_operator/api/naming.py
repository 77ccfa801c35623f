"""Content-derived names: the same document always gets the same name, a different one another.

GitOps tools (and ``kubectl apply``) need a ``metadata.name``; ``generateName`` gives a new object
on every apply. Manifests the CLI generates are named ``<stem>-<digest of the spec>`` instead, so
applying them twice is one object, and a changed spec is a new one.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

DIGEST_CHARS = 10
STEM_LIMIT = 40  # stem + '-' + digest stays a DNS-1123 label with room for the pods' suffixes


def document_digest(document: Any) -> str:
    """``sha256:<hex>`` of a JSON document, independent of key order and formatting."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def content_name(stem: str, document: Any, *, fallback: str = "episode") -> str:
    """``<stem>-<10 hex digits of the document's digest>``, a DNS-1123 label (stem sanitized, cut)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:STEM_LIMIT].strip("-") or fallback
    return f"{cleaned}-{document_digest(document).removeprefix('sha256:')[:DIGEST_CHARS]}"
