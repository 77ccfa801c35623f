"""Pydantic models of the ``Episode`` resource (``episode-operator.dev/v1alpha1``).

These models are the single source of truth: the CRD in ``crds/`` is generated from them
(:mod:`episode_operator.kube.objects.crds`) and a test fails when the committed file drifts. Field
descriptions become the CRD's descriptions, so ``kubectl explain episode.spec`` reads
them. Names are camelCase on the wire and snake_case in Python.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal, get_args

from pydantic import Field, ValidationError, ValidationInfo, WithJsonSchema, field_validator, model_validator

from episode_operator.api.vocabulary import (
    AGENT_FAILURES,
    API_VERSION,
    DEFAULT_AGENT_OUTCOMES,
    AgentFailure,
    AgentOutcome,
    ApiModel,
    Conditions,
    Outcome,
    Phase,
    SeedStage,
    Stage,
    Timestamp,
    TurnPhase,
)
from episode_operator.capture.wire import LENGTH_CAP_NAMES
from episode_operator.taskfolder.oci_artifact import REFERENCE_PATTERN
from episode_operator.taskfolder.plan import INSTRUCTION_PLACEHOLDER, SEED_SETTINGS, ServerSettings

KIND = "Episode"
PLURAL = "episodes"
SINGULAR = "episode"
SHORT_NAMES = ["epi"]
DEFAULT_TASK_ARCHIVE_KEY = "task.tar.gz"
MAX_SETTING_SEC = 7 * 24 * 3600.0  # a week: no episode setting in seconds is longer
PROMPT_TEMPLATE_LIMIT = 64 * 1024


# --- spec ---------------------------------------------------------------------------------------
class InlineTask(ApiModel):
    files: dict[str, str] = Field(
        description="The task folder as relative path → file content (text). "
        "A path ending in '/' is an empty directory."
    )


class ConfigMapTask(ApiModel):
    name: str = Field(min_length=1, description="ConfigMap in the Episode's namespace (kubectl episode pack).")
    key: str = Field(
        default=DEFAULT_TASK_ARCHIVE_KEY,
        min_length=1,
        description="binaryData key holding the gzipped tar of the task folder.",
    )


class OciTask(ApiModel):
    reference: str = Field(
        pattern=REFERENCE_PATTERN,
        max_length=512,
        description="HOST[:PORT]/REPOSITORY@sha256:DIGEST of a task artifact (kubectl episode pack, for a folder "
        "too big for a ConfigMap): named by its manifest's digest, fetched only from the operator's "
        "--task-registry registries and verified.",
    )


class TaskSource(ApiModel):
    inline: InlineTask | None = Field(default=None, description="The whole task folder in the Episode.")
    config_map: ConfigMapTask | None = Field(default=None, description="A packed task folder in a ConfigMap.")
    oci: OciTask | None = Field(
        default=None, description="A packed task folder as an OCI artifact in a registry (over a ConfigMap's size)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> TaskSource:
        if sum(source is not None for source in (self.inline, self.config_map, self.oci)) != 1:
            raise ValueError("spec.task needs exactly one of inline, configMap or oci")
        return self


ModelApi = Literal["chat-completions", "responses", "messages"]
TurnSessions = Literal["fresh", "continue"]
# The sampling parameters each API defines (vLLM's sampling extensions on chat completions, which vLLM
# serves): what spec.agent.model.params may set on every call. A key outside its API's set would reach
# an endpoint that refuses the call, or override the request itself (model, messages, stream, tools).
SAMPLING_PARAMS: Final[dict[ModelApi, frozenset[str]]] = {
    "chat-completions": frozenset(
        {"temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "logit_bias"}
        | {"top_k", "min_p", "repetition_penalty", "min_tokens"}
        | set(LENGTH_CAP_NAMES)
    ),
    "responses": frozenset({"temperature", "top_p", "reasoning"} | set(LENGTH_CAP_NAMES)),
    "messages": frozenset({"temperature", "top_p", "top_k", "stop_sequences", "thinking"} | set(LENGTH_CAP_NAMES)),
}


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, description="A Secret in the Episode's namespace.")
    key: str = Field(default="api-key", min_length=1, description="The key of the Secret's data holding the value.")


class ModelEndpoint(ApiModel):
    """The model an agent calls; every call goes through the pod's capture proxy, which holds the key."""

    free_form: ClassVar[frozenset[str]] = frozenset({"params"})

    name: str = Field(min_length=1, description="The model as the endpoint names it (e.g. gpt-5, Qwen/Qwen3-8B).")
    base_url: str = Field(
        alias="baseURL",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="The endpoint's base URL as an OpenAI client takes it, with its version path "
        "(https://api.openai.com/v1, http://vllm.models:8000/v1, https://api.anthropic.com/v1).",
    )
    api: ModelApi = Field(
        default="chat-completions",
        description="The API the endpoint speaks: chat-completions, responses (OpenAI Responses) or messages "
        "(Anthropic Messages). A harness speaks one or more of them.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="The Secret key holding the API key. It is given to the capture proxy only: the agent gets a "
        "placeholder, so the key appears in no log, status, Event, store or export.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Sampling parameters the capture proxy sets on every model call, over what the harness "
        "sends: temperature, top_p, max_tokens (the length cap, sent as max_output_tokens to a Responses "
        "endpoint) and the other sampling parameters of the endpoint's API (seed, top_k, …).",
    )

    @field_validator("params")
    @classmethod
    def _sampling_of_the_api(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        api = info.data.get("api")
        if api is None:
            return params  # the api itself was refused
        unknown = sorted(set(params) - SAMPLING_PARAMS[api])
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: not a sampling parameter of the {api} API; "
                f"it takes {', '.join(sorted(SAMPLING_PARAMS[api]))}"
            )
        if sum(name in params for name in LENGTH_CAP_NAMES) > 1:
            raise ValueError(f"one length cap, under one of its names ({', '.join(LENGTH_CAP_NAMES)})")
        return params


