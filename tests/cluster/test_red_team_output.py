"""Red team: an agent that owns its pod cannot forge its reward or take the operator down (issue 23).

A ``command`` agent runs as root in its pod: it can replace the supervisor the operator placed
there (``/episode-operator/supervisor.sh``) and end the sessions that run the old one, so that every
later call is answered by its own script. Two attacks, each beside an honest control on the same task:

- a forged reward: its ``download`` answers (and the download its final ``wait`` brings) are a tar
  crafted to plant ``/logs/verifier/reward.txt`` = 1, the verifier's job record (so that ``test.sh``
  would never start) and a ``bash`` that writes 1, at ``/`` of the separate verifier's pod. The
  verifier's ``test.sh`` always writes 0: a 1 could only be forged. The operator re-packs what it got:
  only the artifact's own regular files reach the verifier, the manifest says what was refused;
- an artifact of 2 GiB that costs the agent nothing (a sparse file): the turn ends
  ``agent:output_limit``, and the operator stays up and drives the next Episode.
"""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from kubernetes import client

from tests.cluster.harness import OperatorProcess, create_episode, episode_spec, wait_for_episode

SANDBOX = "episode-operator.local/sandbox:bookworm"
TASK_TOML = f"""\
schema_version = "1.4"

[task]
name = "episode-operator/red-team-output"

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 60.0
environment_mode = "separate"

[environment]
docker_image = "{SANDBOX}"
workdir = "/app"
# No cpus: no CPU request (the node has 2, and other tests run beside these).
memory_mb = 256
"""
# The separate verifier: says what reached it, and always scores 0.
TEST_SH = """\
#!/bin/bash
echo "artifacts: $(cd / && find logs/artifacts -type f | sort | tr '\\n' ' ')"
echo "jobs: $(ls /episode-operator/jobs | tr '\\n' ' ')"
echo "bash: $(head -c 2 /usr/bin/bash | od -An -c | tr -d ' ')"
echo 0 > /logs/verifier/reward.txt
"""
HONEST = "mkdir -p /logs/artifacts && echo 42 > /logs/artifacts/answer.txt"

# What a root agent can do to the pod's supervisor: its own script answers every call made after it.
FORGER = textwrap.dedent(
    r"""
    set -e
    mkdir -p /logs/artifacts && echo 41 > /logs/artifacts/answer.txt
    cp /episode-operator/supervisor.sh /episode-operator/real.sh
    python3 - <<'PY'
    import io, tarfile
    def add(tar, name, data=b"", kind=tarfile.REGTYPE, mode=0o644, link=""):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.linkname, info.mtime = kind, mode, link, 0
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if data else None)
    with tarfile.open("/tmp/crafted.tar", "w") as tar:
        add(tar, "logs/artifacts/answer.txt", b"41\n")
        add(tar, "logs/verifier/reward.txt", b"1")
        add(tar, "/logs/verifier/reward.json", b'{"reward": 1}')
        job = "episode-operator/jobs/a1.t1.verify/"
        for name, data in (("exit", b"0"), ("started_at", b"1"), ("finished_at", b"9999999999"),
                           ("output_path", b"/logs/verifier/test-stdout.txt")):
            add(tar, job + name, data)
        add(tar, "usr/bin/bash", b"#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", mode=0o4755)
        add(tar, "logs/artifacts/../../usr/bin/bash", b"#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", mode=0o755)
        add(tar, "logs/artifacts/verifier", kind=tarfile.SYMTYPE, link="/logs/verifier")
        add(tar, "logs/artifacts/verifier/reward.txt", b"1")
    PY
    cat > /tmp/forger.py <<'PY'
    import os, subprocess, sys
    args, crafted = sys.argv[1:], open("/tmp/crafted.tar", "rb").read()
    if args[:1] == ["download"]:
        sys.stdout.buffer.write(crafted)
        sys.exit(0)
    if "--then-download" in args:
        honest, index = [], 0
        while index < len(args):
            if args[index] == "--":
                honest += args[index:]
                break
            if args[index] in ("--then-download", "--then-exclude"):
                index += 2
                continue
            honest.append(args[index])
            index += 1
        done = subprocess.run(["sh", "/episode-operator/real.sh", *honest], capture_output=True)
        sys.stdout.buffer.write(done.stdout)
        state = done.stdout.split(b"\n", 1)[0]
        if b"phase=exited" in state or b"phase=unstartable" in state:
            sys.stdout.buffer.write(b"download %d\n" % len(crafted) + crafted)
        sys.stderr.buffer.write(done.stderr)
        sys.exit(done.returncode)
    os.execvp("sh", ["sh", "/episode-operator/real.sh", *args])
    PY
    printf '#!/bin/sh\ncase $1 in serve) exit 1 ;; esac\nexec python3 /tmp/forger.py "$@"\n' > /episode-operator/new.sh
    mv /episode-operator/new.sh /episode-operator/supervisor.sh
    # The sessions still run the placed script: end them, every later call comes through ours.
    for proc in /proc/[0-9]*; do
        case "$(tr '\0' ' ' < "$proc/cmdline" 2>/dev/null)" in
            "sh /episode-operator/supervisor.sh serve"*) kill -9 "${proc#/proc/}" 2>/dev/null || true ;;
        esac
    done
    echo "the supervisor is mine"
    """
)


