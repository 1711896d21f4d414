"""Telling a reject from an ack: a dead-letter target of the kit's own on the input queue.

Only the broker sees whether a worker acked a delivery or rejected it. A rejected message
(``basic.reject``, or ``basic.nack`` without requeue) is dead-lettered when its queue has a
dead-letter exchange, with the header ``x-first-death-reason`` ``rejected``; an acked one
never is. So for part of a case the kit gives the worker's input queue a dead-letter exchange
of its own, through a policy (``Admin.dead_letter``), with a queue of its own bound to it, and
reads what arrives there. A quorum queue dead-letters at most once by default
(``dead-letter-strategy`` ``at-most-once``), which needs nothing more of the queue.

The policy outranks the platform's own (priority 999) and replaces it while it is in force: a
queue follows one policy. It takes no effect when the queue was declared with an
``x-dead-letter-exchange`` argument (an argument outranks any policy): so the kit first reads
that argument (as ``topology.queue_argument`` reads arguments) and, when the queue has one,
binds its queue to that exchange instead, with the routing key the broker dead-letters with,
for the block (the canaries, and the bodies the worker rejects then, also reach whatever the
platform bound there). Before anything else the kit rejects a canary of its own, taken from
the input queue ahead of the worker (as ``Wire.borrow`` does), until one arrives there: only
then is the target known to be in place.

The exchange and the queue have one fixed name, :data:`DEAD_LETTERS` (as the policy has), so
that the start of every run removes what a killed run left (:func:`remove_leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import AMQPError

from async_task_api_worker.conformance.admin import Admin, AdminError, release_at_end
from async_task_api_worker.conformance.wire import BORROW_PRIORITY, Wire
from async_task_api_worker.transports.rabbitmq.topology import queue_argument

__all__ = ["DEAD_LETTERS", "DeadLetters", "dead_letter_target", "remove_leftovers"]

#: The name of the kit's dead-letter exchange and of its queue, in every run.
DEAD_LETTERS: Final = "atw-conformance-dead"
_CANARY_ID: Final = "conformance-kit-canary"


@dataclass
class DeadLetters:
    """What reached the kit's dead-letter target.

    Attributes:
        arrived: each body, with the reason the broker gave (``rejected`` for a reject).
        missing: why the target is not in place (empty: it is).
        own: the input queue's own dead-letter exchange the kit's queue is bound to (empty:
            the kit's policy is in force).
        stop: ends the kit's consumer of its queue, once it consumes.
    """

    arrived: dict[bytes, str | None] = field(default_factory=dict)
    missing: str = ""
    own: str = ""
    stop: Callable[[], Awaitable[object]] | None = None
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    async def take(self, message: AbstractIncomingMessage) -> None:
        """Keep a dead-lettered message (the consumer's callback)."""
        reason = (message.headers or {}).get("x-first-death-reason")
        self.arrived[message.body] = reason if isinstance(reason, str) else None
        self._event.set()

    async def wait_for(self, bodies: Iterable[bytes], timeout_s: float) -> bool:
        """Wait until each of ``bodies`` arrived, or the timeout; whether they all did."""
        wanted = set(bodies)
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.arrived.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), left)
        return True


