"""Receiving cancel requests: a queue of this worker's own on the service's control exchange.

docs/protocol.md, "Cancelling a task": clients publish cancel requests to a fanout exchange
(``<service>_control``, ``CONTROL_EXCHANGE_NAME``). Each worker declares it as clients do
(``topology.declare_control_exchange``), and binds to it an exclusive, auto-delete queue of
its own (``<exchange>.<random>``: a name the broker chose, ``amq.gen-...``, could not be
declared again after a reconnect): every worker gets every cancel, and the queue goes with the
worker's connection. On a reconnect, aio-pika's robust channel declares the queue again, binds
it again and consumes again, in that order, before the channel is used; a cancel published
while the worker was away is not in it (the window docs/protocol.md names).

An operator's ``inspect`` request comes the same way, told apart by its AMQP ``type`` property
(``protocol.inspect``); its answer goes to the request's direct reply-to address alone, on this
channel, unconfirmed (a lost answer is a worker named as not answering).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from async_task_api_worker.protocol.inspect import INSPECT_REPLY_TYPE, INSPECT_TYPE, REPLY_TO
from async_task_api_worker.transports.rabbitmq.topology import declare_control_exchange

__all__ = ["Control", "listen_for_cancels"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: The most cancel requests taken unprocessed at once (they are handled as they arrive).
_PREFETCH = 100


@dataclass
class Control:
    """What a worker does with its control messages.

    Attributes:
        consumer_tag: this worker's consumer tag on its input queue now, or ``None``.
        cancel: takes each cancel request's body (every message but an ``inspect``).
        inspect: takes an inspect request's body and the consumer tag, and gives the answer's
            body, or ``None`` to give none; ``None``: inspect requests are read as cancels.
    """

    consumer_tag: Callable[[], str | None]
    cancel: Callable[[bytes], object] | None = None
    inspect: Callable[[bytes, str | None], bytes | None] | None = None


async def _answer(
    channel: AbstractChannel, message: AbstractIncomingMessage, control: Control
) -> None:
    reply_to = message.reply_to or ""
    if control.inspect is None:
        return
    if not reply_to.startswith(f"{REPLY_TO}."):
        # Only to a direct reply-to address: whoever may publish here could otherwise have
        # every worker publish into any queue (the output queue, say).
        _logger.warning("An inspect request without a direct reply-to address was dropped")
        return
    body = control.inspect(message.body, control.consumer_tag())
    if body is None:
        return
    reply = aio_pika.Message(
        body,
        content_type="application/json",
        content_encoding="utf-8",
        correlation_id=message.correlation_id,
        type=INSPECT_REPLY_TYPE,
    )
    with contextlib.suppress(Exception):  # the operator is gone: nobody waits for it
        await channel.default_exchange.publish(reply, routing_key=reply_to)


async def listen_for_cancels(
    connection: AbstractRobustConnection, exchange: str, control: Control
) -> AbstractChannel:
    """Declare ``exchange`` and this worker's queue on it; hand each message to ``control``.

    Its handlers run on the event loop and must not raise (the engine's never does); the
    messages are taken without acks: a cancel is worth nothing once its worker is gone.

    Returns:
        The channel, which lives as long as ``connection`` (close it to stop listening).

    Raises:
        aiormq.exceptions.AMQPError: the broker refused the declare or the bind (an exchange
            of that name exists with another type, or the user may not configure it).
    """
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=_PREFETCH)
    fanout = await declare_control_exchange(channel, exchange)
    queue = await channel.declare_queue(
        f"{exchange}.{uuid.uuid4().hex[:12]}", exclusive=True, auto_delete=True
    )
    await queue.bind(fanout)

    async def on_message(message: AbstractIncomingMessage) -> None:
        if message.type == INSPECT_TYPE and control.inspect is not None:
            await _answer(channel, message, control)
        elif control.cancel is not None:
            control.cancel(message.body)

    await queue.consume(on_message, no_ack=True)
    _logger.info("Listening for cancel requests on exchange %s", exchange)
    return channel