class HarnessSpec(ApiModel):
    free_form: ClassVar[frozenset[str]] = frozenset({"options"})

    name: str = Field(min_length=1, description="A harness preset of the operator: mini-swe-agent, opencode, …")
    version: str | None = Field(
        default=None, description="The harness version (its toolchain image's tag); default: the preset's."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Preset options, e.g. timeoutSec (the harness's own cap on a turn)."
    )


class CaptureSpec(ApiModel):
    token_ids: bool = Field(
        default=False,
        description="Ask a vLLM-compatible endpoint for token ids and log-probabilities and keep them (RL training).",
    )


class AgentSpec(ApiModel):
    free_form: ClassVar[frozenset[str]] = frozenset({"env", "env_from"})

    kind: str = Field(
        description="What acts in the sandbox each turn: one of the operator's agent kinds (the enum lists them)."
    )
    command: str | None = Field(
        default=None,
        description="For kind=command: a shell command run with bash in the working directory each turn. "
        "The turn's instruction is in the file named by $EPISODE_INSTRUCTION_FILE.",
    )
    setup: str | None = Field(
        default=None,
        description="For kind=command: a shell command run once per sandbox before the first turn.",
    )
    harness: HarnessSpec | None = Field(
        default=None, description="For kind=harness: which agent harness runs each turn (a preset of the operator)."
    )
    model: ModelEndpoint | None = Field(
        default=None, description="For kind=harness and command: the model endpoint the agent calls."
    )
    turn_sessions: TurnSessions = Field(
        default="fresh",
        description="fresh: one harness session per turn (Gym's default); continue: one session kept across "
        "turns (harnesses that can continue one).",
    )
    capture: CaptureSpec = Field(default_factory=CaptureSpec, description="How model calls are recorded.")
    env: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes EnvVar entries given to the agent's commands only."
    )
    env_from: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Kubernetes EnvFromSource entries (Secrets, ConfigMaps) for the agent.",
    )


AgentOutages = Literal["retry", "score"]


class RetryPolicy(ApiModel):
    outages: int = Field(
        default=2,
        ge=0,
        le=20,
        description="Fresh attempts after an outage (lost pod, image pull failure, …).",
    )
    agent_outages: AgentOutages = Field(
        default="retry",
        description="An outage of a kind the agent can cause (its container killed, the supervisor's jobs "
        "lost, grading folders it left unclearable, a user it made unswitchable…) once an agent acted in the "
        "attempt: retry (Gym's rule: an outage, retried like any other) or score (the turn counts a measured "
        "0, failureKind agent:broke_sandbox: for RL runs, where breaking the sandbox must not buy a retry).",
    )


