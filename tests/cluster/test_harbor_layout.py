"""The sandbox as Harbor lays it out, on the real cluster (issue 29; docs/harbor-layout.md).

- An oracle solution written against Harbor inspects the layout during its turn — the folders,
  their owners and modes, what the agent may write, what is mounted — and passes only when it is
  Harbor's, under shared and separate verification, as root and as a non-root ``[agent].user``.
- The compose volume case: ``main``'s ENTRYPOINT (a replayed Dockerfile's) writes into a named
  volume it shares with a sidecar; the verifier asks the sidecar what it saw there. Its control
  gives the sidecar a volume of another name: the same task, which must then score 0.
- A volume only sidecars name: the reader sees there what the seeder's image (the operator's, its
  /var/lib/episode-operator uid 65532's) has at its mount path. Its control mounts it ``nocopy``.
- A separate verifier whose environment is ``environment/``: its ``test.sh`` asks the compose
  service beside it, a new one whose volume holds nothing of what the agent planted in its own. Its
  control declares a verifier image: Harbor's verifier environment is then ``tests/``, without the
  services, and the same ``test.sh`` must score 0.

Each test prints what the sandbox showed (``pytest -s``).
"""

from __future__ import annotations

import tarfile

import pytest
from kubernetes import client

from tests.cluster.harness import TASKS, OperatorProcess, episode_spec, run_episode

