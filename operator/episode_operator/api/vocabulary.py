"""The words every layer shares: phases, stages, outcomes, failure kinds, conditions, labels, times.

Each is defined here once, as a closed type where the set of values is closed, so that mypy
catches a misspelt phase or failure kind anywhere, and the CRD's enums come from the same
definitions. Everything is pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# --- the API's identity -------------------------------------------------------------------------
GROUP: Final = "episode-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"


# --- phases and outcomes --------------------------------------------------------------------------
Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
TurnPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Skipped"]
Outcome = Literal["Graded", "Masked", "TerminalFailure", "Ungraded"]
# Once an Episode (or EpisodeSet) is here, nothing drives it any more.
TERMINAL_PHASES: Final[frozenset[str]] = frozenset({"Succeeded", "Failed"})


def is_terminal(phase: object) -> bool:
    """Whether an Episode or EpisodeSet in ``phase`` (any value read from an object) is finished."""
    return phase in TERMINAL_PHASES


class Stage(enum.StrEnum):
    """Where a turn is (``status.turns[].stage``), in the order a turn goes through them.

    The runtime's stage table (``runtime/turn/table.py``) gives each its step, its successor,
    whether it is written to the status before its step runs, its network and what a restarted
    operator does there.
    """

    CLEANUP = "cleanup"
    WORKDIR = "workdir"
    SETUP = "setup"
    HEALTHCHECK = "healthcheck"
    AGENT = "agent"
    TRAJECTORY = "trajectory"
    COLLECT = "collect"
    VERIFY_PREPARE = "verify-prepare"
    VERIFY = "verify"
    DONE = "done"


class SeedStage(enum.StrEnum):
    """Where an attempt's seed is (``status.attempts[].seedStage``), in the order the seed goes through them.

    The runtime's seed table (``runtime/seed.py``) gives each its step, its successor, whether
    it is written to the status before its step runs and what a restarted operator does there.
    """

    IMAGES = "images"
    SANDBOX = "sandbox"
    REPLAY = "replay"
    ENVIRONMENT_FILES = "environment-files"
    ENTRYPOINT = "entrypoint"
    HEALTHCHECK = "healthcheck"
    AGENT_SETUP = "agent-setup"


# --- failure kinds --------------------------------------------------------------------------------
# What a failed turn or episode records in ``failureKind``. Gym's own kinds carry the
# ``harbor:`` prefix; an outage that used up its retries is ``outage:<OutageKind>``.
FailureKind = Literal[
    # measured or terminal, by the task (Gym's names)
    "harbor:step_setup_failed",
    "harbor:step_workdir_failed",
    "harbor:step_healthcheck_failed",
    "harbor:verifier_error",
    "harbor:invalid_task",
    "harbor:seed_refused",
    # retried like an outage, but Gym's own name
    "harbor:task_deadline",
    # the agent's own setup failed, or its model refused it (401/403, unknown model): the episode
    # ends ungraded, not retried (no retry mends a key)
    "agent:setup_failed",
    "agent:model_auth",
    "agent:model_not_found",
    # an agent failure that spec.harbor.agentOutcomePolicy says fails the episode (not retried, not
    # measured): ungraded, under the failure's own name (runtime/agents/agent_failures.py)
    "agent:model_rate_limit",
    "agent:model_unavailable",
    "agent:context_window",
    "agent:timeout",
    "agent:exited",
    # what the agent's sandbox sent back passed the operator's bound for it (a job's answer, an
    # artifact, a log: runtime/limits.py), or its model calls outgrew the capture journal's: the
    # turn fails with a measured 0 (the agent's doing; a retry would do the same)
    "agent:output_limit",
    "agent:capture_limit",
    # an outage of a kind an agent can cause, after one acted, under spec.retries.agentOutages: score
    "agent:broke_sandbox",
    # the task's environment could not be made: a Dockerfile step (replayed or built) failed or ran
    # past build_timeout_sec, its ENTRYPOINT could not start, or environment/ could not be placed
    "environment:build_failed",
    # the Episode object itself cannot be run
    "episode:invalid_spec",
    "episode:task_source",
    # a regrade (spec.regrade) whose original cannot be regraded: not finished, no verdict, a turn verified
    # in its own sandbox (gone), no kept artifacts; or one whose new verdicts reach a turn the original never ran
    "episode:regrade_refused",
    "episode:regrade_incomplete",
]
FAILURE_SETUP: Final[FailureKind] = "harbor:step_setup_failed"
FAILURE_WORKDIR: Final[FailureKind] = "harbor:step_workdir_failed"
FAILURE_HEALTHCHECK: Final[FailureKind] = "harbor:step_healthcheck_failed"
FAILURE_VERIFIER: Final[FailureKind] = "harbor:verifier_error"
FAILURE_INVALID_TASK: Final[FailureKind] = "harbor:invalid_task"
FAILURE_SEED: Final[FailureKind] = "harbor:seed_refused"
# Both a failure kind and an outage kind: past the deadline the attempt is retried (Gym).
FAILURE_DEADLINE: Final = "harbor:task_deadline"
FAILURE_AGENT_SETUP: Final[FailureKind] = "agent:setup_failed"
FAILURE_MODEL_AUTH: Final[FailureKind] = "agent:model_auth"
FAILURE_MODEL_NOT_FOUND: Final[FailureKind] = "agent:model_not_found"
FAILURE_OUTPUT_LIMIT: Final[FailureKind] = "agent:output_limit"
FAILURE_CAPTURE_LIMIT: Final[FailureKind] = "agent:capture_limit"
FAILURE_BROKE_SANDBOX: Final[FailureKind] = "agent:broke_sandbox"
FAILURE_ENVIRONMENT_BUILD: Final[FailureKind] = "environment:build_failed"
FAILURE_INVALID_SPEC: Final[FailureKind] = "episode:invalid_spec"
FAILURE_TASK_SOURCE: Final[FailureKind] = "episode:task_source"
FAILURE_REGRADE_REFUSED: Final[FailureKind] = "episode:regrade_refused"
FAILURE_REGRADE_INCOMPLETE: Final[FailureKind] = "episode:regrade_incomplete"

# Why an attempt was lost under the task (the sandbox failed, not the task or the agent).
OutageKind = Literal[
    "pod_lost",  # the pod was deleted, evicted or its node lost
    "container_exited",  # a container of the pod ended (e.g. OOM-killed)
    "image_pull",  # an image that cannot be pulled
    "container_config",  # a container that cannot be created (bad config, missing Secret…)
    "start_timeout",  # the pod did not start within build_timeout_sec
    "unschedulable",  # the pod could not be placed on a node within the operator's bound
    "image_build",  # an in-cluster build could not run: the registry, the builder or the API failed
    "exec",  # the exec transport failed past its retries
    "api",  # the API server refused or failed a call
    "supervisor",  # the supervisor could not be placed in the pod
    "lost_job",  # a job vanished from the sandbox
    "run_command",  # a command could not be started (no bash, …)
    "place_solution",  # the oracle's solution could not be placed
    "place_instruction",  # the agent's instruction could not be placed
    "clear_grading_files",  # the previous turn's tests or rewards could not be removed
    "user_switch",  # the turn's user could not be switched to
    "read_reward",  # the reward files could not be read back
    "environment_healthcheck",  # [environment.healthcheck] never passed at seed
    "model_rate_limit",  # the model endpoint kept answering 429 until the agent gave up
    "model_unavailable",  # the model endpoint was unreachable, failed (5xx), answered garbage or nothing
    # an agent failure the Episode's agentOutcomePolicy retries, where the default measures it
    "agent_model_auth",
    "agent_model_not_found",
    "agent_context_window",
    "agent_timeout",
    "agent_exited",
    "capture",  # the capture container could not mark or read a turn's model calls
    "harbor:task_deadline",  # past the episode's deadline (Gym's name, kept as is)
]
OUTAGE_KINDS: Final[frozenset[str]] = frozenset(get_args(OutageKind))
# The outages an agent can cause from inside its sandbox (as root it can kill the container's processes,
# fill or break the folders the supervisor and the grading use, delete users): spec.retries.agentOutages
# decides whether one that follows an agent's turn is retried (Gym) or scored. The others (a pod deleted
# or evicted, an image, the scheduler, the API, the model endpoint, the deadline) are never the agent's.
AGENT_CAUSABLE_OUTAGES: Final[frozenset[OutageKind]] = frozenset(
    {
        "container_exited",
        "lost_job",
        "run_command",
        "place_solution",
        "place_instruction",
        "clear_grading_files",
        "user_switch",
        "read_reward",
        "supervisor",
    }
)
assert AGENT_CAUSABLE_OUTAGES <= OUTAGE_KINDS


# How an agent's turn ended badly, as its recorded model calls (and its own output) tell
# (runtime/agents/agent_failures.py decides what each means for the episode).
AgentFailure = Literal[
    "model_auth",  # the endpoint refused the key (401/403)
    "model_not_found",  # the endpoint does not serve the model (404)
    "model_rate_limit",  # the endpoint rate-limited the agent (429) to its end
    "model_unavailable",  # unreachable, 5xx, a broken answer, or no answer at all
    "context_window",  # the conversation outgrew the model's context window
    "timeout",  # the agent ran out of its turn budget with the model answering
    "exited",  # the agent exited non-zero with the model answering
]
AGENT_FAILURES: Final[tuple[AgentFailure, ...]] = get_args(AgentFailure)
# What an agent failure does to the episode (spec.harbor.agentOutcomePolicy, Gym's agent_outcome_policy):
# an outage retried with a fresh attempt, an ungraded end without a retry, or measured (the verifier decides).
AgentOutcome = Literal["retry", "fail", "measure"]
# The seed's rules: a refused key or an unknown model ends the episode ungraded (no retry mends it), an
# endpoint that rate-limits or fails is an outage, and the agent's own failures are measured.
DEFAULT_AGENT_OUTCOMES: Final[dict[AgentFailure, AgentOutcome]] = {
    "model_auth": "fail",
    "model_not_found": "fail",
    "model_rate_limit": "retry",
    "model_unavailable": "retry",
    "context_window": "measure",
    "timeout": "measure",
    "exited": "measure",
}
assert set(DEFAULT_AGENT_OUTCOMES) == set(AGENT_FAILURES)


def outage_failure_kind(kind: OutageKind) -> str:
    """The ``failureKind`` of an episode whose last attempt ended in this outage."""
    return kind if kind.startswith("harbor:") else f"outage:{kind}"


# Every failureKind an Episode or a turn can record: the named kinds and each outage's.
FAILURE_KINDS: Final[frozenset[str]] = frozenset(get_args(FailureKind)) | {
    outage_failure_kind(kind) for kind in get_args(OutageKind)
}
# Their families (the part before ':'): `outage:*` names every outage's kind.
FAILURE_FAMILIES: Final[frozenset[str]] = frozenset(kind.split(":", 1)[0] for kind in FAILURE_KINDS)


def failure_kind_matches(pattern: str, kind: str | None) -> bool:
    """Whether ``kind`` is ``pattern``: a failure kind, or ``FAMILY:*`` for every kind of a family."""
    if kind is None:
        return False
    return kind.startswith(pattern[:-1]) if pattern.endswith(":*") else kind == pattern


# --- time stamps -------------------------------------------------------------------------------
def timestamp(epoch: float) -> str:
    """RFC 3339 in UTC to the second, as Kubernetes writes ``metav1.Time``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def precise_timestamp(epoch: float) -> str:
    """RFC 3339 in UTC with microseconds (Kubernetes' ``MicroTime``)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: str) -> float:
    """Epoch seconds of an RFC 3339 UTC time, with or without a fraction of a second."""
    layout = "%Y-%m-%dT%H:%M:%S.%fZ" if "." in text else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.strptime(text, layout).replace(tzinfo=UTC).timestamp()


# --- conditions --------------------------------------------------------------------------------
class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields dropped as the API server prunes them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    # Fields whose value is a Kubernetes object the CRD does not describe (kept as given).
    free_form: ClassVar[frozenset[str]] = frozenset()

    def to_api(self) -> dict[str, Any]:
        """The JSON-ready camelCase dict, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# RFC 3339 in UTC ("2025-01-02T03:04:05Z", or with a fraction): the API server checks the format.
Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
# metav1.Condition's rules (Kubernetes API conventions), which kubectl and GitOps tools rely on.
CONDITION_TYPE_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A condition as Kubernetes' API conventions define it (``metav1.Condition``)."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN, description="CamelCase, e.g. Complete.")
    status: ConditionStatus
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN, description="Why, CamelCase.")
    message: str = Field(default="", max_length=32768)
    last_transition_time: Timestamp = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was computed from."
    )


