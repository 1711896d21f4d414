"""Reports keep their order on RabbitMQ without a task each: ``placed`` comes before the confirm.

``Transport.send`` publishes and waits for the confirm in the caller's task, and says when the
report holds its place on the channel; a report sent once the previous one is placed lands
behind it, whatever the confirms do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika

from async_task_api_worker.protocol.reports import (
    StartedReport,
    SuccessReport,
    decode_report,
    encode_report,
)
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport
from tests.integration.conftest import Queues

TASKS = 50


def _fields(task_id: str) -> dict[str, Any]:
    return {
        "protocol_version": 1,
        "task_id": task_id,
        "client_id": "c",
        "service": "svc",
        "attempt": 1,
        "timestamp": "2026-12-04T00:00:00.000000Z",
    }


async def test_a_report_sent_once_the_previous_is_placed_lands_behind_it(queues: Queues) -> None:
    transport = RabbitMQTransport(
        urls=[queues.url], in_queue=queues.in_queue, out_queue=queues.out_queue, prefetch=1
    )
    await transport.connect()
    delivery = transport.report_only()
    loop = asyncio.get_running_loop()
    placed_after_confirm: list[str] = []

    async def started_then_success(task_id: str) -> None:
        placed = loop.create_future()
        started = encode_report(StartedReport.model_construct(**_fields(task_id)), seq=0)
        holding = asyncio.ensure_future(
            delivery.report(started, placed=lambda: placed.set_result(None))
        )

        def said_late(_: object) -> None:
            if holding.done():
                placed_after_confirm.append(task_id)

        placed.add_done_callback(said_late)
        await placed
        success = encode_report(
            SuccessReport.model_construct(**_fields(task_id), response={}), seq=1
        )
        await delivery.report(success)
        await holding

    try:
        await asyncio.gather(*(started_then_success(f"t-{n}") for n in range(TASKS)))
    finally:
        await transport.close()
    assert placed_after_confirm == []
    seen: dict[str, list[str]] = {}
    connection = await aio_pika.connect(queues.url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(queues.out_queue, durable=True)
        while sum(len(types) for types in seen.values()) < 2 * TASKS:
            message = await queue.get(timeout=10)
            assert message is not None
            report = decode_report(message.body)
            seen.setdefault(report.task_id, []).append(report.type)
            await message.ack()
    assert all(types == ["started", "success"] for types in seen.values()), seen
    assert len(seen) == TASKS