# A rule per agent failure. Spelled out for the CRD: a structural schema has no propertyNames, so each
# failure is a property (one the models do not know is refused by them, and pruned by the API server).
AgentOutcomePolicy = Annotated[
    dict[AgentFailure, AgentOutcome],
    WithJsonSchema(
        {
            "type": "object",
            "properties": {
                failure: {"type": "string", "enum": list(get_args(AgentOutcome))} for failure in AGENT_FAILURES
            },
        }
    ),
]


class HarborSettings(ApiModel):
    """Gym's harbor server settings, for one Episode (the Gym server's settings set them on every try)."""

    step_setup_timeout_sec: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SETTING_SEC,
        description="The bound of a step's setup.sh (Gym's step_setup_timeout_s); unset: the step's agent budget.",
    )
    verifier_grace_sec: float = Field(
        default=SEED_SETTINGS.verifier_grace_sec,
        ge=0,
        le=MAX_SETTING_SEC,
        description="Added to each turn's verifier budget in the episode deadline (Gym's verifier_grace_s).",
    )
    enforce_task_timeouts: bool = Field(
        default=SEED_SETTINGS.enforce_task_timeouts,
        description="The episode deadline is the task's summed bound (true), or defaultEpisodeTimeoutSec "
        "(false; a task whose sandbox start cannot fit in it is refused at seed).",
    )
    default_episode_timeout_sec: float = Field(
        default=SEED_SETTINGS.default_episode_timeout_sec,
        gt=0,
        le=MAX_SETTING_SEC,
        description="Gym's default_episode_timeout_seconds: the deadline without enforceTaskTimeouts, and the "
        "bound past which an enforced one is warned of.",
    )
    separate_verifier_for_artifacts: bool = Field(
        default=SEED_SETTINGS.separate_verifier_for_artifacts,
        description="A turn whose task or step declares artifacts verifies in a separate sandbox "
        "(Gym's separate_verifier_for_artifacts).",
    )
    prompt_template: str | None = Field(
        default=None,
        max_length=PROMPT_TEMPLATE_LIMIT,
        description="Wraps the first turn's instruction, which stands where the template says {instruction} "
        "(Gym's job-level prompt_template); later turns' instructions are sent as they are.",
    )

    agent_outcome_policy: AgentOutcomePolicy = Field(
        default_factory=lambda: dict(DEFAULT_AGENT_OUTCOMES),
        description="What each agent failure does to the episode (Gym's agent_outcome_policy): retry (an "
        "outage: a fresh attempt within retries.outages), fail (ends it ungraded, no retry) or measure (the "
        "verifier decides). A failure left out keeps its default.",
    )

    @field_validator("prompt_template")
    @classmethod
    def _names_the_instruction(cls, template: str | None) -> str | None:
        if template is not None and INSTRUCTION_PLACEHOLDER not in template:
            raise ValueError(f"a prompt template must say where the instruction goes: {INSTRUCTION_PLACEHOLDER}")
        return template

    def server_settings(self) -> ServerSettings:
        """The settings the task's plan is made under (the outcome policy is the runner's, not the plan's)."""
        return ServerSettings(**self.model_dump(exclude={"agent_outcome_policy"}))


class DebugSpec(ApiModel):
    keep_pods: bool = Field(default=False, description="Keep the sandbox pods of a failed episode for inspection.")


class SandboxSecurity(ApiModel):
    allow_privilege_escalation: bool = Field(
        default=False,
        description="Let task processes gain privileges through setuid binaries (sudo, su). Off, "
        "the sandbox runs with no_new_privs.",
    )
    seccomp_profile: Literal["RuntimeDefault", "Unconfined"] = Field(
        default="RuntimeDefault", description="The seccomp profile of every sandbox container."
    )


class RegradeSpec(ApiModel):
    """A regrade: this Episode runs no agent; it verifies again, with its own task's tests, what another
    Episode's agent left (the artifacts the operator kept of each turn verified in a separate sandbox)."""

    episode: str = Field(min_length=1, description="The finished Episode, in this namespace, to verify again.")
    uid: str | None = Field(
        default=None,
        description="Its uid: the regrade of that run, not of a later Episode of the same name (kubectl episode "
        "regrade sets it).",
    )


