"""Broker-side faults: a deleted output queue, forged headers. Nothing is lost."""

from __future__ import annotations

from typing import Any

import aio_pika

from async_task_api_worker.client import build_envelope
from tests.integration.conftest import Queues, rabbitmqctl
from tests.integration.test_run_on_rabbitmq import collect


async def publish_directly(
    queues: Queues, body: bytes, headers: dict[str, Any] | None = None
) -> None:
    """Publish to the input queue without declaring anything (a bare producer)."""
    connection = await aio_pika.connect(queues.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(
            aio_pika.Message(body, headers=headers or {}, delivery_mode=2),
            routing_key=queues.in_queue,
        )


async def test_a_deleted_output_queue_is_declared_again_and_no_task_is_lost(
    queues: Queues, start_worker: Any
) -> None:
    worker = start_worker("examples.count_words:worker", queues.env())
    rabbitmqctl("delete_queue", "-p", queues.vhost, queues.out_queue)
    task_id, body = build_envelope({"text": "after the delete"}, service="count-words")
    await publish_directly(queues, body)
    worker.wait_for_log("outcome=success action=ack")
    async with queues.client("count-words") as client:
        client.watch(task_id)
        reports = await collect(client, task_id)
    assert [r.type for r in reports] == ["started", "progress", "success"]
    assert "not confirmed by the broker" in worker.log()
    queues.assert_drained(queues.in_queue)


async def test_forged_delivery_count_headers_do_not_stall_the_worker(
    queues: Queues, start_worker: Any
) -> None:
    worker = start_worker("examples.count_words:worker", queues.env())
    task_ids = []
    for forged in ("\u00b2", "9" * 5000, "many"):
        task_id, body = build_envelope({"text": "forged"}, service="count-words")
        task_ids.append(task_id)
        await publish_directly(queues, body, {"x-delivery-count": forged})
    async with queues.client("count-words") as client:
        for task_id in task_ids:
            client.watch(task_id)
        for task_id in task_ids:
            assert (await collect(client, task_id))[-1].type == "success"
    assert "Consumer callback failed" not in worker.log()
    queues.assert_drained(queues.in_queue)
