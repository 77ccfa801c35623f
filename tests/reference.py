"""The reference implementations' own models, loaded from their published wheels.

NeMo Gym needs Python ≥ 3.13 and Harbor ≥ 3.12, so neither can be installed here; yet our rows,
capture records and trajectories must satisfy *their* models, not only ours. So the tests take
the wheels from PyPI (pinned by hash, cached), read the few source files that define the
models, and execute only the definitions the checks need: each requested name with the
top-level statements it depends on, and the imports those use. The models build on pydantic and
on the ``openai`` package's Responses and Chat types (Gym pins openai 2.44.0; so do our test
extras). Nothing of Gym's server stack (fastapi, ray, …) is executed.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
import tempfile
import types
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

# The versions docs/harnesses.md names ("The reference implementations"), pinned by the sha256 of the wheels on PyPI.
WHEELS = {
    "nemo-gym": (
        "0.7.0",
        "nemo_gym-0.7.0-py3-none-any.whl",
        "cce78fc3fd048f36b4c465fe8e9fe3cc5e7afb6f6e287bfe831f156988508a70",
    ),
    "harbor": (
        "0.25.0",
        "harbor-0.25.0-py3-none-any.whl",
        "51923ac567fc57b03279e93468b105f689628bcac2cd3d541d4e44aa5c0ec309",
    ),
}
CACHE = Path(os.environ.get("EPISODE_REFERENCE_CACHE", Path.home() / ".cache" / "episode-operator" / "reference"))


def wheel(project: str) -> zipfile.ZipFile:
    """The project's pinned wheel, downloaded once (pip checks the hash)."""
    version, filename, sha256 = WHEELS[project]
    path = CACHE / filename
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
            requirements.write(f"{project}=={version} --hash=sha256:{sha256}\n")
            requirements.flush()
            # The wheels declare Python ≥ 3.13 (Gym) and ≥ 3.12 (Harbor): ask for them as such; they are pure Python.
            pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
            only = ["--python-version", "3.13.14", "--only-binary=:all:", "--require-hashes"]
            subprocess.run([*pip, *only, "-r", requirements.name, "-d", str(CACHE)], check=True)
    return zipfile.ZipFile(path)


def source(project: str, member: str) -> str:
    with wheel(project) as archive:
        return archive.read(member).decode()


# --- executing a selection of a module -------------------------------------------------------------
def _defined(statement: ast.stmt) -> set[str]:
    if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {statement.name}
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
    names = set()
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, ast.AnnAssign | ast.AugAssign):
        targets = [statement.target]
    for target in targets:
        names |= {node.id for node in ast.walk(target) if isinstance(node, ast.Name)}
    return names


def _used(statement: ast.stmt) -> set[str]:
    names = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)}
    # String annotations (``"AtifStep"``) and forward references name classes too.
    for node in ast.walk(statement):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)
    return names


def select(code: str, wanted: set[str] | None) -> str:
    """The statements of ``code`` that define ``wanted`` (all when None), with what they use, in order.

    A call the module makes as it loads (Gym registers its item unions' tags so: their serialization
    depends on it) is kept when everything it names is kept; other expressions (docstrings) never are.
    """
    tree = ast.parse(code)
    body = [statement for statement in tree.body if not isinstance(statement, ast.Expr)]  # docstrings
    if wanted is None:
        return ast.unparse(ast.Module(body=body, type_ignores=[]))
    needed = set(wanted)
    chosen: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index, statement in enumerate(tree.body):
            if index not in chosen and _defined(statement) & needed:
                chosen.add(index)
                needed |= _used(statement)
                changed = True
    defined = set(dir(builtins)).union(*(_defined(tree.body[index]) for index in chosen))
    chosen |= {
        index
        for index, statement in enumerate(tree.body)
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) and _used(statement) <= defined
    }
    keep = [_trimmed(statement, needed) for index, statement in enumerate(tree.body) if index in chosen]
    return ast.unparse(ast.Module(body=keep, type_ignores=[]))


def _trimmed(statement: ast.stmt, needed: set[str]) -> ast.stmt:
    """An import of only the names needed (``from x import a, b`` where only ``a`` is used)."""
    if isinstance(statement, ast.Import | ast.ImportFrom):
        statement.names = [alias for alias in statement.names if (alias.asname or alias.name).split(".")[0] in needed]
    return statement


