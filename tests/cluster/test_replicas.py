"""Several operator replicas on the real cluster: one driver per Episode whatever is killed (issue 14).

The replicas are local processes (tests/cluster/replicas.py), killed by pid: SIGKILL as a crash,
SIGTERM as a drain or a rollout. What must hold, whatever runs or dies: every job ran once (each
solve.sh appends a line, each verifier counts them), every Event was posted once, the rewards are
the ones the task gives, and the sandbox pod a terminating replica leaves is the one the next
driver uses (nothing was deleted or restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.stream import stream

from episode_operator.api.episodeset_resource import SET_PLURAL as SETS
from episode_operator.runtime.episode_store import StoreSettings, kept_logs, render_logs
from tests.cluster.conftest import namespace_prefix, wait_for_default_service_account
from tests.cluster.harness import (
    REPO,
    TERMINAL,
    create_episode,
    episode_spec,
    install_crd,
    read_episode,
    wait_for_namespace_gone,
)
from tests.cluster.replicas import (
    Replicas,
    agent_pod,
    agent_pod_uid,
    assert_counted_once,
    audit_trail,
    counting_task,
    driver_of,
    duplicated_events,
    finished,
    objects,
    route_of,
    status_of,
    wait_for,
)
from tests.s3server import CREDENTIALS, s3_server


@pytest.fixture
def replicated(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> Iterator[tuple[str, Path]]:
    """A namespace of this test's own (its replicas watch it and keep their Leases there)."""
    install_crd(api_client)
    namespace = f"replicas-{namespace_prefix()}{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for_default_service_account(core, namespace)
    try:
        yield namespace, tmp_path
    finally:
        # Episodes carry kopf's finalizer: delete the namespace while a replica still runs.
        cleaner = Replicas(kubeconfig, tmp_path, namespace, ("cleaner",))
        cleaner.start_all()
        try:
            core.delete_namespace(namespace, propagation_policy="Background")
            wait_for_namespace_gone(core, namespace, 180)
        finally:
            cleaner.stop()