# Conditions are a map keyed by type: one condition per type, merged by type in server-side apply.
Conditions = Annotated[
    list[Condition],
    Field(json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
]


# A condition of an Episode whose pod waits: False while the pod it needs cannot be scheduled,
# pulled or started (reason and message from the pod's state and Events), True once it runs.
PODS_READY: Final = "PodsReady"


def set_condition(
    conditions: list[Condition],
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int | None = None,
) -> None:
    """Set condition ``kind`` in place; its ``lastTransitionTime`` moves only when its status changes."""
    for condition in conditions:
        if condition.type == kind:
            if condition.status != status:
                condition.last_transition_time = now
            condition.status, condition.reason, condition.message = status, reason, message
            condition.observed_generation = generation
            return
    conditions.append(
        Condition(
            type=kind,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=now,
            observed_generation=generation,
        )
    )


# --- labels and annotations ------------------------------------------------------------------------
# On every sandbox pod: which Episode, which attempt, which role (agent/verifier) and turn.
EPISODE_LABEL: Final = f"{GROUP}/episode"
ATTEMPT_LABEL: Final = f"{GROUP}/attempt"
ROLE_LABEL: Final = f"{GROUP}/role"
TURN_LABEL: Final = f"{GROUP}/turn"
# On packed task ConfigMaps and on EpisodeSet children: the task ID (sanitized) and its digest.
TASK_LABEL: Final = f"{GROUP}/task"
TASK_DIGEST_LABEL: Final = f"{GROUP}/task-digest"
# On task ConfigMaps packed into a dataset (`kubectl episode pack --dataset`): the dataset, and the
# task's name in it as Gym names it (a label value cannot hold every task name).
DATASET_LABEL: Final = f"{GROUP}/dataset"
TASK_NAME_ANNOTATION: Final = f"{GROUP}/task-name"
# On EpisodeSet children: the set, the task's index and the attempt.
SET_LABEL: Final = f"{GROUP}/set"
SET_TASK_INDEX_LABEL: Final = f"{GROUP}/task-index"
SET_ATTEMPT_LABEL: Final = f"{GROUP}/set-attempt"
# On a child an EpisodeSet's rerun made (spec.rerun): the rerun generation it belongs to (none: the first run).
SET_RERUN_LABEL: Final = f"{GROUP}/set-rerun"
# On a child a rerun replaced: the generation that replaced it; `--set` exports and views leave it out.
SET_REPLACED_LABEL: Final = f"{GROUP}/set-replaced"
# On in-cluster image build Jobs and their context ConfigMaps: the build context's digest.
BUILD_LABEL: Final = f"{GROUP}/build"
# Kueue's queue: an Episode's is copied to its pods, an EpisodeSet's to its children.
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
# On an Episode or EpisodeSet: the operator replica (its incarnation) that drives it; a claim that
# counts while that replica's member Lease lives (kube/replicas.py, docs/replicas.md).
DRIVER_ANNOTATION: Final = f"{GROUP}/driver"
# On an Episode, an EpisodeSet or a sandbox pod: the replica whose watch sees it (kube/routing.py).
ROUTE_LABEL: Final = f"{GROUP}/replica"
# On the member Leases of one operator's replicas: which operator (its Helm release) they belong to.
REPLICAS_LABEL: Final = f"{GROUP}/replicas"
# On a member Lease: its replica is shutting down (so the others know who stays, e.g. to keep the
# data API registered; kube/data_api_registration.py).
LEAVING_ANNOTATION: Final = f"{GROUP}/leaving"
# On a warm pool's pods (EpisodeSet spec.warmPool, docs/warm-pools.md): the set whose pool holds them, and the
# digest of the pod spec they were made with (what an attempt's own pod spec must hash to for it to claim one).
POOL_LABEL: Final = f"{GROUP}/pool"
POOL_KEY_LABEL: Final = f"{GROUP}/pool-key"
# On a pool pod, written by the operator once it runs: the PID its probe got and the PIDs then alive (freshness).
POOL_MARK_ANNOTATION: Final = f"{GROUP}/pool-mark"
# On a pool pod, written with its mark: the supervisor placed before the mark (its script's and arguments' digest)
# and its placement's answer, so a claimer whose placement is the same places nothing between claim and first job.
POOL_PLACED_ANNOTATION: Final = f"{GROUP}/pool-placed"
# On a claimed pod: the set whose pool it came from (it carries the attempt's labels instead of the pool's).
POOL_CLAIMED_LABEL: Final = f"{GROUP}/claimed-from-pool"
# On a child Episode of a set with a warm pool: its attempts look for a pool pod before making one.
WARM_POOL_ANNOTATION: Final = f"{GROUP}/warm-pool"
# The field manager of what the operator writes to a pool pod: any other manager's field means the pod was touched.
# The pre-pull DaemonSet of a set (docs/prepull.md): its pods' label; on a child, whether its set pre-pulls.
PREPULL_LABEL: Final = f"{GROUP}/prepull"
PREPULL_ANNOTATION: Final = f"{GROUP}/prepull"
FIELD_MANAGER: Final = "episode-operator"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "episode-operator"}
