"""The Step Functions worker's parts without AWS: heartbeats (botocore's Stubber), the child
side, protection without an agent, the import guard, and the rule that the face runs no loop
of its own."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from async_task_api_worker.conclusion import (
    Conclusion,
    Failure,
    Response,
    conclusion_from_json,
)
from async_task_api_worker.errors import PublishError, ReportRefusedError
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES
from async_task_api_worker.sfn import WorkerRequest
from async_task_api_worker.sfn.levels import ExceptionLevels
from async_task_api_worker.sfn.protection import TaskProtection
from async_task_api_worker.sfn.worker import Worker
from async_task_api_worker.transports.sqs_sfn import ProtectionLease, SqsSfnTransport
from async_task_api_worker.transports.sqs_sfn.aws import StaleTokenError, StepFunctionsApi

REPO = Path(__file__).resolve().parents[3]
SFN = REPO / "src" / "async_task_api_worker" / "sfn"


def stubbed() -> tuple[Any, Stubber]:
    client = boto3.client(
        "stepfunctions",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    return client, Stubber(client)


class QuietQueue:
    """An SQS client that deletes and hands back, and never has a message."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.deleted.append(ReceiptHandle)


def transport_with(client: Any, *, heartbeat_s: float = 0.01) -> SqsSfnTransport:
    return SqsSfnTransport(
        queue_url="https://sqs.example/1/q",
        service="q",
        prefetch=1,
        heartbeat_interval_s=heartbeat_s,
        protection_minutes=2,
        sqs_client=QuietQueue(),
        stepfunctions_client=client,
        protection=TaskProtection(""),
    )


async def withdrawn(delivery: Delivery) -> str | None:
    done = asyncio.Event()
    delivery.cancel_token.add_callback(done.set)
    await asyncio.wait_for(done.wait(), 5)
    return delivery.cancel_token.reason


MESSAGE = {"MessageId": "m-1", "ReceiptHandle": "r-1", "Body": json.dumps({"task_token": "t"})}


@pytest.mark.parametrize("code", ["TaskTimedOut", "TaskDoesNotExist", "InvalidToken"])
async def test_a_stale_answer_withdraws_the_delivery(code: str) -> None:
    client, stubber = stubbed()
    stubber.add_response("send_task_heartbeat", {}, {"taskToken": "t"})
    stubber.add_client_error("send_task_heartbeat", service_error_code=code)
    transport = transport_with(client)
    with stubber:
        delivery = await transport.pick_up(MESSAGE)
        # The engine stops the handler on this token (a process group is killed).
        assert await withdrawn(delivery) == "stale task token"
    await delivery.release()
    await transport.close()


async def test_throttling_and_server_errors_never_withdraw() -> None:
    client, stubber = stubbed()
    stubber.add_client_error("send_task_heartbeat", service_error_code="ThrottlingException")
    stubber.add_client_error(
        "send_task_heartbeat", service_error_code="ServiceUnavailable", http_status_code=503
    )
    stubber.add_client_error("send_task_heartbeat", service_error_code="TaskTimedOut")
    transport = transport_with(client)
    with stubber:
        delivery = await transport.pick_up(MESSAGE)
        await withdrawn(delivery)
    # Only the third answer (stale) withdrew it.
    stubber.assert_no_pending_responses()
    await delivery.release()
    await transport.close()


def test_step_functions_answers_become_our_errors() -> None:
    client, stubber = stubbed()
    stubber.add_client_error("send_task_success", service_error_code="InvalidToken")
    stubber.add_client_error("send_task_failure", service_error_code="TaskTimedOut")
    stubber.add_client_error("send_task_success", service_error_code="InvalidOutput")
    stubber.add_client_error("send_task_failure", service_error_code="ThrottlingException")
    api = StepFunctionsApi(client)
    with stubber:
        with pytest.raises(StaleTokenError, match="InvalidToken"):
            api.succeed("t", "{}")
        with pytest.raises(StaleTokenError, match="TaskTimedOut"):
            api.fail("t", "E", "c")
        with pytest.raises(ReportRefusedError, match="InvalidOutput"):
            api.succeed("t", "{}")
        with pytest.raises(PublishError, match="ThrottlingException") as raised:
            api.fail("t", "E", "c")
    assert not isinstance(raised.value, StaleTokenError | ReportRefusedError)


