"""Break the operator on purpose, one declared way at a time, and see which unit test notices.

Each mutation replaces one exact snippet of one module with a wrong variant (a job run as
the wrong user, without its environment, in the wrong directory, with the wrong time limit;
a skipped cleanup, gate or check). It is applied to a scratch copy of the package, never to
the working tree, and the unit tier runs against that copy (``PYTHONPATH`` puts it first),
stopping at the first failure. A mutation no test fails is a hole in the suite. A snippet
that no longer occurs exactly once (the code moved on) is reported as such, never skipped:
update the table with the code.

    .venv/bin/python tests/mutations.py                 # every mutation, a table at the end
    .venv/bin/python tests/mutations.py -k verifier     # those whose name contains "verifier"
    .venv/bin/python tests/mutations.py --list          # the table, nothing run
    .venv/bin/python tests/mutations.py --markdown      # the result as docs/testing.md's table

Exit status: 0 when every mutation was caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "operator" / "episode_operator"
# The unit tier, the files likeliest to notice first: pytest runs files in the order given,
# but a directory given too would bring back its own (alphabetical) order.
FIRST = ("test_job_wiring.py", "test_runtime.py", "test_rewards.py", "test_store.py", "test_real_supervisor.py")
UNIT_TIER = [
    f"tests/unit/{name}"
    for name in [*FIRST, *sorted(p.name for p in (REPO / "tests" / "unit").glob("test_*.py") if p.name not in FIRST)]
]
TIMEOUT_SEC = 900.0


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # below operator/episode_operator/
    snippet: str  # must occur exactly once
    replacement: str
    breaks: str  # what goes wrong, in a user's words


EPISODE = "runtime/episode.py"
VERIFY = "runtime/turn/verify.py"
PREPARE = "runtime/turn/prepare.py"
COLLECT = "runtime/turn/collect.py"
AGENTS = "runtime/agents/builtin.py"
GYM_SERVER = "runtime/gym_server.py"
HARNESSES = "runtime/agents/harnesses.py"
RESULTS_PAGE = "cli/results_page.py"
VIEW = "cli/view.py"
OCI_TASKS = "runtime/oci_tasks.py"
MUTATIONS = [
    # As whom, with which environment.
    Mutation(
        "verifier-user",
        VERIFY,
        "timeout_sec=plan.verifier.timeout_sec,\n        user=plan.verifier.user,\n",
        "timeout_sec=plan.verifier.timeout_sec,\n",
        "test.sh runs as root, not as [verifier].user",
    ),
    Mutation(
        "verifier-env",
        VERIFY,
        "env=plan.verifier.env,\n",
        "",
        "test.sh runs without [verifier.env]",
    ),
    Mutation(
        "solution-env",
        AGENTS,
        'env={**turn.services.plan.solution_env, "DEBIAN_FRONTEND": "noninteractive"},',
        'env={"DEBIAN_FRONTEND": "noninteractive"},',
        "solve.sh runs without [solution.env]",
    ),
    Mutation(
        "solution-debian-frontend",
        AGENTS,
        'env={**turn.services.plan.solution_env, "DEBIAN_FRONTEND": "noninteractive"},',
        "env=dict(turn.services.plan.solution_env),",
        "solve.sh runs without DEBIAN_FRONTEND=noninteractive",
    ),
    Mutation(
        "setup-user",
        PREPARE,
        "timeout_sec=turn.plan.setup_timeout_sec,\n        user=turn.plan.agent.user,\n",
        "timeout_sec=turn.plan.setup_timeout_sec,\n",
        "setup.sh runs as root, not as the step's agent user",
    ),
    Mutation(
        "oracle-user",
        AGENTS,
        "timeout_sec=plan.agent.timeout_sec,\n                user=plan.agent.user,\n",
        "timeout_sec=plan.agent.timeout_sec,\n",
        "the oracle's solve.sh runs as root, not as the agent user",
    ),
    Mutation(
        "command-agent-user",
        AGENTS,
        "user=turn.plan.agent.user,\n                env={**_env(turn),",
        "env={**_env(turn),",
        "the command agent runs as root, not as the agent user",
    ),
    Mutation(
        "command-agent-env",
        AGENTS,
        "return {**turn_env(turn), **(model_env(model) if model is not None else {})}",
        "return model_env(model) if model is not None else {}",
        "the command agent gets no EPISODE_TURN* variables",
    ),
    Mutation(
        "agent-setup-user",
        AGENTS,
        "user=turn.plan.agent.user,\n            env=_env(turn),\n",
        "env=_env(turn),\n",
        "the command agent's setup runs as root",
    ),
    Mutation(
        "healthcheck-user",
        EPISODE,
        "timeout_sec=timeout, user=user",
        "timeout_sec=timeout",
        "the step healthcheck runs as root",
    ),
    Mutation(
        "collect-hook-user",
        COLLECT,
        "user=hook.user,\n",
        "",
        "a collect hook runs as root, not as its user",
    ),
    Mutation(
        "user-switch",
        PREPARE,
        "if user is not None and switches_user(turn):",
        "if False:",
        "the working directory is never given to the agent user",
    ),
    Mutation(
        "quiet-start-with-setup",
        PREPARE,
        'return (\n        cleanup_carrier(turn) != "own"',
        'return True or (\n        cleanup_carrier(turn) != "own"',
        "a first turn's setup.sh runs before the turn's start is written: a restart cannot tell it ran",
    ),
    # Where.
    Mutation(
        "oracle-cwd",
        AGENTS,
        "output=ORACLE_OUTPUT,\n",
        "output=ORACLE_OUTPUT,\n                cwd=SOLUTION,\n",
        "solve.sh runs in /solution, not in the working directory",
    ),
    Mutation(
        "verifier-cwd",
        VERIFY,
        "output=TEST_STDOUT,\n",
        "output=TEST_STDOUT,\n        cwd=TESTS,\n",
        "test.sh runs in /tests, not in the working directory",
    ),
    Mutation(
        "setup-cwd",
        PREPARE,
        "command=f\"bash {PurePosixPath(sandbox.workdir) / 'setup.sh'}\",\n",
        'command=f"bash {PurePosixPath(sandbox.workdir) / \'setup.sh\'}",\n        cwd="/",\n',
        "setup.sh runs in /, not in the working directory",
    ),
    Mutation(
        "workdir-destination",
        PREPARE,
        "folder_tar(turn.services.files, turn.plan.workdir), sandbox.workdir,",
        'folder_tar(turn.services.files, turn.plan.workdir), "/",',
        "workdir/ is merged into /, not into the working directory",
    ),
    # How long.
    Mutation(
        "agent-time-limit",
        AGENTS,
        'command=f"bash {SOLUTION}/{SOLVE}",\n                timeout_sec=plan.agent.timeout_sec,',
        'command=f"bash {SOLUTION}/{SOLVE}",\n                timeout_sec=plan.verifier.timeout_sec,',
        "the oracle is bounded by the verifier's budget, not the agent's",
    ),
    Mutation(
        "verifier-time-limit",
        VERIFY,
        "timeout_sec=plan.verifier.timeout_sec,\n",
        "timeout_sec=plan.agent.timeout_sec,\n",
        "test.sh is bounded by the agent's budget, not the verifier's",
    ),
    Mutation(
        "setup-time-limit",
        PREPARE,
        "timeout_sec=turn.plan.setup_timeout_sec,\n",
        "timeout_sec=turn.plan.verifier.timeout_sec,\n",
        "setup.sh is bounded by the verifier's budget, not the step's",
    ),
    Mutation(
        "collect-hook-time-limit",
        COLLECT,
        "timeout_sec=hook.timeout_sec,\n",
        "timeout_sec=plan.verifier.timeout_sec,\n",
        "a collect hook is bounded by the verifier's budget, not its own",
    ),
    Mutation(
        "episode-deadline",
        EPISODE,
        "if deadline is not None and self.clock() > parse_timestamp(deadline):",
        "if False:",
        "a run past the episode deadline goes on",
    ),
    Mutation(
        "lost-job",
        EPISODE,
        'if state.phase == "unknown":',
        'if state.phase == "unknown" and False:',
        "a job the supervisor lost is polled forever",
    ),
    # Grading.
    Mutation(
        "cleanup-between-turns",
        "runtime/turn/context.py",
        'GRADING_FILES = (f"{TESTS}/", f"{LOGS_VERIFIER}/", TRAJECTORY)',
        "GRADING_FILES = (TRAJECTORY,)",
        "a shared turn's /tests and /logs/verifier are left for the next turn's agent",
    ),
    Mutation(
        "cleanup-before-verify",
        VERIFY,
        "folders = (SEALED_REWARDS,) if turn.separate else (SEALED_TESTS, SEALED_REWARDS)",
        "folders: tuple[str, ...] = ()",
        "files the agent planted in /tests and /logs/verifier are graded",
    ),
    Mutation(
        "reward-after-exit",
        VERIFY,
        "and content.modified > state.finished_at  # both by the container's clock",
        "and False",
        "a reward file rewritten after test.sh exited is accepted",
    ),
    Mutation(
        "min-reward-stop",
        VERIFY,
        'or record.gate == "missed"',
        "",
        "a turn below min_reward does not stop the episode",
    ),
    Mutation(
        "min-reward-record",
        VERIFY,
        "miss = check_min_reward(turn.plan.min_reward, score.rewards)",
        "miss = None",
        "a missed min_reward is not recorded on the turn",
    ),
    # The turn machine and the agents.
    Mutation(
        "agent-stage-unpublished",
        "runtime/turn/table.py",
        "Stage.TRAJECTORY,\n        Published.ALWAYS,",
        "Stage.TRAJECTORY,\n        Published.NEVER,",
        "a restart after the agent started runs the agent again",
    ),
    Mutation(
        "separate-verifier-inputs-masked",
        "runtime/turn/turn_failures.py",
        '        "upload": Becomes(masked=True),\n',
        '        "upload": _CANNOT_RUN,\n',
        "a separate verifier without tar is retried as an outage instead of masked",
    ),
    Mutation(
        "model-auth-retried",
        "api/vocabulary.py",
        '    "model_auth": "fail",\n',
        '    "model_auth": "retry",\n',
        "a refused API key is retried as an outage",
    ),
    Mutation(
        "capture-unmarked",
        "runtime/turn/agent.py",
        'await _capture_job(turn, sandbox, "capture-on", f"--turn {turn.name}")',
        "pass",
        "model calls are not attributed to their turn",
    ),
    Mutation(
        "min-reward-equality",
        "taskfolder/rewards.py",
        "if rewards[key] < threshold:",
        "if rewards[key] <= threshold:",
        "a reward equal to min_reward misses the gate",
    ),
    Mutation(
        "reward-json-wins",
        "taskfolder/rewards.py",
        "    if reward_json is not None:\n        try:",
        "    if reward_json is not None and reward_txt is None:\n        try:",
        "reward.txt is read although reward.json exists",
    ),
    Mutation(
        "reward-txt-unicode-digits",
        "taskfolder/rewards.py",
        'NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\\.[0-9]*)?|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?")',
        'NUMBER = re.compile(r"[+-]?(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][+-]?\\d+)?")',
        'reward.txt "١" scores 1',
    ),
    Mutation(
        "reward-txt-unicode-space",
        "taskfolder/rewards.py",
        "text = _text(data).strip(ASCII_SPACE)",
        "text = _text(data).strip()",
        "reward.txt with a no-break space scores",
    ),
    Mutation(
        "reward-not-finite",
        "taskfolder/rewards.py",
        "    if not math.isfinite(value):\n        raise _Invalid",
        "    if False:\n        raise _Invalid",
        'reward.json {"reward": NaN} scores',
    ),
    # The supervisor and the kept logs.
    Mutation(
        "own-output",
        "runtime/supervisor.sh",
        '    [ "$_osz" -ge "$_off" ] || _off=0\n',
        "    _off=0\n",
        "turn 2's kept oracle log repeats turn 1's output",
    ),
    Mutation(
        "artifacts-before-hooks",
        "runtime/turn/collect.py",
        "    if any(hook.service == MAIN_SERVICE for hook in plan.collect):\n        return None\n",
        "",
        "the artifacts come with the agent's answer although a collect hook on main writes there after it",
    ),
    Mutation(
        "session-no-fallback",
        "kube/pod_sandbox.py",
        "            with contextlib.suppress(SessionFailed):\n                result = _Ran(",
        "            if True:\n                result = _Ran(",
        "a session whose shell died fails the call instead of making it by exec",
    ),
    Mutation(
        "session-stdin-any-head",
        "kube/session.py",
        "        return not command.payload_size or ready is None or ready.exact_head",
        "        return True",
        "uploads go on sessions in containers whose head reads past a request",
    ),
    Mutation(
        "stale-body-drives",
        "kube/replicas.py",
        '        self._check_route(claimable, body)\n        if not membership.owns(metadata["uid"]):\n',
        '        if not membership.owns(metadata["uid"]):\n',
        "a daemon whose object left this replica's watch claims it with the body kopf stopped updating",
    ),
    Mutation(
        "generated-client-eager",
        "cli/operator_main.py",
        "    from episode_operator.kube.generated import install\n\n    install()  # before kopf: see above\n",
        "",
        "kopf imports the whole generated Kubernetes client before the kube layer makes it lazy (+32 MiB)",
    ),
    Mutation(
        "event-backlog-unbounded",
        "kube/event_recorder.py",
        "        if self._pending >= self._max_pending:\n",
        "        if False:\n",
        "Events from many objects queue without bound behind the rate limit (the operator's memory grows with them)",
    ),
    Mutation(
        "logs-in-run-order",
        "runtime/episode_store.py",
        """known.get(f"{blob.turn}/{blob.name.removesuffix('.txt')}", len(known))""",
        "0",
        "kubectl episode logs lists turns by name, not in the order they ran",
    ),
    # Hostile bytes (issue 23): every answer bounded while it streams, artifacts re-packed, link bombs.
    Mutation(
        "answer-unbounded",
        "runtime/limits.py",
        "        if self.size + len(data) > self.limit:\n            raise OutputLimitExceeded",
        "        if False:\n            raise OutputLimitExceeded",
        "an endless answer from an agent's pod is read (and spooled) without end",
    ),
    Mutation(
        "session-answer-held",
        "runtime/supervisor.py",
        "            keep = min(len(call.mark) - 1, len(scanned))\n",
        "            keep = len(scanned)\n",
        "a session holds an answer's stdout in memory and rescans it from the start at every piece",
    ),
    Mutation(
        "session-limit-by-exec",
        "kube/session.py",
        "            except OutputLimitExceeded:\n"
        "                await self._discard(abort=True)\n                raise\n",
        "            except OutputLimitExceeded as error:\n"
        "                raise SessionFailed(str(error)) from error\n",
        "an answer past its bound on a session is asked again by exec instead of failing the turn",
    ),
    Mutation(
        "exec-close-handshake",
        "kube/client.py",
        "                        _abort_connection(websocket)\n",
        "",
        "an exec past its bound is closed by a handshake the hostile peer never ends (the call hangs)",
    ),
    Mutation(
        "tail-frame-unchecked",
        "runtime/supervisor.py",
        'length = reader.frame("tail", spec.tail,',
        'length = reader.frame("tail", limits.artifact_bytes,',
        "a crafted answer passes a download's worth of bytes off as a job's tail, kept in memory",
    ),
    Mutation(
        "turn-output-limit-uncaught",
        EPISODE,
        "            except (TurnFailed, OutputLimitExceeded) as error:\n",
        "            except TurnFailed as error:\n",
        "an answer past its bound crashes the runner instead of failing the turn (agent:output_limit)",
    ),
    Mutation(
        "repack-dot-dot",
        "runtime/archive.py",
        '    if ".." in parts:\n        return "a name with \'..\'", raw\n',
        "",
        "an artifact member named logs/artifacts/../verifier/reward.txt reaches the verifier",
    ),
    Mutation(
        "repack-outside-source",
        "runtime/archive.py",
        '    if root and name != root and not name.startswith(root + "/"):\n',
        "    if False:\n",
        "an artifact member outside the artifact's source (/logs/verifier/reward.txt) reaches the verifier",
    ),
    Mutation(
        "repack-links",
        "runtime/archive.py",
        "    if not (member.isreg() or member.isdir()):\n        kind = _MEMBER_KINDS",
        "    if not (member.isreg() or member.isdir() or member.issym()):\n        kind = _MEMBER_KINDS",
        "a symbolic link in an artifact is kept (a file of its name reaches the verifier)",
    ),
    Mutation(
        "repack-special-bits",
        "runtime/archive.py",
        "        info.mode = member.mode & 0o777\n        info.mtime",
        "        info.mode = member.mode\n        info.mtime",
        "an artifact's setuid and setgid bits reach the verifier's pod",
    ),
    Mutation(
        "repack-clash",
        "runtime/archive.py",
        '        return f"inside /{blocking}, a file of the artifact", name\n',
        "        return None, name\n",
        "a crafted artifact whose members clash makes the verifier's tar fail (the episode masked)",
    ),
    Mutation(
        "artifact-bound",
        "runtime/archive.py",
        "        if self.size > limits.artifact_bytes:\n",
        "        if False:\n",
        "an artifact past the artifact bound is kept",
    ),
    Mutation(
        "turn-artifacts-bound",
        COLLECT,
        "            left -= collected.size\n",
        "",
        "a turn's artifacts past the turn's bound in all are kept",
    ),
    Mutation(
        "artifact-raw-to-verifier",
        COLLECT,
        "repack_artifact, raw, entry.source, limits",
        'repack_artifact, raw, "/", limits',
        "members of the agent's download outside the artifact's source reach the verifier",
    ),
    Mutation(
        "download-dense",
        "runtime/supervisor.sh",
        "        tar -c -f - -C / --sparse --ignore-failed-read",
        "        tar -c -f - -C / --ignore-failed-read",
        "a sparse file in an artifact costs its size in the pod's disk and on the wire",
    ),
    Mutation(
        "extract-through-links",
        "runtime/archive.py",
        "        if place.is_symlink() or (place.exists() and not place.is_dir()):\n",
        "        if place.exists() and not place.is_dir():\n",
        "kubectl episode artifacts writes through a link already in the destination, outside it",
    ),
    Mutation(
        "link-sizes-uncounted",
        "taskfolder/sources.py",
        "            if not self.room_for(link, len(entry.data)):\n",
        "            if not self.room_for(link, 0):\n",
        "a task folder of links to one big file passes the size limit (a 168 KB ConfigMap expands to GiBs)",
    ),
    Mutation(
        "link-chains-deep",
        "taskfolder/sources.py",
        "MAX_SYMLINK_HOPS = 8\n",
        "MAX_SYMLINK_HOPS = 40\n",
        "a task folder's chain of 40 symlinks is followed",
    ),
    Mutation(
        "task-load-on-loop",
        "kube/driver.py",
        "    return await asyncio.to_thread(TaskFiles.from_tar, archive)\n",
        "    return TaskFiles.from_tar(archive)\n",
        "a big task folder is unpacked on the event loop every Episode runs on",
    ),
    # The seed (runtime/seed.py), a replayed image's settings, images, pods that wait.
    Mutation(
        "seed-not-published",
        EPISODE,
        "            if work.publishes(row.published):\n                await self.publish()\n",
        "",
        "a restarted operator redoes the seed from its first stage, not where it was",
    ),
    Mutation(
        "replay-settings-after-restart",
        EPISODE,
        "attempt.ready_at is not None or seed_passed(attempt.seed_stage, SeedStage.REPLAY)",
        "False",
        "after a restart, jobs run without the replayed image's USER, WORKDIR and ENV",
    ),
    Mutation(
        "replayed-workdir",
        "runtime/replay_runner.py",
        "cwd=spec.cwd if spec.cwd is not None else self.settings.workdir,",
        "cwd=spec.cwd,",
        "jobs after a replay run outside the Dockerfile's WORKDIR",
    ),
    Mutation(
        "replayed-user",
        "runtime/replay_runner.py",
        "user=spec.user if spec.user is not None else self.settings.user,",
        "user=spec.user,",
        "jobs after a replay run as root, not as the Dockerfile's USER",
    ),
    Mutation(
        "replay-past-its-bound",
        "runtime/replay_runner.py",
        '            if seen.phase == "unknown":\n',
        "            if True:\n",
        "a restart after replay's bound times out steps that ran in time",
    ),
    Mutation(
        "environment-files",
        "runtime/seed.py",
        "        await sandbox.upload(folder_tar(seed.files, folder), sandbox.workdir)\n",
        "        pass\n",
        "environment/ is not copied into the working directory of a docker_image task",
    ),
    Mutation(
        "entrypoint-unstartable",
        "runtime/seed.py",
        "    check_started(Call.START_ENTRYPOINT, state)\n",
        "",
        "an ENTRYPOINT that cannot start goes unnoticed",
    ),
    Mutation(
        "failed-build-retried",
        "runtime/seed.py",
        'raise EpisodeEnds("TerminalFailure", FAILURE_ENVIRONMENT_BUILD, f"{source.dockerfile}: {outcome.message}")',
        'raise Outage("image_build", outcome.message)',
        "a Dockerfile that fails to build is retried as an outage",
    ),
    Mutation(
        "waiting-status-every-poll",
        EPISODE,
        "if waiting and current is not None and (current.reason, current.message) == (reason, message):",
        "if False:",
        "the status is written again each time a waiting pod says the same",
    ),
    Mutation(
        "waiting-event-every-change",
        EPISODE,
        "        if not repeated:\n",
        "        if True:\n",
        "a waiting pod posts an Event at every change of message, not one per reason",
    ),
    Mutation(
        "fatal-dockerfile-built",
        "taskfolder/replay_plan.py",
        "needs_build = bool(problems) and len(planner.build_only) == len(problems)",
        "needs_build = bool(problems)",
        "a Dockerfile no build would take (syntax error, ../../etc/passwd) goes to a build",
    ),
    Mutation(
        "verifier-image-unmirrored",
        "runtime/sandbox_images.py",
        'else turn.model_copy(update={"verifier": turn.verifier.model_copy(update={"image": image.image})})',
        "else turn",
        "a separate verifier runs its image unmirrored, or not the one decided for it",
    ),
    Mutation(
        "no-verifier-reservation",
        "kube/objects/pods.py",
        "            *([_reservation_container(pod, spec)] if pod.reservation else []),\n",
        "",
        "the agent pod holds no capacity for its verifiers: they can deadlock",
    ),
    Mutation(
        "verifier-requests-kept",
        "kube/objects/pods.py",
        "    released_requests = pod.node_name is not None\n",
        "    released_requests = False\n",
        "a verifier on the agent's node asks again for the capacity reserved for it",
    ),
    Mutation(
        "cpu-fraction-limits",
        "kube/objects/pods.py",
        '        resources = {"requests": asked, "limits": dict(limits)}\n',
        '        resources = {"requests": asked, "limits": dict(asked)}\n',
        "a CPU request fraction cuts the sandbox's CPU limit too: tasks lose the CPUs they ask for",
    ),
    Mutation(
        "pool-claim-unguarded",
        "kube/objects/warm_pool_plan.py",
        '        {"op": "test", "path": "/metadata/resourceVersion", "value": metadata["resourceVersion"]},\n'
        '        {"op": "replace", "path": "/metadata/labels",',
        '        {"op": "replace", "path": "/metadata/labels",',
        "a pool pod's claim is not tested against the version checked: two attempts claim one pod",
    ),
    Mutation(
        "pool-exec-unnoticed",
        "kube/objects/warm_pool_plan.py",
        "    if not 0 < taken <= mark.stride + mark.stride // 2:\n",
        "    if not 0 < taken:\n",
        "a pool pod someone exec'd into since its mark is handed to an attempt",
    ),
    Mutation(
        "pool-touch-unnoticed",
        "kube/objects/warm_pool_plan.py",
        'if entry.get("manager") != FIELD_MANAGER and not _status_only(entry)',
        'if entry.get("manager") is None',
        "a pool pod someone labelled or patched by hand stays claimable",
    ),
    Mutation(
        "pool-key-image-only",
        "kube/objects/warm_pool_plan.py",
        '    canonical = json.dumps(manifest["spec"], sort_keys=True, separators=(",", ":"))\n',
        '    canonical = json.dumps(manifest["spec"]["containers"][0]["image"])\n',
        "an attempt of other resources, env or workdir claims a pool pod of the same image",
    ),
    Mutation(
        "prepull-task-images-missed",
        "kube/prepull.py",
        "        images += _pulled(admission.images)\n",
        "        images += []\n",
        "pre-pull reads the task folders but pulls none of their own images (docker_image, a Dockerfile's FROM)",
    ),
    Mutation(
        "prepull-failing-pull-holds",
        "kube/objects/prepull_plan.py",
        "    return any(not (row.of and row.nodes >= row.of) and not failing(row) for row in status.images)\n",
        "    return any(not (row.of and row.nodes >= row.of) for row in status.images)\n",
        "an image that cannot be pulled holds the children back until prePull.waitSec is over",
    ),
    Mutation(
        "prepull-affinity-required",
        "kube/objects/prepull_plan.py",
        '    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [\n',
        '    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = [\n',
        "a child's pod may only run where its images are: a set stalls while no node has them",
    ),
    Mutation(
        "pool-placed-before-probe",
        "kube/objects/warm_pool_plan.py",
        """    return ("sh", "-c", f"{PROBE[2]}\\necho '{PLACED_AFTER}'\\n{script}", *args)""",
        """    return ("sh", "-c", f"mkdir -p \\"$1/jobs\\"; {PROBE[2]}\\necho '{PLACED_AFTER}'\\n{script}", *args)""",
        "the claimer's probe reads the PIDs after the placement forked: an untouched pool pod reads as exec'd into",
    ),
    Mutation(
        "cpu-fraction-ignored",
        "kube/objects/pods.py",
        '            asked["cpu"] = requests.cpu(environment.cpus)\n',
        "",
        "--cpu-request-fraction is ignored: sandbox pods request their whole CPU limit",
    ),
    Mutation(
        "progress-as-a-reason",
        "kube/objects/pod_state.py",
        'latest.get("reason") not in EXPLAINING_EVENTS:\n        return None\n',
        'latest.get("reason") not in EXPLAINING_EVENTS:\n        pass\n',
        "a pod that waits is said to wait because it was Scheduled",
    ),
    # Replicas and the data API.
    Mutation(
        "store-asyncio-futures",
        "runtime/episode_store.py",
        "        await asyncio.to_thread(obstore.put, self.store, key, data)\n",
        "        await obstore.put_async(self.store, key, data)\n",
        "the store hands obstore asyncio futures again: a CLI reading --data-dir may abort at exit",
    ),
    Mutation(
        "leaving-mark-dropped",
        "kube/replicas.py",
        "        if self._leaving:\n            annotations",
        "        if False:\n            annotations",
        "a replica's renewal erases its leaving mark: replicas stopping together all leave the data API registered",
    ),
    Mutation(
        "own-certificate-per-replica",
        "kube/data_api_registration.py",
        "            continue  # another replica stored one a moment ago: serve that one\n",
        "            pass\n",
        "a replica losing the race to store the certificate serves its own, which the APIService does not trust",
    ),
    # A reward nobody can forge or lose (issue 23).
    Mutation(
        "job-ids-unkeyed",
        EPISODE,
        "return KeyedSandbox(sandbox, key) if key else sandbox",
        "return sandbox",
        "an agent that plants the verifier's job record under its predictable id pre-empts test.sh",
    ),
    Mutation(
        "lost-pod-made-again",
        EPISODE,
        "if recorded is not None or not sandbox.uid:\n            return False",
        "if True:\n            return False",
        "a pod lost while the operator was away is made again and the attempt's later turns graded in it",
    ),
    Mutation(
        "next-attempt-after-back-off",
        EPISODE,
        "        elif self._attempt.finished_at is not None and self._attempt.reason is not None:\n",
        "        elif False:\n",
        "a runner that died in an older runner's back-off resumes the lost attempt in a new pod",
    ),
    Mutation(
        "ending-written-after-release",
        EPISODE,
        '        await self.publish()\n        self.status.phase = "Succeeded" if success else "Failed"\n',
        '        self.status.phase = "Succeeded" if success else "Failed"\n',
        "a runner killed while it deleted a finished episode's pods runs its turns again in a second attempt",
    ),
    Mutation(
        "recorded-ending-not-repeated",
        EPISODE,
        "        if self.status.outcome is not None:\n",
        "        if False:\n",
        "a runner killed while it deleted a failed episode's pods runs turn 1's setup again in a second attempt",
    ),
    Mutation(
        "watch-404-fatal",
        "handlers.py",
        "    watching.continuous_watch = _watch_through_not_found\n",
        "    pass\n",
        "a watch the restarting API server answers 404 stops the operator",
    ),
    Mutation(
        "hostname-allowlist-admitted",
        "taskfolder/plan.py",
        "    problems.extend(hostname_refusals(plan))\n",
        "",
        "an allowlist naming a hostname runs under a policy that blocks the host it names",
    ),
    Mutation(
        "back-off-not-waited",
        EPISODE,
        "await self.sleep(max(parse_timestamp(attempt.not_before) - self.clock(), 0.0))",
        "pass",
        "the next attempt after an outage starts at once, without its back-off",
    ),
    Mutation(
        "lost-pod-created-again",
        "kube/pod_sandbox.py",
        "                    if recorded is not None:\n                        raise SandboxError(",
        "                    if False:\n                        raise SandboxError(",
        "the kube provider makes a recorded pod that is gone again under its name",
    ),
    Mutation(
        "replaced-pod-adopted",
        "kube/pod_sandbox.py",
        "if recorded is not None and uid != recorded:",
        "if False:",
        "a pod deleted and made again under the attempt's pod's name is taken for it",
    ),
    Mutation(
        "verifier-folders-unsealed",
        VERIFY,
        'SEALED_TESTS = sealed(f"{TESTS}/")\nSEALED_REWARDS = sealed(f"{LOGS_VERIFIER}/", JOB_USER)',
        'SEALED_TESTS = f"{TESTS}/"\nSEALED_REWARDS = f"{LOGS_VERIFIER}/"',
        "a non-root agent's leftover processes rename their own test.sh in, or rewrite the reward, as test.sh runs",
    ),
    Mutation(
        "supervisor-folder-world-writable",
        "runtime/supervisor.sh",
        'chmod 0755 "$BASE" && chmod 0700 "$JOBS"',
        'chmod 0777 "$BASE" && chmod 0777 "$JOBS"',
        "a non-root agent creates the verifier's job record in the supervisor's folder",
    ),
    Mutation(
        "seal-after-emptying",
        "runtime/supervisor.sh",
        '    { chown 0:0 "$_q" && chmod "$1" "$_q"; } || die "clear: cannot seal $_q"\n'
        '    empty_dir "$_q" || die "clear: cannot empty $_q"\n',
        '    empty_dir "$_q" || die "clear: cannot empty $_q"\n',
        "a sealed folder keeps the agent's ownership and mode: its processes write into it while test.sh runs",
    ),
    # The capture proxy against the agent beside it (issue 23).
    Mutation(
        "capture-system-resolver",
        "capture/proxy.py",
        "                resolver=PinnedResolver(self.config.hostname, self.config.upstream_addresses),\n",
        "",
        "the proxy resolves the model's hostname through the pod's /etc/hosts: the agent receives the key",
    ),
    Mutation(
        "capture-redirect-followed",
        "capture/proxy.py",
        "                    allow_redirects=False,\n",
        "                    allow_redirects=True,\n",
        "the proxy follows the upstream's redirect wherever it points",
    ),
    Mutation(
        "capture-any-route",
        "capture/proxy.py",
        "        if isinstance(route, Refused):\n            # Not read",
        "        if False:\n            # Not read",
        "the key goes with any method and path the agent sends (/v1/files, /v1/../admin)",
    ),
    Mutation(
        "capture-decoded-route",
        "capture/proxy.py",
        "route = route_of(request.method, request.raw_path, self.base_path)",
        "route = route_of(request.method, request.path, self.base_path)",
        "a percent-encoded path is checked decoded and forwarded encoded (/v1/chat%2Fcompletions)",
    ),
    Mutation(
        "capture-record-unbounded",
        "capture/proxy.py",
        "        room = self.max_record_bytes - len(self.body)\n",
        "        room = len(chunk)\n",
        "a huge answer is recorded whole",
    ),
    Mutation(
        "capture-journal-unbounded",
        "capture/proxy.py",
        "        if self.writer.full(attempt):\n",
        "        if False:\n",
        "an attempt's journal grows without bound",
    ),
    Mutation(
        "capture-refusal-as-auth",
        "capture/proxy.py",
        'NOT_A_ROUTE = Failure(403, "client_error", ROUTE_REFUSED)',
        'NOT_A_ROUTE = Failure(403, "auth", ROUTE_REFUSED)',
        "an agent that calls /v1/files ends its episode ungraded as a refused key instead of measured",
    ),
    Mutation(
        "capture-address-unpinned",
        "kube/upstream.py",
        "    return replace(needs, capture=replace(needs.capture, upstream_addresses=addresses, bounds=bounds))\n",
        "    return needs\n",
        "the agent pod's proxy gets no pinned address (or the operator's bounds): it cannot reach a named upstream",
    ),
    Mutation(
        "capture-service-unread",
        "kube/upstream.py",
        "    service = service_of(upstream.host, namespace)\n",
        "    service = None\n",
        "a model endpoint named by its Service needs DNS, which pods and a local operator may lack",
    ),
    Mutation(
        "capture-missing-service-asks-dns",
        "kube/upstream.py",
        "            if service.explicit:\n",
        "            if False:\n",
        "a ….svc name whose Service does not exist is looked up in DNS, which cannot know it either",
    ),
    Mutation(
        "capture-container-unbounded",
        "kube/objects/pods.py",
        '        "resources": {"requests": dict(capture.bounds.requests), "limits": dict(capture.bounds.limits)},\n',
        "",
        "the capture container has no requests or limits",
    ),
    Mutation(
        "capture-limit-ignored",
        "runtime/turn/agent.py",
        "        if any(call.local_response_reason == CAPTURE_LIMIT for call in calls):\n",
        "        if False:\n",
        "a turn whose calls outgrew the capture journal is verified as if all were recorded",
    ),
    # Token ids on every model API, and carried back on the next call (issue 24).
    Mutation(
        "capture-tokens-chat-only",
        "capture/proxy.py",
        "            if parsed is not None and self.token_ids:  # kept when asked for",
        '            if parsed is not None and self.token_ids and call.dialect == "chat":  # kept when asked for',
        "a Responses or Messages call's token ids are dropped",
    ),
    Mutation(
        "capture-tokens-kept-unasked",
        "capture/proxy.py",
        "            if parsed is not None and self.token_ids:  # kept when asked for",
        "            if parsed is not None:  # kept when asked for",
        "token ids the agent asked for itself are kept though the Episode did not ask (capture.tokenIds off)",
    ),
    Mutation(
        "capture-responses-tokens-unasked",
        "capture/wire.py",
        '    "responses": {"top_logprobs": 0, "enable_response_messages": True},\n',
        '    "responses": {},\n',
        "a Responses call never asks vLLM for its token ids",
    ),
    Mutation(
        "capture-include-replaced",
        "capture/wire.py",
        "            rewritten[name] = [*present, *(value for value in values if value not in present)]\n",
        "            rewritten[name] = list(values)\n",
        "asking for logprobs drops what the harness asked a Responses call to include (codex's encrypted reasoning)",
    ),
    Mutation(
        "capture-responses-raw-tokens-unread",
        "capture/records.py",
        '    prompts, generated = _raw_tokens(response.get("input_messages")), '
        '_raw_tokens(response.get("output_messages"))',
        "    prompts, generated = [], []",
        "the token ids vLLM gives a Responses call (its raw token messages) are not kept",
    ),
    Mutation(
        "capture-responses-gym-bundle-unread",
        "capture/records.py",
        "    if bundles:\n        return bundles[-1]\n",
        "    if False:\n        return bundles[-1]\n",
        "the token ids on a Gym-style Responses answer's last item are not kept",
    ),
    Mutation(
        "capture-messages-stream-tokens-dropped",
        "capture/sse.py",
        "            tokens.update((field, event[field]) for field in TOKEN_FIELDS if field in event)\n",
        "",
        "a streamed Messages answer loses its generation's token ids",
    ),
    Mutation(
        "capture-correction-off",
        "capture/proxy.py",
        "            sent, carried = self.answers.carry(dialect, sent)\n",
        "            _, carried = self.answers.carry(dialect, sent)\n",
        "the next call goes upstream without the earlier answer's token ids: no on-policy correction",
    ),
    Mutation(
        "capture-correction-recorded-inline",
        "capture/proxy.py",
        "exchange.keep_request(data if recorded is sent else json.dumps(recorded).encode(), recorded)",
        "exchange.keep_request(data, sent)",
        "each record holds every earlier answer's token ids again: records grow with the square of the conversation",
    ),
    Mutation(
        "capture-correction-overwrites-client",
        "capture/correction.py",
        "            if isinstance(holder, dict) and not any(field in holder for field in TOKEN_FIELDS):\n",
        "            if isinstance(holder, dict):\n",
        "token ids the client sent on its own history are replaced",
    ),
    Mutation(
        "capture-correction-partial-bundle",
        "capture/records.py",
        "            and len(self.generation_token_ids) == len(self.generation_log_probs)\n",
        "",
        "a token bundle with fewer log-probabilities than tokens is carried, which Gym refuses",
    ),
    Mutation(
        "capture-correction-unbounded",
        "capture/correction.py",
        "        while self.held > self.max_tokens and self._answers:\n",
        "        while False:\n",
        "the proxy's memory of answers' token ids grows without bound",
    ),
    Mutation(
        "capture-correction-any-conversation",
        "capture/correction.py",
        "        digests.append(digest.copy().hexdigest())\n",
        "        digests.append(hashlib.sha256(json.dumps(entry.key()).encode()).hexdigest())\n",
        "an answer's token ids are carried after another conversation that ends in the same words",
    ),
    Mutation(
        "capture-correction-first-item",
        "capture/conversation.py",
        "        if isinstance(item, Mapping) and (entry := _responses_item(entries, item)) is not None:\n"
        "            entry.at = index\n",
        "        if isinstance(item, Mapping) and (entry := _responses_item(entries, item)) is not None:\n"
        "            entry.at = index if entry.at is None else entry.at\n",
        "a Responses answer's token ids go on its first item, not its last where Gym puts them",
    ),
    Mutation(
        "agent-env-on-the-container",
        "kube/objects/pods.py",
        'main["env"] += pod_entries(spec.agent.env)',
        'main["env"] += spec.agent.env',
        "the agent's secrets are on the main container: setup.sh, the ENTRYPOINT and test.sh inherit them",
    ),
    Mutation(
        "agent-env-not-given",
        "runtime/agents/base.py",
        "    return replace(spec, env={**agent_env, **spec.env}, private=True)",
        "    return spec",
        "the agent's own env/envFrom never reach it",
    ),
    Mutation(
        "agent-env-in-the-url",
        "runtime/supervisor.py",
        "    if private or sum(len(arg) for arg in encoded) > ARGV_STDIN_THRESHOLD:",
        "    if sum(len(arg) for arg in encoded) > ARGV_STDIN_THRESHOLD:",
        "the agent's secrets travel in the exec's URL (the API server's logs, the process's command line)",
    ),
    Mutation(
        "agent-outage-scored-before-it-acted",
        EPISODE,
        "record.stage is not None and order.index(record.stage) >= order.index(Stage.AGENT)",
        "record.stage is not None",
        "an outage no agent could have caused (none acted yet) is scored a measured 0 instead of retried",
    ),
    Mutation(
        "agent-outage-never-scored",
        EPISODE,
        '        if self.config.retries.agent_outages != "score" or outage.kind not in AGENT_CAUSABLE_OUTAGES:',
        "        if True:",
        "spec.retries.agentOutages: score is ignored: an agent that breaks its sandbox buys a retry",
    ),
    Mutation(
        "ungraded-dropped-from-pass-at-k",
        "runtime/evaluation.py",
        "    samples = len(rewards) + ungraded\n",
        "    samples = len(rewards)\n",
        "pass@k drops Ungraded attempts silently: a task whose attempts keep failing flatters the table",
    ),
    Mutation(
        "layout-not-made",
        "kube/pod_sandbox.py",
        "self.placed(await self._small(supervisor.placement(layout=layout, limits=self.limits)))",
        "self.placed(await self._small(supervisor.placement(limits=self.limits)))",
        "/logs/verifier is missing while the agent runs: a Harbor solution that looks for it takes its failure branch",
    ),
    # Compose volumes on main (issue 29.2): tests/unit/test_compose_volumes.py, test_pod_verdict.py.
    Mutation(
        "main-volumes-ignored",
        "taskfolder/compose.py",
        'main_volumes = self.volumes(service.get("volumes"), f"{key}.volumes", name)',
        "main_volumes = []",
        "main's compose volumes are dropped: its ENTRYPOINT finds no /startup to write into",
    ),
    Mutation(
        "main-volumes-unmounted",
        "kube/objects/pods.py",
        '"volumeMounts": [{"name": SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR}, *_compose_mounts(pod.volumes)],',
        '"volumeMounts": [{"name": SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR}],',
        "main's volumes are read but not mounted in the main container: nothing it writes there reaches a sidecar",
    ),
    Mutation(
        "volume-image-content-lost",
        "kube/objects/pods.py",
        'if [ "$fill" != new ] && [ -d "$image_path" ]; then',
        "if false; then",
        "a new volume hides what the image had at its path, which Docker copies into it",
    ),
    Mutation(
        "volume-owner-not-copied",
        "kube/objects/pods.py",
        'cp -a "$image_path/." "$seen/"',
        'cp -R "$image_path/." "$seen/"',
        "a volume filled from the image is root's, not its files' and folder's owners' as in Docker",
    ),
    Mutation(
        "volume-layout-mode",
        "kube/objects/pods.py",
        'mode = "0777" if volume.mount_path in ENSURED_DIRS[pod.role] else "-"',
        'mode = "-"',
        "a volume at /logs/artifacts is not 0777 as Harbor's ensure_dirs leaves it: a non-root agent cannot write",
    ),
    Mutation(
        "bind-files-missing",
        "kube/objects/pods.py",
        'tar -x -f "$archive" -C "$environment"',
        "true",
        "a bind of environment/ files mounts an empty folder",
    ),
    Mutation(
        "bind-subpath-dropped",
        "kube/objects/pods.py",
        'mount["subPath"] = _bound_path(volume)',
        "pass",
        "every bind mounts the whole of environment/, not the path it names",
    ),
    Mutation(
        "binds-volume-name-clash",
        "kube/objects/pods.py",
        'ENVIRONMENT_VOLUME = "episode-operator-binds"',
        'ENVIRONMENT_VOLUME = "compose-environment"',
        "a task naming a volume `environment` beside a bind gets a pod the API server refuses (two volumes, one name)",
    ),
    Mutation(
        "bind-leaves-environment",
        "taskfolder/compose.py",
        'if path != ENVIRONMENT and not path.startswith(f"{ENVIRONMENT}/"):',
        "if False:",
        "a bind of ../tests or ../solution puts the grading files in the agent's sandbox",
    ),
    Mutation(
        "volume-over-sealed-folders",
        "runtime/admission.py",
        "*validation.task.compose.mount_refusals(RESERVED_IN_EVERY_CONTAINER, RESERVED_IN_MAIN),",
        "",
        "a volume at /logs/verifier, shared with a sidecar, outlives the seal: a reward can be written past it",
    ),
    Mutation(
        "volume-declaration-unchecked",
        "taskfolder/compose.py",
        "if settings.get(refused):",
        "if False:",
        "an external volume is taken for a fresh emptyDir, whose content the task did not mean",
    ),
    Mutation(
        "bound-files-config-map-unmade",
        "kube/pod_sandbox.py",
        "environment_files=await self._bound_files_config_map(),",
        "environment_files=None,",
        "the agent pod of a task with binds is never made: no ConfigMap brings their files",
    ),
    Mutation(
        "solution-world-writable",
        AGENTS,
        '(sealed(f"{SOLUTION}/"),)',
        '(f"{SOLUTION}/",)',
        "/solution is left 0777, not root's 0755 as Harbor's copy leaves it: any agent user can rewrite the solution",
    ),
    Mutation(
        "scripts-not-executable",
        "runtime/archive.py",
        "return mode | 0o111 if name == script else mode",
        "return mode",
        "solve.sh and test.sh keep a task's 0644, where Harbor makes them executable before running them",
    ),
    # A volume only sidecars name, filled from a sidecar's image with the operator's lent copier.
    Mutation(
        "sidecar-volume-not-filled",
        "kube/objects/pods.py",
        "sidecar_fillers = _sidecar_fillers(pod, spec, images)",
        "sidecar_fillers: list[dict[str, Any]] = []",
        "a volume only sidecars name starts empty and 0777: the sidecar finds none of its image's files there",
    ),
    Mutation(
        "sidecar-filler-not-root",
        "kube/objects/pods.py",
        '"securityContext": root,',
        '"securityContext": container_security(spec),',
        "a sidecar image's USER fills its volume: files of other owners are not copied, or not as theirs",
    ),
    Mutation(
        "volume-nocopy-ignored",
        "kube/objects/pods.py",
        '(True, False): "new",',
        '(True, False): "new-copy",',
        "a volume mounted `nocopy` first is filled from the image all the same, where Docker leaves it empty",
    ),
    # Seed once: a set's children build their Dockerfile once and every pod runs the build's digest.
    Mutation(
        "set-child-replays",
        "runtime/sandbox_images.py",
        """    (Takes.REPLAY, True, True): Making(
        "built",""",
        """    (Takes.REPLAY, True, True): Making(
        "replayed",""",
        "an EpisodeSet's attempts on an operator with a build registry replay the Dockerfile in every pod",
    ),
    Mutation(
        "built-image-by-tag",
        "kube/pod_sandbox.py",
        "return self._pins.get(image, image)",
        "return image",
        "pods run a built image by its tag: whoever pushes under it (an agent reaching the registry) changes "
        "what the next attempt starts from",
    ),
    Mutation(
        "pins-not-read-back-after-a-restart",
        EPISODE,
        "if attempt.ready_at is not None and self.images.builds() and not self._pins:",
        "if False:",
        "a runner restarted past the seed makes a later verifier's pod from the built image's tag",
    ),
    Mutation(
        "copier-missing-unrefused",
        "runtime/admission.py",
        "*([] if lends_copier else copier_refusals(validation.task.compose)),",
        "",
        "an operator without its own image admits a volume only sidecars name, and its agent pod is never made",
    ),
    # A separate verifier whose environment is Harbor's environment/: the compose file runs beside it.
    Mutation(
        "verifier-without-compose",
        "kube/pod_sandbox.py",
        "sidecars = self._pinned_sidecars(self.plan.sidecars) if plan.compose else []",
        "sidecars = []",
        "a separate verifier in environment/ runs without the task's services: a test.sh asking one fails",
    ),
    Mutation(
        "verifier-compose-whatever-its-environment",
        "taskfolder/plan.py",
        "compose = verifier_image_source(self.files, self.config, step).in_task_environment",
        "compose = True",
        "a verifier with an image of its own gets the task's services, which Harbor never runs there",
    ),
    Mutation(
        "verifier-compose-env-dropped",
        "kube/pod_sandbox.py",
        "env={**self.plan.compose_env, **plan.environment.env} if plan.compose else plan.environment.env,",
        "env=plan.environment.env,",
        "a verifier beside the services lacks the environment the compose file gives main",
    ),
    Mutation(
        "verifier-ensures-agent-layout",
        "kube/objects/pods.py",
        'ENSURED_DIRS = {"agent": SANDBOX_LAYOUT, "verifier": (LOGS_VERIFIER,)}',
        'ENSURED_DIRS = {"agent": SANDBOX_LAYOUT, "verifier": SANDBOX_LAYOUT}',
        "a verifier's volume at /logs/artifacts is made 0777, where Harbor's verifier environment leaves it",
    ),
    Mutation(
        "verifier-sidecars-unreserved",
        "kube/objects/pods.py",
        "asked += [sidecar_requests(sidecar.resources) for sidecar in sidecars]",
        "pass",
        "the agent pod reserves nothing for a verifier's services: the verifier on its node does not fit",
    ),
    Mutation(
        "verifier-own-compose-ignored",
        "runtime/sandbox_images.py",
        "planner.problems.append(Problem(own_compose, None, VERIFIER_OWN_COMPOSE.format(turn=turn.name)))",
        "pass",
        "a tests folder's docker-compose.yaml, Harbor's verifier services, is silently not run",
    ),
    Mutation(
        "init-failure-unexplained",
        "kube/objects/pod_state.py",
        'message = status.get("message") or (f"init {failed_init[0]}" if failed_init else "a container exited")',
        'message = status.get("message") or "a container exited"',
        "a pod whose volume filler failed says only 'a container exited'",
    ),
    # The Gym server's settings (runtime/gym_server.py): the Helm values' gym.settings, read at start.
    Mutation(
        "gym-settings-unknown-key-dropped",
        GYM_SERVER,
        '    model_config = ConfigDict(extra="forbid")\n',
        "",
        "a misspelled key of the Gym server's settings (modelServr) is dropped: what it meant is silently its default",
    ),
    Mutation(
        "gym-harbor-unknown-key-dropped",
        GYM_SERVER,
        'model_config = ConfigDict(extra="forbid", strict=True)',
        "model_config = ConfigDict(strict=True)",
        "a misspelled harbor setting of the Gym server (verifierGrace) is dropped: every try runs with the default",
    ),
    Mutation(
        "gym-harbor-lax-types",
        GYM_SERVER,
        'model_config = ConfigDict(extra="forbid", strict=True)',
        'model_config = ConfigDict(extra="forbid")',
        'a harbor setting of another type is coerced, not refused (the string "yes" is taken for true)',
    ),
    Mutation(
        "gym-harbor-settings-row-missing",
        GYM_SERVER,
        "for name, setting in HarborSettings.model_fields.items():",
        "for name, setting in list(HarborSettings.model_fields.items())[:-1]:",
        "a harbor setting has no row in the README's table of Helm values",
    ),
    Mutation(
        "gym-training-capture-unrouted",
        "runtime/gym_protocol.py",
        '{"evaluation": "", "training": "/training-token-capture"}',
        '{"evaluation": "", "training": ""}',
        "modelServerCapture: training sends the calls to Gym's evaluation capture: its training capture records "
        "nothing, and Gym masks a rollout whose row has no token ids",
    ),
    Mutation(
        "gym-training-capture-serverless",
        GYM_SERVER,
        'if self.model_server_capture != "evaluation" and self.model_server is None:',
        "if False:",
        "modelServerCapture: training without modelServer is taken: the calls reach no capture of Gym's, silently",
    ),
    Mutation(
        "sampling-params-unchecked",
        "api/episode_resource.py",
        "        unknown = sorted(set(params) - SAMPLING_PARAMS[api])\n",
        "        unknown: list[str] = []\n",
        "spec.agent.model.params takes any key: top_k reaches a Responses endpoint, model overrides the request",
    ),
    Mutation(
        "agent-outcome-policy-ignored",
        "runtime/agents/agent_failures.py",
        "outcome = policy.get(failure, DEFAULT_AGENT_OUTCOMES[failure])",
        "outcome = DEFAULT_AGENT_OUTCOMES[failure]",
        "spec.harbor.agentOutcomePolicy is ignored: every agent failure does what the seed's table says",
    ),
    Mutation(
        "agent-outcome-policy-unnamed-measured",
        "runtime/agents/agent_failures.py",
        "outcome = policy.get(failure, DEFAULT_AGENT_OUTCOMES[failure])",
        'outcome = policy.get(failure, "measure")',
        "a failure the policy does not name is measured, not given its default (a 429 is graded, not retried)",
    ),  # Reruns of an EpisodeSet (issue 28; runtime/rerun_plan.py).
    Mutation(
        "rerun-rerolls-verdicts",
        "runtime/rerun_plan.py",
        "if not is_terminal(record.phase) or record.outcome not in RERUNNABLE:",
        "if not is_terminal(record.phase):",
        "a rerun naming a failure kind re-runs Graded children too: re-rolled verdicts inflate pass@k",
    ),
    Mutation(
        "rerun-applied-every-pass",
        "runtime/rerun_plan.py",
        "if rerun is None or rerun.generation <= previous.rerun_generation:",
        "if rerun is None:",
        "a rerun generation is applied again at every pass: children re-run over and over",
    ),
    Mutation(
        "rerun-replaced-child-counted",
        "runtime/evaluation.py",
        "        if child.rerun >= expected:\n",
        "        if True:\n",
        "the child a rerun replaced still counts: its outage stays in the set's counts and pass@k",
    ),
    Mutation(
        "rerun-reopens-a-redefined-set",
        "runtime/rerun_plan.py",
        '"DefinitionChanged": False,',
        '"DefinitionChanged": True,',
        "a rerun reopens a set stopped because its definition changed: children of another definition start",
    ),
    Mutation(
        "rerun-policy-unchecked",
        "runtime/rerun_plan.py",
        "    if policy_stops is not None:\n",
        "    if False:\n",
        "a rerun reopens a set its failure policy stops again at once: the replaced children never re-run",
    ),
    Mutation(
        "rerun-finished-set-not-respawned",
        "handlers.py",
        'return not (status.get("completionTime") if status else None) or rerun_requested(spec, status)',
        'return not (status.get("completionTime") if status else None)',
        "a rerun asked of a finished set is never applied: its loop is not spawned again",
    ),
    Mutation(
        "rerun-export-keeps-replaced",
        "kube/objects/children.py",
        'return f"{set_selector(set_name)},!{SET_REPLACED_LABEL}"',
        "return set_selector(set_name)",
        "export --set writes the rows of children a rerun replaced beside those that replaced them",
    ),
    # Regrades (issue 28; runtime/regrade.py).
    Mutation(
        "regrade-shared-turn-admitted",
        "runtime/regrade.py",
        "    if shared:\n        raise RegradeRefused(",
        "    if False:\n        raise RegradeRefused(",
        "a turn verified in the agent's own (gone) sandbox is regraded in a fresh pod without what the agent left",
    ),
    Mutation(
        "regrade-ungraded-admitted",
        "runtime/regrade.py",
        '    "Ungraded": "its outages used up its retries',
        '    "Ungraded": None and "its outages used up its retries',
        "a run without a verdict (outages used up) is regraded into one from a partial attempt",
    ),
    Mutation(
        "regrade-runs-the-agent",
        "runtime/regrade.py",
        "        return Stage.VERIFY_PREPARE\n",
        "        return Stage.CLEANUP\n",
        "a regrade's turns start at their cleanup: the agent runs again",
    ),
    Mutation(
        "regrade-verifies-its-own-artifacts",
        "runtime/regrade.py",
        "return await self.original.artifact_archives(self.attempt, turn)",
        "return await self.own.artifact_archives(attempt, turn)",
        "a regrade's verifier receives none of the original's artifacts",
    ),
    Mutation(
        "regrade-past-the-original-stop",
        "runtime/regrade.py",
        '        if action == "skipped":\n',
        '        if action == "skipped":\n            return False\n',
        "new verdicts that pass a gate the original missed are rolled up as if the turns after it had run",
    ),
    Mutation(
        "regrade-artifacts-unchecked",
        "kube/regrade_driver.py",
        "    if missing:\n",
        "    if False:\n",
        "a regrade of a run whose artifacts the store no longer holds verifies empty sandboxes",
    ),
    Mutation(
        "regrade-keeps-the-old-tests",
        "taskfolder/retest.py",
        "files = {path: entry for path, entry in task.items() if not is_tests_path(path)} | dict(new.items())",
        "files = dict(new.items()) | dict(task.items())",
        "regrade --tests DIR verifies with the original's tests, the new ones ignored where both have a file",
    ),
    Mutation(
        "regrade-exported",
        "cli/episodes.py",
        'episodes = [episode for episode in episodes if not (episode.get("spec") or {}).get("regrade")]',
        "episodes = list(episodes)",
        "export writes a regrade as a second rollout of the run it regraded",
    ),
    # Datasets by name (issue 28; taskfolder/registry.py).
    Mutation(
        "registry-path-leaves-checkout",
        "taskfolder/registry.py",
        "        if not _inside(folder, base.resolve()):\n",
        "        if False:\n",
        "a registry's task path ../ or a symlink out of its checkout packs a folder from elsewhere on the machine",
    ),
    Mutation(
        "registry-commit-unchecked",
        "taskfolder/registry.py",
        "if commit and checkout.head != commit:",
        "if False:",
        "a task the registry pins to a commit is packed from a checkout at another one",
    ),
    Mutation(
        "registry-any-checkout",
        "taskfolder/registry.py",
        "checkout = next((each for each in root.checkouts if each.serves(task.git_url)), None)",
        "checkout = next(iter(root.checkouts), None)",
        "a task of one Git repository is looked for in the checkout of another",
    ),
    Mutation(
        "registry-duplicate-version-first",
        "taskfolder/registry.py",
        "    if len(chosen) > 1:\n",
        "    if False:\n",
        "a name@version listed twice in registry.json evaluates the first silently",
    ),
    Mutation(
        "registry-description-optional",
        "taskfolder/registry.py",
        "    description: str\n",
        '    description: str = ""\n',
        "a registry.json Harbor refuses (a dataset without description) is taken here",
    ),
    # Terminus-2 (issue 25; docs/harnesses.md, "terminus-2").
    Mutation(
        "terminus-2-no-provider",
        HARNESSES,
        'f"--model=openai/{run.model}",\n            f"--api-base={run.base_url}",',
        'f"--model={run.model}",\n            f"--api-base={run.base_url}",',
        "terminus-2 names the model without litellm's provider: litellm refuses every call (no provider for it)",
    ),
    Mutation(
        "terminus-2-logs-over-capture",
        HARNESSES,
        'f"--logs-dir={LOGS}/terminus-2",',
        'f"--logs-dir={LOGS}",',
        "Terminus-2 writes its own trajectory.json where the turn's trajectory (the capture's) belongs",
    ),
    Mutation(
        "terminus-2-cost-map-online",
        HARNESSES,
        '            "OPENAI_API_KEY": run.api_key,\n'
        "            # Offline: litellm reads its cost map from the package, not the internet.\n"
        '            "LITELLM_LOCAL_MODEL_COST_MAP": "true",\n',
        '            "OPENAI_API_KEY": run.api_key,\n',
        "terminus-2's litellm reaches for its cost map on the internet at start, where the sandbox has no network",
    ),
    # The harness presets' own commands (docs/harnesses.md, "The harnesses").
    Mutation(
        "qwen-code-settings-unread",
        "runtime/agents/harnesses.py",
        '            "QWEN_CODE_SYSTEM_SETTINGS_PATH": f"{run.toolchain.path}/share/qwen-code/system-settings.json",\n',
        "",
        "qwen-code ignores the tree's settings: it resolves its usage statistics' host, makes memory calls of its own",
    ),
    Mutation(
        "qwen-code-prompt-positional",
        "runtime/agents/harnesses.py",
        '            # is not read: qwen then waits for stdin).\n            f"--prompt={INSTRUCTION}",\n',
        '            # is not read: qwen then waits for stdin).\n            "--",\n            INSTRUCTION,\n',
        "qwen-code gets its instruction after `--`, which it does not read: it waits for stdin and exits 1",
    ),
    Mutation(
        "qwen-code-state-in-home",
        "runtime/agents/harnesses.py",
        '            "QWEN_HOME": f"{LOGS}/qwen-code",\n',
        "",
        "qwen-code keeps its chats in the agent's home, not under /logs/agent: not kept for the next turn",
    ),
    Mutation(
        "harness-run-api-dropped",
        "runtime/agents/harnesses.py",
        "PLACEHOLDER_KEY, continue_session, model.api)",
        'PLACEHOLDER_KEY, continue_session, "chat-completions")',
        "a harness of several APIs (pi) speaks chat completions whatever spec.agent.model.api says",
    ),
    Mutation(
        "pi-api-ignored",
        "runtime/agents/harnesses.py",
        '        "api": PI_APIS[run.api],\n',
        '        "api": "openai-completions",\n',
        "pi's models.json names chat completions whatever API the run speaks",
    ),
    Mutation(
        "pi-messages-base-url-versioned",
        "runtime/agents/harnesses.py",
        '    base_url = run.base_url.removesuffix("/v1") if run.api == "messages" else run.base_url\n',
        "    base_url = run.base_url\n",
        "pi sends its Messages calls to .../v1/v1/messages, a path no Anthropic endpoint serves",
    ),
    Mutation(
        "pi-state-in-home",
        "runtime/agents/harnesses.py",
        '            "PI_CODING_AGENT_DIR": f"{LOGS}/pi",\n',
        "",
        "pi has no directory for its models.json: the launcher refuses to start it",
    ),
    # kimi-cli's and aider's presets (issue 25; docs/harnesses.md, "kimi-cli", "aider").
    Mutation(
        "kimi-key-in-argv",
        "runtime/agents/harnesses.py",
        '    provider = {"type": "openai_legacy", "base_url": run.base_url, "api_key": ""}\n',
        '    provider = {"type": "openai_legacy", "base_url": run.base_url, "api_key": run.api_key}\n',
        "kimi-cli's key is in its --config argument, where any command of the agent's reads it (ps)",
    ),
    Mutation(
        "kimi-telemetry-on",
        "runtime/agents/harnesses.py",
        '            "telemetry": False,\n',
        '            "telemetry": True,\n',
        "kimi-cli posts its telemetry to its vendor from a sandbox that may reach only the model",
    ),
    Mutation(
        "kimi-rate-limit-unavailable",
        "runtime/agents/harnesses.py",
        '(re.compile(r"^Error code: 429\\b", re.M), "model_rate_limit"),',
        '(re.compile(r"^Error code: 429\\b", re.M), "model_unavailable"),',
        "kimi-cli rate-limited to its end, its calls unrecorded, is called an unavailable endpoint",
    ),
    Mutation(
        "aider-analytics-on",
        "runtime/agents/harnesses.py",
        '            "--no-analytics",\n',
        "",
        "aider asks to collect analytics and, said yes, posts them to PostHog",
    ),
    Mutation(
        "aider-rate-limit-unread",
        "runtime/agents/harnesses.py",
        '    (re.compile(r"^litellm\\.RateLimitError:", re.M), "model_rate_limit"),\n',
        "",
        "aider ended at its budget while retrying a rate-limited endpoint, its calls unrecorded, is a timeout",
    ),
    # cline (npm) and Hermes (PyPI).
    Mutation(
        "cline-feature-flags-fetched",
        HARNESSES,
        '            "E2E_TEST": "true",\n',
        "",
        "cline creates its PostHog feature-flag client and resolves its vendor's host from the sandbox",
    ),
    Mutation(
        "cline-base-url-unwritten",
        HARNESSES,
        '        "settings": {"provider": provider, "model": run.model, "baseUrl": run.base_url},\n',
        '        "settings": {"provider": provider, "model": run.model},\n',
        "cline sends its calls to its provider's own host, not the capture proxy: nothing is captured",
    ),
    Mutation(
        "cline-key-in-providers-file",
        HARNESSES,
        '        "tokenSource": "manual",\n',
        '        "tokenSource": "manual",\n        "apiKey": run.api_key,\n',
        "cline's key is written to a file under /logs/agent, kept with the Episode's logs",
    ),
    Mutation(
        "cline-auth-unread",
        HARNESSES,
        '"errorClass":"auth"',
        '"errorClass":"authz"',
        "cline's refused key, its call unrecorded, is called an exit of the agent, not the key's failure",
    ),
    Mutation(
        "hermes-managed-scope-unread",
        HARNESSES,
        '        "HERMES_MANAGED_DIR": f"{run.toolchain.path}/share/hermes",\n',
        "",
        "Hermes downloads tirith from GitHub, probes the proxy as an Ollama server and makes memory calls of its own",
    ),
    Mutation(
        "hermes-messages-base-url-versioned",
        HARNESSES,
        '        base_url: run.base_url.removesuffix("/v1") if run.api == "messages" else run.base_url,\n',
        "        base_url: run.base_url,\n",
        "Hermes sends its Messages calls to .../v1/v1/messages, a path no Anthropic endpoint serves",
    ),
    Mutation(
        "hermes-state-in-home",
        HARNESSES,
        '        "HERMES_HOME": f"{LOGS}/hermes",\n',
        "",
        "Hermes keeps its sessions in the agent's home, not under /logs/agent: --continue finds none next turn",
    ),
    Mutation(
        "hermes-retries-unread",
        HARNESSES,
        '    (re.compile(HERMES_RETRIED + r"HTTP 429\\b", re.M), "model_rate_limit"),\n',
        "",
        "Hermes rate-limited to its end, its calls unrecorded, is called an unavailable endpoint",
    ),
    # The results page of kubectl episode view (issue 28): what agents wrote never runs in a browser.
    Mutation(
        "view-unescaped",
        RESULTS_PAGE,
        "return Html(html.escape(str(value), quote=True))",
        "return Html(str(value))",
        "a model's answer, a log or an artifact name is put in the page as markup: its script tag is an element",
    ),
    Mutation(
        "view-attributes-unquoted",
        RESULTS_PAGE,
        "return Html(html.escape(str(value), quote=True))",
        "return Html(html.escape(str(value), quote=False))",
        'a quote in a name closes the attribute it is in: a task named x" onclick="… adds a handler',
    ),
    Mutation(
        "view-csp-inline-script",
        RESULTS_PAGE,
        "\"default-src 'none'; script-src 'none'; style-src 'self';",
        "\"default-src 'none'; script-src 'unsafe-inline'; style-src 'self';",
        "the page's policy lets inline scripts run: a hole in the escaping runs the agent's script",
    ),
    Mutation(
        "view-csp-not-sent",
        VIEW,
        '"Content-Security-Policy": policy,\n',
        "",
        "the server sends no Content-Security-Policy: nothing stops a script that slipped through",
    ),
    Mutation(
        "view-any-host",
        VIEW,
        "if host not in self.hosts:",
        "if False:",
        "any Host is answered: a web page that re-points its name at 127.0.0.1 reads the user's results",
    ),
    Mutation(
        "view-no-secret",
        VIEW,
        "if not url.path.startswith(self.base):",
        "if False:",
        "the pages answer without the printed secret path: another user of the machine reads them",
    ),
    Mutation(
        "view-artifact-as-page",
        VIEW,
        'return Answer(HTTPStatus.OK, "application/octet-stream", file=found, download=path[-1])',
        'return Answer(HTTPStatus.OK, "text/html; charset=utf-8", file=found)',
        "an artifact is served as a page of the server's origin: an agent's HTML opens as one of its pages",
    ),
    # Task folders as OCI artifacts: fetched only from allowed registries, bounded, verified, cached; pushed once.
    Mutation(
        "task-artifact-any-registry",
        OCI_TASKS,
        "if reference.registry not in self.settings.registries:",
        "if False:",
        "an Episode makes the operator fetch from any address it names (a registry the operator was not given)",
    ),
    Mutation(
        "task-artifact-manifest-unchecked",
        "taskfolder/oci_artifact.py",
        "if (actual := sha256_digest(manifest)) != reference.digest:",
        "if (actual := sha256_digest(manifest)) != reference.digest and False:",
        "a registry answers another manifest than the digest names, and the operator follows it",
    ),
    Mutation(
        "task-artifact-layer-unbounded",
        "taskfolder/oci_artifact.py",
        "if size > max_layer_bytes:",
        "if False:",
        "an artifact declaring any size is downloaded: --task-artifact-limit bounds nothing",
    ),
    Mutation(
        "task-artifact-longer",
        OCI_TASKS,
        "if received > layer.size:",
        "if False:",
        "a registry sending more than the manifest declares is read to its end",
    ),
    Mutation(
        "task-artifact-digest-unchecked",
        OCI_TASKS,
        'if (actual := "sha256:" + hasher.hexdigest()) != layer.digest:',
        'if (actual := "sha256:" + hasher.hexdigest()) != layer.digest and False:',
        "a tampered layer is cached and run as the task the reference names",
    ),
    Mutation(
        "task-artifact-no-cache",
        OCI_TASKS,
        "if path.is_file():",
        "if False:",
        "every Episode of a task downloads its artifact again",
    ),
    Mutation(
        "task-artifact-pushed-again",
        OCI_TASKS,
        'if await _exists(session, f"{base}/manifests/{reference.digest}", MANIFEST_MEDIA_TYPE):',
        "if False:",
        "pack and run upload the same folder every time",
    ),
]


@dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    verdict: str  # caught, MISSED, SNIPPET MISSING, SNIPPET AMBIGUOUS, HUNG
    caught_by: str = ""
    seconds: float = 0.0

    @property
    def good(self) -> bool:
        return self.verdict == "caught"


def check_snippet(mutation: Mutation) -> str | None:
    """None when the snippet occurs exactly once; else the verdict that says why it cannot be applied."""
    text = (PACKAGE / mutation.file).read_text()
    count = text.count(mutation.snippet)
    return None if count == 1 else "SNIPPET MISSING" if count == 0 else f"SNIPPET AMBIGUOUS ({count}x)"


def run_mutation(mutation: Mutation, tests: list[str]) -> Outcome:
    """Apply ``mutation`` to a scratch copy of the package and run ``tests`` against it."""
    problem = check_snippet(mutation)
    if problem:
        return Outcome(mutation, problem)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation.name}-") as scratch:
        copy = Path(scratch) / "episode_operator"
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        target = copy / mutation.file
        target.write_text(target.read_text().replace(mutation.snippet, mutation.replacement))
        result = _pytest(tests, scratch)
    seconds = time.monotonic() - started
    if result is None:
        return Outcome(mutation, "HUNG", f"no answer in {TIMEOUT_SEC:.0f} s", seconds)
    failed = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if result.returncode == 0:
        return Outcome(mutation, "MISSED", seconds=seconds)
    if not failed:
        return Outcome(mutation, "ERROR", result.stdout[-2000:] + result.stderr[-2000:], seconds)
    return Outcome(mutation, "caught", failed[0].split(" - ")[0], seconds)


def _pytest(tests: list[str], package_root: str | None) -> subprocess.CompletedProcess[str] | None:
    """The tests against the mutated copy at ``package_root``, or (None) against the working tree."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "EPISODE_MUTATION_PACKAGE")}
    if package_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, str(REPO), env.get("PYTHONPATH")]))
        env["EPISODE_MUTATION_PACKAGE"] = package_root  # the suite checks it imports this copy
    command = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-rfE", "-p", "no:cacheprovider"]
    try:
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_SEC)
    except subprocess.TimeoutExpired:
        return None


