"""The RabbitMQ transport: consume and settle deliveries; reports go through ``ReportPublisher``.

This package is the only place that imports aio-pika; every exception it raises is translated
into the SDK's own in ``_errors``. The module is a little over 400 lines: consuming, settling and
withdrawing deliveries share one channel's state and its recovery, and read best in one place.

RabbitMQ behaviours it follows (checked on 3.10 and documented for 4.x):

- ``x-delivery-count`` is set on quorum queues only: absent (or 0) on a first delivery, then
  1, 2... after each requeue, a dead consumer or a consumer timeout. A classic queue only sets
  ``redelivered``: a redelivery without the header has an unknown count.
- A failed attempt is settled with ``basic.reject(requeue=True)``, a give-back with
  ``basic.nack(requeue=True)``: from RabbitMQ 4.3 only the first counts towards the delivery
  limit (before 4.3 both do). Settles are sent together at the end of the event loop's turn,
  and acks of consecutive delivery tags as one ``basic.ack(multiple=True)`` (``acks``).
- When a channel closes (connection loss, consumer timeout, a precondition failure) the broker
  requeues its unacked deliveries itself. Their handlers are cancelled, since another attempt
  is already on its way, and they are never acked or nacked on the reopened channel (their
  delivery tags belong to the dead one). aio-pika's robust channel reopens and restores the
  consumer; if the consume channel closes again and again, the transport gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from async_task_api_worker.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    PublishError,
    SettleError,
    TransportError,
)
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.envelope import DELIVERY_COUNT_HEADER
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.envelope_bodies import EnvelopeBodies
from async_task_api_worker.transports.rabbitmq._errors import (
    CHANNEL_GONE,
    settle_errors,
    setup_error,
)
from async_task_api_worker.transports.rabbitmq.acks import ChannelSettles, Settle
from async_task_api_worker.transports.rabbitmq.control import listen_for_cancels
from async_task_api_worker.transports.rabbitmq.link import BrokerLink
from async_task_api_worker.transports.rabbitmq.reports import ReportPublisher, ReportTrail
from async_task_api_worker.transports.rabbitmq.topology import declare_queue, queue_type

__all__ = ["RabbitMQTransport"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: The consume channel may close this many times within :data:`CHANNEL_FAILURE_WINDOW_S`
#: before the transport gives up (a broker that keeps closing it will not get better).
MAX_CHANNEL_FAILURES: Final = 5
CHANNEL_FAILURE_WINDOW_S: Final = 60.0
#: A consume channel the broker closed on a live connection reopens in milliseconds; one not
#: back after this many seconds will not be (aio-pika gives up a restore the broker refuses,
#: an exclusive consumer or a lost permission): the transport gives up rather than sit idle.
REOPEN_TIMEOUT_S: Final = 30.0


@dataclass(slots=True, eq=False)
class _Handle:
    tag: int
    settles: ChannelSettles
    lost: bool = False
    settled: bool = False
    trail: ReportTrail = field(default_factory=ReportTrail)


class _GaveUp:
    def __init__(self, error: TransportError) -> None:
        self.error = error


_DIGITS = re.compile(r"[0-9]{1,9}")


def delivery_count_of(headers: dict[str, Any], redelivered: bool) -> int | None:
    """The broker's delivery count from the headers, or ``None`` when it is unknown.

    ``x-delivery-count`` may arrive as any AMQP integer type (or a decimal); its absence means
    "unknown" on a redelivery (a classic queue). A first delivery (``redelivered`` false)
    counts 0 whatever its headers say: RabbitMQ 3.10 passes a producer's own
    ``x-delivery-count`` through on a first delivery. A value that is not a plausible count (a
    forged header) counts as unknown; this function never raises.
    """
    if not redelivered:
        return 0
    value = headers.get(DELIVERY_COUNT_HEADER)
    count: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, Decimal | float):
        with contextlib.suppress(ValueError, OverflowError, ArithmeticError):
            if value == int(value):
                count = int(value)
    elif isinstance(value, bytes | str):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if _DIGITS.fullmatch(text.strip()):
            count = int(text)
    if count is not None:
        return min(max(0, count), 1_000_000_000)
    return None


class RabbitMQTransport(EnvelopeBodies):
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
    ) -> None:
        self._control_exchange = control_exchange
        self._cancel_handler: Callable[[bytes], object] | None = None
        self._in_queue_name = in_queue
        self._reopen_timeout_s = reopen_timeout_s
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
        self._consume_channel: AbstractChannel | None = None
        self._in_queue: AbstractQueue | None = None
        self._count_known = True
        self._inbox: asyncio.Queue[Delivery | _GaveUp | None] = asyncio.Queue()
        self._in_flight: dict[int, Delivery] = {}
        self._consumer_tag: str | None = None
        self._stopping = False
        self._channel_failures: list[float] = []
        self._channel_open = True
        self._reopened = asyncio.Event()  # set while the consume channel is open
        self._reopened.set()
        self._gave_up: BrokerUnavailableError | None = None
        self._settles: ChannelSettles | None = None

    # ------------------------------------------------------------------ connecting

    @property
    def delivery_count_known(self) -> bool:
        """Whether the input queue keeps a delivery count (a quorum queue)."""
        return self._count_known

    @property
    def connected(self) -> bool:
        """Whether the consuming connection is open right now (``False`` while it reconnects)."""
        return self._consumer.connected

    @property
    def consuming(self) -> bool:
        """Whether the consumer is active on a connection known to be alive.

        ``False`` while reconnecting, and once a heartbeat has passed without a frame from the
        broker. aio-pika restores the consumer before it calls the channel's reopen callbacks,
        so the channel counts as open again only once consuming has resumed.
        """
        return (
            self._consumer.alive
            and self._channel_open
            and self._consumer_tag is not None
            and not self._stopping
        )

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
            TransportError: the queues could not be declared.
        """
        connection = await self._consumer.open()
        try:
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=self._prefetch)
            self._in_queue = await declare_queue(consume, self._in_queue_name)
            await declare_queue(consume, self._out_queue_name)
            self._count_known = await queue_type(connection, self._in_queue_name) == "quorum"
            if self._cancel_handler is not None and self._control_exchange is not None:
                await listen_for_cancels(connection, self._control_exchange, self._cancel_handler)
            await self._reports.open()
        except BrokerRefusedError:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise self._control_error(exc) from exc
        self._consume_channel = consume
        consume.close_callbacks.add(self._on_consume_channel_closed)
        consume.reopen_callbacks.add(self._on_consume_channel_reopened)
        if not self._count_known:
            _logger.warning(
                "Queue %s is not a quorum queue: the broker keeps no delivery count, so a "
                "RetryableError gets one retry and a crash loop cannot be detected",
                self._in_queue_name,
            )
        _logger.info(
            "Connected to %s: consuming %s, reporting to %s, prefetch %d",
            self._consumer.url_for_logs,
            self._in_queue_name,
            self._out_queue_name,
            self._prefetch,
        )

    def listen_for_cancels(self, handler: Callable[[bytes], object]) -> bool:
        """Receive cancel requests on the control exchange from :meth:`connect` on.

        :meth:`connect` binds this worker's queue to it (``transports.rabbitmq.control``) with
        the rest of its set-up, before it says it is connected.
        """
        if self._control_exchange is None:
            return False
        self._cancel_handler = handler
        return True

    def _control_error(self, exc: Exception) -> BrokerRefusedError | TransportError:
        if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
            return BrokerRefusedError(
                f"the exchange {self._control_exchange} exists with another type or other flags "
                f"than a durable fanout exchange (CONTROL_EXCHANGE_NAME names the cancel "
                f"requests' exchange): {str(exc)[:300]}"
            )
        return setup_error(exc, self._consumer.url_for_logs)

    # ------------------------------------------------------------------ consuming

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Yield deliveries until :meth:`stop_consuming`.

        Raises:
            BrokerUnavailableError: the consume channel kept closing; the transport gave up.
        """
        if self._in_queue is None:
            raise TransportError("connect() first")
        await self._start_consuming(self._in_queue)
        while True:
            item = await self._inbox.get()
            if item is None:
                return
            if isinstance(item, _GaveUp):
                raise item.error
            yield item

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            handle = _Handle(message.delivery_tag or 0, self._settles_of(message.channel))
            handle.settles.received(handle.tag)
        except Exception:  # its channel closed already: the broker requeued it
            return
        if self._stopping:
            # It arrived after the consumer was cancelled: never started, so give it back
            # without burning an attempt.
            with contextlib.suppress(Exception):
                await handle.settles.settle(handle.tag, Settle.NACK_REQUEUE)
            return
        try:
            headers = dict(message.headers or {})
            delivery = Delivery(
                body=message.body,
                headers=headers,
                delivery_count=delivery_count_of(headers, bool(message.redelivered)),
                redelivered=bool(message.redelivered),
                handle=handle,
            )
        except Exception:
            # Nothing the engine could settle: hand it back rather than hold a prefetch slot
            # until the broker's consumer timeout.
            _logger.exception("A delivery could not be read; it is given back")
            with contextlib.suppress(Exception):
                await handle.settles.settle(handle.tag, Settle.NACK_REQUEUE)
            return
        self._in_flight[id(handle)] = delivery
        self._inbox.put_nowait(delivery)

    async def _start_consuming(self, queue: AbstractQueue) -> None:
        """``basic.consume``; again on the reopened channel if the broker closes it meanwhile.

        aio-pika restores only a consumer that started, so a close that crosses the start (it
        is counted by the close callback, as any) is waited out here.

        Raises:
            BrokerUnavailableError: the channel kept closing (the transport gave up).
        """
        while True:
            try:
                self._consumer_tag = await queue.consume(self._on_message)
                return
            except CHANNEL_GONE as exc:
                channel = self._consume_channel
                if channel is not None and channel.is_closed:
                    self._reopened.clear()  # its reopen (or the give-up) sets it
                if self._gave_up is not None:
                    raise self._gave_up from exc
                if self._stopping:
                    raise TransportError("stopped while the consumer started") from exc
                _logger.info(
                    "The consume channel closed while the consumer started (%s); starting it "
                    "again once the channel reopens",
                    type(exc).__name__,
                )
                await self._reopened.wait()

    def _settles_of(self, channel: object) -> ChannelSettles:
        # Delivery tags belong to one channel, and start at 1 again on a reopened one.
        settles = self._settles
        if settles is None or settles.channel is not channel:
            settles = self._settles = ChannelSettles(channel)
        return settles

    def _on_consume_channel_closed(self, _sender: object, exc: BaseException | None) -> None:
        try:
            self._withdraw_in_flight(exc)
        except Exception:  # never let a bookkeeping error stop aio-pika's own close handling
            _logger.exception("Could not withdraw the in-flight deliveries")

    def _withdraw_in_flight(self, exc: BaseException | None) -> None:
        if self._stopping or not self._channel_open:  # our own shutdown, or a repeat
            return
        self._channel_open = False
        self._reopened.clear()
        lost = list(self._in_flight.values())
        self._in_flight.clear()
        for delivery in lost:
            delivery.handle.lost = True
            delivery.cancel_token.cancel("the channel closed; the broker requeued the delivery")
        _logger.warning(
            "The consume channel closed (%s); %d in-flight deliveries were requeued by the "
            "broker and their handlers stopped; the channel reopens",
            type(exc).__name__ if exc else "closed",
            len(lost),
        )
        if (
            isinstance(exc, aiormq.exceptions.AMQPConnectionError | ConnectionError)
            or not self._consumer.connected
        ):
            # A lost connection reconnects by itself, however often: only the broker closing
            # the channel on a live connection (consumer timeout, precondition) counts below.
            return
        now = time.monotonic()
        self._channel_failures = [
            t for t in self._channel_failures if now - t < CHANNEL_FAILURE_WINDOW_S
        ] + [now]
        if len(self._channel_failures) >= MAX_CHANNEL_FAILURES:
            self._give_up(
                f"the consume channel closed {len(self._channel_failures)} times in "
                f"{CHANNEL_FAILURE_WINDOW_S:g} s; giving up"
            )
            return
        asyncio.get_running_loop().call_later(self._reopen_timeout_s, self._check_reopened, now)

    def _check_reopened(self, closed_at: float) -> None:
        # Still closed since that close (the last), on a live connection: the restore failed.
        if (
            self._channel_open
            or self._stopping
            or self._gave_up is not None
            or not self._consumer.connected
            or self._channel_failures[-1:] != [closed_at]
        ):
            return
        self._give_up(
            f"the consume channel did not reopen within {self._reopen_timeout_s:g} s of its "
            "close (the broker refused to restore the consumer); giving up"
        )

    def _give_up(self, why: str) -> None:
        self._gave_up = BrokerUnavailableError(why)
        _logger.error("%s", why)
        self._inbox.put_nowait(_GaveUp(self._gave_up))
        self._reopened.set()  # a consumer waiting to start learns it here

    def _on_consume_channel_reopened(self, _sender: object) -> None:
        self._channel_open = True
        self._reopened.set()
        _logger.info("The consume channel reopened; consuming %s again", self._in_queue_name)

    async def stop_consuming(self) -> None:
        """Cancel the consumer; deliveries received but not yet taken are given back."""
        self._stopping = True
        if self._in_queue is not None and self._consumer_tag is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._in_queue.cancel(self._consumer_tag), timeout=5.0)
            self._consumer_tag = None
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, Delivery):
                with contextlib.suppress(SettleError):
                    await self.requeue(item, count_attempt=False)
        self._inbox.put_nowait(None)

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
        if delivery.handle is not None:
            attributes["messaging.rabbitmq.message.delivery_tag"] = delivery.handle.tag
        return attributes

    async def send(
        self,
        delivery: Delivery,
        report: EncodedReport,
        *,
        placed: Callable[[], None] | None = None,
    ) -> None:
        """Publish ``report`` to the output queue and wait for its confirm, in this task.

        See :meth:`ReportPublisher.send`: reports reach the broker in the order of their calls
        (``placed`` says when this one holds its place), and the caller (the engine's hold)
        bounds the wait.

        Raises:
            MessageTooLargeError: the broker refused the report for its size.
            PublishError: the broker did not confirm it (nack, return, lost channel), or the
                delivery's channel closed (the broker requeued it).
        """
        if delivery.handle is not None and delivery.handle.lost:
            # Its channel closed: the broker requeued it, and the next attempt will report.
            raise PublishError(f"the {report.type} report is for a delivery the broker requeued")
        await self._reports.send(
            report, None if delivery.handle is None else delivery.handle.trail, placed
        )

    async def _settle(self, delivery: Delivery, settle: Settle) -> None:
        """Settle at once (``acks``: sent at the end of this turn, even if the caller is cut)."""
        handle: _Handle = delivery.handle
        self._in_flight.pop(id(handle), None)
        what = settle.method
        if handle.lost:
            raise SettleError(
                f"the delivery's channel closed before the {what}; the broker requeued it"
            )
        if handle.settled:
            # A second settle of a tag would close the channel (PRECONDITION_FAILED).
            raise SettleError(f"the delivery was settled already; the {what} is not sent")
        handle.settled = True
        with settle_errors(f"the {what}"):
            await handle.settles.settle(handle.tag, settle)

    async def ack(self, delivery: Delivery) -> None:
        """``basic.ack``: the delivery is done.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the ack failed.
        """
        await self._settle(delivery, Settle.ACK)

    async def requeue(self, delivery: Delivery, *, count_attempt: bool) -> None:
        """``basic.reject(requeue=True)`` for a failed attempt, ``basic.nack`` for a give-back.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the call failed.
        """
        await self._settle(
            delivery, Settle.REJECT_REQUEUE if count_attempt else Settle.NACK_REQUEUE
        )

    async def reject(self, delivery: Delivery) -> None:
        """``basic.reject(requeue=False)``: dead-lettered where the queue has a DLX.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the reject failed.
        """
        await self._settle(delivery, Settle.REJECT)

    async def close(self) -> None:
        """Close both connections (at most 5 s each, at once); idempotent."""
        self._stopping = True
        await asyncio.gather(self._consumer.close(), self._publisher.close())
