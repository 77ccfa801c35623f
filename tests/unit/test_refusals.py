"""Every load-time refusal of docs/task-format.md §4, one row each, with the file and key named."""

from __future__ import annotations

import pytest

from episode_operator.taskfolder import TaskFiles, TaskRefused, load_task, validate_task
from tests.unit.folders import IMAGE, TEST_SH, check, multi_step, single_step, steps_toml

SEPARATE_STEP = '[steps.verifier]\nenvironment_mode = "separate"\n'


def two_steps(extra_b: str = "", toml: str = "", files: dict[str, str | None] | None = None) -> dict[str, str]:
    return multi_step(toml + steps_toml("a", "b", extra={"b": extra_b}), ["a", "b"], files)


# (id, folder, file, key or None, part of the message)
REFUSALS: list[tuple[str, dict[str, str], str, str | None, str]] = [
    # 1: no task.toml, TOML syntax, encoding
    ("1-no-task-toml", single_step(files={"task.toml": None}), "task.toml", None, "missing"),
    (
        "1-toml-syntax",
        single_step(files={"task.toml": "[agent\ntimeout_sec = 1\n"}),
        "task.toml",
        None,
        "TOML syntax error",
    ),
    # 2: a schema error
    (
        "2-agent-timeout-type",
        single_step('[agent]\ntimeout_sec = "soon"\n'),
        "task.toml",
        "agent.timeout_sec",
        "valid number",
    ),
    # 3: single-step without instruction.md
    (
        "3-no-instruction",
        single_step(files={"instruction.md": None}),
        "instruction.md",
        None,
        "single-step task needs instruction.md",
    ),
    # 4: single-step without tests/, or without test.sh in shared mode
    (
        "4-no-tests-folder",
        single_step(files={"tests/test.sh": None}),
        "tests/",
        None,
        "needs a tests/ folder",
    ),
    (
        "4-no-test-sh",
        single_step(files={"tests/test.sh": None, "tests/helper.sh": "true"}),
        "tests/test.sh",
        None,
        "missing",
    ),
    (
        "4-python-verifier",
        single_step(files={"tests/test.sh": None, "tests/verifier.py": "pass"}),
        "tests/verifier.py",
        None,
        "Python verifiers are not supported",
    ),
    # 5, 6, 7: step folder, its instruction, a test.sh for it
    (
        "5-no-step-folder",
        two_steps(files={"steps/b/instruction.md": None}),
        "steps/b/",
        None,
        "step 'b' needs its folder",
    ),
    (
        "6-no-step-instruction",
        two_steps(files={"steps/b/instruction.md": None, "steps/b/tests/test.sh": TEST_SH}),
        "steps/b/instruction.md",
        None,
        "needs its instruction",
    ),
    (
        "7-no-step-test-sh",
        two_steps(files={"tests/test.sh": None, "steps/a/tests/test.sh": TEST_SH}),
        "steps/b/tests/test.sh",
        None,
        "needs test.sh in steps/b/tests/ or tests/",
    ),
    # 8: a separate step with its own tests/ folder needs a docker_image in its verifier environment
    (
        "8-separate-step-tests-no-image",
        two_steps("[steps.verifier.environment]\ncpus = 1\n", files={"steps/b/tests/test.sh": TEST_SH}),
        "task.toml",
        "steps[1].verifier.environment",
        "must declare docker_image",
    ),
    (
        "8-separate-copy-without-image",
        two_steps(SEPARATE_STEP, toml="", files={"steps/b/tests/extra.txt": "x"})
        | {"task.toml": steps_toml("a", "b", extra={"b": SEPARATE_STEP}) + "[environment]\ncpus = 1\n"},
        "task.toml",
        "steps[1].verifier.environment",
        "must declare docker_image",
    ),
    # 9: a separate verifier without an image or a definition
    (
        "9-separate-no-image",
        single_step("[verifier.environment]\ncpus = 2\n"),
        "task.toml",
        "[verifier.environment]",
        "no image and no definition",
    ),
    # 10: shared together with a verifier environment
    (
        "10-shared-with-environment",
        single_step(f'[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "{IMAGE}"\n'),
        "task.toml",
        "verifier",
        'environment_mode = "shared" conflicts',
    ),
    (
        "10-step-shared-with-environment",
        two_steps(
            f'[steps.verifier]\nenvironment_mode = "shared"\n[steps.verifier.environment]\ndocker_image = "{IMAGE}"\n'
        ),
        "task.toml",
        "steps[1].verifier",
        'environment_mode = "shared" conflicts',
    ),
    # 11: no network restriction on a step
    (
        "11-step-agent-network",
        two_steps('[steps.agent]\nnetwork_mode = "no-network"\n'),
        "task.toml",
        "steps[1]",
        "not allowed on [steps.agent]",
    ),
    (
        "11-step-verifier-network",
        two_steps('[steps.verifier]\nnetwork_mode = "no-network"\n'),
        "task.toml",
        "steps[1]",
        "not allowed on [steps.verifier]",
    ),
    (
        "11-step-verifier-environment-network",
        two_steps(f'[steps.verifier.environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "no-network"\n'),
        "task.toml",
        "steps[1]",
        "[steps.verifier.environment]",
    ),
    # 12: a [verifier] network restriction while a step verifies shared
    (
        "12-verifier-network-shared-step",
        multi_step('[verifier]\nnetwork_mode = "no-network"\n' + steps_toml("a"), ["a"]),
        "task.toml",
        None,
        "while a step verifies shared (steps: a)",
    ),
    # 14: allowed_hosts rules
    (
        "14-hosts-without-allowlist",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nallowed_hosts = ["example.com"]\n'),
        "task.toml",
        "environment",
        'only valid with network_mode = "allowlist"',
    ),
    (
        "14-host-url",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["https://example.com/x"]\n'
        ),
        "task.toml",
        "environment.allowed_hosts",
        "not a URL, port or path",
    ),
    (
        "14-host-port",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["example.com:443"]\n'
        ),
        "task.toml",
        "environment.allowed_hosts",
        "not a URL, port or path",
    ),
    (
        "14-host-brackets",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\nallowed_hosts = ["[example]"]\n'
        ),
        "task.toml",
        "environment.allowed_hosts",
        "brackets",
    ),
    (
        "14-host-inner-wildcard",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\nallowed_hosts = ["api.*.com"]\n'
        ),
        "task.toml",
        "environment.allowed_hosts",
        "leading '*.'",
    ),
    (
        "14-host-wildcard-ip",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\nallowed_hosts = ["*.10.0.0.1"]\n'
        ),
        "task.toml",
        "environment.allowed_hosts",
        "not an IP address",
    ),
    (
        "14-host-bad-label",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\nallowed_hosts = ["exa_mple.com"]\n'
        ),
        "task.toml",
        "environment.allowed_hosts",
        "not a valid hostname",
    ),
    # 15: legacy conflicts
    (
        "15-memory-conflict",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nmemory = "1G"\nmemory_mb = 512\n'),
        "task.toml",
        "environment",
        "memory = '1G' (1024 MB) conflicts with memory_mb = 512",
    ),
    (
        "15-storage-no-suffix",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nstorage = "512"\n'),
        "task.toml",
        "environment",
        "expected a number followed by K, M or G",
    ),
    (
        "15-image-conflict",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nimage = "other:1"\n'),
        "task.toml",
        "environment",
        "conflicts with docker_image",
    ),
    # 16: bounds, NaN and infinity
    (
        "16-build-timeout-zero",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nbuild_timeout_sec = 0\n'),
        "task.toml",
        "environment.build_timeout_sec",
        "greater than 0",
    ),
    (
        "16-cpus-zero",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\ncpus = 0\n'),
        "task.toml",
        "environment.cpus",
        "greater than 0",
    ),
    (
        "16-memory-negative",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nmemory_mb = -1\n'),
        "task.toml",
        "environment.memory_mb",
        "greater than 0",
    ),
    (
        "16-storage-zero",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nstorage_mb = 0\n'),
        "task.toml",
        "environment.storage_mb",
        "greater than 0",
    ),
    (
        "16-gpus-negative",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\ngpus = -1\n'),
        "task.toml",
        "environment.gpus",
        "greater than or equal to 0",
    ),
    (
        "16-agent-timeout-zero",
        single_step("[agent]\ntimeout_sec = 0\n"),
        "task.toml",
        "agent.timeout_sec",
        "greater than 0",
    ),
    (
        "16-verifier-timeout-negative",
        single_step("[verifier]\ntimeout_sec = -5\n"),
        "task.toml",
        "verifier.timeout_sec",
        "greater than 0",
    ),
    (
        "16-collect-timeout-zero",
        single_step('[[verifier.collect]]\ncommand = "true"\ntimeout_sec = 0\n'),
        "task.toml",
        "verifier.collect[0].timeout_sec",
        "greater than 0",
    ),
    (
        "16-nan",
        single_step("[agent]\ntimeout_sec = nan\n"),
        "task.toml",
        "agent.timeout_sec",
        "finite number",
    ),
    (
        "16-inf",
        single_step("[verifier]\ntimeout_sec = inf\n"),
        "task.toml",
        "verifier.timeout_sec",
        "finite number",
    ),
    (
        "16-step-nan",
        two_steps("[steps.verifier]\ntimeout_sec = -inf\n"),
        "task.toml",
        "steps[1].verifier.timeout_sec",
        "(step 'b')",
    ),
    # 17: MCP servers
    (
        "17-sse-without-url",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\n[[environment.mcp_servers]]\nname = "search"\n'),
        "task.toml",
        "environment.mcp_servers[0]",
        "transport 'sse' needs `url`",
    ),
    (
        "17-stdio-without-command",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\n[[environment.mcp_servers]]\nname = "fs"\ntransport = "stdio"\n'
        ),
        "task.toml",
        "environment.mcp_servers[0]",
        "transport 'stdio' needs `command`",
    ),
    (
        "17-unknown-transport",
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\n[[environment.mcp_servers]]\n'
            'name = "x"\ntransport = "carrier-pigeon"\nurl = "http://x"\n'
        ),
        "task.toml",
        "environment.mcp_servers[0].transport",
        "carrier-pigeon",
    ),
    # 18: artifacts
    (
        "18-source-dotdot",
        single_step('artifacts = ["/app/../etc"]\n'),
        "task.toml",
        "artifacts[0].source",
        "'..'",
    ),
    (
        "18-source-backslash",
        single_step('artifacts = ["C:\\\\logs\\\\x"]\n'),
        "task.toml",
        "artifacts[0].source",
        "'/' separators",
    ),
    (
        "18-destination-dotdot",
        single_step('artifacts = [{ source = "/app", destination = "../up" }]\n'),
        "task.toml",
        "artifacts[0].destination",
        "'..'",
    ),
    (
        "18-destination-backslash",
        single_step('artifacts = [{ source = "/app", destination = "a\\\\b" }]\n'),
        "task.toml",
        "artifacts[0].destination",
        "'/' separators",
    ),
    (
        "18-destination-absolute",
        single_step('artifacts = [{ source = "/app", destination = "/abs" }]\n'),
        "task.toml",
        "artifacts[0].destination",
        "must be relative",
    ),
    (
        "18-destination-manifest",
        single_step('artifacts = [{ source = "/app", destination = "manifest.json" }]\n'),
        "task.toml",
        "artifacts[0].destination",
        "reserved for the collection manifest",
    ),
    (
        "18-sidecar-relative-source",
        single_step('artifacts = [{ source = "data/x", service = "db" }]\n'),
        "task.toml",
        "artifacts[0]",
        "must be an absolute path",
    ),
    (
        "18-invalid-service",
        single_step('artifacts = [{ source = "/x", service = "-db" }]\n'),
        "task.toml",
        "artifacts[0].service",
        "invalid compose service name",
    ),
    (
        "18-step-artifact-dotdot",
        two_steps('artifacts = ["/app/../../x"]\n'),
        "task.toml",
        "steps[1].artifacts[0].source",
        "'..'",
    ),
    # 19: collect hooks
    (
        "19-empty-service",
        single_step('[[verifier.collect]]\ncommand = "true"\nservice = ""\n'),
        "task.toml",
        "verifier.collect[0].service",
        "invalid compose service name",
    ),
    (
        "19-service-not-in-compose",
        single_step('[[verifier.collect]]\ncommand = "true"\nservice = "db"\n'),
        "task.toml",
        "verifier.collect[0].service",
        "service 'db' is not a service",
    ),
    # 20: [task] package info
    ("20-task-name-no-org", single_step('[task]\nname = "hello"\n'), "task.toml", "task.name", "'org/name'"),
    ("20-task-name-dotdot", single_step('[task]\nname = "org/a..b"\n'), "task.toml", "task.name", "no '..'"),
    (
        "20-task-version-empty",
        single_step('[task]\nname = "org/x"\nversion = ""\n'),
        "task.toml",
        "task.version",
        "at least 1 character",
    ),
    (
        "20-task-name-missing",
        single_step('[task]\ndescription = "x"\n'),
        "task.toml",
        "task.name",
        "required key is missing",
    ),
    # 21: enums, min_reward, TPU topology
    (
        "21-os",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\nos = "plan9"\n'),
        "task.toml",
        "environment.os",
        "'linux' or 'windows'",
    ),
    (
        "21-environment-mode",
        single_step('[verifier]\nenvironment_mode = "elsewhere"\n'),
        "task.toml",
        "verifier.environment_mode",
        "'shared' or 'separate'",
    ),
    (
        "21-reward-strategy",
        multi_step('multi_step_reward_strategy = "max"\n' + steps_toml("a"), ["a"]),
        "task.toml",
        "multi_step_reward_strategy",
        "'mean' or 'final'",
    ),
    (
        "21-min-reward-string",
        two_steps('min_reward = "high"\n'),
        "task.toml",
        "steps[1].min_reward",
        "must be a number or a table of numbers",
    ),
    (
        "21-min-reward-table-of-strings",
        two_steps('min_reward = { reward = "1" }\n'),
        "task.toml",
        "steps[1].min_reward",
        "must be a number or a table of numbers",
    ),
    (
        "21-tpu-topology",
        single_step(f'[environment]\ndocker_image = "{IMAGE}"\n[environment.tpu]\ntype = "v6e"\ntopology = "2by4"\n'),
        "task.toml",
        "environment.tpu.topology",
        "invalid TPU topology",
    ),
    # Found by the property tests: a non-array [[steps]] is a schema error, not a crash
    ("steps-not-an-array", single_step("steps = true\n"), "task.toml", "steps", "valid list"),
    # Gym's step-name rule and uniqueness
    (
        "steps-bad-name",
        multi_step(steps_toml("-bad"), ["-bad"]),
        "task.toml",
        "steps[0].name",
        "must be letters, digits",
    ),
    (
        "steps-duplicate-names",
        multi_step(steps_toml("a", "a"), ["a"]),
        "task.toml",
        None,
        "duplicate step names: a",
    ),
]


