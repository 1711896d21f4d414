"""The consume channel's closes: its in-flight deliveries withdrawn, and when to give up.

When a channel closes (connection loss, consumer timeout, a precondition failure) the broker
requeues its unacked deliveries itself. Their handlers are cancelled, since another attempt is
already on its way, and they are never acked or nacked on the reopened channel (their delivery
tags belong to the dead one). aio-pika's robust channel reopens, and the consumer starts again
on it (``consumer``); if the broker keeps closing it on a live connection, or does not let it
reopen, the watch gives up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

import aiormq

from async_task_api_worker.errors import BrokerUnavailableError, TransportError
from async_task_api_worker.transports.rabbitmq.delivery import RabbitDelivery

__all__ = [
    "CHANNEL_FAILURE_WINDOW_S",
    "MAX_CHANNEL_FAILURES",
    "REOPEN_TIMEOUT_S",
    "ChannelWatch",
    "GaveUp",
]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: The consume channel may close this many times within :data:`CHANNEL_FAILURE_WINDOW_S`
#: before the transport gives up (a broker that keeps closing it will not get better).
MAX_CHANNEL_FAILURES: Final = 5
CHANNEL_FAILURE_WINDOW_S: Final = 60.0
#: A consume channel the broker closed on a live connection reopens in milliseconds; one not
#: back after this many seconds will not be (aio-pika gives up a restore the broker refuses,
#: an exclusive consumer or a lost permission): the transport gives up rather than sit idle.
REOPEN_TIMEOUT_S: Final = 30.0


class GaveUp:
    """The watch gave up: what :meth:`RabbitMQTransport.deliveries` raises."""

    def __init__(self, error: TransportError) -> None:
        self.error = error


class ChannelWatch:
    """The in-flight deliveries of the consume channel, and its closes and reopens.

    Args:
        queue_name: the input queue (for the log).
        reopen_timeout_s: how long a closed channel may take to reopen (:data:`REOPEN_TIMEOUT_S`).
        connected: whether the consuming connection is open right now.
        gave_up: told once the watch gives up.

    Attributes:
        in_flight: the deliveries received and not settled yet.
        open: whether the channel is open (the consumer starts again before it says so).
        reopened: set while the channel is open.
        stopping: set by the transport's own stop: a close is then not a failure.
        gave_up: why the watch gave up, once it has.
    """

    def __init__(
        self,
        queue_name: str,
        reopen_timeout_s: float,
        *,
        connected: Callable[[], bool],
        gave_up: Callable[[GaveUp], None],
    ) -> None:
        self._queue_name = queue_name
        self._reopen_timeout_s = reopen_timeout_s
        self._connected = connected
        self._tell = gave_up
        self._channel_failures: list[float] = []
        self.in_flight: set[RabbitDelivery] = set()
        self.open = True
        self.reopened = asyncio.Event()
        self.reopened.set()
        self.stopping = False
        self.gave_up: BrokerUnavailableError | None = None

    def closed(self, _sender: object, exc: BaseException | None) -> None:
        """aio-pika's close callback of the channel."""
        try:
            self._withdraw_in_flight(exc)
        except Exception:  # never let a bookkeeping error stop aio-pika's own close handling
            _logger.exception("Could not withdraw the in-flight deliveries")

    def _withdraw_in_flight(self, exc: BaseException | None) -> None:
        if self.stopping or not self.open:  # our own shutdown, or a repeat
            return
        self.open = False
        self.reopened.clear()
        lost = list(self.in_flight)
        self.withdraw(lost, "the channel closed; the broker requeued the delivery")
        _logger.warning(
            "The consume channel closed (%s); %d in-flight deliveries were given back by the "
            "broker (requeued, or gone with a deleted queue) and their handlers stopped; the "
            "channel reopens",
            type(exc).__name__ if exc else "closed",
            len(lost),
        )
        if (
            isinstance(exc, aiormq.exceptions.AMQPConnectionError | ConnectionError)
            or not self._connected()
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

    def withdraw(self, deliveries: Iterable[RabbitDelivery], why: str) -> None:
        """Withdraw ``deliveries``, which the broker requeued.

        They are never reported on or settled again, and their handlers are stopped (``why`` is
        their cancel's reason).
        """
        for delivery in list(deliveries):
            self.in_flight.discard(delivery)
            delivery.lost = True
            delivery.cancel_token.cancel(why)

    def _check_reopened(self, closed_at: float) -> None:
        # Still closed since that close (the last), on a live connection: the restore failed.
        if (
            self.open
            or self.stopping
            or self.gave_up is not None
            or not self._connected()
            or self._channel_failures[-1:] != [closed_at]
        ):
            return
        self._give_up(
            f"the consume channel did not reopen within {self._reopen_timeout_s:g} s of its "
            "close (the broker refused to restore the consumer); giving up"
        )

    def _give_up(self, why: str) -> None:
        self.gave_up = BrokerUnavailableError(why)
        _logger.error("%s", why)
        self._tell(GaveUp(self.gave_up))
        self.reopened.set()  # a consumer waiting to start learns it here

    def reopened_again(self, _sender: object) -> None:
        """aio-pika's reopen callback of the channel."""
        self.open = True
        self.reopened.set()
        _logger.info("The consume channel reopened; consuming %s again", self._queue_name)
