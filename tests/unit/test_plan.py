"""Turn plans: docs/task-format.md §3 resolution rules and the §5 edge cases decidable without a cluster."""

from __future__ import annotations

import pytest

from episode_operator.taskfolder import seed_refusals
from episode_operator.taskfolder.plan import (
    DEFAULT_AGENT_TIMEOUT_SEC,
    DEFAULT_EPISODE_TIMEOUT_SEC,
    HARNESS_SETUP_ALLOWANCE_SEC,
    VERIFIER_GRACE_SEC,
    ServerSettings,
    strip_canary,
)
from tests.unit.folders import IMAGE, TEST_SH, multi_step, plan_of, single_step, steps_toml

VERIFIER_IMAGE = "org/verifier:1"
STEP_VERIFIER_IMAGE = "org/build-verifier:1"


# --- §3.5 / §5.14: verifier mode resolution -------------------------------------------------------
TASK_TABLES = {
    "omitted": "",
    "shared": '[verifier]\nenvironment_mode = "shared"\n',
    "separate": '[verifier]\nenvironment_mode = "separate"\n',
    "environment": f'[verifier.environment]\ndocker_image = "{VERIFIER_IMAGE}"\n',
    "separate+environment": f'[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\n'
    f'docker_image = "{VERIFIER_IMAGE}"\n',
}
STEP_TABLES = {
    "omitted": "",
    "shared": '[steps.verifier]\nenvironment_mode = "shared"\n',
    "separate": '[steps.verifier]\nenvironment_mode = "separate"\n',
    "environment": f'[steps.verifier.environment]\ndocker_image = "{STEP_VERIFIER_IMAGE}"\n',
}
# (task table, step table) → (mode, separate verifier image). None for a shared turn.
MODE_MATRIX = {
    ("omitted", "omitted"): ("shared", None),
    ("omitted", "shared"): ("shared", None),
    ("omitted", "separate"): ("separate", IMAGE),  # a fresh copy of [environment]
    ("omitted", "environment"): ("separate", STEP_VERIFIER_IMAGE),
    ("shared", "omitted"): ("shared", None),
    ("shared", "separate"): ("separate", IMAGE),
    ("shared", "environment"): ("separate", STEP_VERIFIER_IMAGE),
    ("separate", "omitted"): ("separate", IMAGE),
    ("separate", "shared"): ("shared", None),
    ("separate", "environment"): ("separate", STEP_VERIFIER_IMAGE),
    ("environment", "omitted"): ("separate", VERIFIER_IMAGE),
    ("environment", "shared"): ("shared", None),  # task separate + step shared override
    ("environment", "separate"): ("separate", VERIFIER_IMAGE),  # [verifier.environment] before a copy
    ("environment", "environment"): ("separate", STEP_VERIFIER_IMAGE),  # the step's replaces the task's
    ("separate+environment", "omitted"): ("separate", VERIFIER_IMAGE),
    ("separate+environment", "shared"): ("shared", None),
}


@pytest.mark.parametrize(("task_table", "step_table"), sorted(MODE_MATRIX), ids=lambda value: str(value))
def test_step_verifier_mode_resolution(task_table: str, step_table: str) -> None:
    mode, image = MODE_MATRIX[(task_table, step_table)]
    plan = plan_of(multi_step(TASK_TABLES[task_table] + steps_toml("a", extra={"a": STEP_TABLES[step_table]}), ["a"]))
    verifier = plan.turns[0].verifier
    assert (verifier.mode, verifier.image) == (mode, image)
    assert (verifier.environment is None) == (mode == "shared")


@pytest.mark.parametrize(
    ("task_table", "expected"),
    [
        ("omitted", "shared"),
        ("shared", "shared"),
        ("separate", "separate"),
        ("environment", "separate"),
        ("separate+environment", "separate"),
    ],
)
def test_single_step_verifier_mode(task_table: str, expected: str) -> None:
    assert plan_of(single_step(TASK_TABLES[task_table])).turns[0].verifier.mode == expected


