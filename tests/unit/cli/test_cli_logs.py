"""The commands' logs as a person sees them: dev on a terminal, tracebacks at DEBUG, flags passed
on to the worker processes of ``run --processes``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.observability.logging import JsonFormatter
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.hooks import StartupHookError, run_startup_hooks
from async_task_api_worker.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = ["examples.count_words:worker", str(REPO / "examples" / "count_words.jsonl")]
BROKEN = "tests.unit.cli.cli_targets_broken:worker"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z [A-Z]+ +\S+ ")


def cli(*arguments: str, terminal: bool = False, **values: str) -> tuple[int, str, list[str]]:
    """Run the command line with none of our variables set but ``values``.

    Returns:
        The exit code, stdout, and the lines of stderr, which is a pseudo-terminal if
        ``terminal`` (a person's shell), else a pipe.
    """
    ours = {name.upper() for name in WorkerSettings.model_fields}
    env = {name: value for name, value in os.environ.items() if name not in ours} | values
    controller, stderr = pty.openpty() if terminal else (-1, subprocess.PIPE)
    process = subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", *arguments],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    if not terminal:
        out, err = process.communicate(timeout=60)
        return process.returncode, out, err.splitlines()
    os.close(stderr)
    seen = b""
    with contextlib.suppress(OSError):  # EIO: every end of the terminal is closed
        while chunk := os.read(controller, 65536):
            seen += chunk
    os.close(controller)
    out, _ = process.communicate(timeout=60)
    return process.returncode, out, seen.decode().replace("\r\n", "\n").splitlines()


# --- dev's format ------------------------------------------------------------------------------


def test_dev_logs_text_lines_on_a_terminal_unless_told_otherwise() -> None:
    code, _, lines = cli("dev", *EXAMPLE, terminal=True)
    assert code == 0
    decisions = [line for line in lines if "Delivery settled" in line]
    assert len(decisions) == 4
    assert all(TEXT_LINE.match(line) for line in lines), lines
    # The decision line says each field once: its message says outcome, action, code and
    # attempt=1/5 (the delivery limit too); the fields it does not say follow.
    assert " attempt=1/5 task_id=dev-1 service=count-words requeue_counted=false" in decisions[0]
    for name in ("outcome", "action", "attempt", "delivery_limit", "task_id", "service"):
        assert decisions[0].count(f" {name}=") <= 1, (name, decisions[0])
    code, _, lines = cli("dev", *EXAMPLE, terminal=True, LOG_FORMAT="json")
    assert code == 0 and lines and all(json.loads(line)["msg"] for line in lines)
    code, _, lines = cli("dev", *EXAMPLE, "--log-format", "json", terminal=True, LOG_FORMAT="text")
    assert code == 0 and lines and all(json.loads(line)["msg"] for line in lines)


def test_run_logs_text_on_a_terminal_and_json_to_a_pipe() -> None:
    # ``run`` logs to stdout (a container's log): the same rule as dev's, on that stream.
    arguments = ("run", "no_such_module:worker", "--log-level", "DEBUG")
    ours = {name.upper() for name in WorkerSettings.model_fields}
    env = {name: value for name, value in os.environ.items() if name not in ours}
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", *arguments],
        cwd=REPO,
        env=env,
        stdout=terminal,
        stderr=subprocess.PIPE,
    )
    os.close(terminal)
    seen = b""
    with contextlib.suppress(OSError):  # EIO: every end of the terminal is closed
        while chunk := os.read(controller, 65536):
            seen += chunk
    os.close(controller)
    process.communicate(timeout=60)
    logged = seen.decode().replace("\r\n", "\n").splitlines()
    assert process.returncode == ExitCode.CONFIG
    assert logged and all(TEXT_LINE.match(line) for line in logged), logged
    code, out, _ = cli(*arguments)
    assert code == ExitCode.CONFIG
    assert [json.loads(line)["level"] for line in out.splitlines()] == ["DEBUG"]


def test_dev_logs_json_lines_to_a_pipe_and_text_when_asked() -> None:
    code, _, lines = cli("dev", *EXAMPLE)
    assert code == 0
    assert [json.loads(line)["level"] for line in lines]
    code, _, lines = cli("dev", *EXAMPLE, LOG_FORMAT="text")
    assert code == 0 and lines
    assert all(TEXT_LINE.match(line) for line in lines), lines
    assert sum(" outcome=success action=ack " in line for line in lines) == 2


# --- tracebacks at DEBUG ----------------------------------------------------------------------


def test_an_import_error_shows_its_traceback_at_debug_only() -> None:
    code, out, err = cli("check", BROKEN)
    one_line = "async-task-api-worker: cannot import 'tests.unit.cli.cli_targets_broken': "
    assert (code, out, len(err)) == (ExitCode.CONFIG, "", 1)
    assert err[0].startswith(one_line)
    for level in ("DEBUG", "debug"):
        code, _, err = cli("check", BROKEN, LOG_LEVEL=level)
        assert code == ExitCode.CONFIG
        logged, said = err
        assert said.startswith(one_line)
        line = json.loads(logged)
        assert (line["level"], line["msg"]) == ("DEBUG", f"Loading {BROKEN} failed")
        assert 'cli_targets_broken.py", line 3, in <module>' in line["exc"]
        assert "1 / 0" in line["exc"] and "ZeroDivisionError: division by zero" in line["exc"]


def test_an_import_error_traceback_is_one_line_in_the_log_format() -> None:
    arguments = ("no_such_module:worker", "--log-level", "DEBUG", "--log-format", "text")
    code, out, err = cli("run", *arguments)
    assert (code, len(err)) == (ExitCode.CONFIG, 1)
    assert out.count("\n") == 1  # run logs on stdout: one line, the traceback escaped
    assert TEXT_LINE.match(out)
    assert "ModuleNotFoundError" in out and "\\n" in out


@pytest.mark.parametrize("command", ["check", "run", "dev", "tick"])
def test_the_one_line_error_hides_a_password_the_import_error_quotes(command: str) -> None:
    extra = ("--state-dir", "/nonexistent", "--budget-s", "5") if command == "tick" else ()
    code, out, err = cli(command, "tests.unit.cli.cli_targets_secret:worker", *extra)
    assert code == ExitCode.CONFIG
    said = "\n".join([out, *err])
    assert "CANARY-hunter2" not in said
    assert "amqp://worker:***@broker:5672/" in said


async def connect_to_the_database() -> None:
    """A startup hook whose exception's text holds a secret URL."""
    raise ConnectionError("postgresql://app:hunter2@db:5432/app refused")


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO])
async def test_a_failing_startup_hook_shows_its_whole_traceback_at_debug(
    caplog: pytest.LogCaptureFixture, level: int
) -> None:
    caplog.set_level(level, logger="async_task_api_worker")
    with pytest.raises(StartupHookError, match=r"raised ConnectionError$"):
        await run_startup_hooks([connect_to_the_database])
    by_level = {record.levelno: record for record in caplog.records}
    error = by_level[logging.ERROR]
    # The ERROR line is as it was at every level: the type and the frames, not the message.
    assert error.getMessage().startswith(
        "Startup hook connect_to_the_database raised ConnectionError\n  File "
    )
    assert "hunter2" not in error.getMessage() and "refused" not in error.getMessage()
    if level == logging.INFO:
        assert logging.DEBUG not in by_level
        return
    line = json.loads(JsonFormatter().format(by_level[logging.DEBUG]))
    assert line["msg"] == "Startup hook connect_to_the_database: the whole traceback"
    assert "in connect_to_the_database" in line["exc"]
    assert 'raise ConnectionError("postgresql://app:***@db:5432/app refused")' in line["exc"]
    assert "ConnectionError: postgresql://app:***@db:5432/app refused" in line["exc"]
    assert "hunter2" not in json.dumps(line)


