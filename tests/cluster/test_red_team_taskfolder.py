"""Red team, on the real cluster: a task folder built to take the operator down (issue 23).

A ConfigMap is at most about a megabyte, but a tar of links can stand for far more: one file of
zeros and a few hundred links to it once expanded to hundreds of GiB inside the operator, and a
chain of symbolic links was followed as deep as it went. Each is packed as ``kubectl episode pack``
packs a folder (a gzipped tar under ``binaryData``), beside an honest control packed the same way:
the hostile ones are refused at load naming the file, the control runs to its reward, and the
operator that read them all drives on.
"""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Iterable

from kubernetes import client

from episode_operator.api.episode_resource import DEFAULT_TASK_ARCHIVE_KEY
from episode_operator.taskfolder.sources import MAX_SYMLINK_HOPS, SourceLimits
from tests.cluster.harness import OperatorProcess, create_episode, wait_for_episode

MiB = 1024 * 1024
TASK_TOML = b"""\
schema_version = "1.4"
[task]
name = "red-team/task-folder"
[agent]
timeout_sec = 60.0
[verifier]
timeout_sec = 60.0
[environment]
docker_image = "episode-operator.local/sandbox:bookworm"
workdir = "/app"
"""
HONEST = {
    "task.toml": TASK_TOML,
    "instruction.md": b"Write 42 into /app/answer.txt.\n",
    "tests/test.sh": b'if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi >/logs/verifier/reward.txt\n',
    "solution/solve.sh": b"echo 42 > /app/answer.txt\n",
}
# Enough links to one MiB to pass the operator's byte bound in all, however they are counted.
BOMB_LINKS = SourceLimits().max_total_bytes // MiB + 8
# A chain of ten links: the operator follows eight (MAX_SYMLINK_HOPS), so its first two are refused.
CHAIN = 10


def packed(files: dict[str, bytes], links: Iterable[tuple[str, bytes, str]] = ()) -> bytes:
    """A gzipped tar as ``kubectl episode pack`` makes one, with ``(name, kind, target)`` links added."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            archive.addfile(info, io.BytesIO(data))
        for name, kind, target in links:
            link = tarfile.TarInfo(name)
            link.type, link.linkname = kind, target
            archive.addfile(link)
    return buffer.getvalue()


def bomb() -> bytes:
    """One MiB of zeros and enough hard links to it to pass the byte bound: a few KiB packed."""
    links = [(f"environment/copy{number:04d}", tarfile.LNKTYPE, "environment/big.bin") for number in range(BOMB_LINKS)]
    return packed({**HONEST, "environment/big.bin": bytes(MiB)}, links)


def chain() -> bytes:
    """``environment/a0`` → ``a1`` → … → ``task.toml``: longer than any folder needs."""
    links = [
        (f"environment/a{number}", tarfile.SYMTYPE, f"a{number + 1}" if number + 1 < CHAIN else "../task.toml")
        for number in range(CHAIN)
    ]
    return packed(HONEST, links)


def test_a_task_folder_of_links_is_refused_naming_the_file_and_the_honest_one_runs(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, operator: OperatorProcess
) -> None:
    archives = {"bomb": bomb(), "chain": chain(), "honest": packed(HONEST)}
    assert all(len(archive) < 256 * 1024 for archive in archives.values())  # each fits a ConfigMap
    for name, archive in archives.items():
        data = {DEFAULT_TASK_ARCHIVE_KEY: base64.b64encode(archive).decode()}
        core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"task-{name}"), binary_data=data)
        )
        spec = {"task": {"configMap": {"name": f"task-{name}"}}, "agent": {"kind": "oracle"}}
        create_episode(api_client, namespace, name, spec)
    ended = {name: wait_for_episode(api_client, namespace, name, operator, timeout=300) for name in archives}

    honest = ended["honest"]
    assert (honest["phase"], honest["outcome"], honest["reward"]) == ("Succeeded", "Graded", 1.0), honest
    for name in ("bomb", "chain"):
        status = ended[name]
        assert (status["phase"], status["failureKind"]) == ("Failed", "harbor:invalid_task"), status
        assert not status.get("attempts"), status  # refused at load: no pod was made for it
    # The first link past the byte bound is named: the one whose copy would pass it, counted as the
    # MiB it becomes (the links resolve in name order, after the task's own files and big.bin).
    bound = SourceLimits().max_total_bytes
    before = sum(len(data) for data in HONEST.values()) + MiB
    first = next(number for number in range(BOMB_LINKS) if before + (number + 1) * MiB > bound)
    assert f"environment/copy{first:04d}: task folder exceeds {bound} bytes in all" in ended["bomb"]["message"], ended[
        "bomb"
    ]["message"]
    refused_links = [
        f"environment/a{number}: a loop, or a chain of more than {MAX_SYMLINK_HOPS} symlinks" for number in range(2)
    ]
    assert all(line in ended["chain"]["message"] for line in refused_links), ended["chain"]["message"]
    assert operator.process is not None and operator.process.poll() is None, operator.log_tail()
