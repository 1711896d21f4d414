"""The operator's side on RabbitMQ: ask a service's workers what they run, purge, read reports.

Used by the ``inspect``, ``purge`` and ``reports`` commands (docs/commands.md). Queues are only
ever declared passively here: a misspelt service name finds no queue, and creates none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from async_task_api_worker.errors import BrokerRefusedError, TransportError
from async_task_api_worker.protocol.inspect import INSPECT_TYPE, REPLY_TO
from async_task_api_worker.settings import split_broker_urls
from async_task_api_worker.transports.rabbitmq.failures import is_refusal, refused
from async_task_api_worker.transports.rabbitmq.link import BrokerLink
from async_task_api_worker.transports.rabbitmq.topology import declare_control_exchange

__all__ = ["CLOSE_S", "Operator", "QueueState"]

#: The longest closing the connection may take, in seconds: part of ``inspect``'s bound.
CLOSE_S: Final = 1.0
#: The most reports held unacknowledged at once by ``reports --follow``.
_PREFETCH: Final = 100


class QueueState:
    """A queue as a passive declare saw it: its messages ready, and its consumers."""

    __slots__ = ("consumers", "messages", "queue")

    def __init__(self, queue: AbstractQueue, messages: int, consumers: int) -> None:
        self.queue = queue
        self.messages = messages
        self.consumers = consumers


class Operator:
    """One connection to a service's broker, for the operator's commands.

    Args:
        url: the AMQP URL, or several separated by commas (tried in turn).
        connect_timeout_s: give up connecting after this many seconds.
    """

    def __init__(self, url: str, *, connect_timeout_s: float) -> None:
        self._link = BrokerLink(
            split_broker_urls(url),
            heartbeat_s=15,
            name="async-task-api-worker operator",
            connect_timeout_s=connect_timeout_s,
        )
        self._channel: AbstractChannel | None = None

    async def connect(self) -> None:
        """Connect and open a channel.

        Raises:
            BrokerRefusedError: the broker refused the credentials or the vhost.
            BrokerUnavailableError: the broker was not reached in time.
        """
        connection = await self._link.open()
        self._channel = await connection.channel()

    async def close(self) -> None:
        """Close the connection, within :data:`CLOSE_S`; reports not acked go back."""
        with contextlib.suppress(Exception, TimeoutError):
            await asyncio.wait_for(self._link.close(), CLOSE_S)

    def _open(self) -> AbstractChannel:
        if self._channel is None:
            raise TransportError("connect() first")
        return self._channel

    async def queue(self, name: str) -> QueueState:
        """Find the queue ``name`` (a passive declare: it is not created).

        Raises:
            TransportError: there is no such queue in the vhost.
            BrokerRefusedError: the user may not access it.
        """
        channel = self._open()
        try:
            queue = await channel.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise TransportError(
                f"there is no queue {name} on {self._link.url_for_logs} (a wrong --service or "
                f"vhost, or no worker of that service ever started)"
            ) from None
        except Exception as exc:
            if is_refusal(exc):
                raise refused(exc, self._link.url_for_logs) from exc
            raise TransportError(f"could not find the queue {name}: {type(exc).__name__}") from exc
        result = queue.declaration_result
        return QueueState(queue, result.message_count or 0, result.consumer_count or 0)

    async def ask(
        self,
        exchange: str,
        body: bytes,
        *,
        request_id: str,
        client_id: str,
        until: float,
        on_reply: Callable[[bytes], object],
    ) -> None:
        """Publish an inspect request to ``exchange``; hand each reply to ``on_reply`` until then.

        The replies come by RabbitMQ's direct reply-to (no queue of ours); the request expires
        in the workers' queues at ``until`` (``loop.time()``), so that a worker frozen now never
        answers it later.

        Raises:
            BrokerRefusedError: the broker refused the exchange.
            TransportError: the request could not be published.
        """
        channel = self._open()

        async def reply(message: AbstractIncomingMessage) -> None:
            if message.correlation_id == request_id:
                on_reply(message.body)

        loop = asyncio.get_running_loop()
        try:
            replies = await channel.get_queue(REPLY_TO, ensure=False)
            await replies.consume(reply, no_ack=True)
            fanout = await declare_control_exchange(channel, exchange)
            now = datetime.now(UTC)
            await fanout.publish(
                aio_pika.Message(
                    body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT,
                    message_id=f"{request_id}/{INSPECT_TYPE}",
                    correlation_id=request_id,
                    type=INSPECT_TYPE,
                    reply_to=REPLY_TO,
                    timestamp=now,
                    app_id=client_id,
                    expiration=max(0.001, until - loop.time()),
                ),
                routing_key="",
            )
        except Exception as exc:
            if is_refusal(exc) or isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
                raise BrokerRefusedError(f"the exchange {exchange} was refused: {exc}") from exc
            raise TransportError(
                f"could not publish the inspect request: {type(exc).__name__}"
            ) from exc
        await asyncio.sleep(max(0.0, until - loop.time()))  # the workers' time to answer

    async def purge(self, queue: QueueState) -> int:
        """Delete every message ready in ``queue``; how many went.

        Raises:
            TransportError: the broker did not purge it.
        """
        try:
            ok = await queue.queue.purge()
        except Exception as exc:
            if is_refusal(exc):
                raise refused(exc, self._link.url_for_logs) from exc
            raise TransportError(f"could not purge the queue: {type(exc).__name__}") from exc
        return int(getattr(ok, "message_count", 0) or 0)

    async def read(
        self,
        queue: QueueState,
        write: Callable[[bytes], bool],
        *,
        follow: bool,
        stopped: asyncio.Event,
    ) -> None:
        """Hand ``queue``'s messages to ``write``; ack each one it wrote (it returns ``True``).

        A message ``write`` did not write stays unacked, and goes back to the queue when the
        connection closes. Without ``follow`` it reads the messages ready at the passive
        declare, then returns; with it, until ``stopped`` is set.
        """
        channel = self._open()

        async def one(message: AbstractIncomingMessage) -> None:
            if write(message.body):  # written (and flushed) first: a crash here loses nothing
                await message.ack()

        if not follow:
            for _ in range(queue.messages):
                message = await queue.queue.get(no_ack=False, fail=False)
                if message is None or stopped.is_set():
                    return
                await one(message)
            return
        await channel.set_qos(prefetch_count=_PREFETCH)
        await queue.queue.consume(one)
        await stopped.wait()
