"""task.toml parsing: legacy spellings, unknown keys, defaults (docs/task-format.md §2)."""

from __future__ import annotations

from tests.unit.folders import IMAGE, check, multi_step, plan_of, single_step, steps_toml


def warnings_of(folder: dict[str, str]) -> list[str]:
    return [warning.render() for warning in check(folder).warnings]


def test_legacy_spellings_load_and_normalize() -> None:
    toml = (
        'version = "1.1"\n[environment]\nimage = "legacy:1"\nmemory = "2G"\nstorage = "1024K"\nallow_internet = false\n'
    )
    result = check(single_step(toml))
    assert result.valid and result.task is not None
    config = result.task.config
    environment = config.environment
    assert config.schema_version == "1.1"
    assert (environment.docker_image, environment.memory_mb, environment.storage_mb) == ("legacy:1", 2048, 1)
    assert environment.network_mode == "no-network"
    assert set(warnings_of(single_step(toml))) >= {
        "task.toml: version: legacy key, read as schema_version",
        "task.toml: environment.image: legacy key, read as environment.docker_image",
        "task.toml: environment.memory: legacy key, read as environment.memory_mb",
        "task.toml: environment.storage: legacy key, read as environment.storage_mb",
        "task.toml: environment.allow_internet: legacy key, read as environment.network_mode",
    }


def test_allow_internet_yields_to_network_mode() -> None:
    toml = f'[environment]\ndocker_image = "{IMAGE}"\nallow_internet = false\nnetwork_mode = "public"\n'
    assert plan_of(single_step(toml)).environment.network_mode == "public"


def test_equal_legacy_and_current_values_agree() -> None:
    toml = f'[environment]\ndocker_image = "{IMAGE}"\nimage = "{IMAGE}"\nmemory = "512M"\nmemory_mb = 512\n'
    assert check(single_step(toml)).valid


def test_schema_version_stays_when_both_spellings_given() -> None:
    result = check(single_step('schema_version = "1.4"\nversion = "1.0"\n'))
    assert result.task is not None and result.task.config.schema_version == "1.4"


def test_unknown_keys_are_ignored_with_a_warning() -> None:
    toml = 'mystery = 1\n[agent]\ntimeout = 5\n[environment]\ndocker_image = "x"\nshm = "1G"\n' + steps_toml(
        "a", extra={"a": "[steps.verifier]\nenv_vars = {}\n"}
    )
    folder = multi_step(toml, ["a"])
    assert check(folder).valid
    assert set(warnings_of(folder)) >= {
        "task.toml: mystery: unknown key, ignored",
        "task.toml: agent.timeout: unknown key, ignored",
        "task.toml: environment.shm: unknown key, ignored",
        "task.toml: steps[0].verifier.env_vars: unknown key, ignored",
    }


def test_os_is_case_insensitive_and_windows_is_only_warned() -> None:
    folder = single_step(
        f'[environment]\ndocker_image = "{IMAGE}"\nos = "WINDOWS"\n',
        {"tests/test.sh": None, "tests/test.bat": "echo 1"},
    )
    result = check(folder)
    assert result.valid and result.task is not None and result.task.config.environment.os == "windows"
    assert any("Windows task is valid" in w.message for w in result.warnings)


def test_mcp_http_alias_and_defaults() -> None:
    toml = (
        f'[environment]\ndocker_image = "{IMAGE}"\n[[environment.mcp_servers]]\nname = "a"\n'
        'transport = "http"\nurl = "http://x"\n[environment.healthcheck]\ncommand = "true"\n'
    )
    environment = plan_of(single_step(toml)).environment
    assert environment.mcp_servers[0].transport == "streamable-http"
    assert environment.healthcheck is not None
    check_ = environment.healthcheck
    assert (
        check_.interval_sec,
        check_.timeout_sec,
        check_.start_period_sec,
        check_.start_interval_sec,
        check_.retries,
    ) == (5.0, 30.0, 0.0, 5.0, 3)


def test_missing_image_is_valid_with_a_warning() -> None:
    folder = single_step("[environment]\ncpus = 1\n")
    assert check(folder).valid
    assert (
        "task.toml: environment.docker_image: not set, and no environment/Dockerfile to make the image from: an "
        "Episode for this task must give an image (spec.image)"
    ) in warnings_of(folder)
    # A Dockerfile makes the image (replayed or built): nothing to warn of.
    with_dockerfile = single_step("[environment]\ncpus = 1\n", {"environment/Dockerfile": "FROM x\n"})
    assert not [w for w in warnings_of(with_dockerfile) if "docker_image" in w]


def test_user_accepts_names_and_uids_but_not_booleans() -> None:
    assert check(single_step('[agent]\nuser = "alice"\n')).valid
    assert check(single_step("[agent]\nuser = 1000\n")).valid
    refused = check(single_step("[agent]\nuser = true\n"))
    assert [p.render() for p in refused.problems] == [
        "task.toml: agent.user: must be a user name or a numeric UID, not True"
    ]


def test_healthcheck_numbers_are_unbounded_like_gym() -> None:
    assert check(
        single_step(
            '[environment]\ndocker_image = "x"\n[environment.healthcheck]\ncommand = "true"\n'
            "retries = 0\ninterval_sec = 0\n"
        )
    ).valid