# --- run --processes hands the flags on -------------------------------------------------------


def test_run_hands_its_setting_flags_to_the_supervisor_for_each_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("WORKER_PROCESSES", raising=False)
    seen: dict[str, Any] = {}

    def supervise(target: str, settings: WorkerSettings, **kwargs: Any) -> ExitCode:
        seen.update(kwargs, target=target, settings=settings)
        return ExitCode.OK

    monkeypatch.setattr("async_task_api_worker.runtime.processes.supervise", supervise)
    argv = ["run", EXAMPLE[0], "--log-format", "text", "--processes", "3", "--concurrency", "4"]
    assert main(argv) == ExitCode.OK
    assert seen["flags"] == ["--concurrency", "4", "--log-format", "text"]
    assert (seen["settings"].worker_processes, seen["settings"].worker_concurrency) == (3, 4)


async def test_a_worker_process_is_started_with_the_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from async_task_api_worker.executors.process import group
    from async_task_api_worker.runtime.supervised import spawn_worker_process

    started: list[list[str]] = []

    async def spawn_in_new_session(argv: list[str], **_: object) -> Any:
        started.append(argv)
        raise OSError("not started in this test")

    monkeypatch.setattr(group, "spawn_in_new_session", spawn_in_new_session)
    with pytest.raises(OSError, match="not started"):
        await spawn_worker_process("m:w", str(tmp_path), 1, flags=["--concurrency", "4"])
    head = [sys.executable, "-m", "async_task_api_worker", "run", "m:w"]
    assert started == [[*head, "--concurrency", "4", "--processes", "1"]]
