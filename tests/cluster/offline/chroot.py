"""Running a toolchain image's own root in a network namespace: helpers of the offline tests.

The root is the toolchain image's single layer (a static busybox and the tree), unpacked once from the
docker-archive `hack/cluster images` cached and shared read-only by every test, under an overlay of each test's
own that gives it its own few device nodes (unpacked for each of the forty tests, it was three quarters of a
worker's CPU in a minute of a CI run that py-spy sampled); the harness runs
chrooted into it, as an unprivileged user, in a network namespace with only loopback (where the
scripted model server listens), under strace so that every network peer it tries is on record.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from tests.cluster.toolchains import Harness

REPO = Path(__file__).resolve().parents[3]
SERVER = REPO / "tests" / "scripted_model" / "server.py"
MODEL = "scripted-m1"
PORT = 18080
INSTRUCTION = "Offline toolchain check: write the marker file."
AGENT_UID = 1000  # no entry in the image's /etc/passwd: harnesses must not need one
HOME = "/home/agent"
MARKER = f"{HOME}/marker.txt"
# A network syscall's peer, as strace prints it.
PEER = re.compile(
    r'sin6?_port=htons\((\d+)\), (?:sin_addr=inet_addr\("([^"]+)"\)|sin6_addr=inet_pton\(AF_INET6, "([^"]+)"\))'
)


def load_hack_cluster() -> ModuleType:
    """hack/cluster as a module (it is a script): its ImageSpecs know where each image is cached."""
    loader = importlib.machinery.SourceFileLoader("hack_cluster", str(REPO / "hack" / "cluster"))
    spec = importlib.util.spec_from_loader("hack_cluster", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hack_cluster"] = module  # its dataclasses look their module up while being defined
    loader.exec_module(module)
    return module


def unpack_image(archive: Path, rootfs: Path) -> None:
    """The image's root filesystem: the single layer of our docker-archive, unpacked by GNU tar (owners by
    number, modes as they are), which takes well under half the CPU Python's tarfile does on these trees of tens
    of thousands of files."""
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
    [layer_name] = manifest[0]["Layers"]
    rootfs.mkdir(parents=True)
    reader = subprocess.Popen(["tar", "-xOf", str(archive), layer_name], stdout=subprocess.PIPE)
    try:
        subprocess.run(
            ["tar", "-x", "--numeric-owner", "--same-permissions", "--same-owner", "-C", str(rootfs)],
            stdin=reader.stdout,
            check=True,
        )
    finally:
        assert reader.stdout is not None
        reader.stdout.close()
        assert reader.wait() == 0, f"tar could not read {layer_name} from {archive}"


def shared_root(archive: Path, roots: Path) -> Path:
    """The image's root, unpacked once for every test and worker into ``roots`` (beside the image cache, keyed by
    the archive's name, which holds its content's digest) and never written to again: each test mounts it as the
    lower layer of an overlay of its own (:func:`prepared_root`). A root whose archive is gone from the cache (an
    older version) is removed when another is made."""
    root = roots / archive.name.removesuffix(".tar")
    roots.mkdir(parents=True, exist_ok=True)
    with (roots / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the workers unpack one image once, not once each
        if not root.is_dir():
            partial = roots / f".partial-{root.name}-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            unpack_image(archive, partial)
            partial.rename(root)
            for other in roots.iterdir():
                if not other.name.startswith(".") and not (archive.parent / f"{other.name}.tar").exists():
                    shutil.rmtree(other, ignore_errors=True)
    return root


def run_chrooted(netns: str, rootfs: Path, harness: Harness, trace: Path) -> subprocess.CompletedProcess[str]:
    """The harness's command in the chroot, in the namespace, under strace; proc and dev mounted privately."""
    base_url = f"http://127.0.0.1:{PORT}"
    env = {"PATH": "/bin", "HOME": HOME, **harness.environment(MODEL, base_url)}
    command = [
        "/bin/busybox",  # the image's only tools: busybox applets, `env` among them but not linked
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        *harness.command(INSTRUCTION, MODEL, base_url, False),
    ]
    # Only /proc and /dev/pts are mounted, in a private mount namespace that ends with the run. /dev is the
    # root's own few device nodes (prepared_root), never a bind of the host's: a root holding
    # a bind of the host's /dev would let a later `rm -rf` of the root delete the host's nodes.
    # A terminal harness (terminus-2's tmux) opens pseudo-terminals: devpts, an instance of its own.
    devpts = 'mount -t devpts -o newinstance,ptmxmode=0666 devpts "$0/dev/pts"'
    inner = f'mount -t proc proc "$0/proc" && {devpts} && exec "$@"'
    trace_argv = ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=connect,sendto,sendmsg,sendmmsg"]
    argv = [
        "ip",
        "netns",
        "exec",
        netns,
        "unshare",
        "--mount",
        "--propagation=private",
        "--fork",
        "sh",
        "-c",
        inner,
        str(rootfs),
        *trace_argv,
        # The harness is the first process of a pid namespace: when it ends, whatever it left running
        # ends too (terminus-2's tmux server outlives it by design), and strace, which follows them all,
        # returns with it.
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "chroot",
        f"--userspec={AGENT_UID}:{AGENT_UID}",
        str(rootfs),
        *command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)


