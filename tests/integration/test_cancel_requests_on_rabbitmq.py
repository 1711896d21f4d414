"""Cancel requests on RabbitMQ (docs/protocol.md, "Cancelling a task"): the client's side.

A queue bound to ``<service>_control``, as a worker binds one, receives exactly the canonical
bytes and the AMQP properties of ``encode_cancel``, from ``TaskClient.cancel`` and from the
``cancel`` command; the exchange is a durable fanout one that a cancel may create.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from async_task_api_worker.client import TaskClient
from async_task_api_worker.errors import BrokerRefusedError
from async_task_api_worker.protocol import decode_cancel, encode_cancel
from tests.integration.conftest import Queues, rabbitmqctl
from tests.integration.test_cli_on_rabbitmq import cli


def control_exchange(queues: Queues) -> str:
    return f"{queues.name}_control"


def client(queues: Queues, **options: str) -> TaskClient:
    return TaskClient(
        url=queues.url,
        service=queues.name,
        in_queue=queues.in_queue,
        out_queue=queues.out_queue,
        **options,
    )


async def bound_queue(connection: aio_pika.abc.AbstractConnection, exchange: str) -> AbstractQueue:
    """A server-named exclusive queue bound to ``exchange``, as a worker binds.

    Not auto-delete, unlike a worker's: :func:`one_message` ends its consumer, and the queue
    must stay for what the test reads next (it goes with the test's connection).
    """
    channel = await connection.channel()
    # A passive declare: the exchange must already be there, made by a client or a worker.
    control = await channel.get_exchange(exchange)
    queue = await channel.declare_queue("", exclusive=True)
    await queue.bind(control)
    return queue


async def one_message(queue: AbstractQueue, timeout_s: float = 10.0) -> AbstractIncomingMessage:
    """The first message the broker pushes to ``queue``, acked (TimeoutError: none came).

    Any other it pushed meanwhile is given back to the queue when the consumer ends.
    """
    async with queue.iterator() as messages, asyncio.timeout(timeout_s):
        async for message in messages:
            await message.ack()
            return message
    raise AssertionError("the consumer ended without a message")


def assert_is_the_cancel(
    message: AbstractIncomingMessage, task_id: str, client_id: str, before: datetime
) -> None:
    """The message holds exactly ``encode_cancel``'s bytes and properties, made after ``before``."""
    request = decode_cancel(message.body)
    assert (request.task_id, request.client_id) == (task_id, client_id)
    assert before <= request.requested_at <= datetime.now(UTC)
    body, properties = encode_cancel(task_id, client_id, request.requested_at)
    assert message.body == body
    assert message.content_type == properties.content_type == "application/json"
    assert message.content_encoding == properties.content_encoding == "utf-8"
    assert message.delivery_mode == properties.delivery_mode == 1
    assert message.message_id == properties.message_id == f"{task_id}/cancel"
    assert message.correlation_id == properties.correlation_id == task_id
    assert message.type == properties.type == "cancel"
    assert message.app_id == properties.app_id == client_id
    assert message.timestamp is not None
    assert int(message.timestamp.timestamp()) == properties.timestamp_s
    assert not message.headers
    assert message.routing_key == ""


@pytest.fixture
async def connection(queues: Queues) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    opened = await aio_pika.connect(queues.url)
    async with opened:
        yield opened


def exchange_flags(queues: Queues, name: str) -> list[str]:
    output = rabbitmqctl(
        "list_exchanges", "-q", "-p", queues.vhost, "name", "type", "durable", "auto_delete"
    )
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0] == name:
            return parts[1:]
    raise LookupError(f"no exchange {name} in {queues.vhost}")


# ------------------------------------------------------------------------------ TaskClient


async def test_a_cancel_before_any_worker_makes_the_exchange_and_then_reaches_a_bound_queue(
    queues: Queues, connection: aio_pika.abc.AbstractConnection
) -> None:
    exchange = control_exchange(queues)
    async with client(queues, client_id="api-7") as task_client:
        assert task_client.control_exchange == exchange
        # No worker ever started: the exchange does not exist yet, and the cancel goes nowhere
        # without failing, and says so.
        assert await task_client.cancel("t-early") is False
        assert exchange_flags(queues, exchange) == ["fanout", "true", "false"]

        queue = await bound_queue(connection, exchange)
        before = datetime.now(UTC) - timedelta(seconds=1)
        assert await task_client.cancel("t-0001") is True
        assert_is_the_cancel(await one_message(queue), "t-0001", "api-7", before)
        # The early cancel was dropped by the broker, not held for a later queue. (A basic.get
        # answers at once, empty or not: the timeout is the loaded broker's time to answer.)
        assert await queue.get(fail=False, timeout=10) is None