def test_step_environment_replaces_the_task_verifier_environment() -> None:
    """§5.14: a step environment replaces [verifier.environment] whole, it does not merge into it."""
    toml = f'[verifier.environment]\ndocker_image = "{VERIFIER_IMAGE}"\ncpus = 4\nmemory_mb = 4096\n' + steps_toml(
        "a", extra={"a": f'[steps.verifier.environment]\ndocker_image = "{STEP_VERIFIER_IMAGE}"\n'}
    )
    environment = plan_of(multi_step(toml, ["a"])).turns[0].verifier.environment
    assert environment is not None
    assert (environment.docker_image, environment.cpus, environment.memory_mb) == (
        STEP_VERIFIER_IMAGE,
        None,
        None,
    )


def test_separate_copy_of_environment_is_independent() -> None:
    toml = f'[environment]\ndocker_image = "{IMAGE}"\ncpus = 2\n[verifier]\nenvironment_mode = "separate"\n'
    plan = plan_of(single_step(toml))
    assert plan.turns[0].verifier.environment == plan.environment
    assert plan.turns[0].verifier.environment is not plan.environment


# --- §3.11, §5.10, §5.11: budgets and the multiplier -----------------------------------------------
def test_step_verifier_timeout_never_falls_back_to_task_verifier() -> None:
    """§5.10: [verifier].timeout_sec = 30 and a step without its own → 600 × multiplier."""
    toml = "[verifier]\ntimeout_sec = 30\n" + steps_toml("a", "b", extra={"b": "[steps.verifier]\ntimeout_sec = 45\n"})
    plan = plan_of(multi_step(toml, ["a", "b"]), multiplier=1.5)
    assert [turn.verifier.timeout_sec for turn in plan.turns] == [900.0, 67.5]


def test_single_step_verifier_uses_task_timeout() -> None:
    plan = plan_of(single_step("[verifier]\ntimeout_sec = 30\n"), multiplier=2)
    assert plan.turns[0].verifier.timeout_sec == 60.0


def test_multiplier_scales_agent_and_verifier_not_hooks_or_healthchecks() -> None:
    """§5.11: ×2 doubles agent/verifier budgets (the implicit 600 s too), not hooks or healthchecks."""
    toml = '[agent]\ntimeout_sec = 100\n[[verifier.collect]]\ncommand = "true"\n' + steps_toml(
        "a", extra={"a": '[steps.healthcheck]\ncommand = "true"\ntimeout_sec = 7\n'}
    )
    turn = plan_of(multi_step(toml, ["a"]), multiplier=2).turns[0]
    assert turn.agent.timeout_sec == 200.0
    assert turn.verifier.timeout_sec == 1200.0
    assert [hook.timeout_sec for hook in turn.collect] == [60.0]
    assert turn.healthcheck is not None and turn.healthcheck.timeout_sec == 7.0


def test_agent_budget_fallbacks() -> None:
    toml = "[agent]\ntimeout_sec = 50\n" + steps_toml("a", "b", extra={"b": "[steps.agent]\ntimeout_sec = 20\n"})
    assert [t.agent.timeout_sec for t in plan_of(multi_step(toml, ["a", "b"])).turns] == [50.0, 20.0]
    assert plan_of(single_step()).turns[0].agent.timeout_sec == DEFAULT_AGENT_TIMEOUT_SEC


def test_setup_bound_is_the_step_agent_budget() -> None:
    toml = steps_toml("a", extra={"a": "[steps.agent]\ntimeout_sec = 40\n"})
    turn = plan_of(multi_step(toml, ["a"], {"steps/a/workdir/setup.sh": "true\n"}), multiplier=3).turns[0]
    assert (turn.setup, turn.setup_timeout_sec) == (True, 120.0)


@pytest.mark.parametrize("multiplier", [0.0, -1.0, float("nan"), float("inf")])
def test_multiplier_must_be_positive_and_finite(multiplier: float) -> None:
    with pytest.raises(ValueError, match="positive number"):
        plan_of(single_step(), multiplier=multiplier)


