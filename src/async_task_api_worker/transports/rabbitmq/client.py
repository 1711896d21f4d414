"""The producer's side of the protocol on RabbitMQ: publish envelopes and cancels, read reports.

Used by :mod:`async_task_api_worker.client` (the ``submit`` command, the integration tests and
the benchmarks); the only other module, with ``transport``, that imports aio-pika.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Final

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
)

from async_task_api_worker.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    PublishError,
    TransportError,
)
from async_task_api_worker.protocol.reports import MessageProperties
from async_task_api_worker.settings import split_broker_urls
from async_task_api_worker.transports.rabbitmq.failures import (
    CHANNEL_GONE,
    is_refusal,
    publish_errors,
    refused,
    setup_error,
)
from async_task_api_worker.transports.rabbitmq.link import BrokerLink
from async_task_api_worker.transports.rabbitmq.topology import (
    declare_control_exchange,
    declare_queue,
)

__all__ = ["RabbitMQProducer", "ReportMessage", "start_consumer"]

_logger = logging.getLogger("async_task_api_worker.client")

#: How long a report of another task waits before it is given back: a consumer that gave it
#: back at once would receive it again at once, in a loop.
GIVE_BACK_DELAY_S: Final = 0.2
#: The longest a cancel request waits for its confirm, in seconds.
CANCEL_CONFIRM_S: Final = 10.0


class ReportMessage:
    """A report as consumed from the output queue; ``ack`` or ``give_back`` it once."""

    __slots__ = ("_message", "body", "correlation_id")

    def __init__(self, message: AbstractIncomingMessage) -> None:
        self._message = message
        self.body = message.body
        self.correlation_id = message.correlation_id

    async def ack(self) -> None:
        """Remove the report from the output queue (it is ours)."""
        with contextlib.suppress(Exception):  # a lost channel: the report comes back anyway
            await self._message.ack()

    def give_back(self) -> None:
        """Leave the report in the queue for its owner (``basic.nack`` with requeue), soon.

        Before RabbitMQ 4.3 this counts as a delivery of that report on a quorum queue
        (``x-delivery-count``); from 4.3 only its ``x-acquired-count`` moves.
        """
        task = asyncio.ensure_future(self._nack_later())
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)

    async def _nack_later(self) -> None:
        await asyncio.sleep(GIVE_BACK_DELAY_S)
        with contextlib.suppress(Exception):
            await self._message.nack(requeue=True)


_PENDING: set[asyncio.Future[None]] = set()


class RabbitMQProducer:
    """Publishes envelopes and cancel requests to a worker, and consumes its output queue.

    Envelopes go to the worker's input queue, cancel requests to its control exchange.

    Args:
        url: the AMQP URL, or several separated by commas (tried in turn); passwords are never
            logged.
        in_queue: the worker's input queue.
        out_queue: the worker's output queue.
        control_exchange: the worker's control exchange (:meth:`publish_cancel`).
        prefetch: the most reports held unacked at once.
        connect_timeout_s: give up connecting after this many seconds.
    """

    def __init__(
        self,
        *,
        url: str,
        in_queue: str,
        out_queue: str,
        control_exchange: str | None = None,
        prefetch: int = 100,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self._url = url
        self._in_queue = in_queue
        self._out_queue = out_queue
        self._control_exchange = control_exchange
        self._prefetch = prefetch
        self._connect_timeout_s = connect_timeout_s
        self._link: BrokerLink | None = None
        self._publish_channel: AbstractChannel | None = None
        self._consume_channel: AbstractRobustChannel | None = None
        self._reports: AbstractQueue | None = None
        self._control: AbstractExchange | None = None

    async def connect(self, *, queues: bool = True) -> None:
        """Connect and declare both queues (durable, no arguments, as the worker does).

        Args:
            queues: declare the queues; without them (a client that only cancels) only the
                publishing channel is opened, and :meth:`consume_reports` cannot be used.

        Raises:
            BrokerRefusedError: the broker refused the credentials, the vhost or a queue.
            BrokerUnavailableError: the broker was not reached in time.
            TransportError: the queues could not be declared.
        """
        link = BrokerLink(
            split_broker_urls(self._url),
            heartbeat_s=15,
            name="async-task-api-worker client",
            connect_timeout_s=self._connect_timeout_s,
        )
        connection = await link.open()
        self._link = link
        try:
            self._publish_channel = await connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            if not queues:
                return
            self._consume_channel = await connection.channel()
            await self._consume_channel.set_qos(prefetch_count=self._prefetch)
            await declare_queue(self._publish_channel, self._in_queue)
            # Consumed through the queue object declared on the robust channel: aio-pika
            # restores the consumers of such queues after a reconnect, not of others.
            self._reports = await declare_queue(self._consume_channel, self._out_queue)
        except Exception as exc:
            await self.close()
            raise setup_error(exc, link.url_for_logs) from exc

    @property
    def in_queue(self) -> str:
        """The worker's input queue, which :meth:`publish` publishes to."""
        return self._in_queue

    async def publish(
        self,
        body: bytes,
        *,
        message_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Publish ``body`` to the input queue (persistent, JSON) and wait for the confirm.

        ``headers`` become its AMQP headers (a trace context: ``traceparent``, ``tracestate``).

        Raises:
            PublishError: the broker did not confirm it.
        """
        with publish_errors("the task"):
            if self._publish_channel is None:
                raise ConnectionError("not connected")
            await self._publish_channel.default_exchange.publish(
                aio_pika.Message(
                    body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=message_id,
                    headers=dict(headers) if headers else None,
                ),
                routing_key=self._in_queue,
                mandatory=True,
            )

    async def publish_cancel(self, body: bytes, properties: MessageProperties) -> bool:
        """Publish a cancel request to the control exchange and wait for the confirm.

        The exchange is declared (fanout, durable) before the first request, so that a cancel
        may come before any worker started. ``mandatory``: a request that reaches no worker
        (none bound at that moment) comes back, which is not an error (docs/protocol.md,
        "Cancelling a task") but is said.

        Returns:
            Whether a worker's queue was bound to the exchange to receive it.

        Args:
            body: the request's bytes (``protocol.cancel.encode_cancel``).
            properties: its AMQP properties, from the same call.

        Raises:
            BrokerRefusedError: the broker refused the exchange: the user may not configure
                it, or it exists with another type or other flags.
            PublishError: the broker did not confirm the request, or the exchange could not be
                declared for another reason.
        """
        name = self._control_exchange
        if name is None:
            raise PublishError("the cancel request has no control exchange to go to")
        exchange = self._control or await self._declare_control(name)
        # Bounded: a broker that blocks publishers (a memory or disk alarm) would hold the
        # request for as long as the alarm lasts.
        try:
            with publish_errors("the cancel request"):
                return await asyncio.wait_for(
                    self._publish_cancel(exchange, body, properties), CANCEL_CONFIRM_S
                )
        except TimeoutError:
            raise PublishError(
                f"the cancel request was not confirmed within {CANCEL_CONFIRM_S:g} s (does the "
                f"broker block publishers: a memory or disk alarm?)"
            ) from None

    async def _publish_cancel(
        self, exchange: AbstractExchange, body: bytes, properties: MessageProperties
    ) -> bool:
        try:
            await self._publish_cancel_once(exchange, body, properties)
        except aiormq.exceptions.PublishError:  # returned: no queue is bound to the exchange
            return False
        return True

    async def _publish_cancel_once(
        self, exchange: AbstractExchange, body: bytes, properties: MessageProperties
    ) -> None:
        await exchange.publish(
            aio_pika.Message(
                body,
                content_type=properties.content_type,
                content_encoding=properties.content_encoding,
                delivery_mode=properties.delivery_mode,
                message_id=properties.message_id,
                correlation_id=properties.correlation_id,
                type=properties.type,
                timestamp=datetime.fromtimestamp(properties.timestamp_s, UTC),
                app_id=properties.app_id,
                headers=dict(properties.headers) if properties.headers else None,
            ),
            routing_key="",
            # Mandatory: a request no worker is bound for comes back, so that the caller can
            # say it reached nobody (a wrong service name, every worker away).
            mandatory=True,
        )

    async def _declare_control(self, name: str) -> AbstractExchange:
        channel = self._publish_channel
        if channel is None:
            raise PublishError("the cancel request was not confirmed: not connected")
        try:
            self._control = await declare_control_exchange(channel, name)
        except Exception as exc:
            # The failed declare closed the channel: reopen it for the envelopes.
            if channel.is_closed:
                with contextlib.suppress(Exception):
                    await channel.reopen()
            if is_refusal(exc):
                raise refused(exc, self._url_for_logs()) from exc
            if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
                raise BrokerRefusedError(
                    f"the exchange {name} exists with another type or other flags than a "
                    f"durable fanout exchange: {str(exc)[:300]}"
                ) from exc
            raise PublishError(
                f"could not declare the exchange {name}: {type(exc).__name__}"
            ) from exc
        return self._control

    def _url_for_logs(self) -> str:
        return self._link.url_for_logs if self._link is not None else "(not connected)"

    async def consume_reports(self, on_report: Callable[[ReportMessage], Awaitable[None]]) -> None:
        """Call ``on_report`` for each report on the output queue, until :meth:`close`.

        Raises:
            BrokerRefusedError: the broker refused the consumer.
            BrokerUnavailableError: the channel was not back in time.
        """
        queue, channel = self._reports, self._consume_channel
        if queue is None or channel is None:
            raise TransportError("connect() first")

        async def deliver(message: AbstractIncomingMessage) -> None:
            await on_report(ReportMessage(message))

        await start_consumer(
            queue, channel, deliver, timeout_s=self._connect_timeout_s, url=self._url_for_logs()
        )

    async def close(self) -> None:
        """Close the connection; idempotent."""
        link, self._link = self._link, None
        if link is not None:
            await link.close()


async def start_consumer(
    queue: AbstractQueue,
    channel: AbstractRobustChannel,
    callback: Callable[[AbstractIncomingMessage], Awaitable[None]],
    *,
    timeout_s: float,
    url: str,
) -> None:
    """``basic.consume`` on ``queue``; again once ``channel`` is back if it closed meanwhile.

    RabbitMQ closes the whole connection with ``INTERNAL_ERROR`` when a loaded quorum queue
    does not answer a ``basic.consume`` in time; aio-pika restores only consumers that
    started, so this one starts again on the restored channel.

    Args:
        queue: the queue to consume, declared on ``channel``.
        channel: the robust channel ``queue`` was declared on.
        callback: called with each message.
        timeout_s: the longest it keeps trying, in seconds.
        url: the broker's URL as logged (no password).

    Raises:
        BrokerRefusedError: the broker refused the consumer.
        BrokerUnavailableError: the consumer had not started after ``timeout_s``.
    """
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    await queue.consume(callback)
                    return
                except CHANNEL_GONE as exc:
                    if is_refusal(exc):
                        raise refused(exc, url) from exc
                    _logger.info(
                        "The report consumer did not start (%s); starting it again once the "
                        "channel is back",
                        type(exc).__name__,
                    )
                    await channel.ready()
    except TimeoutError as exc:
        raise BrokerUnavailableError(
            f"the report consumer did not start within {timeout_s:g} s ({url})"
        ) from exc
