"""Pydantic models of the ``EpisodeSet`` resource: a dataset × an agent × attempts, as Episodes.

An EpisodeSet is an evaluation declared in one object: which task folders (a list, a label
selector over packed task ConfigMaps, or both), which agent, how many attempts per task
(pass@k), how many children may be active at once. The operator turns it into child
Episodes and rolls their results up into the set's status. Like ``Episode``'s, these models
are the source of the CRD (:func:`episode_operator.kube.objects.crds.episodeset_crd`).

The Episode template is *derived* from :class:`~episode_operator.api.episode_resource.EpisodeSpec`
(every field but ``task``, ``agent`` and ``regrade``), so a field added to Episodes is a field of the
template at once, with the same description, default and bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, WithJsonSchema, create_model, field_validator, model_validator

from episode_operator.api.episode_resource import AgentSpec, EpisodeSpec, ImageStatus, TaskSource
from episode_operator.api.vocabulary import (
    FAILURE_FAMILIES,
    FAILURE_KINDS,
    GROUP,
    ApiModel,
    Conditions,
    Outcome,
    Phase,
    Timestamp,
)

SET_KIND = "EpisodeSet"
SET_PLURAL = "episodesets"
SET_SINGULAR = "episodeset"
SET_SHORT_NAMES = ["epis"]

# Labels of every child Episode (which set, task, task index and attempt): api/vocabulary.py.
# Annotations of every child: the task ID as given, and when the controller created it (µs).
SET_TASK_NAME_ANNOTATION = f"{GROUP}/task-name"
CREATED_AT_ANNOTATION = f"{GROUP}/created-at"
# On a set `kubectl episode eval NAME@VERSION --registry SOURCE` made: the dataset and the catalogue it came from.
DATASET_ANNOTATION = f"{GROUP}/dataset"
REGISTRY_ANNOTATION = f"{GROUP}/registry"
# On a child the set suspended (and will resume): children suspended by anyone else stay so.
SUSPENDED_BY_SET_ANNOTATION = f"{GROUP}/suspended-by-set"
# tasks × attempts: each child has a record in the set's status, which etcd bounds (~1.5 MiB).
MAX_CHILDREN = 5000
# The replaced children a set's status keeps (a compact record each) beside its MAX_CHILDREN records.
MAX_REPLACED = 2500

SetPhase = Phase


# --- spec ---------------------------------------------------------------------------------------
class DatasetTask(TaskSource):
    """One task of the dataset: a task source (inline or a packed ConfigMap) and its ID."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The task ID, unique in the set. Default: the ConfigMap's episode-operator.dev/task "
        "label, else the ConfigMap's name; inline tasks: inline-<index>.",
    )


class LabelSelectorRequirement(ApiModel):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(ApiModel):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def render(self) -> str:
        """The selector as the ``labelSelector`` query parameter (``a=b,c in (d,e),!f``)."""
        parts = [f"{key}={value}" for key, value in sorted(self.match_labels.items())]
        for requirement in self.match_expressions:
            if requirement.operator == "Exists":
                parts.append(requirement.key)
            elif requirement.operator == "DoesNotExist":
                parts.append(f"!{requirement.key}")
            else:
                values = ",".join(requirement.values)
                parts.append(f"{requirement.key} {requirement.operator.lower()} ({values})")
        return ",".join(parts)

    @model_validator(mode="after")
    def _values_for_set_operators(self) -> LabelSelector:
        for requirement in self.match_expressions:
            if requirement.operator in ("In", "NotIn") and not requirement.values:
                raise ValueError(f"selector: {requirement.key} {requirement.operator} needs values")
            if requirement.operator in ("Exists", "DoesNotExist") and requirement.values:
                raise ValueError(f"selector: {requirement.key} {requirement.operator} takes no values")
        if not self.match_labels and not self.match_expressions:
            raise ValueError("selector: an empty selector would select every ConfigMap; name some labels")
        return self


class Dataset(ApiModel):
    tasks: list[DatasetTask] = Field(
        default_factory=list, description="Task sources, in order: task index i is tasks[i]."
    )
    selector: LabelSelector | None = Field(
        default=None,
        description="Packed task ConfigMaps (kubectl episode pack) in the set's namespace, after the listed "
        "tasks, ordered by task ID. Resolved once, when the set starts.",
    )

    @model_validator(mode="after")
    def _not_empty(self) -> Dataset:
        if not self.tasks and self.selector is None:
            raise ValueError("spec.dataset is empty: give tasks, a selector, or both")
        return self


class FailurePolicy(ApiModel):
    max_outages: int | None = Field(
        default=None,
        ge=0,
        description="Stop starting children once more than this many ended Ungraded (outages past "
        "template.retries). Default: no limit.",
    )
    max_terminal_failures: int | None = Field(
        default=None,
        ge=0,
        description="Stop starting children once more than this many ended TerminalFailure (a refused "
        "task, a failed first setup). Default: no limit.",
    )


