"""Where a setting comes from: a flag, then the environment, then ``.env``; and two new rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.errors import SettingsError
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.settings import (
    SETTING_FLAGS,
    LogFormat,
    LogLevel,
    WorkerSettings,
    flag_arguments,
    load_settings,
)
from async_task_api_worker.testing import WorkerHarness
from tests.unit.cli.cli_targets import good_factory

REPO = Path(__file__).resolve().parents[3]
TARGET = "examples.count_words:worker"
COMMANDS = {
    "run": [TARGET],
    "check": [TARGET],
    "dev": [TARGET, "/dev/null"],
    "tick": [TARGET, "--state-dir", "state", "--budget-s", "5"],  # never reached
    "submit": ['{"text": "a"}', "--service", "s"],
    "cancel": ["t-1", "--service", "s"],
    "conformance": ["--service", "s"],
    "inspect": ["--service", "s"],
    "purge": ["--service", "s", "--yes"],
    "reports": ["--service", "s"],
}
#: The commands that only connect: ``--broker-url`` is their one setting flag.
CONNECTING = ("submit", "cancel", "conformance", "inspect", "purge", "reports")
#: Where each command reads its settings (the operator's commands share a module).
MODULE = {"inspect": "operate", "purge": "operate", "reports": "operate"}
#: Per flag: a value in .env, another in the environment, a third on the command line; each
#: differs from the one before, so each source is seen winning.
VALUES = {
    "--processes": ("2", "3", "4"),
    "--concurrency": ("2", "3", "4"),
    "--log-level": ("warning", "ERROR", "debug"),
    "--log-format": ("text", "JSON", "text"),
    "--health-port": ("8001", "8002", "0"),
    "--broker-url": ("amqp://a@one:5672/", "amqp://b@two:5672/", "amqp://c@three:5672/v"),
}


@pytest.fixture(autouse=True)
def cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A current directory of the test's own (where ``.env`` is read), none of our variables."""
    for name in WorkerSettings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))  # the targets still import
    return tmp_path


def flags_of(monkeypatch: pytest.MonkeyPatch, command: str, *extra: str) -> dict[str, str]:
    """What ``main`` hands a command's settings: the setting flags given, by field."""
    seen: list[dict[str, str]] = []

    def spy(values: dict[str, str] | None = None, **_: object) -> WorkerSettings:
        seen.append(dict(values or {}))
        raise SettingsError("invalid setting SEEN: stop here")

    with monkeypatch.context() as patch:
        module = MODULE.get(command, command)
        patch.setattr(f"async_task_api_worker.cli.commands.{module}.load_settings", spy)
        assert main([command, *COMMANDS[command], *extra]) == ExitCode.CONFIG
    (flags,) = seen
    return flags


def value_of(settings: WorkerSettings, field: str) -> str:
    value = getattr(settings, field)
    return str(getattr(value, "get_secret_value", lambda: value)()).casefold()


def test_every_flag_has_a_values_row_and_names_a_setting() -> None:
    assert {flag.flag for flag in SETTING_FLAGS} == set(VALUES)
    assert all(flag.field in WorkerSettings.model_fields for flag in SETTING_FLAGS)


@pytest.mark.parametrize("flag", SETTING_FLAGS, ids=lambda flag: flag.flag)
def test_a_flag_wins_over_the_environment_which_wins_over_dotenv(
    flag: Any, monkeypatch: pytest.MonkeyPatch, cwd: Path
) -> None:
    in_file, in_environment, on_command_line = VALUES[flag.flag]
    (cwd / ".env").write_text(f"{flag.variable}={in_file}\n")
    assert value_of(load_settings(flags_of(monkeypatch, "check")), flag.field) == in_file.casefold()
    monkeypatch.setenv(flag.variable, in_environment)
    assert (
        value_of(load_settings(flags_of(monkeypatch, "check")), flag.field)
        == in_environment.casefold()
    )
    given = flags_of(monkeypatch, "check", flag.flag, on_command_line)
    assert given == {flag.field: on_command_line}
    assert value_of(load_settings(given), flag.field) == on_command_line.casefold()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", SETTING_FLAGS, ids=lambda flag: flag.flag)
def test_each_command_hands_its_flags_to_the_settings(
    command: str, flag: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if command not in flag.commands:
        # dev and tick: one process, no probes server; tick: one delivery at a time.
        # dev connects to nothing; the connecting commands take --broker-url alone.
        assert (command, flag.flag) in {
            ("dev", "--processes"),
            ("dev", "--health-port"),
            ("dev", "--broker-url"),
            ("tick", "--processes"),
            ("tick", "--health-port"),
            ("tick", "--concurrency"),
        } or (command in CONNECTING and flag.flag != "--broker-url")
        with pytest.raises(SystemExit):  # not a flag of theirs: argparse refuses it (exit 2)
            main([command, *COMMANDS[command], flag.flag, "2"])
        return
    value = VALUES[flag.flag][2]
    assert flags_of(monkeypatch, command, flag.flag, value) == {flag.field: value}
    assert (
        capsys.readouterr().err.strip() == "async-task-api-worker: invalid setting SEEN: stop here"
    )


def test_a_bad_flag_is_one_line_naming_the_flag_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", TARGET, "--concurrency", "many"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "async-task-api-worker: invalid setting WORKER_CONCURRENCY (--concurrency): "
    )
    assert "many" not in err


