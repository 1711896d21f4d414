"""The Step Functions worker against moto's server in execute mode and an ECS agent stub."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.integration.sfn_fixtures import Aws, EcsAgentStub
from tests.polling import wait_for
from tests.unit.process.test_process_executor import processes_with

CASES = "tests.integration.sfn_consumer.cases"


def test_the_seed_consumer_example_runs_unchanged(
    aws: Aws, ecs_agent: EcsAgentStub, sfn_worker: Any
) -> None:
    worker = sfn_worker("tests.integration.sfn_consumer.app", aws.env(ECS_AGENT_URI=ecs_agent.url))
    execution = aws.start({"asset_upload_type": "atmos", "bucket": "b", "key": "k"})
    finished = aws.finished(execution)
    assert finished["status"] == "SUCCEEDED", worker.log()
    assert json.loads(finished["output"]) == {"is_valid": True}
    calls = ecs_agent.wait_calls(2)  # off once the task settled, which may follow the end
    assert [call["body"]["ProtectionEnabled"] for call in calls] == [True, False]
    assert ecs_agent.calls[0]["path"] == "/task-protection/v1/state"
    assert ecs_agent.calls[0]["body"]["ExpiresInMinutes"] == 31
    assert aws.messages_left() == 0
    assert worker.stop() == 0


def failed(aws: Aws, payload: dict[str, Any]) -> dict[str, Any]:
    finished = aws.finished(aws.start(payload))
    assert finished["status"] == "FAILED", finished
    return finished


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("domain", "AssetRejected"),
        ("unregistered", "UnknownSubprocessError"),
        ("fake_framework", "UnknownSubprocessError"),
        ("segv", "SubprocessCrashError"),
        ("garbage", "MalformedSubprocessOutput"),
        ("surrogate", "MalformedSubprocessOutput"),  # "\ud800" in its output: not Unicode
        ("big", "SubprocessOutputTooLarge"),
    ],
)
def test_the_failure_taxonomy(aws: Aws, sfn_worker: Any, case: str, error: str) -> None:
    worker = sfn_worker(CASES, aws.env())
    finished = failed(aws, {"case": case})
    history = aws.sfn.get_execution_history(executionArn=finished["executionArn"])["events"]
    failures = [e for e in history if e["type"] == "TaskFailed"]
    assert failures, history
    details = failures[0]["taskFailedEventDetails"]
    assert details["error"] == error, worker.log()
    assert len(details["error"]) <= 256 and len(details.get("cause", "")) <= 32768
    assert worker.process.poll() is None  # the worker goes on


def test_a_large_and_a_non_ascii_request_reach_the_child_intact(aws: Aws, sfn_worker: Any) -> None:
    import hashlib

    sfn_worker(CASES, aws.env())
    for data in ("é" * 70_000 + "ok", "ascii " * 34_000, "日本語のテキスト ✓"):
        finished = aws.finished(aws.start({"case": "echo", "data": data}))
        assert finished["status"] == "SUCCEEDED", finished
        output = json.loads(finished["output"])
        assert output["sha256"] == hashlib.sha256(data.encode()).hexdigest()
        assert output["chars"] == len(data)
        assert output["via_file"] is (len(data.encode()) >= 64 * 1024)


def test_a_stale_token_kills_the_whole_group_silently(aws: Aws, sfn_worker: Any) -> None:
    worker = sfn_worker(CASES, aws.env(HEARTBEAT_S="0.5"))
    marker = f"atw-sfn-{uuid.uuid4().hex}"
    execution = aws.start({"case": "long", "marker": marker})
    wait_for(
        lambda: len(processes_with(marker)) >= 2, 30, lambda: "two processes:\n" + worker.log()
    )
    aws.sfn.stop_execution(executionArn=execution)
    wait_for(lambda: not processes_with(marker), 30, lambda: "no process:\n" + worker.log())
    stale = "The task token went stale"
    wait_for(lambda: stale in worker.log(), 10, lambda: f"{stale!r}:\n{worker.log()}")
    # Nothing was sent for the token: no task success or failure in the execution's history.
    aws.finished(execution)
    history = aws.sfn.get_execution_history(executionArn=execution)["events"]
    assert not [e for e in history if e["type"] in ("TaskSucceeded", "TaskFailed")], history
    assert "did not take the task's" not in worker.log()


def test_malformed_messages(aws: Aws, sfn_worker: Any) -> None:
    worker = sfn_worker(CASES, aws.env())
    # A token, but no `case`: the failure is sent for that token.
    finished = failed(aws, {"other": "x"})
    history = aws.sfn.get_execution_history(executionArn=finished["executionArn"])["events"]
    (failure,) = [e for e in history if e["type"] == "TaskFailed"]
    assert failure["taskFailedEventDetails"]["error"] == "MalformedMessage"
    # Not JSON at all: deleted, logged, the worker goes on.
    aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody="not json {")
    said = "no task token to report to"
    wait_for(lambda: said in worker.log(), 20, lambda: f"{said!r}:\n{worker.log()}")
    assert aws.messages_left() == 0
    assert aws.finished(aws.start({"case": "echo", "data": "after"}))["status"] == "SUCCEEDED"


@pytest.mark.parametrize("mode", ["failure", "error", "hang"])
def test_a_failing_ecs_agent_never_stops_the_task(
    aws: Aws, ecs_agent: EcsAgentStub, sfn_worker: Any, mode: str
) -> None:
    ecs_agent.mode = mode
    worker = sfn_worker(CASES, aws.env(ECS_AGENT_URI=ecs_agent.url))
    started = time.monotonic()
    finished = aws.finished(aws.start({"case": "echo", "data": "x"}), timeout_s=40)
    assert finished["status"] == "SUCCEEDED", worker.log()
    assert ecs_agent.calls and ecs_agent.calls[0]["body"]["ProtectionEnabled"] is True
    if mode == "hang":
        # The call gives up after its 2 s timeout; the task runs anyway.
        assert time.monotonic() - started < 30
    assert "task protection" in worker.log()


def test_sigterm_during_a_message_waits_for_it(aws: Aws, sfn_worker: Any) -> None:
    import signal

    worker = sfn_worker(CASES, aws.env())
    execution = aws.start({"case": "sleepy"})
    running = "Running tests.integration.sfn_consumer.case_sleepy"
    wait_for(lambda: running in worker.log(), 20, lambda: f"{running!r}:\n{worker.log()}")
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=30) == 0
    finished = aws.finished(execution)
    assert finished["status"] == "SUCCEEDED", worker.log()
    assert json.loads(finished["output"]) == {"slept": True}


def test_a_message_past_its_budget_is_killed_and_failed(aws: Aws, sfn_worker: Any) -> None:
    worker = sfn_worker(CASES, aws.env(TIMEOUT_MIN="0.02"))  # 1.2 s
    marker = f"atw-sfn-timeout-{uuid.uuid4().hex}"
    finished = failed(aws, {"case": "long", "marker": marker})
    history = aws.sfn.get_execution_history(executionArn=finished["executionArn"])["events"]
    (failure,) = [e for e in history if e["type"] == "TaskFailed"]
    assert failure["taskFailedEventDetails"]["error"] == "SubprocessTimeoutError", worker.log()
    assert processes_with(marker) == []
