"""Declaring the worker's queues the way the platform expects, and learning their type.

Source: seed "Running a worker": the queues are declared durable and with no arguments, so that
the broker decides their type and policies. Retries need a delivery count, which only quorum
queues keep (RabbitMQ sets ``x-delivery-count`` on them); classic queues only set
``redelivered``.
"""

from __future__ import annotations

import logging

import aiormq
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

__all__ = ["declare_queue", "is_quorum_queue"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")


async def declare_queue(
    connection: AbstractRobustConnection, channel: AbstractChannel, name: str
) -> AbstractQueue:
    """Declare ``name`` durable with no arguments, on ``channel``.

    RabbitMQ refuses a plain declare of an existing quorum queue in a vhost whose default queue
    type is classic (``PRECONDITION_FAILED - inequivalent arg 'x-queue-type'``) and closes the
    channel; the queue then exists as the platform made it, so it is declared passively instead.
    """
    try:
        return await channel.declare_queue(name, durable=True)
    except aiormq.exceptions.ChannelPreconditionFailed:
        _logger.info("Queue %s exists with other arguments; using it as it is", name)
        if channel.is_closed:
            await channel.reopen()
        return await channel.declare_queue(name, passive=True)


async def is_quorum_queue(connection: AbstractRobustConnection, name: str) -> bool:
    """Whether the existing queue ``name`` is a quorum queue.

    AMQP does not report a queue's type, but RabbitMQ compares the arguments of a repeated
    declare with the queue's own: re-declaring with ``x-queue-type: quorum`` is a no-op on a
    quorum queue and a ``PRECONDITION_FAILED`` on any other (a throwaway channel takes the hit).
    """
    channel = await connection.channel()
    try:
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    except aiormq.exceptions.ChannelPreconditionFailed:
        return False
    finally:
        if not channel.is_closed:
            await channel.close()
    return True