def _module(name: str, code: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__["__name__"] = name
    sys.modules[name] = module  # pydantic resolves forward references through sys.modules
    exec(compile(code, f"<reference {name}>", "exec"), module.__dict__)
    return module


# The names nemo_gym/responses_converter.py imports from nemo_gym/openai_utils.py.
RESPONSES_CONVERTER_NEEDS = (
    "NeMoGymChatCompletion",
    "NeMoGymChatCompletionAssistantMessageForTrainingParam",
    "NeMoGymChatCompletionAssistantMessageParam",
    "NeMoGymChatCompletionDeveloperMessageParam",
    "NeMoGymChatCompletionMessageParam",
    "NeMoGymChatCompletionMessageToolCallFunctionParam",
    "NeMoGymChatCompletionMessageToolCallParam",
    "NeMoGymChatCompletionSystemMessageParam",
    "NeMoGymChatCompletionToolMessageParam",
    "NeMoGymChatCompletionToolParam",
    "NeMoGymChatCompletionToolUnionParam",
    "NeMoGymChatCompletionUserMessageParam",
    "NeMoGymChoice",
    "NeMoGymFunctionDefinition",
    "NeMoGymResponseInputTokensDetails",
    "NeMoGymResponseOutputItem",
    "NeMoGymResponseOutputRefusal",
    "NeMoGymResponseOutputTokensDetails",
    "NeMoGymResponseReasoningItem",
    "NeMoGymResponseUsage",
    "NeMoGymSummary",
    "Reasoning",
    "TokenIDLogProbMixin",
    "_validate_atomic_token_metadata",
    "training_variant_of",
)

# The Gym modules the checks need, and from each the names wanted (None: the whole, import-light file).
GYM_MODULES: dict[str, set[str] | None] = {
    "nemo_gym.failure_kinds": None,
    "nemo_gym.config_types": {"ModelServerRef", "ROLLOUT_PATH_PREFIX", "TOKEN_CAPTURE_PATH_SEGMENT"},
    "nemo_gym.global_config": {
        "AGENT_REF_KEY_NAME",
        "ENVIRONMENT_SERVER_STAMP_KEY_NAME",
        "ATTEMPT_INDEX_KEY_NAME",
        "ROLLOUT_ID_KEY_NAME",
        "ROLLOUT_INDEX_KEY_NAME",
        "TASK_INDEX_KEY_NAME",
    },
    "nemo_gym.rollout_correlation": {"maybe_rollout_id_from_run_body"},
    # How an agent routes a rollout's model calls through Gym's model server (resolve_model_base_url).
    "nemo_gym.server_utils": {"apply_rollout_prefix"},
    "nemo_gym.openai_utils": {
        "NeMoGymResponse",
        "NeMoGymResponseCreateParamsNonStreaming",
        "NeMoGymResponseInputItem",
        "NeMoGymEasyInputMessage",
        "NeMoGymFunctionCallOutput",
        "NeMoGymResponseFunctionToolCall",
        "NeMoGymResponseOutputMessage",
        "NeMoGymResponseOutputMessageForTraining",
        "NeMoGymResponseOutputText",
        "NeMoGymChatCompletionCreateParamsNonStreaming",
        # Run as the module loads (``select``): instances of the Responses item unions serialize by it.
        "_register_item_tags",
        # What Gym's ResponsesConverter imports from it.
        *RESPONSES_CONVERTER_NEEDS,
    },
    "nemo_gym.episode_types": {"EpisodeFailure", "BaseEpisodeResponse", "BaseEpisodeRequest", "EpisodeId"},
    "nemo_gym.base_resources_server": {"BaseVerifyResponse"},
    "nemo_gym.rollout_observability": {"AgentObservationBundle", "TrajectoryRecord", "ModelCallRef", "ObservationGap"},
    "nemo_gym.base_responses_api_model": {
        "ModelCallRecord",
        "build_model_call_record",
        "aggregate_model_call_records",
        "_classify_status",
        "_reconstruct_streamed_response",
    },
    "nemo_gym.atif_v1_7": None,
    # How the collector sends an episode request and reads its reply, and harbor's pass@k.
    # and how it tells rollouts apart across runs (``_identity_key``, by ``_routing_identity``).
    "nemo_gym.rollout_collection": {
        "_episode_request_body",
        "_episode_record",
        "_is_episode_response",
        "_identity_key",
        "_routing_identity",
    },
    "nemo_gym.metrics_config": {"PassMajorityStat"},
    "nemo_gym.reward_profile": {"compute_pass_majority_metrics"},
    "responses_api_agents.harbor_agent.utils": None,
    # How Gym's vllm_model turns a Responses request into the chat completion it sends vLLM: where an
    # earlier answer's token ids go (capture/correction.py).
    "nemo_gym.responses_converter": {"ResponsesConverter"},
}


@cache
def gym() -> dict[str, types.ModuleType]:
    """Gym's modules (only the selected definitions), keyed by module name."""
    for package in ("nemo_gym", "responses_api_agents", "responses_api_agents.harbor_agent"):
        sys.modules.setdefault(package, types.ModuleType(package)).__path__ = []
    loaded = {}
    for name, wanted in GYM_MODULES.items():
        code = source("nemo-gym", name.replace(".", "/") + ".py")
        loaded[name] = _module(name, select(code, wanted))
    return loaded


@cache
def harbor_trajectory() -> Any:
    """Harbor's ATIF ``Trajectory`` model (harbor/models/trajectories, which imports only pydantic and itself)."""
    for package in ("harbor", "harbor.models", "harbor.models.trajectories"):
        sys.modules.setdefault(package, types.ModuleType(package)).__path__ = []
    for name in ("content", "subagent_trajectory_ref", "tool_call", "metrics", "final_metrics", "agent"):
        _module(f"harbor.models.trajectories.{name}", source("harbor", f"harbor/models/trajectories/{name}.py"))
    for name in ("observation_result", "observation", "step", "trajectory"):
        _module(f"harbor.models.trajectories.{name}", source("harbor", f"harbor/models/trajectories/{name}.py"))
    return sys.modules["harbor.models.trajectories.trajectory"].Trajectory


TERMINUS_2 = "harbor/agents/terminus_2"


@cache
def harbor_terminus_parser() -> Any:
    """Terminus-2's own parser of a model's JSON answer (``TerminusJSONPlainParser``; it imports only the
    standard library), which decides what Terminus-2 types and whether it is done."""
    for package in ("harbor", "harbor.agents", "harbor.agents.terminus_2"):
        sys.modules.setdefault(package, types.ModuleType(package)).__path__ = []
    name = "harbor.agents.terminus_2.terminus_json_plain_parser"
    return _module(name, source("harbor", f"{TERMINUS_2}/terminus_json_plain_parser.py")).TerminusJSONPlainParser()


def harbor_terminus_prompt(instruction: str, terminal_state: str) -> str:
    """Terminus-2's first prompt, from its own template (``parser_name="json"``, its default)."""
    template = source("harbor", f"{TERMINUS_2}/templates/terminus-json-plain.txt")
    return template.format(instruction=instruction, terminal_state=terminal_state)


@cache
def harbor_registry() -> Any:
    """Harbor's ``harbor.models.registry`` module, with ``DatasetSpec`` (a row of ``registry.json``) and
    ``Registry``: the models, their imports (metrics, task ids) and nothing of Harbor's clients."""
    for package in ("harbor", "harbor.models", "harbor.models.metric", "harbor.models.task"):
        sys.modules.setdefault(package, types.ModuleType(package)).__path__ = []
    # harbor/models/task/id.py imports shortuuid for a cache path no check calls: a stand-in will do.
    sys.modules.setdefault("shortuuid", types.ModuleType("shortuuid"))
    constants = select(source("harbor", "harbor/constants.py"), {"TASK_CACHE_DIR", "PACKAGE_CACHE_DIR"})
    _module("harbor.constants", constants)
    for name in ("metric.type", "metric.config"):
        _module(f"harbor.models.{name}", source("harbor", f"harbor/models/{name.replace('.', '/')}.py"))
    ids = select(source("harbor", "harbor/models/task/id.py"), {"GitTaskId", "LocalTaskId", "PackageTaskId"})
    _module("harbor.models.task.id", ids)
    return _module("harbor.models.registry", select(source("harbor", "harbor/models/registry.py"), {"Registry"}))


def gym_example_rows() -> list[dict[str, Any]]:
    """Gym's own Harbor rollout rows (``responses_api_agents/harbor_agent/example/example_output.jsonl``)."""
    import json

    text = source("nemo-gym", "responses_api_agents/harbor_agent/example/example_output.jsonl")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- checking our output against Gym's models ---------------------------------------------------------------
def gym_constant(module: str, name: str) -> str:
    """A string constant of one of Gym's modules, read from its source (``NAME = "value"``)."""
    found = re.search(rf'^{name} = "([^"]+)"$', source("nemo-gym", module.replace(".", "/") + ".py"), re.MULTILINE)
    assert found, f"{module} no longer defines {name}"
    return found.group(1)


# The identity keys Gym's collector stamps on every record it writes (rollout_collection.py): ours
# must be spelled as Gym spells them, and be no others.
ROW_COLLECTOR_KEYS = {
    *(
        gym_constant("nemo_gym.global_config", name)
        for name in (
            "TASK_INDEX_KEY_NAME",
            "ROLLOUT_INDEX_KEY_NAME",
            "ATTEMPT_INDEX_KEY_NAME",
            "ENVIRONMENT_SERVER_STAMP_KEY_NAME",
        )
    ),
    gym_constant("nemo_gym.rollout_collection", "NG_TASK_ID_KEY"),
}
FAILURE_COLLECTOR_KEYS = ROW_COLLECTOR_KEYS | {
    "_ng_failure_class",
    "_ng_failure_terminal",
    "_ng_failure_message",
    "_ng_failure_stage",
}
CAPTURE_KEYS = {"rollout_id", "metrics", "calls", "gaps"}
PAYLOAD_KEYS = {"request", "response", "request_raw", "response_raw"}


def check_observation_keys(record: dict[str, Any]) -> None:
    """``ng_trajectory``, ``ng_agent_observations`` and ``ng_model_call_capture`` as Gym's models read them."""
    modules = gym()
    observability = modules["nemo_gym.rollout_observability"]
    model = modules["nemo_gym.base_responses_api_model"]
    if "ng_trajectory" in record:
        observability.TrajectoryRecord.model_validate(record["ng_trajectory"])
    if "ng_agent_observations" in record:
        observability.AgentObservationBundle.model_validate(record["ng_agent_observations"])
    if "ng_model_call_capture" in record:
        capture = record["ng_model_call_capture"]
        assert set(capture) <= CAPTURE_KEYS and {"rollout_id", "metrics", "calls"} <= set(capture), capture.keys()
        calls = [model.ModelCallRecord.model_validate(call) for call in capture["calls"]]
        assert not any(PAYLOAD_KEYS & set(call) for call in capture["calls"]), "the payloads belong to ng_trajectory"
        assert capture["metrics"] == model.aggregate_model_call_records(calls)
        for gap in capture.get("gaps") or []:
            observability.ObservationGap.model_validate(gap)


def check_rollout_row(row: dict[str, Any], collector_keys: set[str] | None = ROW_COLLECTOR_KEYS) -> None:
    """A ``rollouts.jsonl`` row: Gym's verify response, its observation keys, collector keys Gym's only
    (``collector_keys`` None: a row Gym's collector wrote, whose ``_ng_`` keys are all its own)."""
    modules = gym()
    modules["nemo_gym.base_resources_server"].BaseVerifyResponse.model_validate(row)
    if collector_keys is not None:
        assert {key for key in row if key.startswith("_ng_")} <= collector_keys
    check_observation_keys(row)
    openai_utils = modules["nemo_gym.openai_utils"]
    for turn in row["turns"]:
        openai_utils.NeMoGymResponseCreateParamsNonStreaming.model_validate(turn["responses_create_params"])
        openai_utils.NeMoGymResponse.model_validate(turn["response"])
        assert "ng_model_call_capture" not in turn
        check_observation_keys(turn)


def check_failure_row(row: dict[str, Any]) -> None:
    """A ``rollouts_failures.jsonl`` row: Gym's handled environment failure (``EpisodeFailure``), no result."""
    modules = gym()
    assert {key for key in row if key.startswith("_ng_")} <= FAILURE_COLLECTOR_KEYS
    assert row["_ng_failure_class"] == "environment_server_failed"
    assert not {"reward", "response", "responses_create_params"} & set(row)
    failure = {
        "failure_reason": row["_ng_failure_message"],
        "terminal": row["_ng_failure_terminal"],
        "stage": row.get("_ng_failure_stage"),
        "failure_kind": row.get("failure_kind"),
    }
    modules["nemo_gym.episode_types"].EpisodeFailure.model_validate(failure)
