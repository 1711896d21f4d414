"""aio-pika and aiormq exceptions, translated into the SDK's (``raise ... from exc``)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import aiormq
from aio_pika.exceptions import ChannelInvalidStateError
from yarl import URL

from async_task_api_worker.errors import (
    BrokerRefusedError,
    PublishError,
    SettleError,
    TransportError,
)

__all__ = [
    "CHANNEL_GONE",
    "connect_failure",
    "is_refusal",
    "publish_errors",
    "refused",
    "settle_errors",
    "setup_error",
    "size_limit_of",
]

#: What a broker operation can raise when the connection or channel is gone or the broker says
#: no: aiormq's protocol errors, a stale channel, the socket itself, or a confirm timeout.
_BROKER_FAILURES = (
    aiormq.exceptions.AMQPError,
    ChannelInvalidStateError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
    RuntimeError,  # aio-pika: "<Connection ...> closed" while a channel reopens
)

#: What starting a consumer raises when its channel or connection closes meanwhile: a robust
#: channel reopens, and the consumer can start again on it. RabbitMQ also closes the connection
#: with ``INTERNAL_ERROR`` (a ``ConnectionClosed``) when a quorum queue's leader does not answer
#: a ``basic.consume`` in time, which happens on a loaded machine.
CHANNEL_GONE = (
    aiormq.exceptions.ChannelClosed,
    aiormq.exceptions.AMQPConnectionError,
    ChannelInvalidStateError,
    ConnectionError,
)

#: What aiormq raises for credentials the broker refused at login.
_LOGIN_REFUSALS = (
    aiormq.exceptions.ProbableAuthenticationError | aiormq.exceptions.AuthenticationError
)


def connect_failure(exc: BaseException) -> str:
    """What a failed connect says in a log line: the exception's type, and the system's reason.

    aiormq wraps the socket's error (``AMQPConnectionError`` around ``ConnectionRefusedError``),
    whose ``errno`` says why (``Connection refused``, ``Name or service not known``); an exception
    with no such cause is its type alone.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and isinstance(seen.errno, int) and seen.errno:
            # A resolver's error (socket.gaierror) has a negative errno and its own words.
            why = os.strerror(seen.errno) if seen.errno > 0 else seen.strerror
            return f"{type(exc).__name__}: {why}"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def is_refusal(exc: BaseException) -> bool:
    """Whether a failure to connect or to set up the queues is a refusal (no retry can help).

    ``ACCESS_REFUSED`` on login arrives as ``ProbableAuthenticationError``; a vhost we may not
    open closes the connection instead of answering ``Connection.OpenOk``, which aiormq reports
    as ``InvalidFrameError``; a queue the user may not declare closes the channel with
    ``ACCESS_REFUSED`` (``ChannelAccessRefused``, or that text in whatever aio-pika raises for
    the closed channel).
    """
    return isinstance(
        exc, _LOGIN_REFUSALS | aiormq.exceptions.InvalidFrameError
    ) or "ACCESS_REFUSED" in str(exc)


_SIZE_REFUSAL = re.compile(r"message size \d+ is larger than configured max size (\d+)")


def size_limit_of(exc: BaseException | None) -> int | None:
    """The broker's ``max_message_size``, when it closed the channel for a message over it.

    RabbitMQ answers ``PRECONDITION_FAILED - message size 2000000 is larger than configured
    max size 1048576`` (3.10 and 4.0), which aiormq raises as ``ChannelPreconditionFailed`` for
    every publish waiting on that channel: the caller compares its own size with the limit.
    """
    if not isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return None
    match = _SIZE_REFUSAL.search(str(exc))
    return int(match.group(1)) if match else None


def refused(exc: BaseException, url_for_logs: str) -> BrokerRefusedError:
    """The error to raise for a refusal (:func:`is_refusal`).

    It names the broker without its password and, for a vhost, gives the command that grants
    access to it.
    """
    broker = f"the broker at {url_for_logs}"
    if isinstance(exc, aiormq.exceptions.InvalidFrameError):
        vhost, user = _vhost_and_user(url_for_logs)
        # aiormq keeps no reply text here (RabbitMQ sends "vhost not found" or "access to vhost
        # refused"), so the two causes are named together.
        return BrokerRefusedError(
            f"access to vhost {vhost!r} was refused for user {user!r} by {broker}: the vhost "
            "does not exist, or the user has no permissions on it (rabbitmqctl set_permissions "
            f"-p {shlex.quote(vhost)} {shlex.quote(user)} '.*' '.*' '.*')"
        )
    if isinstance(exc, _LOGIN_REFUSALS):
        return BrokerRefusedError(
            f"{broker} refused the credentials: check the user and password in BROKER_URL "
            f"({type(exc).__name__})"
        )
    # ACCESS_REFUSED to a queue: the broker's text names it, the vhost and the user.
    return BrokerRefusedError(f"{broker} refused access: {exc}")


def _vhost_and_user(url: str) -> tuple[str, str]:
    """The vhost and user aiormq logs in with for ``url`` (its defaults: ``/``, ``guest``)."""
    try:
        parsed = URL(url)
    except ValueError:
        return "?", "?"
    return parsed.path[1:] or "/", parsed.user or "guest"


def setup_error(exc: BaseException, url_for_logs: str) -> BrokerRefusedError | TransportError:
    """The error to raise when the channels or queues of a new connection could not be set up.

    A refusal (:func:`is_refusal`) gives :func:`refused`'s error; anything else a
    :class:`TransportError` naming the failure's type.
    """
    if is_refusal(exc):
        return refused(exc, url_for_logs)
    return TransportError(f"could not set up the queues: {type(exc).__name__}")


@contextmanager
def _translated(error: type[PublishError | SettleError], what: str, failed: str) -> Iterator[None]:
    try:
        yield
    except _BROKER_FAILURES as exc:
        raise error(f"{what} {failed}: {type(exc).__name__}") from exc
    except Exception as exc:
        if type(exc) is not Exception:
            raise
        # aiormq fails the futures still pending on a channel it closes with a bare Exception
        # (FutureStore.reject_all(None)): a confirm that never came, not a bug of ours.
        raise error(f"{what} {failed}: its channel closed") from exc


def publish_errors(what: str) -> AbstractContextManager[None]:
    """Raise :class:`PublishError` from any broker failure while publishing ``what``."""
    return _translated(PublishError, what, "was not confirmed")


def settle_errors(what: str) -> AbstractContextManager[None]:
    """Raise :class:`SettleError` from any broker failure while settling (``what``)."""
    return _translated(SettleError, what, "did not reach the broker")