def test_episode_deadline_sums_every_bound() -> None:
    toml = (
        f'[environment]\ndocker_image = "{IMAGE}"\nbuild_timeout_sec = 100\n'
        '[environment.healthcheck]\ncommand = "true"\nretries = 2\n'
        "[agent]\ntimeout_sec = 10\n"
        '[[verifier.collect]]\ncommand = "true"\ntimeout_sec = 5\n'
        + steps_toml(
            "a",
            "b",
            extra={
                "a": '[steps.healthcheck]\ncommand = "true"\nretries = 0\ntimeout_sec = 1\n',
                "b": '[steps.verifier]\nenvironment_mode = "separate"\ntimeout_sec = 20\n',
            },
        )
    )
    plan = plan_of(multi_step(toml, ["a", "b"], {"steps/a/workdir/setup.sh": "true"}))
    env_health = 0 + 5 + 30 + 2 * 30 + 1 * 5  # start period + start interval + timeout + retries × timeout + gaps
    step_health = 0 + 5 + 1 + 1 * 1 + 0
    turn_a = HARNESS_SETUP_ALLOWANCE_SEC + 10 + 10 + step_health + 600 + VERIFIER_GRACE_SEC + 5
    turn_b = HARNESS_SETUP_ALLOWANCE_SEC + 10 + 20 + VERIFIER_GRACE_SEC + 5 + 100  # + its sandbox start
    assert plan.deadline_sec == 100 + env_health + turn_a + turn_b


def test_deadline_above_default_keeps_the_task_bound_with_a_warning() -> None:
    """§5.20: a summed bound above 21 600 s is still the deadline; only a warning says so."""
    plan = plan_of(single_step("[agent]\ntimeout_sec = 30000\n"))
    assert plan.deadline_sec > DEFAULT_EPISODE_TIMEOUT_SEC
    assert any("exceeds the default 21600 s" in warning for warning in plan.warnings)


# --- users and env (§3.4.2, §3.4.6, §5.17) -----------------------------------------------------------
def test_agent_and_verifier_users_and_env_overlay() -> None:
    toml = '[agent]\nuser = "alice"\n[verifier]\nuser = "grader"\nenv = { A = "task", B = "task" }\n' + steps_toml(
        "a",
        "b",
        extra={"b": '[steps.agent]\nuser = "bob"\n[steps.verifier]\nuser = 1001\nenv = { B = "step", C = "step" }\n'},
    )
    first, second = plan_of(multi_step(toml, ["a", "b"])).turns
    assert (first.agent.user, first.verifier.user, first.verifier.env) == (
        "alice",
        "grader",
        {"A": "task", "B": "task"},
    )
    assert (second.agent.user, second.verifier.user) == ("bob", 1001)
    assert second.verifier.env == {"A": "task", "B": "step", "C": "step"}


def test_seed_refusals() -> None:
    toml = steps_toml("a", extra={"a": '[steps.agent]\nuser = "bob:staff"\n'})
    plan = plan_of(multi_step(toml, ["a"], {"steps/a/trajectory.json": "{}"}))
    refused = [problem.render() for problem in seed_refusals(plan, accepts_prior_trajectory=False)]
    assert (
        "steps/a/trajectory.json: a first step's trajectory.json is refused for every agent but the oracle" in refused
    )
    assert any("user 'bob:staff'" in line for line in refused)
    oracle = [problem.render() for problem in seed_refusals(plan, accepts_prior_trajectory=True)]
    assert not any("trajectory" in line for line in oracle)
    no_image = plan_of(single_step('[environment]\nos = "Windows"\n', {"tests/test.bat": "x", "tests/test.sh": None}))
    messages = [p.render() for p in seed_refusals(no_image, accepts_prior_trajectory=True)]
    assert messages == ["task.toml: environment.os: the operator runs Linux pods only"]


