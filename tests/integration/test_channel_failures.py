"""A channel the broker closes is reopened and consumed again; one that keeps closing ends it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import pytest

from async_task_api_worker.client import TaskClient
from async_task_api_worker.protocol.envelope import Envelope
from async_task_api_worker.runtime import ExitCode, Runner
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport
from async_task_api_worker.transports.rabbitmq.watch import MAX_CHANNEL_FAILURES
from examples.count_words import worker
from tests.integration.conftest import BROKER_USER, Queues, rabbitmqctl
from tests.integration.test_run_on_rabbitmq import collect
from tests.logs import attached
from tests.polling import until


def transport_for(queues: Queues) -> RabbitMQTransport:
    return RabbitMQTransport(
        urls=[queues.url], in_queue=queues.in_queue, out_queue=queues.out_queue, prefetch=1
    )


#: Every channel of the worker's consuming connection (named ``worker worker``: the service's
#: ``worker``) in the test's vhost acks a delivery tag it never had, as if its client had: the
#: broker closes it with ``PRECONDITION_FAILED - unknown delivery tag``, as it closes a channel
#: whose consumer timed out. RabbitMQ 3.10 has no outside command that closes one channel; the
#: cast is what the connection's reader sends its channel (``rabbit_channel:do/2`` on 3.10 and
#: 4.0, gone from 4.3). A channel of another test that ends while the list is walked answers
#: ``noproc``: ``catch`` leaves it out.
CLOSE_CONSUME_CHANNEL = """
[gen_server2:cast(P, {method, {'basic.ack', 999999, false}, none, noflow})
 || P <- rabbit_channel:list(),
    [{vhost, V}, {connection, C}] <- [catch rabbit_channel:info(P, [vhost, connection])],
    V =:= <<"%(vhost)s">>,
    [{client_properties, Props}] <- [catch rabbit_reader:info(C, [client_properties])],
    {_, longstr, <<"worker worker">>} <- [lists:keyfind(<<"connection_name">>, 1, Props)]].
"""


async def succeeds(client: TaskClient, text: str) -> None:
    """Submit a task and wait for its terminal report, a success."""
    task_id = await client.submit({"text": text})
    assert (await collect(client, task_id))[-1].type == "success"


async def close_consume_channel(queues: Queues) -> None:
    """Make the broker close the worker's consume channel, as a consumer timeout would."""
    closed = await asyncio.to_thread(
        rabbitmqctl, "eval", CLOSE_CONSUME_CHANNEL % {"vhost": queues.vhost}
    )
    assert closed.strip() == "[ok]", closed  # one channel: the consume channel


async def test_a_closed_channel_is_reopened_and_the_consumer_restored(
    queues: Queues, caplog: pytest.LogCaptureFixture
) -> None:
    transport = transport_for(queues)
    runner = Runner(worker, load_settings({}, read_environment=False), transport)
    serving = asyncio.create_task(runner.serve())
    # Consuming before the client comes: a loaded node's quorum queue, declared by both at
    # once, can close the client's connection with INTERNAL_ERROR.
    await until(lambda: transport.consuming, 30, "the consumer to start")
    async with queues.client("count-words") as client:
        await succeeds(client, "before")
        await close_consume_channel(queues)
        await succeeds(client, "after the channel closed")
    runner.request_shutdown("test")
    assert await serving is ExitCode.OK
    assert any("The consume channel closed" in r.getMessage() for r in caplog.records)


