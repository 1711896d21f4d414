"""The in-memory queue's messages, the reports it confirmed, its dead letters, its deliveries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.envelope import (
    ACQUIRED_COUNT_HEADER,
    DELIVERY_COUNT_HEADER,
    read_envelope,
)
from async_task_api_worker.protocol.reports import EncodedReport

if TYPE_CHECKING:
    from async_task_api_worker.transports.memory.broker import InMemoryTransport

__all__ = ["DeadLetter", "MemoryDelivery", "PublishedReport", "QueuedMessage", "message_id_of"]


@dataclass(slots=True)
class QueuedMessage:
    """A message in the in-memory queue.

    Attributes:
        body: the body bytes.
        headers: the message headers, as published.
        delivery_count: how many times the message came back counted (not a give-back).
        acquired_count: how many times it was handed out and came back (``x-acquired-count``).
        redelivered: whether it was handed out before.
        message_id: the queue's own id for the message, from 1.
    """

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    delivery_count: int = 0
    acquired_count: int = 0
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


class MemoryDelivery(Delivery):
    """A delivery of the in-memory queue: each report and settle is its transport's.

    Attributes:
        message_id: the queued message's id (0 for :meth:`InMemoryTransport.report_only`).
    """

    __slots__ = ("_transport", "message_id")

    def __init__(
        self, transport: InMemoryTransport, message: QueuedMessage, *, max_body_bytes: int
    ) -> None:
        counted = transport.counts_deliveries
        headers = dict(message.headers)
        if counted and message.delivery_count:
            headers[DELIVERY_COUNT_HEADER] = message.delivery_count
        if counted and message.acquired_count:
            headers[ACQUIRED_COUNT_HEADER] = message.acquired_count
        super().__init__(
            read_envelope(message.body, max_body_bytes=max_body_bytes),
            headers=headers,
            delivery_count=message.delivery_count if counted else None,
            acquired_count=message.acquired_count if counted else None,
            redelivered=message.redelivered,
        )
        self._transport = transport
        self.message_id = message.message_id

    async def report(
        self, report: EncodedReport, *, placed: Callable[[], None] | None = None
    ) -> None:
        """:meth:`InMemoryTransport.send`."""
        await self._transport.send(self, report, placed=placed)

    async def ack(self) -> None:
        """:meth:`InMemoryTransport.ack`."""
        await self._transport.ack(self)

    async def retry(self) -> None:
        """:meth:`InMemoryTransport.retry`."""
        await self._transport.retry(self)

    async def give_back(self) -> None:
        """:meth:`InMemoryTransport.give_back`."""
        await self._transport.give_back(self)

    async def reject(self) -> None:
        """:meth:`InMemoryTransport.reject`."""
        await self._transport.reject(self)


def message_id_of(delivery: Delivery) -> int:
    """The queued message's id of ``delivery`` (0 for one that is not the queue's)."""
    return delivery.message_id if isinstance(delivery, MemoryDelivery) else 0
