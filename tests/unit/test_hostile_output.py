"""The runner against an agent's pod that sends back too much, or crafted bytes (issue 23).

A root agent can replace its pod's supervisor and tar: an answer may pass every bound, a download
may be a tar made to plant files in a separate verifier's pod. Past a bound the turn fails
(``agent:output_limit``, a measured 0, its verifier not run); a crafted tar brings its verifier
only the regular files and directories of the artifact's source, and the manifest says what was
refused and why. The in-memory sandbox holds its answers to the same bounds the transport does.
"""

from __future__ import annotations

import io
import tarfile

from episode_operator.api.vocabulary import FAILURE_OUTPUT_LIMIT
from episode_operator.runtime.limits import OutputLimits
from tests.unit.episodes import run
from tests.unit.fake_sandbox import World
from tests.unit.folders import single_step

SMALL = OutputLimits(answer_bytes=64 * 1024, log_bytes=16 * 1024, artifact_bytes=256 * 1024, artifact_members=50)
SEPARATE = '[verifier]\nenvironment_mode = "separate"\n'
# test.sh of a task whose separate verifier always scores 0, unless the agent's answer reached it.
ZERO = "check /logs/artifacts/answer.txt 42"


def crafted_tar() -> bytes:
    """What a replaced supervisor answers a download of /logs/artifacts with: an honest-looking
    answer, and what would, unpacked at / of the verifier's pod as root, grade the agent 1."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, 0o6755
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            archive.addfile(info, io.BytesIO(data) if data else None)

        add("logs/artifacts/answer.txt", b"41")
        add("logs/verifier/reward.txt", b"1")
        add("/logs/verifier/reward.txt", b"1")
        add("logs/artifacts/../verifier/reward.txt", b"1")
        add("episode-operator/jobs/a1.t1.verify/exit", b"0")
        add("logs/artifacts/reward", kind=tarfile.SYMTYPE, link="/logs/verifier/reward.txt")
        add("logs/artifacts/tests", kind=tarfile.LNKTYPE, link="tests/test.sh")
        add("logs/artifacts/null", kind=tarfile.CHRTYPE)
    return buffer.getvalue()


def test_a_crafted_artifact_reaches_the_verifier_only_as_its_clean_members() -> None:
    folder = single_step(SEPARATE, {"tests/test.sh": ZERO, "solution/solve.sh": "write /logs/artifacts/answer.txt 41"})
    world = World(crafted={"/logs/artifacts": crafted_tar()})
    status, world, _, store = run(folder, world=world)
    verifier = world.sandboxes["pod-a1-v1"].files["main"]
    assert sorted(path for path in verifier if not path.startswith("/tests/")) == [
        "/logs/artifacts/answer.txt",
        "/logs/verifier/reward.txt",  # test.sh's own: 0
        "/logs/verifier/test-stdout.txt",
    ]
    assert verifier["/logs/verifier/reward.txt"] == b"0"
    assert (status.phase, status.outcome, status.reward) == ("Succeeded", "Graded", 0.0)
    (entry,) = store.manifests[(1, "task")]
    assert entry["status"] == "ok"
    assert [refused["name"] for refused in entry["refused"]] == [
        "logs/verifier/reward.txt",
        "/logs/verifier/reward.txt",
        "logs/artifacts/../verifier/reward.txt",
        "episode-operator/jobs/a1.t1.verify/exit",
        "logs/artifacts/reward",
        "logs/artifacts/tests",
        "logs/artifacts/null",
    ]
    # Kept as re-packed: what the store and `kubectl episode artifacts` get is the clean tar too.
    with tarfile.open(fileobj=io.BytesIO(store.artifacts[(1, "task")][0])) as kept:
        assert [(member.name, member.mode) for member in kept] == [("logs/artifacts/answer.txt", 0o755)]


def test_an_honest_agent_beside_it_scores_what_the_task_gives() -> None:
    folder = single_step(SEPARATE, {"tests/test.sh": ZERO, "solution/solve.sh": "write /logs/artifacts/answer.txt 42"})
    status, _, _, store = run(folder)
    assert (status.outcome, status.reward) == ("Graded", 1.0)
    assert "refused" not in store.manifests[(1, "task")][0]


def test_an_endless_answer_about_the_agents_job_fails_the_turn_with_its_bound_named() -> None:
    world = World(limits=SMALL, padded={".agent": 10 * SMALL.answer_bytes})
    status, world, _, _ = run(single_step("", {"tests/test.sh": "reward 1"}), world=world)
    turn = status.turns[0]
    # A measured 0, as every failure of the agent's own doing is (the episode is graded).
    assert (status.phase, status.outcome, status.reward) == ("Succeeded", "Graded", 0.0)
    assert status.failure_kind == FAILURE_OUTPUT_LIMIT and turn.phase == "Failed"
    assert (turn.reward, turn.reward_valid, turn.failure_kind) == (0.0, False, FAILURE_OUTPUT_LIMIT)
    assert turn.message is not None and turn.message.startswith("refused what the sandbox sent: the answer to `")
    assert "passed the answer bound (--answer-limit 65536)" in turn.message
    assert not any(spec.endswith(".verify") for spec in world.sandboxes["pod-a1"].starts)  # its verifier not run
    assert len(status.attempts) == 1  # not an outage: a retry would do the same


def test_an_artifact_past_its_bound_fails_the_turn() -> None:
    big = "x" * (SMALL.artifact_bytes + 1)
    folder = single_step(SEPARATE, {"solution/solve.sh": f"write /logs/artifacts/big.txt {big}"})
    status, world, _, store = run(folder, world=World(limits=SMALL))
    turn = status.turns[0]
    assert (status.outcome, turn.failure_kind, turn.reward) == ("Graded", FAILURE_OUTPUT_LIMIT, 0.0)
    assert turn.message is not None and "passed the artifact bound (--artifact-limit 262144)" in turn.message
    assert "pod-a1-v1" not in world.sandboxes and (1, "task") not in store.artifacts


def test_a_turns_artifacts_past_the_turn_bound_fail_it() -> None:
    limits = OutputLimits(artifact_bytes=SMALL.artifact_bytes, turn_artifact_bytes=1000)
    folder = single_step(
        'artifacts = ["/app/a", "/app/b"]\n',
        {"solution/solve.sh": f"write /app/a/one {'1' * 600}\nwrite /app/b/two {'2' * 600}"},
    )
    status = run(folder, world=World(limits=limits))[0]
    turn = status.turns[0]
    assert turn.failure_kind == FAILURE_OUTPUT_LIMIT and turn.message is not None
    passed = "the turn's artifacts, with artifact /app/b passed the turn artifacts bound (--turn-artifacts-limit 1000)"
    assert passed in turn.message


def test_a_crafted_artifact_with_too_many_members_fails_the_turn() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for number in range(SMALL.artifact_members + 1):
            archive.addfile(tarfile.TarInfo(f"logs/artifacts/{number}"), io.BytesIO(b""))
    world = World(limits=SMALL, crafted={"/logs/artifacts": buffer.getvalue()})
    status = run(single_step(SEPARATE), world=world)[0]
    assert status.turns[0].failure_kind == FAILURE_OUTPUT_LIMIT
    assert "the artifact members bound (--artifact-members 50)" in (status.turns[0].message or "")
