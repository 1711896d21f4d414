"""``cancel`` in-process, no broker: usage errors before any connection, the exit codes."""

from __future__ import annotations

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.client import TaskClient
from async_task_api_worker.errors import BrokerUnavailableError, PublishError
from async_task_api_worker.protocol import ID_PATTERN, SERVICE_PATTERN
from async_task_api_worker.runtime.exit_codes import ExitCode


class Broker:
    """What the fake TaskClient was asked: connections (with ``reports``), cancels, closes."""

    def __init__(self) -> None:
        self.connects: list[bool] = []
        self.cancels: list[tuple[str, str, str]] = []
        self.closes = 0
        self.fail_connect: Exception | None = None
        self.fail_cancel: Exception | None = None


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    seen = Broker()

    async def connect(self: TaskClient, *, reports: bool = True) -> None:
        seen.connects.append(reports)
        if seen.fail_connect is not None:
            raise seen.fail_connect

    async def cancel(self: TaskClient, task_id: str) -> None:
        seen.cancels.append((task_id, self.client_id, self.control_exchange))
        if seen.fail_cancel is not None:
            raise seen.fail_cancel

    async def close(self: TaskClient) -> None:
        seen.closes += 1

    monkeypatch.setattr(TaskClient, "connect", connect)
    monkeypatch.setattr(TaskClient, "cancel", cancel)
    monkeypatch.setattr(TaskClient, "close", close)
    monkeypatch.delenv("CONTROL_EXCHANGE_NAME", raising=False)
    return seen


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["t 1", "--service", "resize"], f"task id 't 1' does not match {ID_PATTERN}"),
        (["x" * 129, "--service", "resize"], "task id 'xxx"),
        (["t-1\n", "--service", "resize"], "task id 't-1\\n' does not match"),
        (["t-1", "--service", "resize", "--client-id", "a/b"], "--client-id 'a/b' does not"),
        (["t-1", "--service", "re size"], f"--service 're size' does not match {SERVICE_PATTERN}"),
    ],
    ids=["space", "too-long", "newline", "client-id", "service"],
)
def test_an_id_or_a_name_outside_its_pattern_is_exit_2_naming_the_rule(
    broker: Broker, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(["cancel", *argv])

    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == ExitCode.CONFIG
    assert len(err) == 1 and err[0].startswith("async-task-api-worker: "), err
    assert message in err[0]
    assert captured.out == ""
    assert broker.connects == [], "nothing is published for a usage error"


@pytest.mark.parametrize("argv", [["--service", "resize"], ["t-1"]], ids=["no-id", "no-service"])
def test_a_missing_argument_is_exit_2(
    broker: Broker, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["cancel", *argv])
    assert caught.value.code == 2
    assert broker.connects == []


def test_an_invalid_setting_is_exit_2(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONTROL_EXCHANGE_NAME", "")
    assert main(["cancel", "t-1", "--service", "resize"]) == ExitCode.CONFIG
    assert "CONTROL_EXCHANGE_NAME" in capsys.readouterr().err
    assert broker.connects == []


def test_a_confirmed_cancel_prints_one_line_and_exits_0(
    broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["cancel", "t-0001", "--service", "resize", "--client-id", "ops"])

    assert code == ExitCode.OK
    assert capsys.readouterr().out == (
        "cancel requested for t-0001 (service resize, exchange resize_control)\n"
    )
    assert broker.connects == [False], "no queue declared, no report consumed"
    assert broker.cancels == [("t-0001", "ops", "resize_control")]
    assert broker.closes == 1


def test_the_exchange_follows_control_exchange_name(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONTROL_EXCHANGE_NAME", "platform.control")
    assert main(["cancel", "t-1", "--service", "resize"]) == ExitCode.OK
    assert capsys.readouterr().out.endswith("(service resize, exchange platform.control)\n")
    assert broker.cancels == [("t-1", "cli", "platform.control")]


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("connect", BrokerUnavailableError("the broker was not reachable within 10 s: x")),
        ("cancel", PublishError("the cancel request was not confirmed: ConnectionError")),
    ],
)
def test_an_unreachable_or_unconfirming_broker_is_exit_1_with_one_line(
    broker: Broker, capsys: pytest.CaptureFixture[str], where: str, error: Exception
) -> None:
    setattr(broker, f"fail_{where}", error)

    code = main(["cancel", "t-1", "--service", "resize"])

    captured = capsys.readouterr()
    assert code == ExitCode.FAILURE
    assert captured.out == ""
    assert captured.err.strip().splitlines()[-1] == f"async-task-api-worker: {error}"
    assert broker.closes == (1 if where == "cancel" else 0)
