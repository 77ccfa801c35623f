"""Packed task folders: a content-addressed ConfigMap holding the folder as a gzipped tar."""

from __future__ import annotations

import base64
import re
from typing import Any

from episode_operator.api.episode_resource import DEFAULT_TASK_ARCHIVE_KEY
from episode_operator.api.vocabulary import TASK_DIGEST_LABEL, TASK_LABEL
from episode_operator.taskfolder import TaskFiles
from episode_operator.taskfolder.sources import pack_tar

# etcd refuses objects above ~1.5 MiB; a ConfigMap's data and binaryData together stay under 1 MiB.
CONFIG_MAP_LIMIT = 1024 * 1024


class TaskTooLarge(ValueError):
    pass


def task_config_map(files: TaskFiles, *, task: str, namespace: str | None) -> dict[str, Any]:
    """The ConfigMap of a task folder, named after its content so re-packing is idempotent; without a
    namespace (a manifest for Git) it goes where it is applied."""
    archive = pack_tar(files)
    if len(archive) * 4 // 3 > CONFIG_MAP_LIMIT:
        raise TaskTooLarge(
            f"the packed task is {len(archive)} bytes; a ConfigMap holds about {CONFIG_MAP_LIMIT * 3 // 4}"
        )
    digest = files.digest().removeprefix("sha256:")
    stem = re.sub(r"[^a-z0-9-]+", "-", task.lower()).strip("-")[:40].strip("-") or "task"
    metadata: dict[str, Any] = {"name": f"task-{stem}-{digest[:12]}", "namespace": namespace}
    if namespace is None:
        del metadata["namespace"]
    metadata["labels"] = {TASK_LABEL: stem, TASK_DIGEST_LABEL: digest[:63]}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "binaryData": {DEFAULT_TASK_ARCHIVE_KEY: base64.b64encode(archive).decode()},
    }
