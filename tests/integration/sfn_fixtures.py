"""Moto's server in execute mode, an ECS agent stub, and Step Functions workers as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.polling import wait_for
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/worker"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):  # noqa: S310
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """Moto's server: CI's (``MOTO_PORT``), or one started for the session; execute mode on."""
    port = os.environ.get("MOTO_PORT")
    process = None
    if port is None:
        port = str(free_port())
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-p", port],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(url), 30, f"moto's server to answer on {url}")
    request = urllib.request.Request(  # noqa: S310
        f"{url}/moto-api/config",
        data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).close()  # noqa: S310
    yield url
    if process is not None:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class EcsAgentStub:
    """Records task-protection calls; ``mode`` picks the answer: ok, failure, error, hang."""

    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "ok"
    changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_calls(self, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The calls once ``count`` came: protection goes off after the execution may end."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.calls) >= count, timeout_s)
        return self.calls


@pytest.fixture
def ecs_agent() -> Iterator[EcsAgentStub]:
    stub = EcsAgentStub()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with stub.changed:
                stub.calls.append({"path": self.path, "body": body, "at": time.monotonic()})
                stub.changed.notify_all()
            if stub.mode == "hang":
                time.sleep(30)  # an agent that never answers: the worker's call times out
                return
            if stub.mode == "error":
                self.send_response(500)
                self.end_headers()
                return
            answer: dict[str, Any] = (
                {"failure": {"Arn": "arn", "Reason": "TASK_NOT_IN_SERVICE"}}
                if stub.mode == "failure"
                else {"protection": {"ProtectionEnabled": body["ProtectionEnabled"]}}
            )
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield stub
    server.shutdown()
    server.server_close()


@dataclass
class Aws:
    """Clients on moto, a queue, and a state machine sending to it with waitForTaskToken."""

    url: str
    sqs: Any
    sfn: Any
    queue_url: str = ""
    machines: dict[tuple[str, ...], str] = field(default_factory=dict)
    heartbeat_s: int = 30

    def machine(self, fields: tuple[str, ...]) -> str:
        """A state machine whose task state sends these input fields and the task token."""
        if fields not in self.machines:
            body: dict[str, str] = {"task_token.$": "$$.Task.Token"}
            body.update({f"{name}.$": f"$.{name}" for name in fields})
            definition = {
                "StartAt": "Work",
                "States": {
                    "Work": {
                        "Type": "Task",
                        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                        "HeartbeatSeconds": self.heartbeat_s,
                        "Parameters": {"QueueUrl": self.queue_url, "MessageBody": body},
                        "End": True,
                    }
                },
            }
            self.machines[fields] = self.sfn.create_state_machine(
                name=f"m-{uuid.uuid4().hex[:10]}", definition=json.dumps(definition), roleArn=ROLE
            )["stateMachineArn"]
        return self.machines[fields]

    def start(self, payload: dict[str, Any]) -> str:
        """Start an execution whose task state sends ``payload``'s fields and the task token."""
        return str(
            self.sfn.start_execution(
                stateMachineArn=self.machine(tuple(sorted(payload))),
                name=f"e-{uuid.uuid4().hex}",
                input=json.dumps(payload),
            )["executionArn"]
        )

    def finished(self, execution: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The execution once it is no longer RUNNING."""
        deadline = time.monotonic() + timeout_s
        while True:
            described = self.sfn.describe_execution(executionArn=execution)
            if described["status"] != "RUNNING":
                return dict(described)
            if time.monotonic() > deadline:
                raise AssertionError(f"{execution} still RUNNING after {timeout_s} s")
            time.sleep(0.1)

    def messages_left(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )

    def env(self, **more: str) -> dict[str, str]:
        environment = dict(os.environ)
        environment.update(
            AWS_ENDPOINT_URL=self.url,
            AWS_DEFAULT_REGION=REGION,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            QUEUE_URL=self.queue_url,
            PYTHONUNBUFFERED="1",
            # The probes server of each worker on a free port: tests run workers side by side.
            HEALTH_CHECK_PORT="0",
        )
        environment.update(more)
        return environment


@pytest.fixture
def aws(moto_url: str) -> Aws:
    keys = {
        "endpoint_url": moto_url,
        "region_name": REGION,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    sqs = boto3.client("sqs", **keys)
    sfn = boto3.client("stepfunctions", **keys)
    name = f"q-{uuid.uuid4().hex[:10]}"
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    return Aws(moto_url, sqs, sfn, queue_url)


class WorkerRun:
    """A Step Functions worker process; its output goes to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.log_path = logs / f"sfn-worker-{uuid.uuid4().hex[:6]}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=60)
        finally:
            self._log.close()


@pytest.fixture
def sfn_worker(tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerRun] = []

    def start(module: str, env: dict[str, str], *, call: str = "") -> WorkerRun:
        argv = [sys.executable, "-c", call] if call else [sys.executable, "-m", module]
        run = WorkerRun(argv, env, tmp_path)
        started.append(run)
        return run

    yield start
    for run in started:
        run.stop()
