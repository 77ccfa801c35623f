"""The task-folder layer (pure): load, validate and resolve Harbor task folders.

No Kubernetes and no kopf here: everything takes files in memory and returns data, so the
semantics of docs/task-format.md are tested in milliseconds.
"""

from episode_operator.taskfolder.errors import Problem, TaskRefused
from episode_operator.taskfolder.loader import LoadedTask, Validation, load_task, validate_task
from episode_operator.taskfolder.plan import EpisodePlan, TurnPlan, resolve_plan, seed_refusals
from episode_operator.taskfolder.sources import SourceLimits, TaskFile, TaskFiles

__all__ = [
    "EpisodePlan",
    "LoadedTask",
    "Problem",
    "SourceLimits",
    "TaskFile",
    "TaskFiles",
    "TaskRefused",
    "TurnPlan",
    "Validation",
    "load_task",
    "resolve_plan",
    "seed_refusals",
    "validate_task",
]
