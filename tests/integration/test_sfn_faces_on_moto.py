"""Both Step Functions faces on moto: a `@worker.task` on sqs-sfn, and seed 000's Worker."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.integration.sfn_fixtures import Aws, EcsAgentStub
from tests.polling import wait_for
from tests.ports import free_port

pytestmark = pytest.mark.integration

RUN = "from async_task_api_worker.cli import main; raise SystemExit(main(['run', '{target}']))"


def serve(aws: Aws, sfn_worker: Any, target: str, **env: str) -> tuple[Any, str]:
    port = str(free_port())
    worker = sfn_worker(
        "",
        aws.env(
            WORKER_TRANSPORT="sqs-sfn",
            SQS_QUEUE_URL=aws.queue_url,
            HEALTH_CHECK_PORT=port,
            SQS_WAIT_TIME_S="1",
            SFN_HEARTBEAT_INTERVAL_S="1",
            **env,
        ),
        call=RUN.format(target=target),
    )
    return worker, f"http://127.0.0.1:{port}"


def get(url: str) -> tuple[int, str]:
    """The status and body of a GET; ``(0, "")`` while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - loopback
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:
        return 0, ""


def task_failed(aws: Aws, execution: str) -> dict[str, Any]:
    history = aws.sfn.get_execution_history(executionArn=execution)["events"]
    (failure,) = [e for e in history if e["type"] == "TaskFailed"]
    return dict(failure["taskFailedEventDetails"])


def decision_lines(log: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if line["msg"].startswith("Delivery settled:")]


def test_the_example_worker_succeeds_and_fails_with_its_code_on_step_functions(
    aws: Aws, ecs_agent: EcsAgentStub, sfn_worker: Any
) -> None:
    worker, probes = serve(
        aws, sfn_worker, "examples.count_words:worker", ECS_AGENT_URI=ecs_agent.url
    )
    wait_for(lambda: get(f"{probes}/ready")[0] == 200, what=lambda: "ready:\n" + worker.log())
    ok = aws.finished(aws.start({"text": "hello big world"}))
    assert ok["status"] == "SUCCEEDED", worker.log()
    assert json.loads(ok["output"]) == {"words": 3}
    refused = aws.finished(aws.start({"text": "   "}))
    assert refused["status"] == "FAILED", worker.log()
    details = task_failed(aws, refused["executionArn"])
    # moto's server drops SendTaskFailure's cause: tests/unit/sfn checks causes.
    assert details["error"] == "EMPTY_TEXT"
    # One decision line per message, the metrics moved, the probes answer while it runs.
    lines = decision_lines(worker.log())
    assert [(line["outcome"], line.get("code")) for line in lines] == [
        ("success", None),
        ("failure", "EMPTY_TEXT"),
    ]
    assert all(line["msg"].endswith("attempt=1/1") for line in lines)
    assert get(f"{probes}/health") == (200, '{"status":"ok"}')
    assert get(f"{probes}/ready") == (200, '{"status":"ready"}')
    metrics = get(f"{probes}/metrics")[1]
    assert 'worker_tasks_total{status="success"} 1.0' in metrics
    assert 'worker_tasks_total{status="failure"} 1.0' in metrics
    # ECS task protection wrapped each message: on before, off after.
    assert [call["body"]["ProtectionEnabled"] for call in ecs_agent.wait_calls(4)] == [
        True,
        False,
        True,
        False,
    ]
    assert aws.messages_left() == 0
    assert worker.stop() == 0


def test_sigterm_with_a_message_in_hand_finishes_it_then_exits_0(aws: Aws, sfn_worker: Any) -> None:
    worker, probes = serve(
        aws, sfn_worker, "tests.integration.sfn_sdk_workers:napper", WORKER_SHUTDOWN_GRACE_S="0"
    )
    wait_for(lambda: get(f"{probes}/ready")[0] == 200, what=lambda: "ready:\n" + worker.log())
    execution = aws.start({"seconds": 3})
    wait_for(
        lambda: "worker_tasks_in_flight 1.0" in get(f"{probes}/metrics")[1],
        what=lambda: "the task to start:\n" + worker.log(),
    )
    worker.process.send_signal(signal.SIGTERM)
    # The drain waits for it although the grace period is 0: it cannot be given back.
    wait_for(lambda: get(f"{probes}/ready")[0] == 503, what="not ready while draining")
    assert '"draining"' in get(f"{probes}/ready")[1]
    assert worker.process.wait(timeout=60) == 0, worker.log()
    finished = aws.finished(execution)
    assert finished["status"] == "SUCCEEDED", worker.log()
    assert json.loads(finished["output"]) == {"slept": 3}


def test_a_schema_failure_names_no_client_field_in_its_cause_or_the_log(
    aws: Aws, sfn_worker: Any
) -> None:
    worker, _ = serve(aws, sfn_worker, "tests.integration.sfn_sdk_workers:napper")
    execution = aws.start({"seconds": 0, "SECRET_FIELD_NAME_7f3a": "x"})
    finished = aws.finished(execution)
    assert finished["status"] == "FAILED", worker.log()
    assert task_failed(aws, execution)["error"] == "INVALID_INPUT"
    refused = aws.finished(aws.start({"seconds": 0, "fail": True}))
    assert task_failed(aws, refused["executionArn"])["error"] == "NAP_REFUSED"
    assert worker.stop() == 0
    assert "SECRET_FIELD_NAME_7f3a" not in worker.log()


def test_the_seed_face_has_the_same_decision_lines_metrics_and_probes(
    aws: Aws, sfn_worker: Any
) -> None:
    port = str(free_port())
    worker = sfn_worker("tests.integration.sfn_consumer.app", aws.env(HEALTH_CHECK_PORT=port))
    probes = f"http://127.0.0.1:{port}"
    wait_for(lambda: get(f"{probes}/ready")[0] == 200, what=lambda: "ready:\n" + worker.log())
    ok = aws.finished(aws.start({"asset_upload_type": "atmos", "bucket": "b", "key": "k"}))
    assert ok["status"] == "SUCCEEDED", worker.log()
    refused = aws.finished(aws.start({"asset_upload_type": "other", "bucket": "b", "key": "k"}))
    assert task_failed(aws, refused["executionArn"])["error"] == "UnsupportedAssetUploadType"
    lines = decision_lines(worker.log())
    assert [(line["outcome"], line.get("code")) for line in lines] == [
        ("success", None),
        ("failure", "UnsupportedAssetUploadType"),
    ]
    assert {line["service"] for line in lines} == {aws.queue_url.rpartition("/")[2]}
    assert get(f"{probes}/health")[0] == 200
    metrics = get(f"{probes}/metrics")[1]
    assert 'worker_tasks_total{status="success"} 1.0' in metrics
    assert 'worker_tasks_total{status="failure"} 1.0' in metrics
    assert worker.stop() == 0
