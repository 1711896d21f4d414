"""Every way a subprocess can end ends its Step Functions task: one call, bounded, no payload.

Seed 000's ``Worker`` runs real subprocesses here (tests/integration/sfn_consumer); SQS and Step
Functions are a recorder, which can refuse an output as AWS does (``InvalidOutput``): moto's
server neither refuses one nor keeps a failure's ``cause``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError
from pydantic import ConfigDict

from async_task_api_worker.sfn import NonEmptyStr, Worker, WorkerRequest
from async_task_api_worker.sfn.protection import TaskProtection
from async_task_api_worker.transports.sqs_sfn.codec import MAX_CAUSE_CHARS, MAX_ERROR_CHARS
from tests.conftest import decision_records
from tests.integration.sfn_consumer.cases import AssetRejected, CaseRequest, select
from tests.polling import until, wait_for
from tests.unit.process.test_process_executor import processes_with

PAYLOAD = "PAYLOAD-do-not-echo-4411"


@dataclass
class StepFunctions:
    """SQS and Step Functions at once: every call the worker makes, in order."""

    refuse_output: bool = False
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def delete_message(self, **arguments: Any) -> None:
        self.calls.append(("delete", arguments))

    def send_task_heartbeat(self, taskToken: str) -> None:
        self.calls.append(("heartbeat", {"taskToken": taskToken}))

    def send_task_success(self, taskToken: str, output: str) -> None:
        if self.refuse_output:
            raise ClientError(
                {"Error": {"Code": "InvalidOutput", "Message": "bad output"}}, "SendTaskSuccess"
            )
        self.calls.append(("success", {"taskToken": taskToken, "output": output}))

    def send_task_failure(self, taskToken: str, error: str, cause: str) -> None:
        self.calls.append(("failure", {"taskToken": taskToken, "error": error, "cause": cause}))

    def terminal(self) -> list[tuple[str, dict[str, Any]]]:
        return [call for call in self.calls if call[0] in ("success", "failure")]


def worker_on(
    aws: StepFunctions,
    *,
    minutes: float = 1.0,
    schema: Any = CaseRequest,
    heartbeat_s: float = 30.0,
) -> Worker[Any]:
    return Worker(
        request_schema=schema,
        select_subprocess_module=select,
        sqs_queue_url="https://sqs.example/123456789012/cases",
        heartbeat_interval_seconds=heartbeat_s,
        message_processing_timeout_minutes=minutes,
        exception_levels={AssetRejected: logging.WARNING},
        sqs_client=aws,
        stepfunctions_client=aws,
        protection=TaskProtection(""),
    )


def message(**fields: Any) -> dict[str, Any]:
    body = {"task_token": f"token-{uuid.uuid4().hex}", "data": PAYLOAD, **fields}
    return {"MessageId": str(uuid.uuid4()), "ReceiptHandle": "r", "Body": json.dumps(body)}


# case → (the call, the error it carries)
ENDS = [
    ("echo", False, "success", None),
    ("domain", False, "failure", "AssetRejected"),
    ("segv", False, "failure", "SubprocessCrashError"),
    ("garbage", False, "failure", "MalformedSubprocessOutput"),
    ("surrogate", False, "failure", "MalformedSubprocessOutput"),
    ("nan", False, "failure", "MalformedSubprocessOutput"),
    ("big", False, "failure", "SubprocessOutputTooLarge"),
    ("echo", True, "failure", "MalformedSubprocessOutput"),  # InvalidOutput from the API
    ("unregistered", False, "failure", "UnknownSubprocessError"),
    ("fake_framework", False, "failure", "UnknownSubprocessError"),
]


@pytest.mark.parametrize(("case", "refuse_output", "call", "error"), ENDS)
async def test_every_end_of_a_subprocess_ends_its_token_once(
    case: str, refuse_output: bool, call: str, error: str | None, decisions: Any
) -> None:
    aws = StepFunctions(refuse_output=refuse_output)
    sent = message(case=case)
    await worker_on(aws).handle_message(sent)
    ((kind, arguments),) = aws.terminal()
    assert kind == call, aws.calls
    assert arguments["taskToken"] == json.loads(sent["Body"])["task_token"]
    if kind == "failure":
        assert arguments["error"] == error
        assert len(arguments["error"]) <= MAX_ERROR_CHARS
        assert len(arguments["cause"]) <= MAX_CAUSE_CHARS
        assert PAYLOAD not in arguments["error"] + arguments["cause"]
    else:
        assert json.loads(arguments["output"])  # strict JSON
    assert aws.calls[0][0] == "delete"  # deleted on pickup, before it ran
    assert len(decision_records(decisions)) == 1
    assert PAYLOAD not in decisions.text


async def test_a_lone_surrogate_in_the_output_fails_the_task_and_says_where(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its stdout holds the escape "\ud800": valid JSON, not valid Unicode (docs/protocol.md).
    aws = StepFunctions()
    await worker_on(aws).handle_message(message(case="surrogate"))
    ((kind, arguments),) = aws.terminal()
    assert (kind, arguments["error"]) == ("failure", "MalformedSubprocessOutput")
    assert arguments["cause"] == (
        "the handler's result cannot be reported: "
        "value is not valid Unicode: a lone surrogate U+D800 at text"
    )
    (logged,) = [r for r in caplog.records if getattr(r, "error", None) == arguments["error"]]
    assert logged.levelno == logging.ERROR  # its level: none registered for it here


async def test_a_subprocess_past_its_budget_is_killed_whole_and_failed() -> None:
    aws = StepFunctions()
    marker = f"atw-every-end-{uuid.uuid4().hex}"
    await worker_on(aws, minutes=0.02).handle_message(message(case="long", marker=marker))
    ((kind, arguments),) = aws.terminal()
    assert (kind, arguments["error"]) == ("failure", "SubprocessTimeoutError")
    assert arguments["cause"] == "the task did not finish within 1.2 s"  # 0.02 minutes
    assert processes_with(marker) == []


@pytest.mark.parametrize(
    ("fail", "expected"),
    [
        (False, ("success", '{"slept":0.0}')),
        # Its conclusion's code is a name like any other to seed 000's face: not registered.
        (True, ("failure", "UnknownSubprocessError: NAP_REFUSED: This nap was refused.")),
    ],
)
async def test_an_sdk_tasks_conclusion_reaches_step_functions_in_seed_000s_names(
    fail: bool, expected: tuple[str, str]
) -> None:
    aws = StepFunctions()
    await worker_on(aws).handle_message(message(case="sdk_task", input={"fail": fail}))
    ((kind, arguments),) = aws.terminal()
    if kind == "success":
        assert (kind, arguments["output"]) == expected
    else:
        assert (kind, f"{arguments['error']}: {arguments['cause']}") == expected


async def test_a_frozen_workers_subprocess_stops_itself_and_its_task_is_given_back() -> None:
    aws = StepFunctions()
    marker = f"atw-every-end-{uuid.uuid4().hex}"
    # A heartbeat every 0.5 s: the subprocess's group holds a lease of 2 x 0.5 s.
    worker = worker_on(aws, heartbeat_s=0.5)
    handling = asyncio.ensure_future(worker.handle_message(message(case="long", marker=marker)))
    await until(lambda: len(processes_with(marker)) >= 2, 30, "the subprocess's grandchildren")
    # The worker's event loop is frozen until the group has stopped itself: no renewal, no
    # heartbeat goes out meanwhile.
    wait_for(lambda: not processes_with(marker), 30, "the group to stop itself")
    await handling
    # Not the SubprocessCrashError of a SIGKILL: the run is void, its task handed back.
    ((kind, arguments),) = aws.terminal()
    assert (kind, arguments["error"]) == ("failure", "TASK_GIVEN_BACK")


class Strict(WorkerRequest):
    model_config = ConfigDict(frozen=True, extra="forbid")

    case: NonEmptyStr


async def test_a_schema_failure_names_no_client_field(decisions: Any) -> None:
    aws = StepFunctions()
    body = {"task_token": "t", "case": "echo", "CLIENT_SECRET_FIELD_99": 1}
    await worker_on(aws, schema=Strict).handle_message(
        {"MessageId": str(uuid.uuid4()), "ReceiptHandle": "r", "Body": json.dumps(body)}
    )
    ((kind, arguments),) = aws.terminal()
    assert (kind, arguments["error"]) == ("failure", "MalformedMessage")
    assert arguments["cause"] == "invalid input: <key>: extra_forbidden"
    assert "CLIENT_SECRET_FIELD_99" not in decisions.text


async def test_a_body_without_a_token_is_settled_and_logged_with_nothing_sent(
    decisions: Any,
) -> None:
    aws = StepFunctions()
    await worker_on(aws).handle_message({"MessageId": "m", "ReceiptHandle": "r", "Body": "{x"})
    assert aws.terminal() == [] and aws.calls[0][0] == "delete"
    (line,) = decision_records(decisions)
    assert "outcome=poison action=reject" in line.getMessage()
    assert "no task token to report to" in decisions.text


async def test_the_subprocess_stderr_is_redacted_and_at_debug_after_a_normal_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="async_task_api_worker")
    aws = StepFunctions()
    await worker_on(aws).handle_message(message(case="noisy"))
    assert aws.terminal()[0][0] == "success"
    (tail,) = [r for r in caplog.records if "bytes to stderr" in r.getMessage()]
    assert tail.levelno == logging.DEBUG
    assert "amqp://worker:***@broker" in tail.getMessage()
    assert "S3CRET-PW-91" not in caplog.text


def test_a_worker_killed_with_sigkill_takes_its_subprocess_group_with_it() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    marker = f"atw-orphan-{uuid.uuid4().hex}"
    request = json.dumps({"task_token": "t", "case": "long", "marker": marker})
    worker = f"""
import os, subprocess, sys, time
env = dict(os.environ, WORKER_REQUEST={request!r})
subprocess.Popen(
    [sys.executable, "-m", "async_task_api_worker.sfn.launch",
     "tests.integration.sfn_consumer.case_long"],
    env=env, start_new_session=True,
)
time.sleep(300)  # alive until the test kills it, as kill -9 would
"""
    process = subprocess.Popen(
        [sys.executable, "-c", worker], cwd=Path(__file__).resolve().parents[3], env=os.environ
    )
    try:
        # the subprocess's two grandchildren
        wait_for(lambda: len(processes_with(marker)) >= 2, 30, "two processes")
    finally:
        process.kill()  # what kill -9 or the OOM killer does to the worker
        process.wait()
    wait_for(
        lambda: not processes_with(marker), 10, "the subprocess's group to end with its worker"
    )
