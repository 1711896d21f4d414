"""Publishing reports on a connection of their own, with publisher confirms.

RabbitMQ blocks a connection that publishes during a memory or disk alarm, and stops reading
its socket, acks included: on a connection of their own, reports can be held while deliveries
are still settled, and the consumer is never blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustChannel

from async_task_api_worker.errors import MessageTooLargeError, PublishError
from async_task_api_worker.protocol.codes import ReportType
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.rabbitmq.failures import publish_errors, size_limit_of
from async_task_api_worker.transports.rabbitmq.link import BrokerLink

__all__ = ["REFUSALS_PER_CHANNEL", "REFUSALS_PER_CONNECTION", "ReportPublisher", "ReportTrail"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: Reports refused in a row (``basic.nack``) before the next goes out on a fresh channel, and
#: before it goes out on a fresh connection.
REFUSALS_PER_CHANNEL: Final = 3
REFUSALS_PER_CONNECTION: Final = 9


@dataclass(slots=True, eq=False)
class ReportTrail:
    """The ``started`` report sent for one delivery: on which channel, and its publish.

    A channel that closes loses what was unconfirmed on it (the broker drops the frames that
    follow the one it closed the channel for). So a delivery's later report may not go out on
    a new channel before its ``started`` is confirmed: it would land without it. Refused, it
    is tried again, behind ``started`` sent once more (the engine's reporter sends a lost
    ``started`` again ahead of the terminal report). Only ``started`` is tracked: it is the
    one report that the engine sends again for another.
    """

    channel: object | None = None
    report: EncodedReport | None = None
    confirmed: bool = False

    def allows(self, report: EncodedReport, channel: object) -> bool:
        """Whether ``report`` may go out on ``channel`` now."""
        if self.channel is None or self.channel is channel or report is self.report:
            return True
        return self.confirmed


class _Handover:
    """Run once the publish holds its place: frees the order for the next report, says so.

    Scheduled with ``call_soon`` just before the publishing task enters aiormq's
    ``basic_publish``, it runs after that task's step, when the publish has taken aiormq's
    channel lock (first come, first served) or queued its frame: no later report can overtake
    it, and no task per report is needed to get there.
    """

    __slots__ = ("_order", "_placed", "ran", "refused")

    def __init__(self, order: asyncio.Lock, placed: Callable[[], None] | None) -> None:
        self._order = order
        self._placed = placed
        self.ran = False
        self.refused = False

    def __call__(self) -> None:
        self.ran = True
        self._order.release()
        if self._placed is not None and not self.refused:
            self._placed()


class ReportPublisher:
    """Publishes reports to ``out_queue`` on ``link``'s connection, confirmed and mandatory.

    Args:
        link: the reports' own connection.
        out_queue: the output queue (``OUT_QUEUE_NAME``), published to through the default
            exchange.
    """

    def __init__(self, link: BrokerLink, out_queue: str) -> None:
        self._link = link
        self._out_queue = out_queue
        self._channel: AbstractRobustChannel | None = None
        self._reopened = asyncio.Event()
        self._refusals = 0
        self._fresh_channel: asyncio.Future[None] | None = None
        self._order = asyncio.Lock()

    @property
    def blocked(self) -> bool:
        """Whether reports cannot go out now.

        The broker blocks the connection (``connection.blocked``), or it is not known to be
        alive.
        """
        return self._link.blocked or not self._link.alive

    async def open(self) -> None:
        """Connect and open the confirmed channel.

        Raises:
            BrokerRefusedError: the broker refused the credentials or the vhost.
            BrokerUnavailableError: no broker was reached in time.
        """
        await self._link.open()
        self._channel = await self._confirmed_channel()

    async def _confirmed_channel(self) -> AbstractRobustChannel:
        """A channel with publisher confirms whose returns (unroutable reports) raise."""
        channel = await self._link.connection.channel(
            publisher_confirms=True, on_return_raises=True
        )
        channel.reopen_callbacks.add(self._on_reopen)
        return channel

    def _on_reopen(self, _channel: object) -> None:
        self._reopened.set()

    async def _writable_channel(self) -> tuple[AbstractRobustChannel, Any]:
        """The report channel and its aiormq channel, once a frame put on it now goes out open.

        aiormq answers the broker's ``channel.close`` with ``close-ok`` at once, but marks the
        channel closed some steps later: a publish that took aiormq's channel lock in between
        went out on a channel the broker had freed, and RabbitMQ 4.0 closed the whole
        connection for it (``504 CHANNEL_ERROR - expected 'channel.open'``, after a report over
        ``max_message_size``: issue 29). So the reports before this one must have left
        (aiormq's channel lock is free: their frames are drained), and a channel the broker
        closed, or that closed with its connection, is waited for until aio-pika has reopened
        it. Called under the order lock; the caller puts its frame in the same step.

        Raises:
            ConnectionError: not connected (before :meth:`open`).
        """
        while True:
            channel = self._channel
            if channel is None:
                raise ConnectionError("not connected")
            self._reopened.clear()  # before looking: a reopen from now on wakes the wait
            underlay: Any = await channel.get_underlay_channel()  # aiormq's Channel
            if not _closing(underlay):
                async with underlay.lock:  # free once the earlier reports' frames have left
                    pass
                if not _closing(underlay):
                    return channel, underlay
            await self._reopened.wait()

    async def send(
        self,
        report: EncodedReport,
        trail: ReportTrail | None = None,
        placed: Callable[[], None] | None = None,
    ) -> None:
        """Publish ``report`` to the output queue and wait for its confirm, in this task.

        Reports reach the broker in the order of their calls: ``placed`` is called once the
        report holds its place on the channel (queued behind every earlier one, ahead of every
        later one), so that the engine can send a delivery's terminal report before
        ``started`` is confirmed. The publish is mandatory: a report the broker cannot route
        (the output queue was deleted) is a failure, not a silent drop. Nothing here has a time
        limit of its own: while the broker blocks the connection, and for a confirm that is
        merely late, it waits, and only the caller (the engine's hold) stops the wait, by
        cancelling it. Refused again and again (``basic.nack``: a full queue with
        ``reject-publish``), the channel is replaced (RabbitMQ 3.10 kept nacking a quorum
        queue's publishes on the same channel after the queue had room again) and then the
        connection.

        Args:
            report: the report.
            trail: its delivery's :class:`ReportTrail`, which keeps a report from going out on
                a new channel ahead of an earlier one lost with the old channel.
            placed: called on the event loop once the report holds its place (not when it
                failed before that).

        Raises:
            MessageTooLargeError: the broker refused the report for its size
                (``max_message_size``); publishing it again cannot help.
            PublishError: the broker did not confirm it (nack, return, lost channel), or an
                earlier report of the delivery was lost with its channel (``trail``).
        """
        properties = report.properties
        # The frame's properties are built here rather than through aio_pika.Message, whose
        # checked attribute setting cost about 8 % of the worker's CPU per task (the default
        # exchange's publish is what Exchange.publish does, with the same confirm and return).
        amqp_properties = aiormq.spec.Basic.Properties(
            content_type=properties.content_type,
            content_encoding=properties.content_encoding,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT.value,
            message_id=properties.message_id,
            correlation_id=properties.correlation_id,
            message_type=properties.type,
            timestamp=datetime.fromtimestamp(properties.timestamp_s, UTC),
            app_id=properties.app_id,
            headers=dict(properties.headers) if properties.headers else None,
        )
        started = trail if report.type is ReportType.STARTED else None
        handover: _Handover | None = None
        await self._order.acquire()
        channel: AbstractChannel | None = None
        try:
            with publish_errors(f"the {report.type} report"):
                await self._link.wait_unblocked()  # never into a socket the broker ignores
                # Read under the order lock: a fresh channel replaces this one under it too, so
                # that no report waits on a channel closed for good (_replace_publish_channel).
                channel, underlay = await self._writable_channel()
                if trail is not None and not trail.allows(report, underlay):
                    raise PublishError(
                        f"the {report.type} report waits: an earlier report of its delivery "
                        "was not confirmed on a channel that has closed since"
                    )
                if started is not None:
                    started.channel, started.report, started.confirmed = underlay, report, False
                handover = _Handover(self._order, placed)
                asyncio.get_running_loop().call_soon(handover)
                await underlay.basic_publish(
                    report.body,
                    exchange="",
                    routing_key=self._out_queue,
                    properties=amqp_properties,
                    mandatory=True,
                    # Drained, not just queued (aiormq's wait=True): the connection's write
                    # queue holds 10 frames, and a publish parked on it when the connection
                    # drops is never woken, holding the channel's lock for every later report.
                )
        except BaseException as exc:
            if handover is not None and not handover.ran:
                handover.refused = True  # failed before it took a place: ``placed`` is not said
            if isinstance(exc, PublishError):
                raise await self._refusal(exc, report, channel) from exc.__cause__
            raise
        finally:
            if handover is None:
                self._order.release()
        if started is not None:
            started.confirmed = True
        self._refusals = 0

    async def _refusal(
        self, exc: PublishError, report: EncodedReport, channel: AbstractChannel | None
    ) -> PublishError:
        """What a refusal of ``report`` is: too large for the broker, or a refusal (counted)."""
        cause = exc.__cause__
        limit = size_limit_of(cause)
        if limit is not None and len(report.body) > limit:
            return MessageTooLargeError(str(cause))
        if isinstance(cause, aiormq.exceptions.PublishError) and channel is not None:
            # Returned as unroutable: the output queue is gone. Declare it again so that the
            # engine's next try can succeed.
            with contextlib.suppress(Exception):
                await channel.declare_queue(self._out_queue, durable=True)
        if isinstance(cause, aiormq.exceptions.DeliveryError):
            self._refused()
        return exc

    def _refused(self) -> None:
        """Count a ``basic.nack``; replace the channel, then the connection, when they pile up."""
        self._refusals += 1
        if self._refusals % REFUSALS_PER_CONNECTION == 0:
            _logger.warning(
                "The broker refused %d reports in a row; publishing on a fresh connection",
                self._refusals,
            )
            self._link.drop()
        elif self._refusals % REFUSALS_PER_CHANNEL == 0 and self._fresh_channel is None:
            _logger.warning(
                "The broker refused %d reports in a row; publishing on a fresh channel",
                self._refusals,
            )
            self._fresh_channel = asyncio.ensure_future(self._replace_publish_channel())

    async def _replace_publish_channel(self) -> None:
        try:
            fresh = await self._confirmed_channel()
            # Swapped between two reports, never under one that is on its way to the old
            # channel: aio-pika never reopens a channel closed on purpose, and a report
            # waiting for it to reopen would hold the order lock for good.
            async with self._order:
                old, self._channel = self._channel, fresh
            if old is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(old.close(), timeout=5.0)
        except Exception as exc:  # the next refusals try again
            _logger.warning("Could not open a fresh report channel (%s)", type(exc).__name__)
        finally:
            self._fresh_channel = None


def _closing(underlay: Any) -> bool:
    """Whether aiormq's channel ``underlay`` is closed, or closing (no frame may follow).

    Closing: it got (or sent) ``channel.close``. aiormq sets its private close event as it
    answers ``channel.close``, steps before the channel counts as closed (``is_closed``);
    without that event only ``is_closed`` is read.
    """
    event = getattr(underlay, "_Channel__close_event", None)
    return bool(underlay.is_closed) or (isinstance(event, asyncio.Event) and event.is_set())