class EpisodeSpec(ApiModel):
    free_form: ClassVar[frozenset[str]] = frozenset({"resources", "tolerations", "image_pull_secrets"})

    task: TaskSource = Field(description="Where the Harbor task folder comes from.")
    agent: AgentSpec = Field(description="What acts in the sandbox each turn.")
    image: str | None = Field(
        default=None,
        description="A prebuilt image of the task's sandbox: overrides docker_image, and the task's "
        "environment/Dockerfile is then neither replayed nor built. The operator's image mirrors apply.",
    )
    timeout_multiplier: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="Scales every agent and verifier budget (Gym's timeout_multiplier).",
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        description="Kubernetes ResourceRequirements for the main container; overrides [environment].",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector for every sandbox pod.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations for every sandbox pod.")
    runtime_class_name: str | None = Field(default=None, description="RuntimeClass (gVisor, Kata…) for sandbox pods.")
    image_pull_secrets: list[dict[str, Any]] = Field(
        default_factory=list, description="LocalObjectReferences to pull secrets for sandbox images."
    )
    retries: RetryPolicy = Field(default_factory=RetryPolicy, description="How outages are retried.")
    harbor: HarborSettings = Field(
        default_factory=HarborSettings, description="Gym's harbor server settings for this Episode."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the Episode this long after it finished."
    )
    debug: DebugSpec = Field(default_factory=DebugSpec, description="Debugging aids.")
    security: SandboxSecurity = Field(default_factory=SandboxSecurity, description="How sandbox pods are confined.")
    suspend: bool = Field(default=False, description="While true the episode does not start (Kueue admission).")
    regrade: RegradeSpec | None = Field(
        default=None,
        description="Verify another finished Episode's kept artifacts with this Episode's task's tests, agent skipped "
        "(kubectl episode regrade): status.regrade and status.turns hold the new verdicts, the original is untouched.",
    )


# --- status -------------------------------------------------------------------------------------
class ArtifactSummary(ApiModel):
    collected: int = Field(default=0, description="Entries with status ok.")
    failed: int = Field(default=0, description="Entries with status failed (missing source, …).")
    skipped: int = Field(default=0, description="Entries skipped (first claimant of a destination wins).")
    empty: int = Field(default=0, description="Entries whose source was empty.")


class TurnStatus(ApiModel):
    name: str
    phase: TurnPhase = "Pending"
    stage: Stage | None = Field(
        default=None,
        description=f"Where the turn is (the runtime's stage table): {', '.join(Stage)}.",
    )
    reward: float | None = None
    verifier_rewards: dict[str, float] = Field(default_factory=dict)
    reward_valid: bool | None = None
    gate: Literal["passed", "missed"] | None = Field(
        default=None,
        description="The turn's min_reward gate, decided once when its reward was read: missed stops the episode.",
    )
    verifier_mode: Literal["shared", "separate"] | None = None
    failure_kind: str | None = None
    agent_exit_code: int | None = None
    agent_failure: AgentFailure | None = Field(
        default=None,
        description="How the agent's turn ended badly, as its recorded model calls (else its output) tell: "
        "model_auth, model_not_found, model_rate_limit, model_unavailable, context_window, timeout, exited.",
    )
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    artifacts: ArtifactSummary | None = None
    message: str | None = None


class TaskStatus(ApiModel):
    digest: str | None = Field(default=None, description="sha256 of the task folder's paths, modes and contents.")
    steps: int | None = Field(default=None, description="Number of turns.")
    name: str | None = Field(default=None, description="[task].name, when set.")


ImageMade = Literal["prebuilt", "replayed", "built"]


class ImageStatus(ApiModel):
    """The image the current attempt's agent sandbox started from, and why it is that one."""

    ref: str | None = Field(
        default=None,
        description="The image the agent pod runs: a built image by its manifest digest (repository@sha256:…), "
        "a replayed one's FROM image, else the prebuilt image.",
    )
    made: ImageMade | None = Field(
        default=None,
        description="prebuilt; replayed (environment/Dockerfile applied in the attempt's pod); built (in the "
        "cluster, once per build context).",
    )
    message: str | None = Field(default=None, description="Why the image is made so, and from what.")


PodRole = Literal["agent", "verifier"]