@pytest.mark.parametrize(
    ("toml", "key", "host"),
    [
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["10.0.0.0/8", "pypi.org"]\n',
            "environment",
            "pypi.org",
        ),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["*.github.com"]\n', "agent", "*.github.com"),
        ('[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["files.example"]\n', "verifier", "files.example"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["10.0.0.1", "fd00::/8"]\n', None, None),
        ('[environment]\nnetwork_mode = "public"\n', None, None),
    ],
    ids=["environment", "agent-wildcard", "verifier", "addresses-only", "public"],
)
def test_a_hostname_in_an_allowlist_is_refused_at_seed_naming_its_key(
    toml: str, key: str | None, host: str | None
) -> None:
    """Harbor's rule: enforce the allowlist or refuse the task. A NetworkPolicy names addresses
    only, so a hostname would be a policy that blocks the host it names (a measured 0)."""
    refused = [p.render() for p in seed_refusals(plan_of(single_step(toml)), accepts_prior_trajectory=True)]
    if key is None:
        assert refused == []
        return
    assert refused == [
        f"task.toml: {key}.allowed_hosts: {host!r} is a hostname: the operator's NetworkPolicies allow addresses "
        "and CIDR ranges only, so the host would be unreachable; list its addresses instead"
    ]


# --- tests, solutions, workdir, instructions (§5.12, §5.13, §5.19) -----------------------------------
def test_tests_are_layered_step_over_task() -> None:
    """§5.13: task helpers + step test.sh → both; a step helper overrides the task's."""
    files = {
        "tests/helpers.sh": "task helpers",
        "tests/data/shared.txt": "x",
        "steps/a/tests/test.sh": TEST_SH,
        "steps/b/tests/helpers.sh": "step helpers",
    }
    a, b = plan_of(multi_step(steps_toml("a", "b"), ["a", "b"], files)).turns
    assert a.tests == {
        "data/shared.txt": "tests/data/shared.txt",
        "helpers.sh": "tests/helpers.sh",
        "test.sh": "steps/a/tests/test.sh",
    }
    assert b.tests == {
        "data/shared.txt": "tests/data/shared.txt",
        "helpers.sh": "steps/b/tests/helpers.sh",
        "test.sh": "tests/test.sh",
    }


def test_solution_per_step_else_top_level() -> None:
    files = {
        "solution/solve.sh": "top",
        "steps/a/solution/solve.sh": "a",
        "steps/b/solution/notes.md": "no script",
    }
    result = plan_of(multi_step(steps_toml("a", "b", "c"), ["a", "b", "c"], files))
    assert [(t.solution, t.solution_runnable) for t in result.turns] == [
        ("steps/a/solution", True),
        ("steps/b/solution", False),  # flagged: the oracle cannot validate this step
        ("solution", True),
    ]
    assert plan_of(multi_step(steps_toml("a"), ["a"])).turns[0].solution is None


def test_workdir_and_setup_only_at_workdir_root() -> None:
    """§5.12: a setup.sh outside workdir/ (or deeper in it) is not run."""
    files = {
        "steps/a/workdir/setup.sh": "true",
        "steps/b/setup.sh": "not run",
        "steps/c/workdir/sub/setup.sh": "not run",
    }
    result = plan_of(multi_step(steps_toml("a", "b", "c"), ["a", "b", "c"], files))
    assert [(t.workdir, t.setup) for t in result.turns] == [
        ("steps/a/workdir", True),
        (None, False),
        ("steps/c/workdir", False),
    ]


def test_canary_lines_are_stripped_only_at_the_start() -> None:
    """§5.19."""
    text = "<!-- harbor-canary GUID 1234 -->\n# BENCHMARK DATA canary line\n\n\nDo it.\n<!-- canary -->\nkeep\n"
    assert strip_canary(text) == "Do it.\n<!-- canary -->\nkeep\n"
    assert strip_canary("Do it.\n# canary\n") == "Do it.\n# canary\n"
    assert strip_canary("") == ""


def test_top_level_instruction_of_a_multi_step_task_is_never_used() -> None:
    folder = multi_step(steps_toml("a", "b"), ["a", "b"], {"instruction.md": "SECRET"})
    assert all("SECRET" not in turn.instruction for turn in plan_of(folder).turns)