STARTUP_EVIDENCE = TASKS / "startup-evidence"
SEEDED_VOLUME = TASKS / "seeded-volume"
FRESH_SERVICES = TASKS / "fresh-services"
LAYOUT_REPORT = "/logs/artifacts/layout.txt"
# What an oracle written against Harbor checks of the layout during its turn (Harbor 0.25,
# environments/base.py ensure_dirs: `mkdir -p` and `chmod 777` of the three as root after
# `compose up`), writing what it found to the artifacts; "ok" last when all of it holds.
LAYOUT_SOLVE = rf"""#!/bin/bash
report={LAYOUT_REPORT}
layout="/logs/agent /logs/verifier /logs/artifacts"
{{
  echo "user $(id -un)"
  for p in /logs $layout /solution /solution/solve.sh /tests; do
    if [ -e "$p" ]; then stat -c '%n %U:%G %a %F' "$p"; else echo "$p missing"; fi
  done
  for d in $layout; do
    if touch "$d/.probe" 2>/dev/null && rm -f "$d/.probe"; then echo "$d writable"; else echo "$d not writable"; fi
  done
  echo "mounted: $(awk '$5 ~ "^/(logs|tests|solution)(/|$)" {{print $5}}' /proc/self/mountinfo | sort | xargs)"
}} > "$report"
for d in $layout; do
  [ "$(stat -c '%U %a' "$d")" = "root 777" ] && grep -qx "$d writable" "$report" || exit 1
done
[ "$(stat -c '%U %a' /logs)" = "root 755" ] && grep -qx "mounted: " "$report" && echo ok >> "$report"
"""
# The verifier shows what it runs in: its folders sealed (README, "Against a hostile agent").
LAYOUT_TEST = f"""#!/bin/bash
cat {LAYOUT_REPORT}
stat -c '%n %U:%G %a' /tests /tests/test.sh /logs/verifier
if [ "$(tail -n 1 {LAYOUT_REPORT})" = ok ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def layout_task(mode: str, user: str | None) -> dict[str, str]:
    toml = (
        'schema_version = "1.4"\n[task]\nname = "episode-operator/harbor-layout"\n'
        + "[agent]\ntimeout_sec = 60.0\n"
        + (f'user = "{user}"\n' if user else "")
        + "[verifier]\ntimeout_sec = 60.0\n"
        + ('environment_mode = "separate"\n' if mode == "separate" else "")
        + '[environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\n'
    )
    return {
        "task.toml": toml,
        "instruction.md": "Report the sandbox's layout.\n",
        "solution/solve.sh": LAYOUT_SOLVE,
        "tests/test.sh": LAYOUT_TEST,
    }


def kept(operator: OperatorProcess, namespace: str, name: str) -> dict[str, str]:
    """What the operator kept of an Episode (its data directory): the logs of its jobs (``verifier.txt``,
    ``agent.txt``, ``replay.txt``…) and the text files of its artifacts, by name."""
    texts: dict[str, str] = {}
    for path in sorted((operator.data_dir / namespace / name).rglob("*")):
        if path.parent.name == "logs" and path.suffix == ".txt":
            texts[path.name] = path.read_text(errors="replace")
        elif path.parent.name == "artifacts" and path.suffix == ".tar":
            with tarfile.open(path) as archive:
                for member in archive:
                    content = archive.extractfile(member) if member.isfile() else None
                    if content is not None:
                        texts[member.name] = content.read().decode(errors="replace")
    return texts


def shown(texts: dict[str, str]) -> str:
    return "".join(f"--- {name}\n{text}" for name, text in texts.items())


@pytest.mark.parametrize("mode", ["shared", "separate"])
@pytest.mark.parametrize("user", [None, "nobody"], ids=["root", "non-root"])
def test_an_oracle_written_against_harbor_finds_its_layout_during_its_turn(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, mode: str, user: str | None
) -> None:
    status = run_episode(api_client, namespace, "layout", episode_spec(files=layout_task(mode, user)), operator)
    seen = kept(operator, namespace, "layout")
    print(f"\n== {mode}, {user or 'root'}\n{shown(seen)}")
    turn = status["turns"][0]
    assert (status["phase"], status["reward"], turn["agentExitCode"], turn["rewardValid"]) == (
        "Succeeded",
        1.0,
        0,
        True,
    ), f"{status}\n{shown(seen)}"
    assert seen[LAYOUT_REPORT.lstrip("/")].splitlines() == [
        f"user {user or 'root'}",
        "/logs root:root 755 directory",
        "/logs/agent root:root 777 directory",
        "/logs/verifier root:root 777 directory",
        "/logs/artifacts root:root 777 directory",
        # As Harbor's `docker compose cp` of solution/ (a 0755 folder) and its `chmod +x` leave them.
        "/solution root:root 755 directory",
        "/solution/solve.sh root:root 755 regular file",
        "/tests missing",  # Harbor uploads the tests after the agent's turn
        "/logs/agent writable",
        "/logs/verifier writable",
        "/logs/artifacts writable",
        "mounted: ",  # folders of the sandbox, as Harbor's are without auto_mounting
        "ok",
    ]
    # While test.sh runs: /tests and /logs/verifier root's 0755 (sealed; Harbor leaves them as the
    # agent's turn left them), test.sh executable as Harbor's `chmod +x` makes it.
    assert seen["verifier.txt"].splitlines()[-3:] == [
        "/tests root:root 755",
        "/tests/test.sh root:root 755",
        "/logs/verifier root:root 755",
    ]


def test_a_sidecar_reads_what_mains_entrypoint_wrote_into_their_shared_volume(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    status = run_episode(api_client, namespace, "evidence", episode_spec(STARTUP_EVIDENCE), operator, timeout=300)
    seen = kept(operator, namespace, "evidence")
    print(f"\n== startup-evidence\n{shown(seen)}")
    assert (status["phase"], status["outcome"], status["reward"]) == ("Succeeded", "Graded", 1.0), (
        f"{status}\n{shown(seen)}"
    )
    # A new volume with nothing under its path in the image: root's 0755, as Docker makes it.
    assert "main's /startup: root:root 755, evidence.txt: " in seen["verifier.txt"]


def test_the_control_a_sidecar_naming_another_volume_sees_nothing(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    compose = (STARTUP_EVIDENCE / "environment" / "docker-compose.yaml").read_text()
    other = compose.replace("startup-evidence:/startup:ro", "other-evidence:/startup:ro").replace(
        "volumes:\n  startup-evidence:\n", "volumes:\n  startup-evidence:\n  other-evidence:\n"
    )
    assert other.count("other-evidence") == 2
    spec = episode_spec(STARTUP_EVIDENCE, edits={"environment/docker-compose.yaml": other})
    status = run_episode(api_client, namespace, "control", spec, operator, timeout=300)
    seen = kept(operator, namespace, "control")
    print(f"\n== control\n{shown(seen)}")
    assert (status["phase"], status["outcome"], status["reward"]) == ("Succeeded", "Graded", 0.0), (
        f"{status}\n{shown(seen)}"
    )
    assert "the reader saw: 404 nothing in /startup" in seen["verifier.txt"]


def seeded_compose(mode: str) -> str:
    """seeded-volume's compose file, the seeder's mount of the volume given ``mode`` (``""`` as it is)."""
    compose = (SEEDED_VOLUME / "environment" / "docker-compose.yaml").read_text()
    edited = compose.replace("seeded:/var/lib/episode-operator\n", f"seeded:/var/lib/episode-operator{mode}\n")
    assert edited.count("seeded:/var/lib/episode-operator") == 1 and (edited != compose) == bool(mode)
    return edited


@pytest.mark.parametrize("mode", ["", ":nocopy"], ids=["filled", "control-nocopy"])
def test_a_volume_only_sidecars_name_holds_the_first_ones_image_content(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, mode: str
) -> None:
    name = "seeded" if not mode else "seeded-nocopy"
    spec = episode_spec(SEEDED_VOLUME, edits={"environment/docker-compose.yaml": seeded_compose(mode)})
    status = run_episode(api_client, namespace, name, spec, operator, timeout=300)
    seen = kept(operator, namespace, name)
    print(f"\n== {name}\n{shown(seen)}")
    assert (status["phase"], status["outcome"], status["reward"]) == ("Succeeded", "Graded", 0.0 if mode else 1.0), (
        f"{status}\n{shown(seen)}"
    )
    if mode:  # nocopy: a new volume, root's 0755 and empty, as Docker leaves it
        assert seen["verifier.txt"].split("the reader sees:\n", 1)[1].splitlines()[0] == "/seen 0:0 755"
    else:
        assert "data 65532:65532 755" in seen["verifier.txt"].splitlines()


@pytest.mark.parametrize("declared_image", [False, True], ids=["in-environment", "control-own-image"])
def test_a_separate_verifier_asks_the_new_compose_service_beside_it(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess, declared_image: bool
) -> None:
    toml = (FRESH_SERVICES / "task.toml").read_text()
    # The control: a verifier image of its own makes Harbor's verifier environment tests/, without the services.
    own_image = '\n[verifier.environment]\ndocker_image = "episode-operator.local/sandbox:bookworm"\n'
    edits = {"task.toml": toml.replace("\n[environment]", own_image + "\n[environment]", 1)} if declared_image else {}
    name = "own-image" if declared_image else "fresh"
    status = run_episode(api_client, namespace, name, episode_spec(FRESH_SERVICES, edits=edits), operator, timeout=300)
    seen = kept(operator, namespace, name)
    print(f"\n== {name}\n{shown(seen)}")
    assert (status["phase"], status["outcome"], status["reward"]) == (
        "Succeeded",
        "Graded",
        0.0 if declared_image else 1.0,
    ), f"{status}\n{shown(seen)}"
    # During the agent's turn the keeper beside it saw what the agent planted.
    agent_saw = seen["logs/artifacts/agent-saw.txt"].strip()
    assert agent_saw.startswith("boot ") and agent_saw.endswith("; /state: planted.txt"), agent_saw
    said = dict(line.split(": ", 1) for line in seen["verifier.txt"].splitlines() if ": " in line)
    if declared_image:
        assert said["this verifier's keeper said"].startswith("unreachable: "), said
        return
    # The verifier's keeper is another start of it, its volume new: nothing the agent left reaches it.
    mine = said["this verifier's keeper said"]
    assert mine.startswith("boot ") and mine.endswith("; /state: empty"), said
    assert mine.split(";")[0] != agent_saw.split(";")[0]
    assert said["this verifier's /state"] == ""
