"""``submit`` in-process, no broker: every task is checked before anything is published."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.client import TaskClient
from async_task_api_worker.runtime.exit_codes import ExitCode


@pytest.fixture(autouse=True)
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The services a TaskClient connected for: none, when a usage error stops submit first."""
    connected: list[str] = []

    async def connect(self: TaskClient) -> None:
        connected.append(self.service)
        raise AssertionError("submit connected before refusing its input")

    monkeypatch.setattr(TaskClient, "connect", connect)
    return connected


def submit_file(path: Path | str, *extra: str) -> int:
    return main(["submit", "--file", str(path), "--service", "count-words", *extra])


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("[1, 2]", "line 3 must be a JSON object"),
        ("{not json", "line 3 is not JSON: "),
        ('{"text": NaN}', "line 3 would be refused by the worker: "),
    ],
)
def test_a_bad_line_is_a_usage_error_naming_it_before_any_task_is_published(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    connects: list[str],
    bad_line: str,
    message: str,
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"text": "a"}\n\n' + bad_line + '\n{"text": "b"}\n')

    code = submit_file(tasks)

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and f"{tasks} {message}" in err[0], err
    assert connects == []


def test_stdin_is_read_with_a_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"text": "a"}\n"b"\n'))
    assert submit_file("-") == 2
    assert "- line 2 must be a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (None, (), "cannot read"),
        ("\n  \n", (), "holds no task input"),
        ('{"text": "a"}\n', ("--task-id", "t-1"), "not with --file"),
        ('{"text": "a"}\n', ("--input-ref", '{"name": "v", "uri": "s3://b/k"}'), "not with --file"),
    ],
    ids=["missing", "empty", "task-id", "input-ref"],
)
def test_a_file_submit_refuses_what_it_cannot_publish(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    connects: list[str],
    *,
    content: str | None,
    extra: tuple[str, ...],
    message: str,
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    if content is not None:
        tasks.write_text(content)
    assert submit_file(tasks, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert connects == []


def test_an_input_and_a_file_together_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["submit", "{}", "--file", str(tmp_path / "t.jsonl"), "--service", "count-words"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_task_input_nested_too_deep_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["submit", "--file", str(tasks), "--service", "s"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1 is nested too deep to read" in err