@pytest.mark.parametrize(
    ("folder", "file", "key", "fragment"), [row[1:] for row in REFUSALS], ids=[row[0] for row in REFUSALS]
)
def test_refusal_names_file_and_key(folder: dict[str, str], file: str, key: str | None, fragment: str) -> None:
    result = check(folder)
    assert not result.valid
    matches = [p for p in result.problems if p.file == file and p.key == key and fragment in p.message]
    assert matches, "\n".join(p.render() for p in result.problems)


def test_load_task_raises_with_every_problem() -> None:
    folder = single_step("[agent]\ntimeout_sec = 0\n[verifier]\ntimeout_sec = -1\n", {"instruction.md": None})
    with pytest.raises(TaskRefused) as refused:
        load_task(TaskFiles.from_mapping(folder))
    keys = {problem.key for problem in refused.value.problems}
    assert {"agent.timeout_sec", "verifier.timeout_sec"} <= keys


def test_all_errors_are_collected_across_tables_and_folders() -> None:
    """Schema errors in several tables and a missing step folder are reported together."""
    toml = "[environment]\ncpus = 0\n[agent]\ntimeout_sec = -1\n" + steps_toml(
        "ok", "gone", "bad name", extra={"ok": "[steps.verifier]\ntimeout_sec = 0\n"}
    )
    result = validate_task(
        TaskFiles.from_mapping({"task.toml": toml, "steps/ok/instruction.md": "x", "tests/test.sh": TEST_SH})
    )
    rendered = [problem.render() for problem in result.problems]
    assert "task.toml: environment.cpus: Input should be greater than 0 (got 0)" in rendered
    assert "task.toml: agent.timeout_sec: Input should be greater than 0 (got -1)" in rendered
    assert any(r.startswith("task.toml: steps[0].verifier.timeout_sec:") and "(step 'ok')" in r for r in rendered)
    assert any(r.startswith("task.toml: steps[2].name:") for r in rendered)
    # Folder checks still run on the steps whose names are usable.
    assert "steps/gone/: missing: step 'gone' needs its folder" in rendered


