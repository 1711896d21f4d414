"""Receiving cancel requests: a queue of this worker's own on the service's control exchange.

docs/protocol.md, "Cancelling a task": clients publish cancel requests to a fanout exchange
(``<service>_control``, ``CONTROL_EXCHANGE_NAME``). Each worker declares it as clients do
(``topology.declare_control_exchange``), and binds to it an exclusive, auto-delete queue of
its own (``<exchange>.<random>``: a name the broker chose, ``amq.gen-...``, could not be
declared again after a reconnect): every worker gets every cancel, and the queue goes with the
worker's connection. On a reconnect, aio-pika's robust channel declares the queue again, binds
it again and consumes again, in that order, before the channel is used; a cancel published
while the worker was away is not in it (the window docs/protocol.md names).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

__all__ = ["listen_for_cancels"]

from async_task_api_worker.transports.rabbitmq.topology import declare_control_exchange

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: The most cancel requests taken unprocessed at once (they are handled as they arrive).
_PREFETCH = 100


async def listen_for_cancels(
    connection: AbstractRobustConnection, exchange: str, handler: Callable[[bytes], object]
) -> AbstractChannel:
    """Declare ``exchange`` and this worker's queue on it; hand each body to ``handler``.

    ``handler`` runs on the event loop and must not raise (the engine's never does); the
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
        handler(message.body)

    await queue.consume(on_message, no_ack=True)
    _logger.info("Listening for cancel requests on exchange %s", exchange)
    return channel