def test_protection_without_an_agent_is_a_no_op(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    protection = TaskProtection("")
    assert protection.enabled is False
    assert protection.enable(30) is False and protection.disable() is False
    assert "ECS_AGENT_URI is not set" in caplog.text


def run_child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=REPO,
    )


CHILD = """
import math
from async_task_api_worker.sfn import WorkerRequest, run_handler

class Request(WorkerRequest):
    size: int

def handle(request):
    print("noise on stdout")
    if request.size < 0:
        return {"bad": math.nan}
    return {"size": request.size}

run_handler(Request, handle)
"""


def conclusion_of(done: subprocess.CompletedProcess[str]) -> Conclusion:
    """The child's conclusion, read as its parent reads it (any name as its code)."""
    document = json.loads(done.stdout)
    return conclusion_from_json(document, sdk_codes=RESERVED_ERROR_CODES, names=True)


def test_run_handler_reads_the_file_keeps_prints_off_and_is_strict(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"task_token": "t", "size": 3}))
    done = run_child(CHILD, {"WORKER_REQUEST_FILE": str(request)})
    assert (done.returncode, conclusion_of(done)) == (0, Response({"size": 3}))
    assert "noise on stdout" in done.stderr
    nan = run_child(CHILD, {"WORKER_REQUEST": json.dumps({"task_token": "t", "size": -1})})
    failure = conclusion_of(nan)
    assert nan.returncode == 1
    assert isinstance(failure, Failure) and failure.code == "ValueError"
    invalid = run_child(CHILD, {"WORKER_REQUEST": '{"task_token": "t", "size": "SECRET"}'})
    failure = conclusion_of(invalid)
    assert isinstance(failure, Failure)
    assert (invalid.returncode, failure.code) == (1, "ValidationError")
    assert "SECRET" not in failure.message and "size" in failure.message
    assert "SECRET" not in invalid.stderr and "'t'" not in invalid.stderr  # nor the token


STRICT_CHILD = """
from pydantic import ConfigDict
from async_task_api_worker.sfn import WorkerRequest, run_handler

class Request(WorkerRequest):
    model_config = ConfigDict(frozen=True, extra="forbid")
    size: int

run_handler(Request, lambda request: {"size": request.size})
"""


def test_run_handler_names_no_client_field_of_a_refused_request() -> None:
    body = json.dumps({"task_token": "t", "size": 1, "CLIENT_KEY_NAME_31": "v"})
    done = run_child(STRICT_CHILD, {"WORKER_REQUEST": body})
    failure = Failure("ValidationError", "invalid request: <key>: extra_forbidden")
    assert (done.returncode, conclusion_of(done)) == (1, failure)
    assert "CLIENT_KEY_NAME_31" not in done.stderr


def test_importing_without_boto3_says_how_to_install() -> None:
    done = run_child(
        "import sys; sys.modules['boto3'] = None\nimport async_task_api_worker.sfn", {}
    )
    assert done.returncode == 1
    assert "boto3 (the SDK's `aws` extra)" in done.stderr


def test_the_face_runs_no_loop_signal_handler_or_aws_call_of_its_own() -> None:
    # The poll loop is the transport's, signals and the drain the runtime's, and the
    # subprocess's output is read in sfn.subprocesses alone (docs/sfn.md, "How it is built").
    forbidden = {
        "receive_message",
        "delete_message",
        "send_task_success",
        "send_task_failure",
        "send_task_heartbeat",
        "add_signal_handler",
        "signal",
        "run",
        "killpg",
    }
    # The subprocess's side: its handler, its supervisor (which kills its group for it).
    children = {"handler.py", "task_child.py", "launch.py"}
    for path in set(SFN.glob("*.py")) - {SFN / name for name in children}:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                owner = node.func.value
                if name == "run" and not (isinstance(owner, ast.Name) and owner.id == "asyncio"):
                    continue
                if name == "signal" and not (isinstance(owner, ast.Name) and owner.id == "signal"):
                    continue
                assert name not in forbidden, f"{path.name} calls {name}"
    readers = [path.name for path in SFN.glob("*.py") if "conclusion_from_json" in path.read_text()]
    assert readers == ["subprocesses.py"]