@contextlib.asynccontextmanager
async def dead_letter_target(wire: Wire, admin: Admin) -> AsyncIterator[DeadLetters]:
    """The kit's dead-letter target on ``wire``'s input queue, for the ``async with`` block.

    The kit's exchange and queue are named :data:`DEAD_LETTERS`. When the target could not be
    put in place, :attr:`DeadLetters.missing` says why and the block runs all the same. The
    policy, the exchange and the queue are removed when the block ends, whatever happens (the
    policy as :func:`~async_task_api_worker.conformance.admin.release_at_end` does).
    """
    name = DEAD_LETTERS
    letters = DeadLetters()
    unbind: Callable[[], Awaitable[object]] | None = None
    asked = False  # for the policy
    channel = await wire.connection.channel()
    try:
        try:
            exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.FANOUT)
            # Exclusive, so classic whatever the vhost's default type.
            queue = await channel.declare_queue(
                name, exclusive=True, arguments={"x-queue-type": "classic"}
            )
            await queue.bind(exchange)
            letters.stop = functools.partial(
                queue.cancel, await queue.consume(letters.take, no_ack=True)
            )
            bound = await _bind_own(wire, queue)
            if bound is None:
                asked = True
                await admin.dead_letter(wire.in_queue, name)
            else:
                unbind = functools.partial(queue.unbind, *bound)
                letters.own = bound[0]
            if not await _canary(wire, letters):
                letters.missing = (
                    f"a message the kit rejected was not dead-lettered within "
                    f"{wire.timeout_s:.0f} s (to {letters.own or name!r})"
                )
        except (AdminError, AMQPError, LookupError) as exc:
            letters.missing = f"the dead-letter target could not be set up: {exc}"[:300]
        yield letters
    finally:
        await release_at_end(admin, was_set=asked)
        # The exclusive queue would live as long as the kit's connection: deleted now, its
        # consumer first (the broker would cancel it, and the client say so on stderr).
        with contextlib.suppress(AMQPError):
            if letters.stop is not None and not channel.is_closed:
                await letters.stop()
            if unbind is not None and not channel.is_closed:
                await unbind()
            if channel.is_closed:  # a declaration refused closed it
                channel = await wire.connection.channel()
            await channel.queue_delete(name)
            await channel.exchange_delete(name)
            await channel.close()


async def remove_leftovers(wire: Wire) -> None:
    """Delete the kit's dead-letter queue and exchange, if a killed run left them.

    The queue is exclusive, so the broker dropped it with the killed kit's connection; the
    exchange stays until deleted. Neither is in use between cases: a failure is ignored (the
    case that needs the target says what it could not set up).
    """
    with contextlib.suppress(AMQPError):
        channel = await wire.connection.channel()
        try:
            await channel.queue_delete(DEAD_LETTERS)
            await channel.exchange_delete(DEAD_LETTERS)
        finally:
            if not channel.is_closed:
                await channel.close()


async def _bind_own(wire: Wire, queue: aio_pika.abc.AbstractQueue) -> tuple[str, str] | None:
    """Bind ``queue`` to the input queue's own dead-letter exchange; ``(exchange, key)``.

    The key is the queue's ``x-dead-letter-routing-key``, else the one the kit publishes with
    (the queue's name). ``None``: the queue has no such argument, or the broker did not tell.

    Raises:
        AMQPError: the exchange does not exist.
    """
    probe = "atw-conformance-probe"
    try:
        own = await queue_argument(wire.connection, wire.in_queue, "x-dead-letter-exchange", probe)
    except LookupError:
        return None
    if not own:
        return None
    key = await queue_argument(wire.connection, wire.in_queue, "x-dead-letter-routing-key", probe)
    binding = (str(own), str(key or wire.in_queue))
    await queue.bind(*binding)
    return binding


async def _canary(wire: Wire, letters: DeadLetters) -> bool:
    """Reject canaries from the input queue until one reaches ``letters``; whether one did.

    Each is taken ahead of the worker (``x-priority``); the wire's timeout bounds the tries.
    """
    channel = await wire.connection.channel()
    queue = await channel.get_queue(wire.in_queue)
    others: list[AbstractIncomingMessage] = []

    async def on_message(message: AbstractIncomingMessage) -> None:
        if message.message_id == _CANARY_ID:
            await message.reject(requeue=False)
        else:
            others.append(message)  # given back once the canaries end

    tag = await queue.consume(on_message, arguments={"x-priority": BORROW_PRIORITY})
    try:
        deadline = time.monotonic() + wire.timeout_s
        number = 0
        while (left := deadline - time.monotonic()) > 0:
            number += 1
            body = b'{"conformance_kit":"canary %d"}' % number
            await wire.publish(body, message_id=_CANARY_ID)
            if await letters.wait_for([body], min(left, 0.5)):
                return True
        return False
    finally:
        await queue.cancel(tag)
        for message in others:
            await message.nack(requeue=True)
        await channel.close()
