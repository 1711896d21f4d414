"""Settles batched on a real broker: acks, rejects and nacks interleaved at concurrency 16.

A ``basic.ack(multiple=True)`` that covered a delivery still running, or one given back, would
either settle it unreported (its task lost) or make the broker close the channel
(``PRECONDITION_FAILED - unknown delivery tag``), and every delivery in flight would be run
again. Here every task ends once, as its input says, each handler runs as often as its outcome
calls for, and the consume channel never closes.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import aio_pika

from async_task_api_worker.client import build_envelope
from tests.integration.conftest import Queues

OUTCOMES = {"ok": 30, "fail": 15, "retry": 10}
LIMIT = 5  # WORKER_DELIVERY_LIMIT's default


async def publish(url: str, queue: str, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        for body in bodies:
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, routing_key=queue)


async def terminal_reports(url: str, queue: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` terminal reports on ``queue``, then every other one within 2 s."""
    connection = await aio_pika.connect(url)
    found: list[dict[str, Any]] = []
    async with connection:
        channel = await connection.channel()
        out = await channel.declare_queue(queue, durable=True)
        async with out.iterator() as messages:
            try:
                while True:
                    timeout_s = 120.0 if len(found) < count else 2.0
                    message = await asyncio.wait_for(messages.__anext__(), timeout=timeout_s)
                    await message.ack()
                    report = json.loads(message.body)
                    if report["type"] in ("success", "failure"):
                        found.append(report)
            except TimeoutError:
                pass
    return found


async def test_interleaved_acks_rejects_and_nacks_settle_each_task_once(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    tasks = {
        f"{outcome}-{number}": outcome
        for outcome, count in OUTCOMES.items()
        for number in range(count)
    }
    bodies = [
        build_envelope({"outcome": outcome}, service="mixed", task_id=task_id, client_id="c")[1]
        for task_id, outcome in tasks.items()
    ]
    bodies[10:10] = [b"not json"] * 5  # poison without a task id: rejected, not requeued
    await publish(queues.url, queues.in_queue, bodies)
    worker = start_worker(
        "tests.integration.workers:mixed",
        queues.env(WORKER_CONCURRENCY="16", ATW_TEST_MARKERS=str(markers)),
    )
    reports = await terminal_reports(queues.url, queues.out_queue, len(tasks))

    assert Counter(report["task_id"] for report in reports) == dict.fromkeys(tasks, 1)
    for report in reports:
        outcome = tasks[report["task_id"]]
        if outcome == "ok":
            assert report["type"] == "success"
        else:
            assert report["type"] == "failure"
            code = "BAD_INPUT" if outcome == "fail" else "UPSTREAM_DOWN"
            assert report["error"]["code"] == code
    runs = Counter(path.name.split(".")[0] for path in markers.iterdir())
    assert runs == {task_id: LIMIT if o == "retry" else 1 for task_id, o in tasks.items()}
    queues.assert_drained(queues.in_queue)
    assert "consume channel closed" not in worker.log()
