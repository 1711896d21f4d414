"""One RabbitMQ delivery: its counts, its reports and its settle.

RabbitMQ behaviours it follows (measured on 3.10.8, 4.0.5 and 4.3.6: docs/brokers.md,
"Attempt counting per version", from ``tests/integration/test_attempt_counting_on_rabbitmq.py``):

- Quorum queues count, classic queues only set ``redelivered`` (``delivery_count`` ``None``).
  ``x-delivery-count`` is absent (3.10: 0) on a first delivery. Before 4.3 it counts every
  return: a reject, a nack, a crash, a lost connection, a consumer timeout. From 4.3 it counts
  a ``basic.reject``, a crash and a lost connection only; a redelivery after a give-back or a
  consumer timeout carries none (measured): it counts 0.
- ``x-acquired-count`` (4.3+ quorum queues) counts every earlier hand-out; it bounds the loops
  4.3's delivery count does not see (``WORKER_ACQUIRED_LIMIT``). Before 4.3 a producer's own
  header of that name passes through, so it is read only from a broker that sets it.
- A failed attempt is settled with ``basic.reject(requeue=True)`` (:meth:`retry`), a give-back
  with ``basic.nack(requeue=True)`` (:meth:`give_back`). Settles are sent together at the end
  of the event loop's turn, and acks of consecutive delivery tags as one
  ``basic.ack(multiple=True)`` (``acks``).
- A delivery whose channel closed was requeued by the broker: it is neither reported on nor
  settled again (its delivery tag belonged to the dead channel).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from async_task_api_worker.errors import EnvelopeDecodeError, PublishError, SettleError
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.envelope import (
    ACQUIRED_COUNT_HEADER,
    DELIVERY_COUNT_HEADER,
    Envelope,
)
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.rabbitmq.acks import ChannelSettles, Settle
from async_task_api_worker.transports.rabbitmq.failures import settle_errors
from async_task_api_worker.transports.rabbitmq.reports import ReportPublisher, ReportTrail

__all__ = [
    "RabbitDelivery",
    "acquired_count_of",
    "delivery_count_of",
]

_DIGITS = re.compile(r"[0-9]{1,9}")


def delivery_count_of(
    headers: Mapping[str, Any], redelivered: bool, *, quorum: bool, acquired: bool = False
) -> int | None:
    """The broker's delivery count of this delivery (earlier counted returns), or ``None``.

    The one counting rule of the RabbitMQ transport (see the module for what each version
    counts):

    - a classic queue (``quorum`` false) keeps no count: ``None``, a first delivery's too (its
      attempt is then read from ``redelivered`` alone, under a limit of its own);
    - a first delivery (``redelivered`` false) counts 0 whatever its headers say: RabbitMQ 3.10
      and 4.x pass a producer's own ``x-delivery-count`` through on a first delivery;
    - a quorum queue's redelivery without ``x-delivery-count`` counts 0 (RabbitMQ 4.3 sets none
      after a give-back or a consumer timeout); an unreadable value is ``None`` (unknown);
    - from a broker that sets ``x-acquired-count`` (``acquired``: 4.3+), the count is at most
      that: 4.3 leaves a producer's forged ``x-delivery-count`` in place until it first counts.

    ``x-delivery-count`` may arrive as any AMQP integer type (or a decimal, or digits); this
    function never raises.
    """
    if not quorum:
        return None
    if not redelivered:
        return 0
    count = _count(headers.get(DELIVERY_COUNT_HEADER, 0))
    handed_out = acquired_count_of(headers, redelivered) if acquired else None
    if count is not None and handed_out is not None:
        return min(count, handed_out)
    return count


def acquired_count_of(headers: Mapping[str, Any], redelivered: bool) -> int | None:
    """How many times the broker handed this message out before (``x-acquired-count``).

    Read only from a broker that sets the header (RabbitMQ 4.3+ quorum queues: the caller
    decides). A first delivery counts 0 whatever its headers say; a redelivery without a
    readable value is ``None`` (unknown). Never raises.
    """
    if not redelivered:
        return 0
    return _count(headers.get(ACQUIRED_COUNT_HEADER))


def _count(value: object) -> int | None:
    """A header's count as an ``int`` in 0..10**9, or ``None`` for one that is not a count."""
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