# The device nodes a harness needs: (name, major, minor), all 0666 as the kernel makes them.
DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))


@contextlib.contextmanager
def prepared_root(archive: Path, tmp_path: Path) -> Iterator[Path]:
    """The toolchain image's root, with its own /dev, a home and /logs/agent for the agent user: an overlay whose
    lower layer is the image's shared root (:func:`shared_root`, read-only) and whose upper layer is this test's,
    so what the test and its harness write stays in ``tmp_path``. Unmounted when the test is done."""
    lower = shared_root(archive, image_roots(archive))
    upper, work, rootfs = tmp_path / "upper", tmp_path / "work", tmp_path / "rootfs"
    for directory in (upper, work, rootfs):
        directory.mkdir()
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(rootfs)], check=True)
    try:
        assert not list(rootfs.glob("lib*")) and not (rootfs / "usr").exists(), "the image must hold no libc of its own"
        for name, major, minor in DEVICES:
            os.mknod(rootfs / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(rootfs / "dev" / name, 0o666)
        (rootfs / "dev" / "fd").symlink_to("/proc/self/fd")
        (rootfs / "dev" / "pts").mkdir()
        (rootfs / "dev" / "ptmx").symlink_to("pts/ptmx")
        (rootfs / "dev" / "shm").mkdir(mode=0o1777)
        (rootfs / "dev" / "shm").chmod(0o1777)
        for directory in (HOME, "/logs/agent"):
            (rootfs / directory.lstrip("/")).mkdir(parents=True)
            os.chown(rootfs / directory.lstrip("/"), AGENT_UID, AGENT_UID)
        yield rootfs
    finally:
        subprocess.run(["umount", str(rootfs)], check=True)


def image_roots(archive: Path) -> Path:
    """Where the images' shared roots are kept: beside hack/cluster's image cache (``<cache>/images``)."""
    return archive.parent.parent / "toolchain-roots"


def give_image_programs(rootfs: Path, programs: tuple[str, ...]) -> None:
    """Put in the root the programs a harness runs from the task image by their path (its registry entry's
    ``image_needs``): this machine's, with the shared libraries they load, at the same paths -- as every task
    image such a harness can run on has them. The harness itself still runs from its tree alone."""
    for program in programs:
        host = Path(program)
        listing = subprocess.run(["ldd", str(host)], capture_output=True, text=True, check=True).stdout
        libraries = [Path(word) for line in listing.splitlines() for word in line.split() if word.startswith("/")]
        for source in (host, *libraries):
            target = rootfs / str(source).lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(source.resolve(), target)


def foreign_peers(trace: Path) -> list[str]:
    """Every network peer in the trace other than the model server (DNS included)."""
    foreign = []
    for line in trace.read_text().splitlines():
        for port, ipv4, ipv6 in PEER.findall(line):
            if (ipv4 or ipv6, int(port)) != ("127.0.0.1", PORT):
                foreign.append(line.strip())
    return foreign