# The outcomes a rerun may re-run: none is a verdict. A Graded child is never re-run, whatever its
# reward or failure kind (re-rolling verdicts until they pass would bias pass@k);
# runtime/rerun_plan.py says why each is.
RerunOutcome = Literal["Ungraded", "TerminalFailure", "Masked"]


# What spec.rerun.failureKinds may name: a failure kind, or a family of them (outage:*). The CRD lists them, so
# the API server refuses a misspelt one as it is applied, naming the field; the model refuses it too.
FAILURE_KIND_PATTERNS = sorted(FAILURE_KINDS | {f"{family}:*" for family in FAILURE_FAMILIES})
FailureKindPattern = Annotated[str, WithJsonSchema({"type": "string", "enum": FAILURE_KIND_PATTERNS})]


class RerunSpec(ApiModel):
    generation: int = Field(
        ge=1,
        description="Raise it to re-run: the children finished when the set sees a new generation and matching "
        "outcomes and failureKinds are replaced by new ones, once per generation; the others are kept.",
    )
    outcomes: list[RerunOutcome] = Field(
        default_factory=list,
        description="Re-run children that ended so (Ungraded, TerminalFailure, Masked; never Graded). Empty: any "
        "of them, as failureKinds says.",
    )
    failure_kinds: list[FailureKindPattern] = Field(
        default_factory=list,
        description="Re-run children whose failureKind is one of these (outage:image_pull, or outage:* for a "
        "family). With outcomes, a child must match both. Empty: any. A generation naming neither is refused "
        "(status.reruns says so) and the set goes on.",
    )

    @field_validator("failure_kinds")
    @classmethod
    def _known_kinds(cls, kinds: list[str]) -> list[str]:
        unknown = [kind for kind in kinds if kind not in FAILURE_KIND_PATTERNS]
        if unknown:
            families = ", ".join(f"{family}:*" for family in sorted(FAILURE_FAMILIES))
            raise ValueError(f"{', '.join(unknown)}: no such failure kind (a kind, or a family: {families})")
        return kinds


class _TemplateBase(ApiModel):
    free_form: ClassVar[frozenset[str]] = EpisodeSpec.free_form


# A child's task and agent are the set's; a child is never a regrade.
TEMPLATE_EXCLUDED = frozenset({"task", "agent", "regrade"})

if TYPE_CHECKING:

    class EpisodeTemplate(_TemplateBase):
        """Every field of EpisodeSpec but task, agent and regrade (built from it at import time)."""

else:
    EpisodeTemplate = create_model(
        "EpisodeTemplate",
        __base__=_TemplateBase,
        __doc__="Every field of EpisodeSpec but task, agent and regrade: what each child Episode gets.",
        **{
            name: (field.annotation, field)
            for name, field in EpisodeSpec.model_fields.items()
            if name not in TEMPLATE_EXCLUDED
        },
    )


class WarmPool(ApiModel):
    """Ready sandbox pods the set keeps for its children's attempts (docs/warm-pools.md).

    A pool pod is made as an attempt's agent pod would be, from this image and these resources, the set's
    template (security, requests, node placement) and its agent's toolchains; an attempt claims one only
    when its own pod spec hashes to the pool's (the ``pool-key`` label), else it makes a fresh pod at once.
    """

    target: int = Field(
        ge=0, le=100, description="How many ready pods the pool keeps (fewer once fewer children remain to start)."
    )
    quota: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="The most unclaimed pool pods that exist at once, starting or ready (default: target).",
    )
    image: str = Field(min_length=1, description="The image of the pool's pods: the children's task image.")
    cpus: int | None = Field(default=None, gt=0, description="[environment] cpus of the children's tasks.")
    memory_mb: int | None = Field(default=None, gt=0, description="[environment] memory_mb of the children's tasks.")
    storage_mb: int | None = Field(default=None, gt=0, description="[environment] storage_mb of the children's tasks.")
    workdir: str | None = Field(default=None, description="[environment] workdir of the children's tasks.")
    max_age_sec: int = Field(
        default=3000,
        ge=60,
        le=3300,
        description="A pool pod older than this is replaced: its keep-alive forks hourly, which its freshness "
        "check would take for someone's exec.",
    )

    @model_validator(mode="after")
    def _quota_holds_target(self) -> WarmPool:
        if self.quota is not None and self.quota < self.target:
            raise ValueError(f"warmPool.quota ({self.quota}) is below its target ({self.target})")
        return self

    @property
    def bound(self) -> int:
        return self.target if self.quota is None else self.quota


