"""An in-memory broker and transport: a real :class:`~async_task_api_worker.ports.Transport`.

It behaves like a RabbitMQ quorum queue where it matters to the engine: each message has a
delivery count (``x-delivery-count``, absent on the first delivery), a requeue puts it back at
the head, a prefetch bounds the unacked deliveries, a queue delivery limit drops a message to
the dead letters, publishes are confirmed (or fail, on request). With ``count_deliveries=False``
it behaves like a classic queue: only the redelivered flag is set.

It backs the test harness and the ``dev`` command, and runs the same engine as production.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from async_task_api_worker.errors import PublishError, SettleError
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.envelope import DELIVERY_COUNT_HEADER
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.envelope_bodies import EnvelopeBodies

__all__ = ["DeadLetter", "InMemoryTransport", "PublishedReport", "QueuedMessage"]


@dataclass(slots=True)
class QueuedMessage:
    """A message in the in-memory queue.

    Attributes:
        body: the body bytes.
        headers: the message headers, as published.
        delivery_count: how many times the message was handed out and came back.
        redelivered: whether it was handed out before.
        message_id: the queue's own id for the message, from 1.
    """

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    delivery_count: int = 0
    redelivered: bool = False
    message_id: int = 0


@dataclass(frozen=True, slots=True)
class PublishedReport:
    """A report the broker confirmed, with the id of the message it was about."""

    report: EncodedReport
    message_id: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that left the queue without an ack.

    ``reason`` is ``rejected`` or ``delivery_limit`` (RabbitMQ's ``x-first-death-reason``).
    """

    message: QueuedMessage
    reason: str