class PodRecord(ApiModel):
    """A pod of an attempt, as the attempt first saw it run."""

    role: PodRole
    turn: int | None = Field(default=None, description="The turn (from 1) of a verifier pod.")
    name: str
    uid: str


class AttemptStatus(ApiModel):
    number: int
    reason: str | None = Field(default=None, description="Why the attempt ended, for an outage.")
    started_at: Timestamp | None = None
    not_before: Timestamp | None = Field(
        default=None,
        description="The outage back-off: the attempt starts no earlier than this (written before the wait, "
        "so that a restarted operator waits out the rest and never resumes the lost attempt).",
    )
    job_key: str | None = Field(
        default=None,
        description="The key in the attempt's job ids. The supervisor keeps its jobs' records in the agent's own "
        "sandbox, and a job that exists is never started again: with a key the pod cannot read, an agent cannot "
        "name (and pre-create) a job it did not see started, such as its turn's verifier.",
    )
    pods: list[PodRecord] = Field(
        default_factory=list,
        description="Each pod of the attempt (name and uid) once it ran: a pod missing afterwards, or there with "
        "another uid, was lost with what the attempt did in it, and the attempt is an outage.",
    )
    seed_stage: SeedStage | None = Field(
        default=None,
        description=f"The seed stage the attempt is in (or was last in): {', '.join(SeedStage)}.",
    )
    ready_at: Timestamp | None = Field(
        default=None, description="When the sandbox was ready (the seed's end): the deadline's clock starts."
    )
    deadline_at: Timestamp | None = Field(
        default=None, description="Past this the attempt fails as harbor:task_deadline."
    )
    finished_at: Timestamp | None = None


RegradeAction = Literal["verify", "carried", "skipped"]


class RegradedTurn(ApiModel):
    name: str
    action: RegradeAction = Field(
        description="verify: its artifacts verified again (it was verified in a separate sandbox); carried: its "
        "record is the original's (the verifier never ran: a failed preparation, the agent's own failure); skipped: "
        "the original never reached its verifier."
    )
    original_reward: float | None = None


class RegradeStatus(ApiModel):
    """What a regrade verifies again: the original's run, fixed when the regrade starts."""

    episode: str
    uid: str
    attempt: int = Field(description="The original's attempt whose kept artifacts are verified.")
    original_outcome: Outcome | None = None
    original_reward: float | None = None
    turns: list[RegradedTurn] = Field(default_factory=list)


class EpisodeStatus(ApiModel):
    phase: Phase | None = None
    outcome: Outcome | None = None
    reward: float | None = None
    verifier_rewards: dict[str, float] = Field(default_factory=dict)
    verifier_mode: Literal["shared", "separate", "mixed"] | None = None
    stopped_after_turn: str | None = None
    failure_kind: str | None = None
    message: str | None = None
    attempt: int | None = None
    attempts: list[AttemptStatus] = Field(default_factory=list)
    current_turn: int | None = None
    progress: str | None = Field(default=None, description="Turns done / total, for printing.")
    turns: list[TurnStatus] = Field(default_factory=list)
    task: TaskStatus | None = None
    image: ImageStatus | None = Field(default=None, description="The image the agent sandbox started from, and why.")
    pod_name: str | None = None
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    regrade: RegradeStatus | None = Field(default=None, description="For a regrade (spec.regrade): what it verifies.")
    observed_generation: int | None = None
    conditions: Conditions = Field(default_factory=list)


class Episode(ApiModel):
    """The whole resource, as read from the API server."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: EpisodeSpec
    status: EpisodeStatus | None = None


def episode_manifest(
    namespace: str | None,
    spec: EpisodeSpec,
    *,
    name: str | None = None,
    generate_name: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An Episode object ready to create (``name`` or ``generate_name``); no namespace: where it is applied."""
    metadata: dict[str, Any] = {"namespace": namespace} if namespace else {}
    metadata["labels"] = labels or {}
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = generate_name or "episode-"
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec.to_api()}


def validation_message(error: ValidationError) -> str:
    """A spec's validation errors in one line, each located as ``spec.<path>``."""
    parts = []
    for detail in error.errors(include_url=False):
        location = ".".join(str(part) for part in detail["loc"])
        text = str(detail["msg"]).removeprefix("Value error, ")
        parts.append(f"spec.{location}: {text}" if location else text)
    return "; ".join(parts)