class RabbitDelivery(Delivery):
    """A delivery of the input queue: reports go through the ``ReportPublisher``.

    It is settled on the channel it came on.

    Args:
        envelope: the body as decoded (``protocol.envelope.read_envelope``).
        headers: the AMQP headers.
        delivery_count: the broker's count, or ``None`` (a classic queue, or unknown).
        acquired_count: the broker's count of earlier hand-outs (4.3+), or ``None``.
        redelivered: AMQP ``redelivered``.
        tag: the delivery tag on ``settles``' channel.
        settles: the channel's settles; ``None`` for a delivery that settles nothing
            (``RabbitMQTransport.report_only``).
        reports: the transport's report publisher.
        done: called once with the delivery at its first settle (the transport forgets it).

    Attributes:
        lost: the broker requeued it (its channel closed, or it was held past the consumer
            timeout): set by the transport.
        received_at: when it arrived (``time.monotonic()``), in seconds.
        consumer_tag: the consumer it was handed to (set by the transport).
    """

    __slots__ = (
        "_done",
        "_reports",
        "_settled",
        "_settles",
        "consumer_tag",
        "lost",
        "received_at",
        "tag",
        "trail",
    )

    def __init__(
        self,
        envelope: Envelope | EnvelopeDecodeError,
        *,
        headers: Mapping[str, Any],
        delivery_count: int | None,
        acquired_count: int | None = None,
        redelivered: bool,
        tag: int,
        settles: ChannelSettles | None,
        reports: ReportPublisher,
        done: Callable[[RabbitDelivery], object],
    ) -> None:
        super().__init__(
            envelope,
            headers=headers,
            delivery_count=delivery_count,
            acquired_count=acquired_count,
            redelivered=redelivered,
        )
        self.tag = tag
        self.trail = ReportTrail()
        self.lost = False
        self.received_at = time.monotonic()
        self.consumer_tag = ""
        self._settles = settles
        self._reports = reports
        self._done = done
        self._settled = False

    async def report(
        self, report: EncodedReport, *, placed: Callable[[], None] | None = None
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
        if self.lost:
            # Its channel closed: the broker requeued it, and the next attempt will report.
            raise PublishError(f"the {report.type} report is for a delivery the broker requeued")
        await self._reports.send(report, self.trail, placed)

    async def ack(self) -> None:
        """``basic.ack``: the delivery is done.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the ack failed.
        """
        await self._settle(Settle.ACK)

    async def retry(self) -> None:
        """``basic.reject(requeue=True)``: another attempt, counted.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the call failed.
        """
        await self._settle(Settle.REJECT_REQUEUE)

    async def give_back(self) -> None:
        """``basic.nack(requeue=True)``: back without counting an attempt (RabbitMQ 4.3+).

        Before 4.3 it counts like :meth:`retry`; from 4.3 only ``x-acquired-count`` moves.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the call failed.
        """
        await self._settle(Settle.NACK_REQUEUE)

    async def reject(self) -> None:
        """``basic.reject(requeue=False)``: dead-lettered where the queue has a DLX.

        Raises:
            SettleError: the channel closed (the broker requeued it), or the reject failed.
        """
        await self._settle(Settle.REJECT)

    async def _settle(self, settle: Settle) -> None:
        """Settle at once (``acks``: sent at the end of this turn, even if the caller is cut)."""
        self._done(self)
        what = settle.method
        if self.lost:
            raise SettleError(
                f"the delivery's channel closed before the {what}; the broker requeued it"
            )
        if self._settled or self._settles is None:
            # A second settle of a tag would close the channel (PRECONDITION_FAILED).
            raise SettleError(f"the delivery was settled already; the {what} is not sent")
        self._settled = True
        with settle_errors(f"the {what}"):
            await self._settles.settle(self.tag, settle)
