"""Declaring the worker's queues and control exchange the way the platform expects.

Source: seed "Running a worker": the queues are declared durable and with no arguments, so that
the broker decides their type and policies. Retries need a delivery count, which only quorum
queues keep (RabbitMQ sets ``x-delivery-count`` on them); classic queues only set
``redelivered``. The control exchange, where clients publish cancel requests, is declared alike
by workers and clients (docs/protocol.md, "Cancelling a task").
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

import aiormq
from aio_pika import ExchangeType
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractQueue

from async_task_api_worker.protocol.cancel import (
    CONTROL_EXCHANGE_AUTO_DELETE,
    CONTROL_EXCHANGE_DURABLE,
    CONTROL_EXCHANGE_TYPE,
)

__all__ = [
    "declare_control_exchange",
    "declare_queue",
    "inequivalent_argument",
    "queue_argument",
    "queue_type",
]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: RabbitMQ's words for a repeated declare whose arguments differ from the queue's (3.10, 4.0):
#: ``inequivalent arg 'x-max-length' for queue 'q' in vhost 'v': received none but current is
#: the value '10' of type 'byte'``. A queue whose type came from its vhost's default type
#: (``add_vhost --default-queue-type classic``) words it without a type: ``received 'quorum'
#: but current is 'classic'``.
_INEQUIVALENT: Final = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for queue '.*' in vhost '.*': received .* but current "
    r"is (?:the value '(?P<value>.*)' of type '(?P<type>[a-z]+)'|'(?P<bare>[^']*)'|none)"
)
_INTEGER_TYPES: Final = frozenset(
    {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort", "unsignedint"}
)
#: Arguments a queue can carry; past this many, the type is not worth learning.
_MAX_ARGUMENTS: Final = 16


def inequivalent_argument(reply: str) -> tuple[str, Any] | None:
    """The argument a ``PRECONDITION_FAILED`` reply names, and the queue's own value of it.

    Returns:
        ``(name, value)``, ``value`` being ``None`` when the queue has no such argument; or
        ``None`` when ``reply`` is not about an inequivalent argument.
    """
    match = _INEQUIVALENT.search(reply)
    if match is None:
        return None
    value: Any = match["bare"] if match["value"] is None else match["value"]
    if value is not None and match["type"] in _INTEGER_TYPES:
        try:
            value = int(value)
        except ValueError:
            return None
    return match["arg"], value


async def declare_queue(channel: AbstractChannel, name: str) -> AbstractQueue:
    """Declare ``name`` durable with no arguments, on ``channel``.

    A queue that already exists with arguments (a quorum queue in a vhost whose default type is
    classic, a max length, a dead-letter exchange...) makes RabbitMQ refuse a plain declare
    (``PRECONDITION_FAILED - inequivalent arg ...``) and close the channel; the queue is then
    used as the platform made it, declared passively, and the log names the argument.
    """
    try:
        return await channel.declare_queue(name, durable=True)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        _logger.info(
            "Queue %s exists with arguments this worker does not declare; using it as it is "
            "(the broker: %s)",
            name,
            str(exc)[:300],
        )
        if channel.is_closed:
            await channel.reopen()
        return await channel.declare_queue(name, passive=True)


async def declare_control_exchange(channel: AbstractChannel, name: str) -> AbstractExchange:
    """Declare the cancel requests' exchange ``name``: fanout, durable, not auto-delete, no args.

    The flags are ``protocol.cancel``'s (``CONTROL_EXCHANGE_*``), which the AsyncAPI document
    states too.

    Workers and clients both declare it, with exactly these flags, so that whichever comes first
    makes it and the other's declare agrees (a declare with other flags would fail with
    ``PRECONDITION_FAILED`` and close the channel). Durable, so that a client may cancel before
    any worker started, and the exchange outlives a broker restart.

    Raises:
        aiormq.exceptions.ChannelPreconditionFailed: the exchange exists with another type or
            other flags.
        aiormq.exceptions.ChannelAccessRefused: the user may not configure it.
    """
    return await channel.declare_exchange(
        name,
        ExchangeType(CONTROL_EXCHANGE_TYPE),
        durable=CONTROL_EXCHANGE_DURABLE,
        auto_delete=CONTROL_EXCHANGE_AUTO_DELETE,
    )


async def queue_type(connection: AbstractConnection, name: str) -> str:
    """The type of the existing queue ``name``: ``quorum``, ``classic``, ``stream``...

    AMQP does not report a queue's type: it is read as :func:`queue_argument` reads any
    argument (none means classic); ``unknown`` when the broker does not say.
    """
    try:
        value = await queue_argument(connection, name, "x-queue-type", "quorum")
    except LookupError:
        return "unknown"
    return str(value or "classic")


async def queue_argument(
    connection: AbstractConnection, name: str, argument: str, guess: Any
) -> Any:
    """The existing queue ``name``'s own value of ``argument``; ``None``: it has none.

    AMQP does not report a queue's arguments, but RabbitMQ compares the arguments of a repeated
    declare with the queue's own and names the first that differs, with the queue's value. So
    the queue is declared again with ``argument: guess`` plus each argument it turns out to
    have, on throwaway channels, until the broker either agrees (the queue's value is
    ``guess``) or names ``argument`` itself.

    Raises:
        LookupError: the broker refused the declare for another reason, or named too many
            arguments.
    """
    arguments: dict[str, Any] = {argument: guess}
    for _ in range(_MAX_ARGUMENTS):
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            named = inequivalent_argument(str(exc))
            if named is None:
                raise LookupError(f"{name!r}: {exc}") from exc
            other, value = named
            if other == argument:
                return value
            if value is None:
                arguments.pop(other, None)
            else:
                arguments[other] = value
            continue
        finally:
            if not channel.is_closed:
                await channel.close()
        return guess
    raise LookupError(f"{name!r}: more than {_MAX_ARGUMENTS} arguments differ")