def test_dotenv_ignores_variables_that_are_not_settings(cwd: Path) -> None:
    (cwd / ".env").write_text(
        "AWS_REGION=eu-west-1\nAWS_SECRET_ACCESS_KEY=abc\nmy_app_token=xyz\nDATABASE_URL=\n"
        "# a comment\nexport WORKER_DELIVERY_LIMIT=7\nworker_concurrency=6\n"
    )
    settings = load_settings()
    assert (settings.worker_delivery_limit, settings.worker_concurrency) == (7, 6)
    assert main(["check", TARGET]) == ExitCode.OK


def test_a_bad_value_of_ours_in_dotenv_exits_2_with_one_line(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / ".env").write_text("AWS_REGION=eu-west-1\nWORKER_DELIVERY_LIMIT=zero\n")
    assert main(["check", TARGET]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "async-task-api-worker: invalid setting WORKER_DELIVERY_LIMIT (in .env): "
    )
    assert "zero" not in err


def test_a_bad_value_from_the_environment_is_not_blamed_on_dotenv(
    cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (cwd / ".env").write_text("WORKER_DELIVERY_LIMIT=zero\n")
    monkeypatch.setenv("WORKER_DELIVERY_LIMIT", "none")  # the environment wins, and is wrong
    assert main(["check", TARGET]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.startswith("async-task-api-worker: invalid setting WORKER_DELIVERY_LIMIT: ")


def test_a_dotenv_that_is_not_utf8_exits_2_with_one_line(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / ".env").write_bytes(b"LOG_LEVEL=\xff\xfe\n")
    assert main(["check", TARGET]) == ExitCode.CONFIG
    assert capsys.readouterr().err == (
        "async-task-api-worker: invalid setting file .env: not UTF-8 text\n"
    )


def test_the_harness_and_values_only_settings_read_no_dotenv(cwd: Path) -> None:
    (cwd / ".env").write_text("WORKER_DELIVERY_LIMIT=9\nLOG_LEVEL=DEBUG\n")
    assert load_settings(read_environment=False).worker_delivery_limit == 5
    assert WorkerHarness(good_factory()).settings.worker_delivery_limit == 5
    assert load_settings().worker_delivery_limit == 9


def test_flag_arguments_give_back_the_flags_in_the_tables_order() -> None:
    assert flag_arguments({"log_format": "text", "worker_concurrency": "3"}) == [
        "--concurrency",
        "3",
        "--log-format",
        "text",
    ]
    with pytest.raises(KeyError):
        flag_arguments({"worker_delivery_limit": 3})


# --- the rules that came with them -------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("LOG_LEVEL", "debug", LogLevel.DEBUG),
        ("LOG_LEVEL", "Warning", LogLevel.WARNING),
        ("LOG_FORMAT", "TEXT", LogFormat.TEXT),
        ("LOG_FORMAT", "json", LogFormat.JSON),
    ],
)
def test_log_level_and_format_are_taken_in_any_case(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: object
) -> None:
    monkeypatch.setenv(variable, value)
    assert getattr(load_settings(), variable.lower()) is expected


def test_a_lower_case_log_level_flag_runs_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", TARGET, "--log-level", "debug"]) == ExitCode.OK
    assert "worker count-words" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("first", "cap", "refused"), [("5", "1", True), ("1", "1", False), ("0.5", "30", False)]
)
def test_a_first_backoff_above_its_cap_is_refused_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    first: str,
    cap: str,
    refused: bool,
) -> None:
    monkeypatch.setenv("WORKER_RETRY_BACKOFF_S", first)
    monkeypatch.setenv("WORKER_RETRY_BACKOFF_MAX_S", cap)
    code = main(["check", TARGET])
    err = capsys.readouterr().err
    if not refused:
        assert (code, err) == (ExitCode.OK, "")
        return
    assert code == ExitCode.CONFIG
    assert err == (
        "async-task-api-worker: invalid setting WORKER_RETRY_BACKOFF_S: must not exceed "
        "WORKER_RETRY_BACKOFF_MAX_S (lower the first or raise the cap)\n"
    )


# --- the settings page's table (docs/settings.md) ------------------------------------------------


def test_the_settings_page_table_lists_every_variable_with_its_flag() -> None:
    table = (REPO / "docs" / "settings.md").read_text()
    rows = re.findall(r"^\| `([A-Z_0-9]+)` \|([^|]*)\|", table, flags=re.MULTILINE)
    flags = {variable: cell.strip() for variable, cell in rows}
    assert set(flags) == {name.upper() for name in WorkerSettings.model_fields}
    assert flags == {
        name.upper(): next((f"`{f.flag}`" for f in SETTING_FLAGS if f.field == name), "")
        for name in WorkerSettings.model_fields
    }