# --- artifacts (§2.10, §5.18) ----------------------------------------------------------------------
def test_artifacts_in_collection_order_with_origin() -> None:
    toml = 'artifacts = ["/app/out", { source = "/var/log/app.log", destination = "logs/app.log" }]\n' + steps_toml(
        "a", extra={"a": 'artifacts = [{ source = "/app/step", exclude = ["*.tmp"] }]\n'}
    )
    turn = plan_of(multi_step(toml, ["a"])).turns[0]
    assert [(a.source, a.destination, a.origin, a.exclude) for a in turn.artifacts] == [
        ("/logs/artifacts", "logs/artifacts", "convention", []),
        ("/app/out", "app/out", "task", []),
        ("/var/log/app.log", "logs/app.log", "task", []),
        ("/app/step", "app/step", "step", ["*.tmp"]),
    ]


def test_declared_convention_entry_replaces_the_implicit_one() -> None:
    toml = 'artifacts = [{ source = "/logs/artifacts/", exclude = ["big"] }]\n'
    turn = plan_of(single_step(toml)).turns[0]
    assert [(a.source, a.origin, a.exclude) for a in turn.artifacts] == [("/logs/artifacts/", "task", ["big"])]


# --- shapes -----------------------------------------------------------------------------------------
def test_empty_steps_array_is_single_step() -> None:
    plan = plan_of(single_step("steps = []\n"))
    assert (plan.multi_step, [turn.name for turn in plan.turns], plan.reward_strategy) == (
        False,
        ["task"],
        None,
    )


def test_reward_strategy_defaults_to_mean_and_legacy_mode_is_dropped() -> None:
    assert plan_of(multi_step(steps_toml("a"), ["a"])).reward_strategy == "mean"
    legacy = 'multi_step_reward_mode = "final"\n' + steps_toml("a")
    assert plan_of(multi_step(legacy, ["a"])).reward_strategy == "mean"
    final = 'multi_step_reward_strategy = "final"\n' + steps_toml("a")
    assert plan_of(multi_step(final, ["a"])).reward_strategy == "final"


def test_min_reward_and_step_healthcheck_carried_per_turn() -> None:
    toml = steps_toml(
        "a",
        "b",
        extra={
            "a": "min_reward = 1\n",
            "b": 'min_reward = { core = 0.5 }\n[steps.healthcheck]\ncommand = "curl x"\n',
        },
    )
    a, b = plan_of(multi_step(toml, ["a", "b"])).turns
    assert (a.min_reward, a.healthcheck) == (1.0, None)
    assert b.min_reward == {"core": 0.5}
    assert b.healthcheck is not None and (b.healthcheck.command, b.healthcheck.retries) == ("curl x", 3)


def test_collect_hooks_task_then_step() -> None:
    toml = '[[verifier.collect]]\ncommand = "task"\n' + steps_toml(
        "a", extra={"a": '[[steps.verifier.collect]]\ncommand = "step"\ntimeout_sec = 3\n'}
    )
    turn = plan_of(multi_step(toml, ["a"])).turns[0]
    assert [(hook.command, hook.timeout_sec) for hook in turn.collect] == [("task", 60.0), ("step", 3.0)]


def test_environment_files_copied_when_nothing_builds() -> None:
    assert plan_of(single_step(files={"environment/data.txt": "x"})).environment_files == "environment"
    assert (
        plan_of(single_step(files={"environment/Dockerfile": "FROM x", "environment/data.txt": "x"})).environment_files
        is None
    )
    assert plan_of(single_step()).environment_files is None


def test_phase_network_policies() -> None:
    toml = (
        f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
        '[agent]\nnetwork_mode = "no-network"\n'
    )
    turn = plan_of(single_step(toml)).turns[0]
    assert (turn.agent.network.mode, turn.agent.network.allowed_hosts) == ("no-network", [])
    assert (turn.verifier.network.mode, turn.verifier.network.allowed_hosts) == ("allowlist", ["pypi.org"])


