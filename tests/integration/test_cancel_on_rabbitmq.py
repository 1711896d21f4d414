"""Cancelling tasks from the client on RabbitMQ (docs/protocol.md, "Cancelling a task").

Two workers consume one queue, as in production; the cancel goes to the control exchange,
which every worker listens on. Each cancelled task ends with one ``failure TASK_CANCELLED``,
nothing after it, its input acked, and (process isolation) its process group gone.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from async_task_api_worker.client import AnyReport
from async_task_api_worker.protocol.reports import FailureReport
from tests.integration.conftest import Queues, rabbitmqctl, wait_for
from tests.unit.process.test_process_executor import processes_with

pytestmark = pytest.mark.timeout(120)

ASYNC = "tests.integration.cancel_workers:napping"
SYNC = "tests.integration.cancel_workers:napping_in_a_thread"
ISOLATED = "tests.unit.process.workers:isolated"


def _two_workers(start_worker: Any, target: str, queues: Queues) -> list[Any]:
    workers = [start_worker(target, queues.env()) for _ in range(2)]
    for worker in workers:
        worker.wait_for_log("Listening for cancel requests")
    return workers


async def _submit_then_cancel(
    queues: Queues, service: str, task_input: dict[str, Any], running: Any
) -> tuple[str, list[AnyReport]]:
    async with queues.client(service) as client:
        task_id = await client.submit(task_input)
        await asyncio.to_thread(wait_for, running, 30.0, "the task to start")
        await client.cancel(task_id)
        reports = [report async for report in client.reports(task_id)]
    return task_id, reports


def _assert_cancelled(reports: list[AnyReport], workers: list[Any], task_id: str) -> None:
    assert [report.type for report in reports] == ["started", "failure"]
    failure = reports[-1]
    assert isinstance(failure, FailureReport)
    assert failure.error.code == "TASK_CANCELLED"

    def decided() -> list[str]:
        lines = [line for worker in workers for line in worker.log().splitlines()]
        return [line for line in lines if task_id in line and "Delivery settled" in line]

    # The line comes once the report is confirmed and the delivery acked: after the client
    # has the report, under load a moment later.
    wait_for(lambda: decided() != [], what="the decision line")
    assert len(decided()) == 1
    assert "outcome=cancelled_by_client action=conclude code=TASK_CANCELLED" in decided()[0]


@pytest.mark.parametrize("target", [ASYNC, SYNC], ids=["async", "def"])
def test_a_running_task_is_cancelled_with_one_terminal_report_and_acked(
    queues: Queues, start_worker: Any, tmp_path: Path, target: str
) -> None:
    workers = _two_workers(start_worker, target, queues)
    marker = tmp_path / "nap"
    service = "cancel-async" if target == ASYNC else "cancel-sync"
    started = Path(f"{marker}.started")
    task_id, reports = asyncio.run(
        _submit_then_cancel(queues, service, {"marker": str(marker)}, started.exists)
    )
    _assert_cancelled(reports, workers, task_id)
    queues.assert_drained(queues.in_queue)
    queues.assert_drained(queues.out_queue)  # nothing after the terminal report
    if target == SYNC:
        wait_for(Path(f"{marker}.stopped").exists, what="the def handler to see ctx.cancelled")


def test_a_cancelled_isolated_task_loses_its_whole_process_group(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    workers = _two_workers(start_worker, ISOLATED, queues)
    marker = f"atw-cancel-{uuid.uuid4().hex}"
    pid_file = tmp_path / "child.pid"
    task_input = {"mode": "grandchildren", "marker": marker, "data": str(pid_file)}
    task_id, reports = asyncio.run(
        _submit_then_cancel(
            queues, "isolated", task_input, lambda: len(processes_with(marker)) == 2
        )
    )
    _assert_cancelled(reports, workers, task_id)
    wait_for(lambda: processes_with(marker) == [], what="the task's grandchildren to be gone")
    with pytest.raises(ProcessLookupError):
        os.killpg(int(pid_file.read_text()), 0)
    queues.assert_drained(queues.in_queue)


def test_a_task_cancelled_before_its_delivery_never_runs(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    workers = _two_workers(start_worker, ASYNC, queues)
    marker = tmp_path / "never"
    task_id = f"t-{uuid.uuid4().hex}"

    async def cancel_then_submit() -> list[AnyReport]:
        async with queues.client("cancel-async") as client:
            await client.cancel(task_id)
            for worker in workers:  # each remembers it: either may get the task
                await asyncio.to_thread(worker.wait_for_log, f"{task_id}: not running here")
            await client.submit({"marker": str(marker)}, task_id=task_id)
            return [report async for report in client.reports(task_id)]

    reports = asyncio.run(cancel_then_submit())
    assert [report.type for report in reports] == ["failure"]
    assert isinstance(reports[0], FailureReport)
    assert reports[0].error.code == "TASK_CANCELLED"
    assert not Path(f"{marker}.started").exists()
    queues.assert_drained(queues.in_queue)


def test_malformed_and_unknown_cancels_are_logged_and_the_workers_serve_on(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    workers = _two_workers(start_worker, ASYNC, queues)

    async def publish_garbage() -> None:
        connection = await aio_pika.connect(queues.url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange("cancel-async_control")
            for body in (b"{not json", b"[]", b'{"type": "cancel"}'):
                await exchange.publish(aio_pika.Message(body), routing_key="")

    asyncio.run(publish_garbage())
    for worker in workers:
        worker.wait_for_log("A cancel request was refused (invalid_json)")
        worker.wait_for_log("A cancel request was refused (not_an_object)")
    marker = tmp_path / "after"
    task_id, reports = asyncio.run(
        _submit_then_cancel(
            queues, "cancel-async", {"marker": str(marker)}, Path(f"{marker}.started").exists
        )
    )
    _assert_cancelled(reports, workers, task_id)


def test_cancels_reach_a_worker_again_after_its_connection_was_closed(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    workers = _two_workers(start_worker, ASYNC, queues)

    def bindings() -> int:
        listing = rabbitmqctl(
            "list_bindings", "-q", "-p", queues.vhost, "source_name", "destination_name"
        )
        return sum(line.startswith("cancel-async_control\t") for line in listing.splitlines())

    wait_for(lambda: bindings() == 2, what="both control queues bound")
    rabbitmqctl("close_all_connections", "-p", queues.vhost, "cancel test")
    for worker in workers:
        worker.wait_for_log("Reconnected to", timeout_s=60)
    wait_for(lambda: bindings() == 2, what="both control queues bound again")
    marker = tmp_path / "again"
    task_id, reports = asyncio.run(
        _submit_then_cancel(
            queues, "cancel-async", {"marker": str(marker)}, Path(f"{marker}.started").exists
        )
    )
    _assert_cancelled(reports, workers, task_id)