class CountingProtection(TaskProtection):
    def __init__(self) -> None:
        super().__init__("http://agent.invalid")
        self.states: list[bool] = []
        self.renewed = asyncio.Event()

    def enable(self, expires_in_minutes: int) -> bool:
        self.states.append(True)
        if self.states.count(True) >= 3:
            self.renewed.set()
        return True

    def disable(self) -> bool:
        self.states.append(False)
        return True


async def run_here(call: Any) -> Any:
    return call()


async def test_protection_covers_the_budget_and_is_renewed_on_long_messages() -> None:
    worker: Worker[WorkerRequest] = Worker(
        request_schema=WorkerRequest,
        select_subprocess_module=lambda request: "x",
        sqs_queue_url="https://sqs.example/1/q",
        message_processing_timeout_minutes=3000,
    )
    assert worker.protection_minutes == 2880  # ECS's cap
    assert worker.renew_period_s == 2879 * 60
    protection = CountingProtection()
    lease = ProtectionLease(protection, 2880, run_here, renew_period_s=0.01)
    await lease.acquire()
    await lease.acquire()  # a second delivery in hand shares the protection
    await asyncio.wait_for(protection.renewed.wait(), 5)
    await lease.release()
    assert protection.states[-1] is True  # one delivery still in hand
    await lease.release()
    assert protection.states[0] is True and protection.states[-1] is False
    assert protection.states.count(False) == 1


class Routed(WorkerRequest):
    pass


class Recorder:
    """SQS and Step Functions at once: records what the worker sends."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []
        self.successes: list[str] = []

    def send_task_failure(self, taskToken: str, error: str, cause: str) -> None:
        self.failures.append((error, cause))

    def send_task_success(self, taskToken: str, output: str) -> None:
        self.successes.append(output)

    def send_task_heartbeat(self, taskToken: str) -> None:
        return None

    def delete_message(self, **kwargs: object) -> None:
        return None


async def test_routing_code_raising_even_systemexit_fails_the_task_not_the_worker() -> None:
    recorder = Recorder()

    def select(request: Routed) -> str:
        raise SystemExit(3)

    worker: Worker[Routed] = Worker(
        request_schema=Routed,
        select_subprocess_module=select,
        sqs_queue_url="https://sqs.example/1/q",
        sqs_client=recorder,
        stepfunctions_client=recorder,
        protection=TaskProtection(""),
    )
    await worker.handle_message(
        {"MessageId": "m", "Body": json.dumps({"task_token": "t"}), "ReceiptHandle": "r"}
    )
    assert recorder.failures == [("SystemExit", "3")]


def test_the_most_specific_registered_class_sets_the_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Rejected(Exception):
        pass

    levels = ExceptionLevels({Exception: logging.DEBUG, Rejected: logging.CRITICAL})
    caplog.set_level(logging.DEBUG)
    levels.log(Rejected, "rejected")
    assert caplog.records[-1].levelno == logging.CRITICAL
    assert levels.level_of(KeyError) == logging.DEBUG
    assert ExceptionLevels(None).level_of(KeyError) == logging.ERROR


def test_a_garbled_agent_answer_is_tolerated() -> None:
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer() -> None:
        connection, _ = server.accept()
        connection.recv(65536)
        connection.sendall(b"garbage without a status line\r\n\r\n")
        connection.close()

    threading.Thread(target=answer, daemon=True).start()
    protection = TaskProtection(f"http://127.0.0.1:{server.getsockname()[1]}")
    assert protection.enable(5) is False
    server.close()