# --- Gym's harbor server settings (spec.harbor) ------------------------------------------------------
def test_the_step_setup_timeout_setting_bounds_setup_sh_unscaled() -> None:
    toml = steps_toml("a", "b", extra={"a": "[steps.agent]\ntimeout_sec = 40\n"})
    folder = multi_step(toml, ["a", "b"], {"steps/a/workdir/setup.sh": "true\n"})
    turns = plan_of(folder, multiplier=3, settings=ServerSettings(step_setup_timeout_sec=7)).turns
    assert [(turn.setup, turn.setup_timeout_sec) for turn in turns] == [(True, 7.0), (False, None)]


def test_the_verifier_grace_setting_is_counted_once_per_turn() -> None:
    folder = multi_step(steps_toml("a", "b", "c"), ["a", "b", "c"])
    seed, graceless = plan_of(folder), plan_of(folder, settings=ServerSettings(verifier_grace_sec=0))
    assert seed.deadline_sec - graceless.deadline_sec == 3 * VERIFIER_GRACE_SEC


def test_without_enforced_task_timeouts_the_deadline_is_the_default_and_must_fit_a_sandbox_start() -> None:
    folder = single_step(f'[environment]\ndocker_image = "{IMAGE}"\nbuild_timeout_sec = 900\n')
    loose = plan_of(folder, settings=ServerSettings(enforce_task_timeouts=False, default_episode_timeout_sec=1000))
    assert loose.deadline_sec == 1000 and not seed_refusals(loose, accepts_prior_trajectory=False)
    tight = plan_of(folder, settings=ServerSettings(enforce_task_timeouts=False, default_episode_timeout_sec=600))
    (refusal,) = [problem.render() for problem in seed_refusals(tight, accepts_prior_trajectory=False)]
    assert "environment.build_timeout_sec" in refusal and "defaultEpisodeTimeoutSec" in refusal, refusal
    # Enforced, the same default only warns: the task's own bound stands.
    enforced = plan_of(folder, settings=ServerSettings(default_episode_timeout_sec=600))
    assert enforced.deadline_sec > 600 and any("exceeds the default 600 s" in w for w in enforced.warnings)
    assert not seed_refusals(enforced, accepts_prior_trajectory=False)


def test_separate_verifier_for_artifacts_separates_the_turns_that_declare_artifacts() -> None:
    toml = steps_toml("plain", "declares", extra={"declares": 'artifacts = ["/app/out"]\n'})
    folder = multi_step(toml, ["plain", "declares"])
    assert [t.verifier.mode for t in plan_of(folder).turns] == ["shared", "shared"]
    separated = plan_of(folder, settings=ServerSettings(separate_verifier_for_artifacts=True))
    assert [(t.verifier.mode, t.verifier.image) for t in separated.turns] == [("shared", None), ("separate", IMAGE)]
    # A task-level declaration reaches every turn; the implicit /logs/artifacts is no declaration.
    task_level = multi_step('artifacts = ["/app/out"]\n' + steps_toml("a", "b"), ["a", "b"])
    modes = [
        t.verifier.mode
        for t in plan_of(task_level, settings=ServerSettings(separate_verifier_for_artifacts=True)).turns
    ]
    assert modes == ["separate", "separate"]


def test_the_prompt_template_wraps_the_first_turns_instruction_only() -> None:
    template = ServerSettings(prompt_template="You are in a sandbox.\n\n{instruction}\nAnswer with care.")
    turns = plan_of(multi_step(steps_toml("a", "b"), ["a", "b"]), settings=template).turns
    assert [turn.instruction for turn in turns] == [
        "You are in a sandbox.\n\nInstruction of a.\n\nAnswer with care.",
        "Instruction of b.\n",
    ]
    (single,) = plan_of(single_step(), settings=template).turns
    assert single.instruction == "You are in a sandbox.\n\nDo the thing.\n\nAnswer with care."