def task(agent_writes: str | None = None) -> dict[str, str]:
    return {
        "task.toml": TASK_TOML,
        "instruction.md": "Write the answer to /logs/artifacts/answer.txt.\n",
        "tests/test.sh": TEST_SH,
        "solution/solve.sh": f"#!/bin/bash\n{agent_writes or HONEST}\n",
    }


def kept(operator: OperatorProcess, namespace: str, name: str, relative: str) -> str:
    """A file the operator kept for an Episode's attempt 1 (``<data>/<ns>/<name>/<uid>/attempt-1/…``)."""
    (path,) = (operator.data_dir / namespace / name).glob(f"*/attempt-1/{relative}")
    return path.read_text()


def start_all(api: client.ApiClient, namespace: str, specs: dict[str, dict[str, Any]]) -> None:
    for name, spec in specs.items():
        create_episode(api, namespace, name, spec)


def test_an_agent_owning_its_pods_supervisor_cannot_forge_a_separate_verifiers_reward(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    start_all(
        api_client,
        namespace,
        {
            "forger": episode_spec(files=task(), agent={"kind": "command", "command": FORGER}),
            "honest": episode_spec(files=task()),  # the oracle: the answer the task wants
        },
    )
    forged = wait_for_episode(api_client, namespace, "forger", operator, timeout=300)
    honest = wait_for_episode(api_client, namespace, "honest", operator, timeout=300)

    assert "the supervisor is mine" in kept(operator, namespace, "forger", "task/logs/agent.txt"), forged
    for status in (forged, honest):
        assert (status["phase"], status["outcome"], status["reward"]) == ("Succeeded", "Graded", 0.0), status
    # What reached the verifier: the artifact's own file, the verifier's own job only, its own bash.
    received = {
        # A file "under" the refused link is what it says it is: a file inside the artifact.
        "forger": "logs/artifacts/answer.txt logs/artifacts/verifier/reward.txt",
        "honest": "logs/artifacts/answer.txt",
    }
    for name, files in received.items():
        log = kept(operator, namespace, name, "task/logs/verifier.txt")
        assert f"artifacts: {files} \n" in log, log
        # One job in the verifier's folder, its own: test.sh's (its id keyed per attempt: a1.t1.verify.<key>).
        assert re.search(r"^jobs: a1\.t1\.verify\.[0-9a-f]{16} $", log, re.M) and "bash: 177E" in log, log
    (entry,) = json.loads(kept(operator, namespace, "forger", "task/artifacts/manifest.json"))
    refused = {item["name"]: item["reason"] for item in entry["refused"]}
    assert entry["status"] == "ok" and refused.keys() == {
        "logs/verifier/reward.txt",
        "/logs/verifier/reward.json",
        "episode-operator/jobs/a1.t1.verify/exit",
        "episode-operator/jobs/a1.t1.verify/started_at",
        "episode-operator/jobs/a1.t1.verify/finished_at",
        "episode-operator/jobs/a1.t1.verify/output_path",
        "usr/bin/bash",
        "logs/artifacts/../../usr/bin/bash",
        "logs/artifacts/verifier",
    }, refused
    assert refused["usr/bin/bash"] == "outside the artifact's source /logs/artifacts"
    assert "refused" not in json.loads(kept(operator, namespace, "honest", "task/artifacts/manifest.json"))[0]


def test_a_sparse_artifact_of_2_gib_ends_the_turn_and_the_operator_drives_on(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    sparse = "mkdir -p /logs/artifacts && truncate -s 2G /logs/artifacts/hole && echo 42 > /logs/artifacts/answer.txt"
    start_all(
        api_client, namespace, {"sparse": episode_spec(files=task(), agent={"kind": "command", "command": sparse})}
    )
    status = wait_for_episode(api_client, namespace, "sparse", operator, timeout=300)
    (turn,) = status["turns"]
    assert (status["outcome"], status["failureKind"], turn["failureKind"]) == (
        "Graded",
        "agent:output_limit",
        "agent:output_limit",
    ), status
    passed = (
        r"the files of artifact /logs/artifacts \(\d+ bytes\) passed the artifact bound \(--artifact-limit 1073741824\)"
    )
    assert re.search(passed, turn["message"]), turn["message"]
    assert operator.process is not None and operator.process.poll() is None, operator.log_tail()
    # Still driving: an honest Episode after it is scored.
    start_all(api_client, namespace, {"after": episode_spec(files=task())})
    after = wait_for_episode(api_client, namespace, "after", operator, timeout=300)
    assert (after["outcome"], after["reward"]) == ("Graded", 0.0) and "failureKind" not in after["turns"][0]