def test_shared_and_separate_verifier_folders_are_accepted() -> None:
    """Control rows: the refusals above are specific, not a blanket rule."""
    ok = [
        two_steps(
            f'[steps.verifier.environment]\ndocker_image = "{IMAGE}"\n',
            files={"steps/b/tests/test.sh": TEST_SH},
        ),
        two_steps(SEPARATE_STEP, files={"steps/b/tests/test.sh": TEST_SH}),  # copy of [environment] has an image
        single_step("[verifier.environment]\ncpus = 2\n", {"tests/Dockerfile": "FROM x\n"}),  # warned, not refused
        multi_step('[verifier]\nnetwork_mode = "no-network"\n' + steps_toml("a", extra={"a": SEPARATE_STEP}), ["a"]),
        single_step(
            f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["*.Example.com.", "10.0.0.0/8", "::1"]\n'
        ),
        single_step("[steps]\n"),  # not an array: refused below, so this row checks the opposite
    ]
    for folder in ok[:-1]:
        result = check(folder)
        assert result.valid, "\n".join(p.render() for p in result.problems)
    assert not check(ok[-1]).valid


def test_separate_verifier_with_dockerfile_definition_is_valid() -> None:
    """Its image is made from tests/Dockerfile (replayed or built), as Harbor makes it."""
    result = check(single_step("[verifier.environment]\ncpus = 2\n", {"tests/Dockerfile": "FROM x\n"}))
    assert result.valid and not result.warnings


def test_source_problems_are_refusals() -> None:
    files = TaskFiles.from_mapping({**single_step(), "../escape.txt": "x", "/abs.txt": "y"})
    result = validate_task(files)
    rendered = [problem.render() for problem in result.problems]
    assert "../escape.txt: path escapes the task folder ('..')" in rendered
    assert "/abs.txt: absolute path in a task folder source" in rendered
