"""The worker as a real process on the machine's RabbitMQ, driven by the client API."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.client import AnyReport, TaskClient
from async_task_api_worker.protocol import FailureReport, SuccessReport
from tests.integration.conftest import Queues, rabbitmqctl, wait_for
from tests.polling import until


async def collect(client: TaskClient, task_id: str, timeout_s: float = 60.0) -> list[AnyReport]:
    async def gather() -> list[AnyReport]:
        return [report async for report in client.reports(task_id)]

    return await asyncio.wait_for(gather(), timeout=timeout_s)


def reading(client: TaskClient, task_id: str) -> tuple[list[AnyReport], asyncio.Task[None]]:
    """The reports of ``task_id`` so far (a list that grows as they arrive), and the task that
    reads them until the terminal one: for a test that must see one before it goes on."""
    seen: list[AnyReport] = []

    async def read() -> None:
        async for report in client.reports(task_id):
            seen.append(report)

    return seen, asyncio.ensure_future(read())


def started(reports: list[AnyReport]) -> list[int]:
    """The attempts of the ``started`` reports among ``reports``."""
    return [r.attempt for r in reports if r.type == "started"]


def calls(markers: Path, task_id: str) -> list[int]:
    """The attempts the handler was called with for ``task_id``, in order."""
    return sorted(int(path.name.split(".")[1]) for path in markers.glob(f"{task_id}.*"))


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
async def test_run_processes_submitted_tasks_in_order(
    queues: Queues, start_worker: Any, event_loop: str
) -> None:
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    worker = start_worker("examples.count_words:worker", queues.env(WORKER_EVENT_LOOP=event_loop))
    assert f"Event loop: {event_loop} " in worker.log()
    async with queues.client("count-words") as client:
        task_id = await client.submit({"text": "hello big world"})
        reports = await collect(client, task_id)
    assert [r.type for r in reports] == ["started", "progress", "success"]
    assert isinstance(reports[-1], SuccessReport)
    assert reports[-1].response == {"words": 3}
    assert {r.task_id for r in reports} == {task_id}
    queues.assert_drained(queues.in_queue)


async def test_a_fatal_error_is_one_failure_and_the_input_is_acked(
    queues: Queues, start_worker: Any
) -> None:
    start_worker("examples.count_words:worker", queues.env())
    async with queues.client("count-words") as client:
        task_id = await client.submit({"text": "   "})
        reports = await collect(client, task_id)
    assert [r.type for r in reports] == ["started", "failure"]
    assert isinstance(reports[-1], FailureReport)
    assert reports[-1].error.code == "EMPTY_TEXT"
    queues.assert_drained(queues.in_queue)


async def test_a_retryable_error_is_redelivered_until_the_limit_then_concluded(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        "tests.integration.workers:retrying", queues.env(ATW_TEST_MARKERS=str(markers))
    )
    async with queues.client("retrying") as client:
        task_id = await client.submit({})
        reports = await collect(client, task_id)
    started = [r.attempt for r in reports if r.type == "started"]
    assert started == [1, 2, 3, 4, 5]  # attempt = x-delivery-count + 1, rising with each reject
    assert calls(markers, task_id) == [1, 2, 3, 4, 5]
    assert isinstance(reports[-1], FailureReport)
    assert (reports[-1].error.code, reports[-1].attempt) == ("UPSTREAM_DOWN", 5)
    # The last decision line follows the settle, after the report the client already has.
    worker.wait_for_log("outcome=failure action=conclude code=UPSTREAM_DOWN attempt=5/5")
    log = worker.log()
    for attempt in range(1, 5):
        assert f"outcome=retry action=nack-requeue code=UPSTREAM_DOWN attempt={attempt}/5" in log
    queues.assert_drained(queues.in_queue)


async def test_a_crash_loop_is_abandoned_without_running_the_handler(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    env = queues.env(ATW_TEST_MARKERS=str(markers))
    async with queues.client("hanging") as client:
        task_id = await client.submit({})
        seen, read = reading(client, task_id)
        for run in range(1, 6):
            worker = start_worker("tests.integration.workers:hanging", env)
            # The call and its ``started`` report: that report is published beside the handler,
            # so a kill right after the call began (a loaded machine) could come before it left.
            await until(
                lambda run=run: len(calls(markers, task_id)) == run and len(started(seen)) == run,
                what=f"call {run} and its started report",
            )
            worker.signal(signal.SIGKILL)
            worker.wait()
        final = start_worker("tests.integration.workers:hanging", env)
        await asyncio.wait_for(read, timeout=60)
    reports = seen
    assert calls(markers, task_id) == [1, 2, 3, 4, 5]  # not called a sixth time
    assert started(reports) == [1, 2, 3, 4, 5]
    assert isinstance(reports[-1], FailureReport)
    assert reports[-1].error.code == "TASK_ABANDONED_AFTER_REDELIVERIES"
    assert reports[-1].attempt == 6
    # The decision line follows the settle, after the report the client already has.
    final.wait_for_log("code=TASK_ABANDONED_AFTER_REDELIVERIES attempt=6/5")
    queues.assert_drained(queues.in_queue)


async def test_poison_bodies_are_settled_once_and_the_worker_keeps_serving(
    queues: Queues, start_worker: Any
) -> None:
    worker = start_worker("examples.count_words:worker", queues.env())
    bodies = {
        "invalid_utf8": b"\xff\xfe\xfd",
        "truncated": b'{"protocol_version": 1, "task_id": "x',
        "array": b"[1, 2, 3]",
        "no_task_id": b'{"protocol_version": 1, "client_id": "c", "service": "count-words"}',
    }
    async with queues.client("count-words") as client:
        for body in bodies.values():
            await client.publish_raw(body)
        client.watch("poison-1")
        await client.publish_raw(
            b'{"protocol_version": 1, "task_id": "poison-1", "client_id": "c",'
            b' "service": "count-words", "input": "not an object"}'
        )
        poison_reports = await collect(client, "poison-1")
        good = await client.submit({"text": "still here"})
        good_reports = await collect(client, good)
    assert [r.type for r in poison_reports] == ["failure"]
    assert isinstance(poison_reports[0], FailureReport)
    assert poison_reports[0].error.code == "POISON_MESSAGE"
    assert isinstance(good_reports[-1], SuccessReport)
    log = worker.log()
    assert log.count("outcome=poison action=reject") == 4
    assert log.count("outcome=poison action=conclude code=POISON_MESSAGE") == 1
    assert worker.process.poll() is None  # the same process served it all
    queues.assert_drained(queues.in_queue)


async def test_a_forced_disconnect_redelivers_the_task_and_it_succeeds_once(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        "tests.integration.workers:sleeping", queues.env(ATW_TEST_MARKERS=str(markers))
    )
    async with queues.client("sleeping") as client:
        task_id = await client.submit({"seconds": 3600})
        wait_for(lambda: calls(markers, task_id) == [1], what="the first call")
        rabbitmqctl("close_all_connections", "-p", queues.vhost, "integration test")
        reports = await collect(client, task_id)
    assert calls(markers, task_id) == [1, 2]
    terminal = [r for r in reports if r.type in ("success", "failure")]
    assert len(terminal) == 1
    assert isinstance(terminal[0], SuccessReport)
    assert terminal[0].response == {"attempt": 2}
    log = worker.log()
    assert "outcome=cancelled action=none" in log  # the first attempt: never acked on a new channel
    assert "PRECONDITION_FAILED" not in log  # no stale delivery tag was used
    assert worker.process.poll() is None
    queues.assert_drained(queues.in_queue)


async def test_a_factory_target_runs(queues: Queues, start_worker: Any, markers: Path) -> None:
    start_worker("tests.integration.workers:factory", queues.env(ATW_TEST_MARKERS=str(markers)))
    async with queues.client("sleeping") as client:
        task_id = await client.submit({})
        reports = await collect(client, task_id)
    assert reports[-1].type == "success"