class PrePull(ApiModel):
    """Pull the children's images onto the nodes they may run on before they start (docs/prepull.md).

    The images are every one a child's pods run: each task's sandbox image (``spec.image``, else the task's
    ``[environment] docker_image``, else its Dockerfile's FROM when replayed), separate verifiers' and compose
    sidecars' images, the agent's toolchain images, the capture proxy's, the warm pool's, and ``images``.
    """

    images: list[str] = Field(
        default_factory=list, description="More images to pull beside the ones the set's children run."
    )
    wait_sec: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Children start only once every image is on every node, an image's pull fails, or this many "
        "seconds passed since the set started (0: they start at once, beside the pulls).",
    )


class EpisodeSetSpec(ApiModel):
    dataset: Dataset = Field(description="The task folders to evaluate.")
    agent: AgentSpec = Field(description="The agent of every child Episode.")
    attempts: int = Field(default=1, ge=1, le=100, description="Child Episodes per task (the n of pass@k).")
    parallelism: int = Field(
        default=1,
        ge=1,
        le=10000,
        description="At most this many children of the set are active (created, not yet Succeeded or Failed).",
    )
    template: EpisodeTemplate = Field(
        default_factory=EpisodeTemplate,
        description="Episode spec fields for every child (image, timeoutMultiplier, resources, retries…).",
    )
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy, description="When the set stops starting children."
    )
    success_threshold: float = Field(
        default=1.0, description="A graded child whose reward is at least this counts as a success for pass@k."
    )
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="Kueue LocalQueue: children and their pods carry it as the kueue.x-k8s.io/queue-name label.",
    )
    suspend: bool = Field(
        default=False,
        description="While true no child starts, and the active children the set started are suspended "
        "(they start over from turn 1 when resumed).",
    )
    rerun: RerunSpec | None = Field(
        default=None,
        description="Re-run the finished children that failed so, in place (same task and attempt), once per "
        "generation; the replaced ones are listed in status.tasks[].replaced. Reopens a Succeeded set, or one "
        "the failure policy stopped.",
    )
    warm_pool: WarmPool | None = Field(
        default=None,
        description="Ready sandbox pods kept for the children's attempts to claim (never reused after an agent ran).",
    )
    pre_pull: PrePull | None = Field(
        default=None,
        description="Pull the children's images (tasks', toolchains', the pool's) onto the nodes they may run on "
        "before they need them, with one DaemonSet the set owns; children prefer nodes that hold their image.",
    )


# --- status -------------------------------------------------------------------------------------
class SetChildStatus(ApiModel):
    """One child Episode (a task's attempt), as the set last observed it."""

    attempt: int
    name: str
    phase: Phase | None = None
    outcome: Outcome | None = None
    reward: float | None = None
    failure_kind: str | None = None
    created_at: Timestamp | None = Field(default=None, description="When the controller created it (µs; annotation).")
    finished_at: Timestamp | None = Field(default=None, description="The child's own status.finishedAt.")
    image: ImageStatus | None = Field(
        default=None,
        description="The image the child's agent sandbox started from (a digest when built once), and why.",
    )
    observed_finished_at: Timestamp | None = Field(
        default=None, description="When the controller first saw it finished (µs), before creating any other child."
    )


class ReplacedChild(ApiModel):
    """A child a rerun replaced: what it was, kept when its record made way for the child that re-ran it."""

    attempt: int
    name: str
    outcome: Outcome | None = None
    failure_kind: str | None = None
    finished_at: Timestamp | None = None
    rerun: int = Field(description="The spec.rerun generation that replaced it.")


class SetTaskStatus(ApiModel):
    """One task of the dataset and its attempts."""

    index: int
    name: str
    config_map: str | None = Field(default=None, description="The packed task's ConfigMap, if any.")
    children: list[SetChildStatus] = Field(default_factory=list)
    finished: int = 0
    graded: int = Field(default=0, description="Finished Graded: samples of pass@k and of the mean reward.")
    ungraded: int = Field(
        default=0, description="Finished Ungraded (outages used up): samples of pass@k, as misses; not of the mean."
    )
    successes: int = Field(default=0, description="Graded with reward ≥ successThreshold.")
    mean_reward: float | None = None
    pass_at_k: list[float] = Field(
        default_factory=list, description="pass@1, pass@2, … for k ≤ graded + ungraded (an ungraded attempt a miss)."
    )
    replaced: list[ReplacedChild] = Field(
        default_factory=list, description="Children reruns replaced, oldest first (counted nowhere else)."
    )

    def rerun_generation(self, attempt: int) -> int:
        """The rerun generation of the attempt's current child: the last that replaced one (0: the first run)."""
        return max((child.rerun for child in self.replaced if child.attempt == attempt), default=0)


class PassAtK(ApiModel):
    k: int
    value: float | None = Field(
        default=None, description="Mean over the tasks with at least k graded or ungraded attempts."
    )
    tasks: int = Field(default=0, description="How many tasks the mean covers.")
    ungraded: int = Field(default=0, description="Ungraded attempts of those tasks, counted as misses.")


