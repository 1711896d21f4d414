"""The in-memory broker and transport (see the package): the queue, its confirms, its faults."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from async_task_api_worker.errors import PublishError, SettleError
from async_task_api_worker.ports import Delivery, Observer
from async_task_api_worker.protocol.envelope import DEFAULT_MAX_BODY_BYTES
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.memory.messages import (
    DeadLetter,
    MemoryDelivery,
    PublishedReport,
    QueuedMessage,
    message_id_of,
)

__all__ = ["InMemoryTransport"]


class InMemoryTransport:
    """An in-memory queue with publisher confirms, for the harness and ``dev``.

    Args:
        prefetch: the most unacked deliveries handed out at once.
        count_deliveries: ``True`` for a quorum queue (deliveries carry a count), ``False`` for
            a classic queue (``delivery_count`` is ``None``, only ``redelivered`` is set).
        queue_delivery_limit: the queue's own ``delivery-limit`` policy: a message requeued
            more times than this goes to :attr:`dead_letters`. ``None``: no limit.
        on_publish: called with each confirmed report (the ``dev`` command prints them).
        max_body_bytes: the largest body accepted (``WORKER_MAX_MESSAGE_BYTES``); a larger one
            is a poison message.
    """

    def __init__(
        self,
        *,
        prefetch: int = 1,
        count_deliveries: bool = True,
        queue_delivery_limit: int | None = None,
        on_publish: Callable[[PublishedReport], None] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self._prefetch = prefetch
        self._max_body_bytes = max_body_bytes
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
    def counts_deliveries(self) -> bool:
        """Whether deliveries carry a count (a quorum queue) or not (a classic queue)."""
        return self._count_deliveries

    def span_attributes(self, delivery: Delivery | None) -> Mapping[str, str | int]:
        """``messaging.system`` ``memory``; the queues are named ``in`` and ``out``."""
        return {
            "messaging.system": "memory",
            "messaging.destination.name": "out" if delivery is None else "in",
        }

    def put(
        self,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        *,
        delivery_count: int = 0,
        acquired_count: int | None = None,
    ) -> QueuedMessage:
        """Enqueue a message (at the tail), as a producer's publish would.

        Args:
            body: the body bytes.
            headers: optional message headers.
            delivery_count: start the message as if it had been delivered this many times.
            acquired_count: ... and handed out this many times (default: ``delivery_count``).

        Returns:
            The queued message.
        """
        message = QueuedMessage(
            bytes(body),
            dict(headers or {}),
            delivery_count=delivery_count,
            acquired_count=delivery_count if acquired_count is None else acquired_count,
            redelivered=delivery_count > 0 or bool(acquired_count),
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
    def holding(self) -> bool:
        """Always: nothing can take a delivery away from its worker here."""
        return True

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

    def observe(self, observer: Observer) -> None:
        """Nothing to tell: this broker never cancels a consumer (``Transport.observe``)."""

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

    def report_only(self) -> MemoryDelivery:
        """A delivery that reports and settles nothing (for ``Engine.report_result``)."""
        return MemoryDelivery(self, QueuedMessage(b""), max_body_bytes=self._max_body_bytes)

    def take(self, message_id: int | None = None) -> MemoryDelivery | None:
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
        return MemoryDelivery(self, message, max_body_bytes=self._max_body_bytes)

    async def deliveries(self) -> AsyncIterator[MemoryDelivery]:
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

    async def stop_consuming(self) -> tuple[()]:
        """End :meth:`deliveries`; unacked deliveries can still be settled.

        Returns:
            Nothing: a message is handed out only as :meth:`deliveries` yields it.
        """
        self._consuming = False
        self._wake()
        return ()

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
        published = PublishedReport(report, message_id_of(delivery))
        self.published.append(published)
        if self._on_publish is not None:
            self._on_publish(published)

    def _settle(self, delivery: Delivery) -> QueuedMessage:
        message = self._unacked.pop(message_id_of(delivery), None)
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

    async def retry(self, delivery: Delivery) -> None:
        """Put the message back at the head, its delivery count one up (``basic.reject``).

        Raises:
            SettleError: the delivery was already settled.
        """
        self._requeue(self._settle(delivery), counted=True)

    async def give_back(self, delivery: Delivery) -> None:
        """Put the message back at the head, its count as it was (4.3+'s ``basic.nack``).

        Raises:
            SettleError: the delivery was already settled.
        """
        self._requeue(self._settle(delivery), counted=False)

    def _requeue(self, message: QueuedMessage, *, counted: bool) -> None:
        message.redelivered = True
        message.acquired_count += 1
        if counted:
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
