"""The input queue's consumer: started with a fresh tag each time, and cancelled by the broker.

aio-pika's robust channel restores a consumer with its old tag, and RabbitMQ 4.3 refuses that
after it cancelled the consumer itself (``530 NOT_ALLOWED - attempt to reuse consumer tag``,
closing the connection). So the consumer here is not aio-pika's robust one: it is started on
the channel's AMQP client (aiormq), again on every reopen and after every ``basic.cancel`` from
the broker, each time with a new tag of its own (``atw/<host>/<pid>/<nonce>``).

The broker cancels a consumer (``basic.cancel``) when the queue is deleted, and from RabbitMQ
4.3 at a consumer timeout, instead of closing the channel. At a timeout it requeues only the
deliveries held past it; the consumer's others stay the worker's, and are settled as usual.
Those held past the timeout the consumer asked for are withdrawn, their handlers stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Final

import aiormq
from aio_pika.abc import AbstractRobustChannel
from aiormq.abc import DeliveredMessage

from async_task_api_worker.errors import TransportError
from async_task_api_worker.ports import CancelCause
from async_task_api_worker.protocol.inspect import consumer_tag
from async_task_api_worker.transports.rabbitmq.delivery import RabbitDelivery
from async_task_api_worker.transports.rabbitmq.failures import CHANNEL_GONE
from async_task_api_worker.transports.rabbitmq.watch import ChannelWatch

__all__ = ["LATE_SETTLE_WINDOW_S", "TIMEOUT_TOLERANCE_S", "Consumer"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: A delivery held this close to the consumer timeout when the broker cancels the consumer is
#: taken as timed out (the broker's timer and ours do not start at the same instant).
TIMEOUT_TOLERANCE_S: Final = 1.0
#: A cancel that comes this soon after a delivery held past the timeout was settled is that
#: delivery's timeout: a handler that blocked the event loop ends, and is settled, before the
#: loop reads the cancel the broker sent meanwhile.
LATE_SETTLE_WINDOW_S: Final = 5.0
#: How long a ``basic.cancel`` at the worker's stop may take, in seconds.
_CANCEL_TIMEOUT_S: Final = 4.0


class Consumer:
    """The consumer of the input queue on the consume channel.

    Args:
        queue: the input queue's name.
        watch: the consume channel's watch (its in-flight deliveries, reopens, the give-up).
        on_message: called with each delivery.
        on_cancelled: told of each cancel by the broker, with its cause (``consumer_timeout``,
            or ``other``: the queue was deleted, or a quorum queue's leader moved).

    Attributes:
        tag: the consumer tag while it consumes; ``None`` before, between and after.
        arguments: ``basic.consume``'s arguments (``x-consumer-timeout``), set before starting.
        timeout_s: the consumer timeout asked for in :attr:`arguments`, in seconds, if any.
    """

    def __init__(
        self,
        queue: str,
        watch: ChannelWatch,
        on_message: Callable[[DeliveredMessage], Coroutine[Any, Any, None]],
        on_cancelled: Callable[[CancelCause], object],
    ) -> None:
        self._queue = queue
        self._watch = watch
        self._on_message = on_message
        self._on_cancelled = on_cancelled
        self._channel: AbstractRobustChannel | None = None
        self._wanted = False
        self._restarting: asyncio.Task[None] | None = None
        self._held_past_at = -LATE_SETTLE_WINDOW_S  # when one held past the timeout settled
        self.tag: str | None = None
        self.arguments: dict[str, Any] | None = None
        self.timeout_s: float | None = None

    def attach(self, channel: AbstractRobustChannel) -> None:
        """Follow ``channel``'s reopens: the consumer starts again on each (once started)."""
        self._channel = channel
        channel.reopen_callbacks.add(self._reopened)

    async def start(self) -> None:
        """``basic.consume``; again once the channel reopens if the broker closes it meanwhile.

        Raises:
            BrokerUnavailableError: the channel kept closing (the transport gave up).
            TransportError: stopped meanwhile.
        """
        self._wanted = True
        while self.tag is None:
            try:
                await self._consume()
            except CHANNEL_GONE as exc:
                channel = self._channel
                if channel is not None and channel.is_closed:
                    self._watch.reopened.clear()  # its reopen (or the give-up) sets it
                if self._watch.gave_up is not None:
                    raise self._watch.gave_up from exc
                if self._watch.stopping:
                    raise TransportError("stopped while the consumer started") from exc
                _logger.info(
                    "The consume channel closed while the consumer started (%s); starting it "
                    "again once the channel reopens",
                    type(exc).__name__,
                )
                await self._watch.reopened.wait()  # the reopen starts it (_reopened)

    async def _consume(self) -> None:
        assert self._channel is not None  # noqa: S101 - attach() comes first
        client = await self._channel.get_underlay_channel()
        if self._broker_cancelled not in client.on_consumer_cancel_callbacks:
            client.on_consumer_cancel_callbacks.add(self._broker_cancelled)
        # A new tag each time (one is never used twice), naming the host and process: an
        # operator finds it where consumers are listed, and ``inspect`` names a silent one.
        tag = consumer_tag(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:12])
        ok = await client.basic_consume(
            self._queue, self._on_message, arguments=self.arguments, consumer_tag=tag
        )
        self.tag = ok.consumer_tag

    async def _reopened(self, _sender: object) -> None:
        # A reopened channel has no consumer: the old tag went with the old channel.
        self.tag = None
        if self._wanted and not self._watch.stopping:
            try:
                await self._consume()
            except Exception as exc:  # the channel closed again: its next reopen tries again
                _logger.info("The consumer could not start on the reopened channel (%s)", exc)
                return
        self._watch.reopened_again(_sender)

    def settled(self, delivery: RabbitDelivery) -> None:
        """Forget ``delivery``, settled now (its first settle).

        One held past the timeout is noted: see :data:`LATE_SETTLE_WINDOW_S`.
        """
        self._watch.in_flight.discard(delivery)
        if self._held_past(delivery, now := time.monotonic()):
            self._held_past_at = now

    def _held_past(self, delivery: RabbitDelivery, now: float) -> bool:
        timeout_s = self.timeout_s
        return timeout_s is not None and now - delivery.received_at >= (
            timeout_s - TIMEOUT_TOLERANCE_S
        )

    def _broker_cancelled(self, frame: aiormq.spec.Basic.Cancel) -> None:
        if self._watch.stopping:
            return  # our own stop's
        tag = frame.consumer_tag
        now = time.monotonic()
        # RabbitMQ 4.3 times out each delivery of a cancelled consumer on its own, and says so
        # with another basic.cancel of the old tag: the consumer of today is not touched then.
        timed_out = [
            d for d in self._watch.in_flight if d.consumer_tag == tag and self._held_past(d, now)
        ]
        current = tag == self.tag
        if not current and not timed_out:
            return  # an older consumer's, with nothing of it left to withdraw
        late = current and now - self._held_past_at < LATE_SETTLE_WINDOW_S
        cause = CancelCause.CONSUMER_TIMEOUT if timed_out or late else CancelCause.OTHER
        self._watch.withdraw(
            timed_out, "held past the consumer timeout; the broker requeued the delivery"
        )
        _logger.warning(
            "The broker cancelled %s consumer of %s (%s); %d deliveries held past it were "
            "requeued by the broker and their handlers stopped, %d others run on%s",
            "the" if current else "an earlier",
            self._queue,
            f"a consumer timeout of {self.timeout_s:g} s"
            if cause is CancelCause.CONSUMER_TIMEOUT
            else "not a consumer timeout: the queue was deleted, or its leader moved",
            len(timed_out),
            len(self._watch.in_flight),
            "; consuming again with a new consumer tag" if current else "",
        )
        self._on_cancelled(cause)
        if current:
            self.tag = None
            self._restarting = asyncio.get_running_loop().create_task(self._again())

    async def _again(self) -> None:
        try:
            await self.start()
        except Exception as exc:
            # The channel closes then (a queue that is gone: 404; 4.3 closes the connection
            # for a quorum queue being deleted, 541): its reopen declares the queue again and
            # starts the consumer, or the watch gives up.
            _logger.info("Consuming again after the broker's cancel failed (%s)", exc)

    async def stop(self) -> None:
        """``basic.cancel`` of the consumer, within 4 s.

        Its errors are swallowed: the worker is stopping, and the broker requeues what it
        hands out after, when the connection closes.
        """
        self._wanted = False
        tag, self.tag = self.tag, None
        if tag is None or self._channel is None:
            return
        try:
            client = await asyncio.wait_for(
                self._channel.get_underlay_channel(), timeout=_CANCEL_TIMEOUT_S
            )
            await client.basic_cancel(tag, timeout=_CANCEL_TIMEOUT_S)
        except (TimeoutError, *CHANNEL_GONE, aiormq.exceptions.AMQPError):
            return