def markdown(outcomes: list[Outcome]) -> str:
    lines = ["| mutation | what breaks | file | verdict | first test that failed |", "| --- | --- | --- | --- | --- |"]
    for outcome in outcomes:
        mutation = outcome.mutation
        test = f"`{outcome.caught_by}`" if outcome.caught_by else ""
        lines.append(f"| `{mutation.name}` | {mutation.breaks} | `{mutation.file}` | {outcome.verdict} | {test} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", "--keyword", default="", help="only mutations whose name contains this")
    parser.add_argument("--list", action="store_true", help="print the mutations and whether they apply")
    parser.add_argument("--markdown", action="store_true", help="print the result as a Markdown table")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="mutations run at once (each its own copy)")
    parser.add_argument("tests", nargs="*", default=UNIT_TIER, help="what pytest runs (default: the unit tier)")
    args = parser.parse_args()
    chosen = [mutation for mutation in MUTATIONS if args.keyword in mutation.name]
    if args.list:
        for mutation in chosen:
            print(f"{mutation.name:28} {mutation.file:24} {check_snippet(mutation) or 'applies'}: {mutation.breaks}")
        return 0 if all(check_snippet(mutation) is None for mutation in chosen) else 1
    baseline = _pytest(args.tests, None)
    if baseline is None or baseline.returncode != 0:
        print("the unmutated suite fails: fix it first\n" + (baseline.stdout[-3000:] if baseline else "(hung)"))
        return 1
    outcomes: list[Outcome] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for outcome in pool.map(lambda mutation: run_mutation(mutation, args.tests), chosen):
            outcomes.append(outcome)
            print(f"{outcome.mutation.name:28} {outcome.verdict:8} {outcome.seconds:5.0f} s  {outcome.caught_by}")
    if args.markdown:
        print("\n" + markdown(outcomes))
    holes = [outcome for outcome in outcomes if not outcome.good]
    print(f"\n{len(outcomes) - len(holes)} of {len(outcomes)} mutations caught")
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