class PhaseCounts(ApiModel):
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0


class OutcomeCounts(ApiModel):
    graded: int = 0
    masked: int = 0
    terminal_failure: int = 0
    ungraded: int = Field(default=0, description="Infrastructure failures (outages past retries); not in the mean.")


class RerunRecord(ApiModel):
    """A spec.rerun generation, as the set applied it (or refused it)."""

    generation: int
    outcomes: list[RerunOutcome] = Field(default_factory=list)
    failure_kinds: list[str] = Field(default_factory=list)
    replaced: int = Field(default=0, description="Children it replaced.")
    applied_at: Timestamp | None = None
    message: str | None = Field(default=None, description="Why it replaced nothing, when it was refused.")


class WarmPoolStatus(ApiModel):
    """The set's warm pool as its last pass saw it."""

    target: int = Field(default=0, description="Ready pods the pool aims at now (spec target, capped by what remains).")
    ready: int = Field(default=0, description="Pool pods running, marked fresh and claimable.")
    starting: int = Field(default=0, description="Pool pods made and not yet claimable.")
    claimed: int = Field(default=0, description="Pods claimed from the pool that still exist (their attempts run).")
    key: str | None = Field(default=None, description="The pool-key label: the digest of the pool's pod spec.")
    message: str | None = Field(default=None, description="Why the pool holds fewer pods than its target, if it says.")


class PrePullImage(ApiModel):
    """One image the set pre-pulls, as its last pass saw it."""

    image: str
    nodes: int = Field(default=0, description="Nodes of the pre-pull DaemonSet that hold it.")
    of: int = Field(default=0, description="Nodes the pre-pull DaemonSet runs on (the nodes the children may use).")
    message: str | None = Field(default=None, description="Why a node does not hold it yet (a pull waiting, failing).")


class PrePullStatus(ApiModel):
    """The set's pre-pull (spec.prePull) as its last pass saw it."""

    daemon_set: str | None = Field(default=None, description="The DaemonSet that pulls the images.")
    images: list[PrePullImage] = Field(default_factory=list, description="Every image pulled, in a stable order.")
    ready: str | None = Field(default=None, description="Images on every node / images, for printing.")
    left_out: int = Field(
        default=0, description="Images past the bound of one pre-pull pod (the last by name), not pulled."
    )
    message: str | None = Field(default=None, description="Why images are missing or not pulled, if it says.")


class EpisodeSetStatus(ApiModel):
    phase: SetPhase | None = None
    reason: str | None = Field(default=None, description="Why the set stopped or failed, CamelCase.")
    message: str | None = None
    total: int | None = Field(default=None, description="tasks × attempts, once the dataset is resolved.")
    created: int = 0
    active: int = Field(default=0, description="Children created and not yet Succeeded or Failed.")
    finished: int = 0
    progress: str | None = Field(default=None, description="finished/total, for printing.")
    phases: PhaseCounts = Field(default_factory=PhaseCounts)
    outcomes: OutcomeCounts = Field(default_factory=OutcomeCounts)
    mean_reward: float | None = Field(default=None, description="Mean reward of the Graded children.")
    pass_at_k: list[PassAtK] = Field(default_factory=list, description="Unbiased pass@k for k = 1 … attempts.")
    tasks: list[SetTaskStatus] = Field(default_factory=list, description="The resolved dataset, in task order.")
    definition: str | None = Field(
        default=None, description="sha256 of dataset, attempts, agent and template when the set started."
    )
    start_time: Timestamp | None = None
    completion_time: Timestamp | None = Field(
        default=None, description="Set when no child is active and none will start."
    )
    reruns: list[RerunRecord] = Field(default_factory=list, description="Each spec.rerun generation seen, in order.")
    warm_pool: WarmPoolStatus | None = Field(default=None, description="The warm pool (spec.warmPool), if any.")
    pre_pull: PrePullStatus | None = Field(default=None, description="The images pre-pulled (spec.prePull), if any.")
    observed_generation: int | None = None
    conditions: Conditions = Field(default_factory=list)

    @property
    def rerun_generation(self) -> int:
        """The last spec.rerun generation the set has seen (applied or refused); 0: none."""
        return max((record.generation for record in self.reruns), default=0)


def child_spec(spec: EpisodeSetSpec, task: TaskSource, env: dict[str, str]) -> EpisodeSpec:
    """The spec of a child Episode: the template's fields, the task, the agent with ``env`` first."""
    agent = spec.agent.model_copy(
        update={"env": [{"name": name, "value": value} for name, value in env.items()] + list(spec.agent.env)}
    )
    fields: dict[str, Any] = spec.template.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return EpisodeSpec.model_validate({**fields, "task": task.to_api(), "agent": agent.to_api()})