class _Said(logging.Handler):
    """Counts the transport's lines that contain ``text``, and wakes a waiter on each."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.count = 0
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.count += 1
            self.changed.set()

    async def reach(self, count: int) -> None:
        while self.count < count:
            self.changed.clear()
            await self.changed.wait()


@contextlib.contextmanager
def transport_says(text: str) -> Iterator[_Said]:
    """Count the RabbitMQ transport's lines (its INFO ones too) that contain ``text``, in this
    process: a worker serving in the test's loop says ``Connected to`` once its queues are
    declared."""
    said = _Said(text)
    transport_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")
    with attached(transport_logger, said, logging.INFO):
        yield said


async def test_a_channel_that_keeps_closing_stops_the_worker_with_failure(queues: Queues) -> None:
    # Each close waits for the reopen before the next, on the transport's own lines: a slow
    # machine only makes it slower (the window, 60 s, is far from five reopens).
    with (
        transport_says("The consume channel reopened") as reopened,
        transport_says("The consume channel closed") as closed,
    ):
        transport = transport_for(queues)
        runner = Runner(worker, load_settings({}, read_environment=False), transport)
        serving = asyncio.create_task(runner.serve())
        # The consumer started (a close before is another test).
        await until(lambda: transport.consuming, 30, "the consumer to start")
        for closes in range(1, MAX_CHANNEL_FAILURES + 1):
            await close_consume_channel(queues)
            await asyncio.wait_for(closed.reach(closes), timeout=30)
            if closes < MAX_CHANNEL_FAILURES:
                await asyncio.wait_for(reopened.reach(closes), timeout=30)
        assert await asyncio.wait_for(serving, timeout=30) is ExitCode.FAILURE


async def test_a_channel_closed_while_the_consumer_starts_is_consumed_again(
    queues: Queues,
) -> None:
    # The broker closes the channel while basic.consume is on its way: aio-pika restores only a
    # consumer that started, so the transport starts it again on the reopened channel.
    transport = transport_for(queues)
    await transport.connect()
    try:
        deliveries = transport.deliveries()
        first = asyncio.ensure_future(anext(deliveries))
        await close_consume_channel(queues)  # before the consumer's task has even run
        async with queues.client("count-words") as client:
            task_id = await client.submit({"text": "after the close"})
            delivery = await asyncio.wait_for(first, timeout=30)
        assert isinstance(delivery.envelope, Envelope) and delivery.envelope.task_id == task_id
        assert transport.consuming
        await delivery.ack()
    finally:
        await transport.stop_consuming()
        await transport.close()


async def test_a_channel_the_broker_will_not_restore_ends_the_worker_not_idles_it(
    queues: Queues,
) -> None:
    # The consume permission is gone when the channel reopens: aio-pika's restore is refused
    # and it gives up, the connection alive. The transport must not sit idle for ever.
    transport = RabbitMQTransport(
        urls=[queues.url],
        in_queue=queues.in_queue,
        out_queue=queues.out_queue,
        prefetch=1,
        reopen_timeout_s=2.0,
    )
    runner = Runner(worker, load_settings({}, read_environment=False), transport)
    serving = asyncio.create_task(runner.serve())
    try:
        await until(lambda: transport.consuming, 30, "the consumer to start")
        rabbitmqctl("set_permissions", "-p", queues.vhost, BROKER_USER, ".*", ".*", "^$")
        await close_consume_channel(queues)
        assert await asyncio.wait_for(serving, timeout=30) is ExitCode.FAILURE
    finally:
        rabbitmqctl("set_permissions", "-p", queues.vhost, BROKER_USER, ".*", ".*", ".*")
        if not serving.done():
            runner.request_shutdown("test")
            await serving


async def test_a_consumer_the_broker_cancels_is_started_again_with_a_new_tag(
    queues: Queues,
) -> None:
    # Deleting the queue makes any RabbitMQ cancel the consumer (basic.cancel); 4.3 does the
    # same at a consumer timeout, and refuses the old tag again (530, the connection closed).
    with transport_says("The broker cancelled the consumer of") as cancelled:
        transport = transport_for(queues)
        runner = Runner(worker, load_settings({}, read_environment=False), transport)
        serving = asyncio.create_task(runner.serve())
        # Consuming before the client comes: a loaded node's quorum queue, declared by both at
        # once, closed the client's connection with INTERNAL_ERROR once (CI, 3.10).
        await until(lambda: transport.consuming, what="the consumer started")
        async with queues.client("count-words") as client:
            await succeeds(client, "before")
            await asyncio.to_thread(
                rabbitmqctl, "delete_queue", "-p", queues.vhost, queues.in_queue
            )
            await cancelled.reach(1)
            # Consuming again finds no queue (404): the reopened channel declares it again.
            await until(lambda: transport.consuming, what="the consumer started again")
            await succeeds(client, "after the consumer was cancelled")
        runner.request_shutdown("test")
        assert await serving is ExitCode.OK
        assert cancelled.count == 1
        exposition = runner.metrics.exposition()[0].decode()
        assert 'worker_consumer_cancels_total{cause="other"} 1.0' in exposition
        assert 'worker_consumer_cancels_total{cause="consumer_timeout"} 0.0' in exposition