async def test_every_bound_queue_receives_each_cancel(
    queues: Queues, connection: aio_pika.abc.AbstractConnection
) -> None:
    exchange = control_exchange(queues)
    async with client(queues) as task_client:
        await task_client.cancel("t-make-the-exchange")
        first = await bound_queue(connection, exchange)
        second = await bound_queue(connection, exchange)
        before = datetime.now(UTC) - timedelta(seconds=1)
        await task_client.cancel("T" + "x" * 126 + "9")
        for queue in (first, second):
            assert_is_the_cancel(await one_message(queue), "T" + "x" * 126 + "9", "cli", before)


async def test_a_cancel_only_client_declares_no_queue(queues: Queues) -> None:
    task_client = client(queues)
    await task_client.connect(reports=False)
    try:
        await task_client.cancel("t-1")
    finally:
        await task_client.close()
    listed = rabbitmqctl("list_queues", "-q", "-p", queues.vhost, "name")
    assert queues.in_queue not in listed.split()
    assert queues.out_queue not in listed.split()


async def test_an_exchange_of_another_type_is_a_refusal_and_the_client_still_submits(
    queues: Queues, connection: aio_pika.abc.AbstractConnection
) -> None:
    channel = await connection.channel()
    await channel.declare_exchange(control_exchange(queues), aio_pika.ExchangeType.DIRECT)
    async with client(queues) as task_client:
        with pytest.raises(BrokerRefusedError, match="another type or other flags"):
            await task_client.cancel("t-1")
        # The refused declare closed the publishing channel; it was reopened for the envelopes.
        await task_client.submit({"text": "still works"})
    queues.assert_counts(queues.in_queue, (1, 0))


def test_an_invalid_task_id_is_refused_before_anything_is_published(queues: Queues) -> None:
    async def cancel() -> None:
        async with client(queues) as task_client:
            await task_client.cancel("t 1")

    with pytest.raises(ValueError, match="task_id: string_pattern_mismatch"):
        asyncio.run(cancel())


# ------------------------------------------------------------------------------ the command


def test_the_cancel_command_publishes_the_canonical_request(queues: Queues) -> None:
    exchange = control_exchange(queues)

    async def bind_then_receive(ready: asyncio.Event) -> AbstractIncomingMessage:
        async with await aio_pika.connect(queues.url) as connection:
            channel = await connection.channel()
            # Declared with the flags every side uses, so the command's declare agrees.
            await channel.declare_exchange(exchange, aio_pika.ExchangeType.FANOUT, durable=True)
            queue = await bound_queue(connection, exchange)
            ready.set()
            return await one_message(queue, timeout_s=60)

    async def scenario() -> tuple[AbstractIncomingMessage, int, str, str]:
        ready = asyncio.Event()
        receiving = asyncio.ensure_future(bind_then_receive(ready))
        await ready.wait()
        env = queues.env(CONTROL_EXCHANGE_NAME=exchange)
        done = await asyncio.to_thread(
            cli, "cancel", "t-0001", "--service", queues.name, "--client-id", "ops", env=env
        )
        return await receiving, done.returncode, done.stdout, done.stderr

    before = datetime.now(UTC) - timedelta(seconds=1)
    message, code, stdout, stderr = asyncio.run(scenario())

    assert code == 0, stderr
    assert stdout == f"cancel requested for t-0001 (service {queues.name}, exchange {exchange})\n"
    assert_is_the_cancel(message, "t-0001", "ops", before)
    listed = rabbitmqctl("list_queues", "-q", "-p", queues.vhost, "name").split()
    assert queues.in_queue not in listed, "the command declares no queue"


def test_the_cancel_command_uses_the_default_exchange_name(queues: Queues) -> None:
    env = queues.env()
    env.pop("CONTROL_EXCHANGE_NAME", None)
    done = cli("cancel", "t-1", "--service", queues.name, env=env)
    assert done.returncode == 0, done.stderr
    assert exchange_flags(queues, f"{queues.name}_control") == ["fanout", "true", "false"]
    # Nothing was bound to the new exchange: the request reached nobody, and that is said.
    assert "warning: no worker is bound to" in done.stderr


def test_the_cancel_command_exits_2_when_the_broker_refuses_the_exchange(queues: Queues) -> None:
    async def make_a_direct_exchange() -> None:
        async with await aio_pika.connect(queues.url) as connection:
            channel = await connection.channel()
            await channel.declare_exchange(control_exchange(queues), aio_pika.ExchangeType.DIRECT)

    asyncio.run(make_a_direct_exchange())
    env = queues.env()
    env.pop("CONTROL_EXCHANGE_NAME", None)

    done = cli("cancel", "t-1", "--service", queues.name, env=env)

    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("async-task-api-worker: the exchange ")
    assert "another type or other flags" in line
    assert done.stdout == ""