class InMemoryTransport(EnvelopeBodies):
    """An in-memory queue with publisher confirms, for the harness and ``dev``.

    Args:
        prefetch: the most unacked deliveries handed out at once.
        count_deliveries: ``True`` for a quorum queue (deliveries carry a count), ``False`` for
            a classic queue (``delivery_count`` is ``None``, only ``redelivered`` is set).
        queue_delivery_limit: the queue's own ``delivery-limit`` policy: a message requeued
            more times than this goes to :attr:`dead_letters`. ``None``: no limit.
        on_publish: called with each confirmed report (the ``dev`` command prints them).
    """

    def __init__(
        self,
        *,
        prefetch: int = 1,
        count_deliveries: bool = True,
        queue_delivery_limit: int | None = None,
        on_publish: Callable[[PublishedReport], None] | None = None,
    ) -> None:
        self._prefetch = prefetch
        self._count_deliveries = count_deliveries
        self._queue_delivery_limit = queue_delivery_limit
        self._ready: deque[QueuedMessage] = deque()
        self._unacked: dict[int, QueuedMessage] = {}
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._consuming = False
        self._cancel_handlers: list[Callable[[bytes], object]] = []
        self._closed = False
        self._fail_publishes: list[list[str | int | None]] = []
        self._confirms = asyncio.Event()
        self._confirms.set()
        self._refuse_confirms: list[str | None] = []
        self._on_publish = on_publish
        self.published: list[PublishedReport] = []
        """Every report sent and not refused at its confirm, in the order sent."""
        self.dead_letters: list[DeadLetter] = []
        """Messages rejected or dropped by the queue's delivery limit."""
        self.acked: list[QueuedMessage] = []
        """Messages acked, in order."""

    # ------------------------------------------------------------------ the producer side

    @property
    def delivery_count_known(self) -> bool:
        """Whether deliveries carry a count (a quorum queue) or not (a classic queue)."""
        return self._count_deliveries

    def span_attributes(self, delivery: Delivery | None) -> Mapping[str, str | int]:
        """``messaging.system`` ``memory``; the queues are named ``in`` and ``out``."""
        return {
            "messaging.system": "memory",
            "messaging.destination.name": "out" if delivery is None else "in",
        }

    def put(
        self, body: bytes, headers: Mapping[str, Any] | None = None, *, delivery_count: int = 0
    ) -> QueuedMessage:
        """Enqueue a message (at the tail), as a producer's publish would.

        Args:
            body: the body bytes.
            headers: optional message headers.
            delivery_count: start the message as if it had been delivered this many times.

        Returns:
            The queued message.
        """
        message = QueuedMessage(
            bytes(body),
            dict(headers or {}),
            delivery_count=delivery_count,
            redelivered=delivery_count > 0,
            message_id=next(self._ids),
        )
        self._ready.append(message)
        self._wake()
        return message

    def fail_next_publish(self, report_type: str | None = None, *, times: int | None = 1) -> None:
        """Make the next publishes of ``report_type`` (or of any type) fail.

        Args:
            report_type: ``started``, ``progress``, ``success`` or ``failure``; ``None``: any.
            times: how many publishes fail; ``None``: every one, until
                :meth:`clear_publish_failures` (a broker refusing reports for a while).
        """
        self._fail_publishes.append([report_type, times])

    def hold_confirms(self) -> None:
        """Withhold every confirm until :meth:`release_confirms`: reports are sent, unconfirmed."""
        self._confirms.clear()

    def release_confirms(self) -> None:
        """Confirm what :meth:`hold_confirms` withheld, and every report from now on."""
        self._confirms.set()

    def refuse_next_confirm(self, report_type: str | None = None) -> None:
        """Nack the next sent report of ``report_type`` (or of any type) at its confirm.

        The report was sent, so later reports went out behind it; the broker then refuses it
        (a ``basic.nack``), and it leaves :attr:`published`.
        """
        self._refuse_confirms.append(report_type)

    def clear_publish_failures(self) -> None:
        """Forget every failure :meth:`fail_next_publish` asked for: the broker takes reports."""
        self._fail_publishes.clear()

    @property
    def ready(self) -> tuple[QueuedMessage, ...]:
        """The messages waiting in the queue, head first: a tuple taken now, read-only."""
        return tuple(self._ready)

    @property
    def ready_count(self) -> int:
        """Messages waiting in the queue."""
        return len(self._ready)

    @property
    def unacked_count(self) -> int:
        """Messages handed out and not yet settled."""
        return len(self._unacked)

    async def join(self) -> None:
        """Wait until the queue is empty and every delivery settled (no polling)."""
        await self._wait_for(lambda: not self._ready and not self._unacked)

    async def _wait_for(self, condition: Callable[[], object]) -> None:
        # No await between the check and the wait: a wake-up cannot be lost.
        while not condition():
            self._changed.clear()
            await self._changed.wait()

    # ------------------------------------------------------------------ the Transport

    @property
    def consuming(self) -> bool:
        """Whether :meth:`deliveries` is handing out messages (between connect and stop)."""
        return self._consuming

    @property
    def publishing_blocked(self) -> bool:
        """Never: the memory broker takes every report (see :meth:`fail_next_publish`)."""
        return False

    async def connect(self) -> None:
        """Nothing to connect to; marks the transport as consuming."""
        self._consuming = True

    def listen_for_cancels(self, handler: Callable[[bytes], object]) -> bool:
        """Hand the bodies given to :meth:`publish_cancel` to ``handler`` from now on."""
        self._cancel_handlers.append(handler)
        return True

    def publish_cancel(self, body: bytes) -> int:
        """Deliver a cancel request's body to every listener, at once (the fanout exchange).

        Returns:
            How many listeners got it (none before :meth:`listen_for_cancels`: lost, as a
            cancel published while no worker is bound is).
        """
        for handler in self._cancel_handlers:
            handler(body)
        return len(self._cancel_handlers)

    def take(self, message_id: int | None = None) -> Delivery | None:
        """Hand out a message now: the one at the head, or the one with ``message_id``.

        Returns:
            The delivery, or ``None`` if there is no such message ready.
        """
        if message_id is None:
            if not self._ready:
                return None
            message = self._ready.popleft()
        else:
            found = [queued for queued in self._ready if queued.message_id == message_id]
            if not found:
                return None
            message = found[0]
            self._ready.remove(message)
        self._unacked[message.message_id] = message
        headers = dict(message.headers)
        if self._count_deliveries and message.delivery_count:
            headers[DELIVERY_COUNT_HEADER] = message.delivery_count
        return Delivery(
            body=message.body,
            headers=headers,
            delivery_count=message.delivery_count if self._count_deliveries else None,
            redelivered=message.redelivered,
            handle=message.message_id,
        )

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Yield deliveries while consuming, at most ``prefetch`` unacked at once."""
        self._consuming = True
        while True:
            await self._wait_for(
                lambda: not self._consuming or (self._ready and len(self._unacked) < self._prefetch)
            )
            if not self._consuming:
                return
            delivery = self.take()
            if delivery is not None:
                yield delivery

    async def stop_consuming(self) -> None:
        """End :meth:`deliveries`; unacked deliveries can still be settled."""
        self._consuming = False
        self._wake()

    async def send(
        self,
        delivery: Delivery,
        report: EncodedReport,
        *,
        placed: Callable[[], None] | None = None,
    ) -> None:
        """Send ``report`` now (:meth:`publish`), say it is placed, and wait for its confirm.

        Raises:
            PublishError: :meth:`fail_next_publish` asked for this one to fail (before it is
                placed), or :meth:`refuse_next_confirm` (after).
        """
        await self.publish(delivery, report)
        if placed is not None:
            placed()
        failed = next(
            (
                index
                for index, wanted in enumerate(self._refuse_confirms)
                if wanted is None or wanted == report.type
            ),
            None,
        )
        if failed is not None:
            del self._refuse_confirms[failed]
        await self._confirms.wait()
        if failed is not None:
            self.published[:] = [sent for sent in self.published if sent.report is not report]
            raise PublishError(f"injected nack of the {report.type} report")

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        """Record ``report`` as confirmed, unless a failure was requested for it.

        Raises:
            PublishError: :meth:`fail_next_publish` asked for this one to fail.
        """
        for index, (wanted, times) in enumerate(self._fail_publishes):
            if wanted is None or wanted == report.type:
                if isinstance(times, int):
                    if times <= 1:
                        del self._fail_publishes[index]
                    else:
                        self._fail_publishes[index][1] = times - 1
                raise PublishError(f"injected failure of the {report.type} publish")
        published = PublishedReport(report, int(delivery.handle or 0))
        self.published.append(published)
        if self._on_publish is not None:
            self._on_publish(published)

    def _settle(self, delivery: Delivery) -> QueuedMessage:
        message = self._unacked.pop(int(delivery.handle or 0), None)
        if message is None:
            raise SettleError("unknown delivery (already settled?)")
        return message

    async def ack(self, delivery: Delivery) -> None:
        """Remove the message.

        Raises:
            SettleError: the delivery was already settled.
        """
        self.acked.append(self._settle(delivery))
        self._wake()

    async def requeue(self, delivery: Delivery, *, count_attempt: bool) -> None:
        """Put the message back at the head.

        A counted requeue adds one to its delivery count; a give-back does not (RabbitMQ 4.3+
        semantics for ``basic.reject`` and ``basic.nack``).

        Raises:
            SettleError: the delivery was already settled.
        """
        message = self._settle(delivery)
        message.redelivered = True
        if count_attempt:
            message.delivery_count += 1
        limit = self._queue_delivery_limit
        if limit is not None and message.delivery_count > limit:
            self.dead_letters.append(DeadLetter(message, "delivery_limit"))
        else:
            self._ready.appendleft(message)
        self._wake()

    async def reject(self, delivery: Delivery) -> None:
        """Drop the message to :attr:`dead_letters`.

        Raises:
            SettleError: the delivery was already settled.
        """
        self.dead_letters.append(DeadLetter(self._settle(delivery), "rejected"))
        self._wake()

    async def close(self) -> None:
        """Stop consuming; idempotent."""
        self._closed = True
        await self.stop_consuming()

    def _wake(self) -> None:
        self._changed.set()
