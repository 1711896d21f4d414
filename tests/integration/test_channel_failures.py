"""A channel the broker closes is reopened and consumed again; one that keeps closing ends it."""

from __future__ import annotations

import asyncio

import pytest

from async_task_api_worker.runtime import ExitCode, Runner
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport
from async_task_api_worker.transports.rabbitmq.transport import MAX_CHANNEL_FAILURES
from examples.count_words import worker
from tests.integration.conftest import Queues
from tests.integration.test_run_on_rabbitmq import collect


def transport_for(queues: Queues) -> RabbitMQTransport:
    return RabbitMQTransport(
        urls=[queues.url], in_queue=queues.in_queue, out_queue=queues.out_queue, prefetch=1
    )


async def close_consume_channel(transport: RabbitMQTransport) -> None:
    """Make the broker close the consume channel, as a consumer timeout would
    (here: ``PRECONDITION_FAILED - unknown delivery tag``)."""
    channel = transport._consume_channel
    assert channel is not None
    await channel.ready()  # type: ignore[attr-defined]
    raw = await channel.get_underlay_channel()
    await raw.basic_ack(999_999)


async def test_a_closed_channel_is_reopened_and_the_consumer_restored(
    queues: Queues, caplog: pytest.LogCaptureFixture
) -> None:
    transport = transport_for(queues)
    runner = Runner(worker, load_settings({}, read_environment=False), transport)
    serving = asyncio.create_task(runner.serve())
    async with queues.client("count-words") as client:
        first = await client.submit({"text": "before"})
        assert (await collect(client, first))[-1].type == "success"
        await close_consume_channel(transport)
        second = await client.submit({"text": "after the channel closed"})
        assert (await collect(client, second))[-1].type == "success"
    runner.request_shutdown("test")
    assert await serving is ExitCode.OK
    assert any("The consume channel closed" in r.getMessage() for r in caplog.records)


async def test_a_channel_that_keeps_closing_stops_the_worker_with_failure(queues: Queues) -> None:
    transport = transport_for(queues)
    runner = Runner(worker, load_settings({}, read_environment=False), transport)
    serving = asyncio.create_task(runner.serve())
    while not transport.connected or transport._consume_channel is None:
        await asyncio.sleep(0.01)
    for closes in range(1, MAX_CHANNEL_FAILURES + 1):
        await close_consume_channel(transport)
        while len(transport._channel_failures) < closes:  # the broker's close has landed
            await asyncio.sleep(0.01)
    assert await asyncio.wait_for(serving, timeout=30) is ExitCode.FAILURE
