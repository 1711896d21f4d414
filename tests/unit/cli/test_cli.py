"""The command line in-process: dev, target loading, usage errors."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.cli.loading import load_worker
from async_task_api_worker.errors import DefinitionError, TargetError
from async_task_api_worker.protocol import decode_report

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parent)


def test_dev_prints_every_report_of_the_example_file(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["dev", "examples.count_words:worker", str(EXAMPLES / "count_words.jsonl")])
    out = capsys.readouterr().out
    reports = [decode_report(line.encode()) for line in out.splitlines()]
    by_task: dict[str, list[str]] = {}
    for report in reports:
        by_task.setdefault(report.task_id, []).append(report.type)
    assert code == 0
    assert by_task == {
        "dev-1": ["started", "progress", "success"],
        "dev-2": ["started", "failure"],
        "dev-3": ["failure"],
        "dev-4": ["started", "progress", "success"],
    }
    codes = [r.error.code for r in reports if r.type == "failure"]  # type: ignore[union-attr]
    assert codes == ["EMPTY_TEXT", "INVALID_INPUT"]


def test_dev_reads_stdin_and_reports_bad_lines_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ['{"text": "one two"}', "[1, 2]", "not json", "", '{"text": "three"}']
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    code = main(["dev", "examples.count_words:worker"])
    captured = capsys.readouterr()
    successes = [
        json.loads(line)["response"]
        for line in captured.out.splitlines()
        if json.loads(line)["type"] == "success"
    ]
    assert code == 1
    assert successes == [{"words": 2}, {"words": 1}]
    assert "line 2 must be a JSON object; the line is skipped" in captured.err
    assert "line 3 is not JSON: Expecting value" in captured.err


def test_dev_with_a_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "examples.count_words:worker", "/no/such/file.jsonl"]) == 2
    assert "cannot read /no/such/file.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "must look like my_module:worker"),
        ("examples.count_words:Input", "is not a Worker"),
        ("examples.count_words:missing", "has no attribute 'missing'"),
        (
            "tests.unit.cli.cli_targets:raising_factory",
            "factory tests.unit.cli.cli_targets:raising_factory raised RuntimeError: boom",
        ),
        (
            "tests.unit.cli.cli_targets:not_a_worker_factory",
            "is not a Worker, nor a function returning one",
        ),
        (
            "tests.unit.cli.cli_targets_broken:worker",
            "cannot import 'tests.unit.cli.cli_targets_broken': ZeroDivisionError",
        ),
    ],
)
def test_bad_targets_exit_2_with_one_line(
    target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dev", target, "/dev/null"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err


def test_a_factory_returning_a_worker_is_loaded() -> None:
    assert load_worker("tests.unit.cli.cli_targets:good_factory").name == "from-factory"


def test_a_definition_error_in_a_factory_propagates() -> None:
    with pytest.raises(DefinitionError):
        load_worker("tests.unit.cli.cli_targets:misdefined_factory")


def test_target_errors_are_config_errors() -> None:
    with pytest.raises(TargetError):
        load_worker(":worker")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == "async-task-api-worker 0.1.0"


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError


def test_dev_stops_when_its_reader_goes_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    lines = "".join('{"text": "word"}\n' for _ in range(50))
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    assert main(["dev", "examples.count_words:worker"]) == 0


def test_dev_whose_reader_goes_away_after_its_input_ended_stops_the_running_task(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The input (a file) ends first; then the first report finds stdout gone: nobody can see
    # the running task's reports any more, so it is stopped, not waited for (600 s here).
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("{}\n{}\n")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    caplog.set_level(logging.INFO, logger="async_task_api_worker")
    assert main(["dev", "tests.unit.cli.cli_targets:waiting", str(tasks)]) == 0
    messages = [record.getMessage() for record in caplog.records]
    assert "Shutdown requested (stdout closed): draining" in messages
    assert not any("(the input ended)" in message for message in messages)
    assert any("outcome=shutdown_requeued" in message for message in messages)


class SignallingStdout(io.StringIO):
    """Sends SIGTERM to this process at the first report, as an operator would."""

    def write(self, text: str) -> int:
        if not self.getvalue():
            os.kill(os.getpid(), signal.SIGTERM)
        return super().write(text)


def test_dev_stops_on_sigterm_even_while_stdin_stays_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b'{"text": "one"}\n')  # and the pipe stays open: no end of input
    stdout = SignallingStdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    with os.fdopen(read_end) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert main(["dev", "examples.count_words:worker"]) == 0
        os.close(write_end)  # the reader thread sees the end; only then can the file close
    assert '"type":"success"' in stdout.getvalue()


def test_dev_stopped_early_says_what_never_started_and_still_exits_1_for_a_refused_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    inputs = tmp_path / "inputs.jsonl"  # a file is queued whole before the first report
    inputs.write_text('not json\n{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n')
    monkeypatch.setattr(sys, "stdout", SignallingStdout())
    monkeypatch.setenv("WORKER_CONCURRENCY", "1")
    assert main(["dev", "examples.count_words:worker", str(inputs)]) == 1
    err = capsys.readouterr().err
    assert "line 1 is not JSON" in err
    # "three" at least: the signal is taken while "one" runs, and "two" may be in hand then
    assert re.search(r"\b[12] task\(s\) never started: the embedded broker keeps nothing", err)


def test_dev_refuses_a_line_that_is_not_utf8_and_runs_the_rest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_bytes(b'{"text": "one"}\n\xff\xfe{"text": "two"}\n{"text": "three"}\n')
    assert main(["dev", "examples.count_words:worker", str(inputs)]) == 1
    out, err = capsys.readouterr()
    assert "line 2 is not JSON" in err
    assert out.count('"type":"success"') == 2


def test_check_prints_the_budget_and_the_shutdown_bound(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_SHUTDOWN_GRACE_S", "10")
    assert main(["check", "examples.count_words:worker"]) == 0
    out = capsys.readouterr().out
    assert "worker count-words: async handler, service mode" in out
    assert (
        "time budget: task timeout 30 s + WORKER_RETRY_BACKOFF_MAX_S 30 s + cancel grace 1 s + "
        "report confirm 2 s + WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S 60 s = 123 s"
    ) in out
    assert "on RabbitMQ 4.3+, a quorum queue: the worker asks for a consumer timeout of 1800 s" in (
        out
    )
    assert (
        "on RabbitMQ before 4.3 (its own consumer timeout): under WORKER_CONSUMER_TIMEOUT_S "
        "1800 s: ok"
    ) in out
    assert "holds its delivery for up to 1740 s from its arrival" in out
    assert "largest report: 16777216 bytes (WORKER_MAX_REPORT_BYTES)" in out
    assert "broker: 1 URL, heartbeat 15 s (a connection silent for 30 s is taken for dead)" in out
    assert "shutdown bound: 27 s after SIGTERM" in out
    assert "terminationGracePeriodSeconds: 28" in out


def test_check_names_the_event_loop_and_refuses_a_missing_uvloop(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_EVENT_LOOP", "asyncio")
    assert main(["check", "examples.count_words:worker"]) == 0
    assert "event loop: asyncio (WORKER_EVENT_LOOP=asyncio)" in capsys.readouterr().out
    # A None entry in sys.modules makes the import fail, as when uvloop is not installed.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setenv("WORKER_EVENT_LOOP", "uvloop")
    assert main(["check", "examples.count_words:worker"]) == 2
    err = capsys.readouterr().err
    assert "WORKER_EVENT_LOOP=uvloop but uvloop is not installed" in err
    assert len(err.strip().splitlines()) == 1


def test_check_says_which_consumer_timeout_applies_to_a_task_longer_than_the_brokers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_TASK_TIMEOUT_S", "5000")
    assert main(["check", "examples.count_words:worker"]) == 0  # it runs on RabbitMQ 4.3+
    out = capsys.readouterr().out
    # 5000 + 30 + 1 + 2 + 60 = 5093 s, rounded up, + 1 s
    assert "the worker asks for a consumer timeout of 5094 s (x-consumer-timeout)" in out
    assert "before 4.3 (its own consumer timeout): the worker does not start: " in out
    assert "must be under WORKER_CONSUMER_TIMEOUT_S 1800 s on RabbitMQ before 4.3" in out
    assert "holds its delivery for up to 5034 s from its arrival" in out


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://guest:s3cret@localhost:99999/", "port out of 1..65535"),
        ("amqp://guest:s3cret@:5672/", "names no host"),
        ("redis://guest:s3cret@localhost/", "amqp:// or amqps://"),
        ("amqp://guest:s3cret@a/ amqp://guest:s3cret@b/", "white space"),
    ],
)
def test_run_exits_2_at_once_for_an_invalid_broker_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str, says: str
) -> None:
    monkeypatch.setenv("BROKER_URL", url)
    assert main(["run", "examples.count_words:worker"]) == 2
    err = capsys.readouterr().err
    assert "invalid setting BROKER_URL" in err and says in err
    assert len(err.strip().splitlines()) == 1
    assert "s3cret" not in err


def test_check_names_the_sqs_sfn_transport_and_its_bounds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_TRANSPORT", "sqs-sfn")
    monkeypatch.setenv("SQS_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/words")
    monkeypatch.setenv("WORKER_SHUTDOWN_GRACE_S", "10")
    assert main(["check", "examples.count_words:worker"]) == 0
    out = capsys.readouterr().out
    assert "transport: sqs-sfn (https://sqs.eu-west-1.amazonaws.com/123456789012/words" in out
    assert "every delivery is attempt 1/1" in out
    assert "ECS task protection 2 min at a time" in out
    assert "largest output: 262144 bytes" in out
    assert "time budget" not in out  # RabbitMQ's consumer timeout does not apply
    # A task in hand cannot be given back: the grace covers the 30 s timeout plus 10 s.
    assert "shutdown bound: 62 s after SIGTERM (max(grace 40 s, 5)" in out
    assert "10 s close (5 s + 5 s long poll)" in out
    assert "ECS stopTimeout: 63" in out


def test_sqs_sfn_without_its_queue_or_boto3_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_TRANSPORT", "sqs-sfn")
    assert main(["check", "examples.count_words:worker"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "async-task-api-worker: invalid setting SQS_QUEUE_URL: required with "
        "WORKER_TRANSPORT=sqs-sfn\n"
    )
    monkeypatch.setenv("SQS_QUEUE_URL", "https://sqs.example/1/words")
    for name in list(sys.modules):
        if name.startswith("async_task_api_worker.transports.sqs_sfn"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "boto3", None)
    assert main(["check", "examples.count_words:worker"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "boto3 (the SDK's `aws` extra)" in err


def test_a_queue_url_without_the_sqs_transport_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forgotten WORKER_TRANSPORT would quietly consume RabbitMQ instead.
    monkeypatch.setenv("SQS_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/1/words")
    assert main(["check", "examples.count_words:worker"]) == 2
    assert capsys.readouterr().err == (
        "async-task-api-worker: invalid setting SQS_QUEUE_URL: set, but WORKER_TRANSPORT is "
        "rabbitmq (sqs-sfn?)\n"
    )
