"""JSON logs, metrics and secrets of a real worker process on the real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from async_task_api_worker.client import build_envelope
from async_task_api_worker.protocol.reports import decode_report
from tests.integration.conftest import Queues, broker_url, rabbitmqctl, wait_for
from tests.probes_client import get

TARGET = "tests.integration.observed_workers:observed"


async def submit_all(queues: Queues, service: str, inputs: list[dict[str, Any]]) -> list[str]:
    async with queues.client(service) as client:
        return [await client.submit(task_input) for task_input in inputs]


async def publish_raw(queues: Queues, body: bytes) -> None:
    connection = await aio_pika.connect(queues.url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queues.in_queue)


async def drain_reports(queues: Queues, count: int) -> list[bytes]:
    """Take ``count`` reports off the output queue (their raw bodies), one ``get`` at a time."""
    connection = await aio_pika.connect(queues.url)
    bodies: list[bytes] = []
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(queues.out_queue, durable=True)
        while len(bodies) < count:
            message = await queue.get(timeout=10, fail=False)
            if message is None:
                raise AssertionError(f"only {len(bodies)} of {count} reports: {bodies}")
            bodies.append(message.body)
            await message.ack()
    return bodies


def settled(worker: Any, count: int) -> bool:
    return worker.log().count("Delivery settled") >= count


def test_every_stdout_line_is_json_and_library_lines_carry_the_task_id(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(TARGET, queues.env(ATW_TEST_MARKERS=str(markers)))
    task_ids = asyncio.run(submit_all(queues, "observed", [{"mode": "ok"}, {"mode": "fatal"}]))
    wait_for(lambda: settled(worker, 2), what="two decision lines")
    worker.stop()
    lines = worker.lines()  # fails on any line that is not JSON
    assert lines
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= set(line), line
    library = [line for line in lines if line["logger"] == "some.lib"]
    assert {line["task_id"] for line in library} == set(task_ids)
    assert all(line["service"] == "observed" and line["attempt"] == 1 for line in library)
    handler = [line for line in lines if line["msg"] == "handler line"]
    assert {line["task_id"] for line in handler} == set(task_ids)
    decisions = [line for line in lines if line["msg"].startswith("Delivery settled")]
    assert [(d["task_id"], d["outcome"], d["action"]) for d in decisions] == [
        (task_ids[0], "success", "ack"),
        (task_ids[1], "failure", "conclude"),
    ]
    assert decisions[1]["code"] == "NOT_ALLOWED"
    assert worker.stderr_path.read_text() == ""


def test_a_def_handler_thread_carries_the_task_id(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        "tests.integration.observed_workers:threaded", queues.env(ATW_TEST_MARKERS=str(markers))
    )
    (task_id,) = asyncio.run(submit_all(queues, "threaded", [{}]))
    wait_for(lambda: settled(worker, 1), what="the decision line")
    (line,) = [line for line in worker.lines() if line["msg"] == "thread line"]
    assert line["task_id"] == task_id


def test_an_application_root_logger_is_kept_and_nothing_is_printed_twice(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        "tests.integration.app_logging_worker:worker", queues.env(ATW_TEST_MARKERS=str(markers))
    )
    asyncio.run(submit_all(queues, "observed", [{"mode": "ok"}]))
    wait_for(lambda: settled(worker, 1), what="the decision line")
    worker.stop()
    lines = worker.stdout().splitlines()
    assert lines
    assert all(line.startswith("APP ") for line in lines), lines
    assert len(lines) == len(set(lines)), "a line was printed twice"
    assert sum("Delivery settled" in line for line in lines) == 1
    assert sum(line.startswith("APP INFO Connected to") for line in lines) == 1
    assert "APP INFO library line for ok" in lines


@pytest.fixture
def canary_user(quorum_vhost: str) -> Iterator[tuple[str, str]]:
    """A broker user whose password is a canary secret."""
    user, password = f"atw-{uuid.uuid4().hex[:6]}", f"CANARYpw{uuid.uuid4().hex[:12]}"
    rabbitmqctl("add_user", user, password)
    rabbitmqctl("set_permissions", "-p", quorum_vhost, user, ".*", ".*", ".*")
    yield user, password
    rabbitmqctl("delete_user", user)


def test_canary_secrets_appear_in_no_log_line_report_or_metric(
    queues: Queues, start_worker: Any, markers: Path, canary_user: tuple[str, str]
) -> None:
    user, password = canary_user
    secret = f"CANARYin{uuid.uuid4().hex[:12]}"
    url = broker_url(queues.vhost, user=user, password=password)
    worker = start_worker(
        TARGET, queues.env(BROKER_URL=url, ATW_TEST_MARKERS=str(markers), LOG_LEVEL="DEBUG")
    )
    inputs = [
        {"mode": "ok", "text": secret},
        {"mode": "crash", "text": secret},  # the exception's text holds the secret
        {"mode": "fatal", "text": secret},
        {"mode": "echo", "text": secret},  # the handler chooses to return it
        {"mode": f"not-a-mode-{secret}", "text": secret},  # invalid input
    ]
    # Published raw: a TaskClient would consume reports from the output queue we read below.
    bodies_in = [
        build_envelope(task_input, service="observed", task_id=f"c-{n}", client_id="c")[1]
        for n, task_input in enumerate(inputs)
    ]
    _, poison = build_envelope({"text": secret}, service="observed", task_id="p-1", client_id="c")
    bodies_in.append(poison.replace(b'"input"', b'"input":1,"x"'))
    bodies_in.append(b"{" + secret.encode())
    for body in bodies_in:
        asyncio.run(publish_raw(queues, body))
    wait_for(lambda: settled(worker, 7), what="seven decision lines")
    bodies = asyncio.run(drain_reports(queues, 10))  # 4 started, 2 success, 4 failure
    # A reconnect makes the client library log about the connection, URL included.
    rabbitmqctl("close_all_connections", "-p", queues.vhost, "canary test")
    wait_for(lambda: "consume channel reopened" in worker.log(), what="the reconnect")
    metrics = get(worker.probes_url, "/metrics").body.decode()
    worker.stop()

    everything_logged = worker.log()
    assert "INTERNAL_ERROR" in everything_logged and "RuntimeError" in everything_logged
    assert "Connected to amqp://" in everything_logged and ":***@" in everything_logged
    for secret_text in (secret, password):
        assert secret_text not in everything_logged
        assert secret_text not in metrics
    reports = [decode_report(body) for body in bodies]
    echo_id = "c-3"
    for body, report in zip(bodies, reports, strict=True):
        if report.task_id == echo_id and report.type == "success":
            assert secret.encode() in body
        else:
            assert secret.encode() not in body, body
            assert password.encode() not in body


def test_metrics_of_a_real_process_count_its_deliveries(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(TARGET, queues.env(ATW_TEST_MARKERS=str(markers)))
    asyncio.run(
        submit_all(
            queues,
            "observed",
            [{"mode": "ok"}, {"mode": "fatal"}, {"mode": "retry"}, {"mode": "progress"}],
        )
    )
    asyncio.run(publish_raw(queues, b"[]"))
    wait_for(lambda: settled(worker, 6), what="six decision lines")  # the retry settles twice
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(
            get(worker.probes_url, "/metrics").body.decode()
        )
        for sample in family.samples
    }
    assert found[("worker_tasks_total", (("status", "success"),))] == 3
    assert found[("worker_tasks_total", (("status", "failure"),))] == 1
    assert found[("worker_tasks_total", (("status", "retry"),))] == 1
    assert found[("worker_tasks_total", (("status", "poison"),))] == 1
    assert found[("worker_task_retries_total", ())] == 1
    assert found[("worker_task_failures_total", (("code", "NOT_ALLOWED"),))] == 1
    assert found[("worker_poison_messages_total", (("reason", "not_an_object"),))] == 1
    assert found[("worker_progress_dropped_total", (("reason", "backwards"),))] == 1
    # One started per attempt; a retried attempt is requeued without waiting for its started
    # (engine.reporting: end_started), whose confirm may come after, uncounted.
    assert found[("worker_messages_published_total", (("message_type", "started"),))] in (4, 5)
    assert found[("worker_messages_published_total", (("message_type", "success"),))] == 3
    assert found[("worker_tasks_in_flight", ())] == 0