# --- one driver per Episode --------------------------------------------------------------------------
def test_two_replicas_and_the_driver_killed_every_5_seconds(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    """SIGKILL whichever replica drives the Episode every 5 s (and start it again 5 s later): each job
    ran once, each Event was posted once, the reward is right."""
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1"))
    replicas.start_all()
    try:
        # Each step's solve.sh sleeps 6 s: the episode outlives at least three kills however fast the takeovers.
        create_episode(api_client, namespace, "battered", episode_spec(files=counting_task(4, solve="sleep 6")))
        kills: list[str] = []
        drove: set[str | None] = set()
        deadline = time.monotonic() + 300
        next_kill = time.monotonic() + 5
        while not finished(api_client, namespace, "battered"):
            assert time.monotonic() < deadline, replicas.logs()
            holder = driver_of(read_episode(api_client, namespace, "battered"))
            drove.add(holder)
            if time.monotonic() >= next_kill:
                # Start the one killed 5 s ago again (a new incarnation), then kill the driver: the
                # other replica must take over, and the restarted one take its share back.
                next_kill += 5
                dead = [name for name in replicas.names if not replicas.alive(name)]
                if holder is not None and replicas.alive(holder):
                    replicas.kill(holder)
                    kills.append(holder)
                replicas.start(*dead)
            time.sleep(0.2)
        status = status_of(api_client, namespace, "battered")
        assert len(kills) >= 3, f"the run ended after {len(kills)} kill(s)"
        assert {"r0", "r1"} <= drove, f"only {drove} drove it"
        assert_counted_once(status, 4)
        assert duplicated_events(core, namespace, "battered") == []
    finally:
        replicas.stop()


def test_a_standby_takes_over_within_15_seconds_of_the_drivers_death(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    """Default lease settings: SIGKILL the driver mid-agent; the other replica drives on within 15 s,
    re-attached to the same pod and the same job."""
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1"), leases=())
    replicas.start_all()
    try:
        spec = episode_spec(files=counting_task(2, solve="sleep 20"))
        create_episode(api_client, namespace, "orphan", spec)
        wait_for(
            lambda: (
                [t.get("stage") for t in status_of(api_client, namespace, "orphan").get("turns") or []][:1] == ["agent"]
            ),
            "the first agent turn",
            replicas,
        )
        pod = agent_pod_uid(core, namespace, "orphan")
        holder = driver_of(read_episode(api_client, namespace, "orphan"))
        assert holder is not None and pod is not None
        killed = time.monotonic()
        replicas.kill(holder)
        wait_for(
            lambda: driver_of(read_episode(api_client, namespace, "orphan")) not in (None, holder),
            "the other replica's claim",
            replicas,
            timeout=15,
        )
        took = time.monotonic() - killed
        wait_for(lambda: finished(api_client, namespace, "orphan"), "the end", replicas, timeout=180)
        assert_counted_once(status_of(api_client, namespace, "orphan"), 2)
        assert agent_pod_uid(core, namespace, "orphan") in (None, pod)  # released at the end, never replaced
        assert took <= 15
        assert duplicated_events(core, namespace, "orphan") == []
    finally:
        replicas.stop()


def test_sigterm_at_every_moment_of_a_turn_hands_over_without_deleting_anything(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    """SIGTERM the driver in each turn's preparation (workdir/ and setup.sh, while the status says
    ``cleanup``) and in its agent-to-reward part (solve.sh, collect, test.sh: ``agent``), turn after
    turn: the other replica takes over at once, the sandbox pod is never replaced, every setup and
    solve ran once.

    Each setup.sh and solve.sh waits for a token the test gives once it has stopped the driver there
    (and started it again): the turn cannot run past a stage before the test is done with it, however
    long a stop and a start take on a loaded machine (sleeps of 2 s were outrun, the agent stage never
    met)."""
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1"))
    replicas.start_all()
    tokens = {"cleanup": "/app/release-setup", "agent": "/app/release-solve"}
    try:
        files = counting_task(
            4,
            solve=f"until rm {tokens['agent']} 2>/dev/null; do sleep 0.2; done",
            setup=f"until rm {tokens['cleanup']} 2>/dev/null; do sleep 0.2; done",
        )
        for step in range(1, 5):  # setup.sh appends too: each ran once
            files[f"steps/s{step}/tests/test.sh"] = files[f"steps/s{step}/tests/test.sh"].replace(
                "then echo 1", f'then [ "$(wc -l < /app/setups.txt)" = {step} ] && echo 1 || echo 0'
            )
        create_episode(api_client, namespace, "drained", episode_spec(files=files))
        pods: set[str] = set()
        stopped_in: list[tuple[int, str]] = []
        targets = [(turn, stage) for turn in range(4) for stage in ("cleanup", "agent")]
        for target in targets:

            def at(target: tuple[int, str] = target) -> bool:
                status = status_of(api_client, namespace, "drained")
                turns, current = status.get("turns") or [], status.get("currentTurn")
                if (pod := agent_pod_uid(core, namespace, "drained")) is not None:
                    pods.add(pod)
                assert status.get("phase") not in TERMINAL, f"finished before {target}: {status}"
                return current == target[0] and len(turns) > current and turns[current].get("stage") == target[1]

            wait_for(at, f"the stage {target}", replicas, 240)
            holder = wait_for(
                lambda: (
                    (name := driver_of(read_episode(api_client, namespace, "drained"))) in replicas.names
                    and replicas.alive(name)
                    and name
                ),
                "a live driver",
                replicas,
            )
            replicas.processes[holder].stop()  # SIGTERM, waits for the exit
            stopped_in.append(target)
            replicas.start(holder)
            pod = agent_pod(core, namespace, "drained")
            assert pod is not None, f"no sandbox pod at {target}"
            stream(
                core.connect_get_namespaced_pod_exec, pod.metadata.name, namespace, container="main",
                command=["touch", tokens[target[1]]], stderr=True, stdout=True, stdin=False, tty=False,
            )  # fmt: skip
        wait_for(lambda: finished(api_client, namespace, "drained"), "the end", replicas, 240)
        assert_counted_once(status_of(api_client, namespace, "drained"), 4)
        assert stopped_in == targets
        assert len(pods) == 1, f"the sandbox pod was replaced: {pods}"
        assert duplicated_events(core, namespace, "drained") == []
    finally:
        replicas.stop()


def test_a_rolling_replacement_with_episodes_running(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    """What ``helm upgrade`` makes of the chart's Deployment (RollingUpdate, maxSurge 1, maxUnavailable 0):
    a new replica starts, then an old one is stopped (SIGTERM), until all are new. The Episodes running
    through it finish once and right, each on the pod it started on."""
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("old-0", "old-1", "new-0", "new-1"), leases=())
    replicas.start("old-0", "old-1")
    try:
        names = [f"upgraded-{index}" for index in range(4)]
        for name in names:
            create_episode(api_client, namespace, name, episode_spec(files=counting_task(3, solve="sleep 4")))
        pods = wait_for(
            lambda: (
                (found := {name: agent_pod_uid(core, namespace, name) for name in names})
                and all(found.values())
                and found
            ),
            "every Episode's pod",
            replicas,
        )
        for old, new in (("old-0", "new-0"), ("old-1", "new-1")):
            replicas.start(new)
            replicas.processes[old].stop()
        wait_for(lambda: all(finished(api_client, namespace, name) for name in names), "the end", replicas, 240)
        for name in names:
            assert_counted_once(status_of(api_client, namespace, name), 3)
            assert agent_pod_uid(core, namespace, name) in (None, pods[name])
            assert duplicated_events(core, namespace, name) == []
        finishers = {driver_of(read_episode(api_client, namespace, name)) for name in names}
        assert finishers & {"new-0", "new-1"}, f"the new replicas drove nothing: {finishers}"
    finally:
        replicas.stop()


# --- shards ------------------------------------------------------------------------------------------
def test_three_sharded_replicas_share_the_episodes_and_a_dead_ones_continue_on_the_others(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1", "r2"))
    replicas.start_all()
    try:
        names = [f"shard-{index}" for index in range(9)]
        for name in names:
            create_episode(api_client, namespace, name, episode_spec(files=counting_task(2, solve="sleep 8")))

        def drivers() -> dict[str, str | None]:
            return {item["metadata"]["name"]: driver_of(item) for item in objects(api_client, namespace, "episodes")}

        def routes() -> dict[str, str | None]:
            return {item["metadata"]["name"]: route_of(item) for item in objects(api_client, namespace, "episodes")}

        claimed = wait_for(lambda: (d := drivers()) and all(d.values()) and d, "every Episode claimed", replicas)
        assert len(set(claimed.values())) >= 2, f"one replica drives everything: {claimed}"
        # Each is routed to (watched by) the replica that drives it, and by no other.
        assert routes() == claimed
        victim = max(set(claimed.values()), key=list(claimed.values()).count)
        orphans = [name for name, driver in claimed.items() if driver == victim]
        replicas.kill(victim)
        killed = time.monotonic()
        wait_for(
            lambda: all(
                drivers()[name] not in (None, victim) or finished(api_client, namespace, name) for name in orphans
            ),
            "the dead replica's Episodes on the others",
            replicas,
            timeout=30,
        )
        assert time.monotonic() - killed <= 30
        assert victim not in {routes()[name] for name in orphans}
        wait_for(lambda: all(finished(api_client, namespace, name) for name in names), "the end", replicas, 300)
        for name in names:
            assert_counted_once(status_of(api_client, namespace, name), 2)
            assert duplicated_events(core, namespace, name) == []
    finally:
        replicas.stop()


def test_an_episodeset_of_40_across_3_replicas_killed_at_random(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    """Replicas SIGKILLed at random and started again through a set of 40 children: the set's
    aggregates equal its children's, no child created twice, none lost, no turn run twice."""
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1", "r2"))
    replicas.start_all()
    chance = random.Random(14)
    try:
        task = {"inline": {"files": counting_task(1, solve="sleep 1")}}
        spec = {
            "dataset": {"tasks": [{"name": f"t{index}", **task} for index in range(20)]},
            "attempts": 2,
            "agent": {"kind": "oracle"},
            "parallelism": 6,
        }
        body = {"apiVersion": "episode-operator.dev/v1alpha1", "kind": "EpisodeSet", "metadata": {"name": "forty"}}
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            "episode-operator.dev", "v1alpha1", namespace, SETS, {**body, "spec": spec}
        )

        def complete() -> bool:
            sets = objects(api_client, namespace, SETS)
            return bool(sets and (sets[0].get("status") or {}).get("completionTime"))

        kills = 0
        deadline = time.monotonic() + 600
        while not complete():
            assert time.monotonic() < deadline, replicas.logs()
            time.sleep(chance.uniform(4, 10))
            victim = chance.choice(replicas.names)
            replicas.kill(victim)
            kills += 1
            replicas.start(victim)
        children = objects(api_client, namespace, "episodes")
        status = objects(api_client, namespace, SETS)[0]["status"]
        names = [child["metadata"]["name"] for child in children]
        assert len(names) == len(set(names)) == 40, names
        assert kills >= 3
        phases = [(child.get("status") or {}).get("phase") for child in children]
        assert phases.count("Succeeded") == 40, phases
        wrong = {
            child["metadata"]["name"]: (child["status"]["reward"], child["status"]["attempts"])
            for child in children
            if (child["status"]["attempt"], child["status"]["reward"]) != (1, 1.0)
        }
        trail = audit_trail(namespace, list(wrong))
        assert wrong == {}, f"{wrong}\n" + "\n".join(trail) + f"\n{replicas.logs(80)}"
        assert (status["total"], status["created"], status["finished"], status["active"]) == (40, 40, 40, 0)
        assert status["phases"]["succeeded"] == 40 and status["outcomes"]["graded"] == 40
        assert status["meanReward"] == 1.0
        recorded = sorted(child["name"] for task in status["tasks"] for child in task["children"])
        assert recorded == sorted(names)
        assert duplicated_events(core, namespace, "forty") == []
    finally:
        replicas.stop()


def test_sigterm_hands_over_at_once(
    kubeconfig: Path, api_client: client.ApiClient, core: client.CoreV1Api, replicated: tuple[str, Path]
) -> None:
    """A terminating replica deletes its Lease once its drivers stopped: the other drives on within a
    few seconds (no lease expiry to wait for), on the same pod."""
    namespace, root = replicated
    replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1"), leases=())
    replicas.start_all()
    try:
        create_episode(api_client, namespace, "drain", episode_spec(files=counting_task(2, solve="sleep 15")))
        wait_for(lambda: agent_pod_uid(core, namespace, "drain"), "the sandbox pod", replicas)
        holder = wait_for(lambda: driver_of(read_episode(api_client, namespace, "drain")), "a driver", replicas)
        pod = agent_pod_uid(core, namespace, "drain")
        process = replicas.processes[holder].process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        wait_for(
            lambda: driver_of(read_episode(api_client, namespace, "drain")) not in (None, holder),
            "the other replica's claim",
            replicas,
            timeout=15,
        )
        took = time.monotonic() - sent
        with contextlib.suppress(Exception):
            process.wait(timeout=30)
        wait_for(lambda: finished(api_client, namespace, "drain"), "the end", replicas, timeout=180)
        assert_counted_once(status_of(api_client, namespace, "drain"), 2)
        assert agent_pod_uid(core, namespace, "drain") in (None, pod)
        assert took < 8, f"took over {took:.1f} s after SIGTERM"
        replicas.start(holder)  # a new incarnation, once the Episode finished on the other
        leases, driver = operating_commands(kubeconfig, namespace, "drain")
        assert "r0." in leases and "r1." in leases  # the restarted one's new incarnation joined
        assert driver.rsplit(".", 1)[0] in ("r0", "r1") and driver != holder
    finally:
        replicas.stop()


def operating_commands(kubeconfig: Path, namespace: str, name: str) -> list[str]:
    """The commands of docs/replicas.md's "Operating", as printed but for the namespace and name."""
    text = (REPO / "docs" / "replicas.md").read_text().split("## Operating", 1)[1].split("```sh", 1)[1]
    outputs = []
    for line in text.split("```", 1)[0].strip().splitlines():
        command = line.split("  #", 1)[0].strip().replace("episode-operator-system", namespace).replace("NAME", name)
        if "get episode " in command:
            command += f" -n {namespace}"
        result = subprocess.run(
            command, shell=True, capture_output=True, text=True, env={**os.environ, "KUBECONFIG": str(kubeconfig)}
        )
        assert result.returncode == 0, f"{command}: {result.stderr}"
        outputs.append(result.stdout)
    return outputs


# --- the store ----------------------------------------------------------------------------------------
POD_NETWORK_GATEWAY = "198.18.0.1"  # this machine, as the cluster's pods reach it (hack/cluster's bridge)


def test_logs_and_artifacts_in_a_bucket_are_served_by_any_replica_and_outlive_the_driver(
    kubeconfig: Path,
    api_client: client.ApiClient,
    replicated: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas with data directories of their own and one S3 bucket (moto's server, on the address
    the cluster's pods reach this machine at): the Episode's driver is killed after it finished, and
    every log is there for any replica's data API to read."""
    namespace, root = replicated
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with s3_server(root / "moto.log", host=POD_NETWORK_GATEWAY) as s3:
        s3.create_bucket("kept")
        port = s3.endpoint.rsplit(":", 1)[1]
        store = ("--store-url", "s3://kept/episodes", "--store-endpoint", s3.endpoint, "--store-allow-http")
        replicas = Replicas(kubeconfig, root, namespace, ("r0", "r1"), extra_args=store)
        for name, process in replicas.processes.items():
            process.data_dir = root / f"data-{name}"  # nothing shared but the bucket
        # The agent reaches the bucket's server from its pod (bash's /dev/tcp: no curl needed).
        probe = (
            f"exec 3<>/dev/tcp/{POD_NETWORK_GATEWAY}/{port}; printf 'GET /moto-api/ HTTP/1.0\\r\\n\\r\\n' >&3; "
            "head -1 <&3; echo marker-$(cat /app/turns.txt 2>/dev/null | wc -l)"
        )
        replicas.start_all()
        try:
            create_episode(api_client, namespace, "kept", episode_spec(files=counting_task(2, solve=probe)))
            wait_for(lambda: finished(api_client, namespace, "kept"), "the end", replicas, timeout=180)
            body = read_episode(api_client, namespace, "kept")
            assert_counted_once(body["status"], 2)
            driver = driver_of(body)
            assert driver is not None
            replicas.kill(driver)
            # What the data API of any replica reads: the bucket, through a store of its own.
            settings = StoreSettings(url="s3://kept/episodes", endpoint=s3.endpoint, allow_http=True)
            blobs = settings.open(root / "elsewhere").episode(namespace, "kept", body["metadata"]["uid"])
            logs = render_logs(asyncio.run(kept_logs(blobs))).decode()
            assert "==> attempt 1 turn s1: agent <==" in logs and "==> attempt 1 turn s2: verifier <==" in logs
            assert "HTTP/1.1 200" in logs, logs  # the pod reached the server
            assert "marker-0" in logs and "marker-1" in logs, logs
            assert not list((root / f"data-{driver}").rglob("*.txt")), "logs written to the data directory"
        finally:
            replicas.stop()


def test_a_lease_namespace_that_does_not_exist_is_a_clear_error(kubeconfig: Path, tmp_path: Path) -> None:
    command = [
        str(Path(sys.executable).parent / "episode-operator"), "run", "--namespace", "treplicas-none",
        "--kubeconfig", str(kubeconfig), "--metrics-port", "0", "--data-dir", str(tmp_path),
        "--lease-namespace", "no-such-namespace-for-leases",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "episode-operator: cannot join the operator's replicas (--lease-namespace no-such-namespace-for-leases): "
        )
    ), result.stderr
    assert "Traceback" not in result.stderr
