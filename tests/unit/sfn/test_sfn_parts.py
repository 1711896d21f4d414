"""The Step Functions worker's parts without AWS: heartbeats (botocore's Stubber), the child
side, protection without an agent, the import guard and the extraction rule."""

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

from async_task_api_worker.sfn import WorkerRequest
from async_task_api_worker.sfn._aws import StepFunctionsClient
from async_task_api_worker.sfn.protection import TaskProtection
from async_task_api_worker.sfn.worker import Worker

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


class FakeChild:
    def __init__(self) -> None:
        self.kills = 0

    def kill(self) -> None:
        self.kills += 1


def worker_with(client: Any) -> Worker[WorkerRequest]:
    worker: Worker[WorkerRequest] = Worker(
        request_schema=WorkerRequest,
        select_subprocess_module=lambda request: "x",
        sqs_queue_url="https://sqs.example/q",
        heartbeat_interval_seconds=0.01,
        sqs_client=object(),
        stepfunctions_client=client,
        protection=TaskProtection(""),
    )
    worker._connect()
    return worker


@pytest.mark.parametrize("code", ["TaskTimedOut", "TaskDoesNotExist", "InvalidToken"])
async def test_a_stale_answer_kills_the_group(code: str) -> None:
    client, stubber = stubbed()
    stubber.add_response("send_task_heartbeat", {}, {"taskToken": "t"})
    stubber.add_client_error("send_task_heartbeat", service_error_code=code)
    child = FakeChild()
    stale = asyncio.Event()
    with stubber:
        await asyncio.wait_for(worker_with(client)._heartbeat("t", child, stale), 5)  # type: ignore[arg-type]
    assert stale.is_set()
    assert child.kills == 1


async def test_throttling_and_server_errors_never_kill() -> None:
    client, stubber = stubbed()
    stubber.add_client_error("send_task_heartbeat", service_error_code="ThrottlingException")
    stubber.add_client_error(
        "send_task_heartbeat", service_error_code="ServiceUnavailable", http_status_code=503
    )
    stubber.add_client_error("send_task_heartbeat", service_error_code="TaskTimedOut")
    child = FakeChild()
    stale = asyncio.Event()
    with stubber:
        await asyncio.wait_for(worker_with(client)._heartbeat("t", child, stale), 5)  # type: ignore[arg-type]
    # Only the third answer (stale) killed.
    assert child.kills == 1
    stubber.assert_no_pending_responses()


def test_failures_and_successes_that_cannot_be_sent_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, stubber = stubbed()
    stubber.add_client_error("send_task_success", service_error_code="InvalidToken")
    stubber.add_client_error("send_task_failure", service_error_code="TaskTimedOut")
    with stubber:
        wrapper = StepFunctionsClient(client)
        assert wrapper.succeed("t", "{}") is False
        assert wrapper.fail("t", "E", "c") is False
    assert "InvalidToken" in caplog.text and "TaskTimedOut" in caplog.text


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


def test_run_handler_reads_the_file_keeps_prints_off_and_is_strict(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"task_token": "t", "size": 3}))
    done = run_child(CHILD, {"WORKER_REQUEST_FILE": str(request)})
    assert (done.returncode, json.loads(done.stdout)) == (0, {"size": 3})
    assert "noise on stdout" in done.stderr
    nan = run_child(CHILD, {"WORKER_REQUEST": json.dumps({"task_token": "t", "size": -1})})
    assert nan.returncode == 1
    assert json.loads(nan.stdout)["error"] == "ValueError"
    invalid = run_child(CHILD, {"WORKER_REQUEST": '{"task_token": "t", "size": "SECRET"}'})
    envelope = json.loads(invalid.stdout)
    assert (invalid.returncode, envelope["error"]) == (1, "ValidationError")
    assert "SECRET" not in envelope["message"] and "size" in envelope["message"]
    assert "SECRET" not in invalid.stderr and "'t'" not in invalid.stderr  # nor the token


def test_importing_without_boto3_says_how_to_install() -> None:
    done = run_child(
        "import sys; sys.modules['boto3'] = None\nimport async_task_api_worker.sfn", {}
    )
    assert done.returncode == 1
    assert "pip install 'async-task-api-worker[aws]'" in done.stderr


ALLOWED = {
    "async_task_api_worker.executors.process.group",
    "async_task_api_worker.executors.process.output",
}


def test_sfn_imports_only_its_documented_building_blocks() -> None:
    # task_child.py runs an SDK task through the one task call: the bridge, not seed 000.
    for path in set(SFN.glob("*.py")) - {SFN / "task_child.py"}:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module
                if module.startswith("async_task_api_worker") and not module.startswith(
                    "async_task_api_worker.sfn"
                ):
                    assert module in ALLOWED, f"{path.name} imports {module}"


class CountingProtection(TaskProtection):
    def __init__(self) -> None:
        super().__init__("http://agent.invalid")
        self.states: list[bool] = []

    def enable(self, expires_in_minutes: int) -> bool:
        self.states.append(True)
        return True

    def disable(self) -> bool:
        self.states.append(False)
        return True


async def test_protection_covers_the_budget_and_is_renewed_on_long_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    protection = CountingProtection()
    worker: Worker[WorkerRequest] = Worker(
        request_schema=WorkerRequest,
        select_subprocess_module=lambda request: "x",
        sqs_queue_url="q",
        message_processing_timeout_minutes=3000,
        sqs_client=object(),
        stepfunctions_client=object(),
        protection=protection,
    )
    assert worker.protection_minutes == 2880  # ECS's cap
    assert worker.renew_period_s == 2879 * 60
    monkeypatch.setattr(Worker, "renew_period_s", 0.01)
    renewed = asyncio.Event()

    async def slow(self: Any, message: Any) -> None:
        while protection.states.count(True) < 3:
            await asyncio.sleep(0.01)
        renewed.set()

    async def processing(self: Any, body: str) -> None:
        await slow(self, body)

    monkeypatch.setattr(Worker, "_delete", lambda self, message: asyncio.sleep(0))
    monkeypatch.setattr(Worker, "_process", processing)
    await worker.handle_message({"Body": "{}", "ReceiptHandle": "r"})
    assert renewed.is_set()
    assert protection.states[0] is True and protection.states[-1] is False


class Routed(WorkerRequest):
    pass


class Recorder:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []

    def send_task_failure(self, taskToken: str, error: str, cause: str) -> None:
        self.failures.append((error, cause))

    def delete_message(self, **kwargs: object) -> None:
        return None


async def test_routing_code_raising_even_systemexit_fails_the_task_not_the_worker() -> None:
    recorder = Recorder()

    def select(request: Routed) -> str:
        raise SystemExit(3)

    worker: Worker[Routed] = Worker(
        request_schema=Routed,
        select_subprocess_module=select,
        sqs_queue_url="q",
        sqs_client=recorder,
        stepfunctions_client=recorder,
        protection=TaskProtection(""),
    )
    await worker.handle_message({"Body": json.dumps({"task_token": "t"}), "ReceiptHandle": "r"})
    assert recorder.failures == [("SystemExit", "3")]


def test_the_most_specific_registered_class_sets_the_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Rejected(Exception):
        pass

    worker: Worker[Routed] = Worker(
        request_schema=Routed,
        select_subprocess_module=lambda request: "x",
        sqs_queue_url="q",
        exception_levels={Exception: logging.DEBUG, Rejected: logging.CRITICAL},
    )
    caplog.set_level(logging.DEBUG)
    worker._log(Rejected, "rejected")
    assert caplog.records[-1].levelno == logging.CRITICAL


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
