"""The RabbitMQ transport: consume deliveries (``delivery``: their reports and settles).

This package is the only place that imports aio-pika; every exception it raises is translated
into the SDK's own in ``failures``.

When a channel closes (connection loss, consumer timeout, a precondition failure) the broker
requeues its unacked deliveries itself. Their handlers are cancelled, since another attempt is
already on its way, and they are never acked or nacked on the reopened channel (their delivery
tags belong to the dead one). aio-pika's robust channel reopens, and the consumer starts again
on it with a new tag (``consumer``), as after the broker cancelled it; if the consume channel
closes again and again, the transport gives up.

From RabbitMQ 4.3 the worker asks for its own consumer timeout on a quorum queue
(``x-consumer-timeout``: ``broker_rules.consumer_timeout_s``); before, the time budget must
fit under the broker's, and :meth:`RabbitMQTransport.connect` raises the budget's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import aiormq
from aio_pika.abc import AbstractRobustChannel
from aiormq.abc import DeliveredMessage

from async_task_api_worker.broker_rules import since_rabbitmq_4_3
from async_task_api_worker.errors import BrokerRefusedError, TimeBudgetError, TransportError
from async_task_api_worker.ports import CancelCause, ConsumerCancelled, Delivery, Observer
from async_task_api_worker.protocol.envelope import DEFAULT_MAX_BODY_BYTES, read_envelope
from async_task_api_worker.transports.rabbitmq.acks import ChannelSettles, Settle
from async_task_api_worker.transports.rabbitmq.consumer import Consumer
from async_task_api_worker.transports.rabbitmq.control import Control, listen_for_cancels
from async_task_api_worker.transports.rabbitmq.delivery import (
    RabbitDelivery,
    acquired_count_of,
    delivery_count_of,
)
from async_task_api_worker.transports.rabbitmq.failures import setup_error
from async_task_api_worker.transports.rabbitmq.link import BrokerLink
from async_task_api_worker.transports.rabbitmq.reports import ReportPublisher
from async_task_api_worker.transports.rabbitmq.topology import declare_queue, queue_type
from async_task_api_worker.transports.rabbitmq.watch import REOPEN_TIMEOUT_S, ChannelWatch, GaveUp

__all__ = ["RabbitMQTransport"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")


class RabbitMQTransport:
    """A :class:`~async_task_api_worker.ports.Transport` on RabbitMQ.

    Two connections: one consumes and settles, the other publishes the reports. RabbitMQ blocks
    a connection that publishes during a memory or disk alarm, and stops reading its socket,
    acks included; on a connection of their own, the reports can be held while the deliveries
    are still settled, and the consumer is never blocked.

    Args:
        urls: the AMQP URLs (``BROKER_URL``, split at its commas), tried in turn; their
            passwords are never logged.
        in_queue: the queue tasks are consumed from (``IN_QUEUE_NAME``).
        out_queue: the queue reports are published to (``OUT_QUEUE_NAME``).
        prefetch: the most unacked deliveries held at once (``WORKER_CONCURRENCY``).
        service: the worker's name, shown as the connections' names in the broker.
        heartbeat_s: the AMQP heartbeat to ask for (``BROKER_HEARTBEAT_S``), in seconds.
        connect_timeout_s: give up connecting after this many seconds (``None``: keep trying,
            with a backoff capped at 30 s).
        reconnect_interval_s: aio-pika's wait between reconnection attempts, in seconds.
        reopen_timeout_s: how long a consume channel the broker closed may take to reopen
            before the transport gives up (:data:`REOPEN_TIMEOUT_S`).
        control_exchange: the exchange cancel requests come on (``CONTROL_EXCHANGE_NAME``).
        max_body_bytes: the largest body accepted (``WORKER_MAX_MESSAGE_BYTES``); a larger one
            is a poison message.
        consumer_timeout_s: the consumer timeout asked for where the broker takes one
            (``broker_rules.consumer_timeout_s``), in seconds; ``None``: never asked.
        time_budget_error: raised by :meth:`connect` on a broker that takes none, when the time
            budget does not fit under its own (``broker_rules.check_time_budget``).
    """

    def __init__(
        self,
        *,
        urls: Sequence[str],
        in_queue: str,
        out_queue: str,
        prefetch: int,
        service: str = "worker",
        heartbeat_s: int = 15,
        connect_timeout_s: float | None = None,
        reconnect_interval_s: float = 1.0,
        reopen_timeout_s: float = REOPEN_TIMEOUT_S,
        control_exchange: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        consumer_timeout_s: float | None = None,
        time_budget_error: TimeBudgetError | None = None,
    ) -> None:
        self._consumer_timeout_s = consumer_timeout_s
        self._time_budget_error = time_budget_error
        self._observers: list[Observer] = []
        self._max_body_bytes = max_body_bytes
        self._control_exchange = control_exchange
        self._control = Control(consumer_tag=lambda: self._tasks_consumer.tag)
        self._in_queue_name = in_queue
        self._out_queue_name = out_queue
        self._prefetch = prefetch
        self._service = service

        def link(name: str) -> BrokerLink:
            return BrokerLink(
                urls,
                name=name,
                heartbeat_s=heartbeat_s,
                connect_timeout_s=connect_timeout_s,
                reconnect_interval_s=reconnect_interval_s,
            )

        self._consumer = link(f"{service} worker")
        self._publisher = link(f"{service} worker reports")
        self._reports = ReportPublisher(self._publisher, out_queue)
        self._consume_channel: AbstractRobustChannel | None = None
        self._count_known = True
        self._counts_acquired = False
        self._inbox: asyncio.Queue[RabbitDelivery | GaveUp | None] = asyncio.Queue()
        self._watch = ChannelWatch(
            in_queue,
            reopen_timeout_s,
            connected=lambda: self._consumer.connected,
            gave_up=self._inbox.put_nowait,
        )
        self._tasks_consumer = Consumer(in_queue, self._watch, self._on_message, self._cancelled)
        self._settles: ChannelSettles | None = None

    # ------------------------------------------------------------------ connecting

    @property
    def connected(self) -> bool:
        """Whether the consuming connection is open right now (``False`` while it reconnects)."""
        return self._consumer.connected

    @property
    def holding(self) -> bool:
        """Whether the consume channel is open on a connection known to be alive.

        ``False`` while reconnecting, and once a heartbeat has passed without a frame from the
        broker; ``True`` during a drain. Its deliveries are still this worker's meanwhile.
        """
        return self._consumer.alive and self._watch.open

    @property
    def consuming(self) -> bool:
        """Whether the transport holds (:attr:`holding`) and its consumer is active.

        The consumer starts again before the channel counts as open again.
        """
        return self.holding and self._tasks_consumer.tag is not None and not self._watch.stopping

    @property
    def publishing_blocked(self) -> bool:
        """Whether reports cannot be published right now.

        The broker blocks the connection (``connection.blocked``: a memory or disk alarm), or
        it is not known to be alive.
        """
        return self._reports.blocked

    async def connect(self) -> None:
        """Connect, open the channels, declare both queues and learn the input queue's type.

        Raises:
            BrokerRefusedError: the broker refused the credentials, the vhost or a queue.
            BrokerUnavailableError: no broker was reached within ``connect_timeout_s``.
            TimeBudgetError: the broker sets no consumer timeout of the worker's asking (before
                RabbitMQ 4.3) and the time budget does not fit under its own.
            TransportError: the queues could not be declared.
        """
        connection = await self._consumer.open()
        try:
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=self._prefetch)
            await declare_queue(consume, self._in_queue_name)
            await declare_queue(consume, self._out_queue_name)
            self._count_known = await queue_type(connection, self._in_queue_name) == "quorum"
            client = await consume.get_underlay_channel()
            version = client.connection.server_properties.get("version")
            since_4_3 = since_rabbitmq_4_3(version)
            self._counts_acquired = self._count_known and since_4_3
            self._ask_consumer_timeout(since_4_3)
            if self._control.cancel is not None and self._control_exchange is not None:
                await listen_for_cancels(connection, self._control_exchange, self._control)
            await self._reports.open()
        except (BrokerRefusedError, TimeBudgetError):
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise self._control_error(exc) from exc
        self._consume_channel = consume
        consume.close_callbacks.add(self._watch.closed)
        self._tasks_consumer.attach(consume)
        if not self._count_known:
            _logger.warning(
                "Queue %s is not a quorum queue: the broker keeps no delivery count, so a "
                "RetryableError gets one retry and a crash loop cannot be detected",
                self._in_queue_name,
            )
        timeout_s = self._tasks_consumer.timeout_s
        _logger.info(
            "Connected to %s (RabbitMQ %s): consuming %s, reporting to %s, prefetch %d (deliveries "
            "held unacked at most), %s",
            self._consumer.url_for_logs,
            version or "of unknown version",
            self._in_queue_name,
            self._out_queue_name,
            self._prefetch,
            f"a consumer timeout of the worker's own, {timeout_s:g} s"
            if timeout_s is not None
            else "no consumer timeout (a classic queue)"
            if since_4_3
            else "the broker's own consumer timeout (its consumer_timeout setting: before 4.3 "
            "a queue cannot ask for one)",
        )

    def _ask_consumer_timeout(self, since_4_3: bool) -> None:
        """Ask for the worker's own consumer timeout where the broker takes one (``broker_rules``).

        Raises:
            TimeBudgetError: the broker has only its own, and the time budget does not fit.
        """
        if not since_4_3:
            if self._time_budget_error is not None:
                raise self._time_budget_error
        elif self._count_known and self._consumer_timeout_s is not None:
            # A classic queue refuses the argument, and has no consumer timeout from 4.3 at all.
            self._tasks_consumer.timeout_s = self._consumer_timeout_s
            self._tasks_consumer.arguments = {
                "x-consumer-timeout": round(self._consumer_timeout_s * 1000)
            }

    def observe(self, observer: Observer) -> None:
        """Tell ``observer`` of each consumer the broker cancelled (``ConsumerCancelled``)."""
        self._observers.append(observer)

    def _cancelled(self, cause: CancelCause) -> None:
        event = ConsumerCancelled(cause)
        for observer in self._observers:
            try:
                observer.notify(event)
            except Exception:
                _logger.exception("An observer failed on %s", event)

    def listen_for_cancels(self, handler: Callable[[bytes], object]) -> bool:
        """Receive cancel requests on the control exchange from :meth:`connect` on.

        :meth:`connect` binds this worker's queue to it (``transports.rabbitmq.control``) with
        the rest of its set-up, before it says it is connected.
        """
        if self._control_exchange is None:
            return False
        self._control.cancel = handler
        return True

    def answer_inspections(self, answer: Callable[[bytes, str | None], bytes | None]) -> None:
        """Answer ``inspect`` requests on the control exchange with ``answer`` (``control``)."""
        self._control.inspect = answer

    def _control_error(self, exc: Exception) -> BrokerRefusedError | TransportError:
        if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
            return BrokerRefusedError(
                f"the exchange {self._control_exchange} exists with another type or other flags "
                f"than a durable fanout exchange (CONTROL_EXCHANGE_NAME names the cancel "
                f"requests' exchange): {str(exc)[:300]}"
            )
        return setup_error(exc, self._consumer.url_for_logs)

    # ------------------------------------------------------------------ consuming

    async def deliveries(self) -> AsyncIterator[RabbitDelivery]:
        """Yield deliveries until :meth:`stop_consuming`.

        Raises:
            BrokerUnavailableError: the consume channel kept closing; the transport gave up.
        """
        if self._consume_channel is None:
            raise TransportError("connect() first")
        await self._tasks_consumer.start()
        while True:
            item = await self._inbox.get()
            if item is None:
                return
            if isinstance(item, GaveUp):
                raise item.error
            yield item

    async def _on_message(self, message: DeliveredMessage) -> None:
        try:
            tag = message.delivery_tag or 0
            settles = self._settles_of(message.channel)
            settles.received(tag)
        except Exception:  # its channel closed already: the broker requeued it
            return
        try:
            headers = dict(message.header.properties.headers or {})
            redelivered = bool(message.redelivered)
            delivery = RabbitDelivery(
                read_envelope(message.body, max_body_bytes=self._max_body_bytes),
                headers=headers,
                delivery_count=delivery_count_of(
                    headers, redelivered, quorum=self._count_known, acquired=self._counts_acquired
                ),
                acquired_count=acquired_count_of(headers, redelivered)
                if self._counts_acquired
                else None,
                redelivered=redelivered,
                tag=tag,
                settles=settles,
                reports=self._reports,
                done=self._tasks_consumer.settled,
            )
        except Exception:
            # No delivery the engine could settle: hand it back rather than hold a prefetch
            # slot until the broker's consumer timeout (an SDK bug; no decision line can be
            # written for what could not be read).
            _logger.exception("A delivery could not be read; it is given back")
            with contextlib.suppress(Exception):
                await settles.settle(tag, Settle.NACK_REQUEUE)
            return
        delivery.consumer_tag = message.consumer_tag or ""
        # One that arrives after the consumer was cancelled still goes in: stop_consuming
        # returns it, to be given back through the engine.
        self._watch.in_flight.add(delivery)
        self._inbox.put_nowait(delivery)

    def _settles_of(self, channel: object) -> ChannelSettles:
        # Delivery tags belong to one channel, and start at 1 again on a reopened one.
        settles = self._settles
        if settles is None or settles.channel is not channel:
            settles = self._settles = ChannelSettles(channel)
        return settles

    async def stop_consuming(self) -> list[RabbitDelivery]:
        """Cancel the consumer; return the deliveries received but not yet taken.

        The caller gives them back through the engine (``Engine.give_back``). AMQP sends no
        delivery for a consumer after its ``basic.cancel-ok``, so every delivery received is
        either taken from :meth:`deliveries` or returned here. Only a cancel that failed (a
        channel gone, 4 s without an answer) can let one arrive later: it stays unacked, and
        the broker requeues it when the connection closes.
        """
        self._watch.stopping = True
        await self._tasks_consumer.stop()
        left: list[RabbitDelivery] = []
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, RabbitDelivery):
                left.append(item)
        self._inbox.put_nowait(None)
        return left

    # ------------------------------------------------------------------ reports and settles

    def span_attributes(self, delivery: Delivery | None) -> Mapping[str, str | int]:
        """The input queue and the delivery tag, or (``None``) the output queue (tracing)."""
        if delivery is None:
            return {
                "messaging.system": "rabbitmq",
                "messaging.destination.name": self._out_queue_name,
                "messaging.rabbitmq.destination.routing_key": self._out_queue_name,
            }
        attributes: dict[str, str | int] = {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": self._in_queue_name,
        }
        if isinstance(delivery, RabbitDelivery):
            attributes["messaging.rabbitmq.message.delivery_tag"] = delivery.tag
        return attributes

    def report_only(self) -> RabbitDelivery:
        """A delivery that reports and settles nothing.

        For a report whose delivery was settled already (the ``tick`` command's sweep,
        ``Engine.report_result``).
        """
        return RabbitDelivery(
            read_envelope(b""),
            headers={},
            delivery_count=0,
            redelivered=False,
            tag=0,
            settles=None,
            reports=self._reports,
            done=self._watch.in_flight.discard,
        )

    async def close(self) -> None:
        """Close both connections (at most 5 s each, at once); idempotent."""
        self._watch.stopping = True
        await asyncio.gather(self._consumer.close(), self._publisher.close())
