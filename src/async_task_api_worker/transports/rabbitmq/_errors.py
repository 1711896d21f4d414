"""aio-pika and aiormq exceptions, translated into the SDK's (``raise ... from exc``)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import aiormq
from aio_pika.exceptions import ChannelInvalidStateError

from async_task_api_worker.errors import (
    BrokerRefusedError,
    PublishError,
    SettleError,
)

__all__ = ["is_refusal", "publish_errors", "settle_errors", "size_limit_of"]

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


def is_refusal(exc: BaseException) -> bool:
    """Whether a connection failure is the broker refusing us (retrying cannot help).

    ``ACCESS_REFUSED`` on login arrives as ``ProbableAuthenticationError``; a vhost we may not
    open closes the connection instead of answering ``Connection.OpenOk``, which aiormq reports
    as ``InvalidFrameError``.
    """
    return isinstance(
        exc,
        aiormq.exceptions.ProbableAuthenticationError
        | aiormq.exceptions.AuthenticationError
        | aiormq.exceptions.InvalidFrameError,
    )


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
    """The error to raise for a refusal, naming the broker without its password."""
    if isinstance(exc, aiormq.exceptions.InvalidFrameError):
        why = (
            "would not open the vhost: it does not exist, or the user has no permissions on it "
            "(rabbitmqctl set_permissions -p VHOST USER '.*' '.*' '.*')"
        )
    else:
        why = "refused the credentials: check the user and password in BROKER_URL"
    return BrokerRefusedError(f"the broker at {url_for_logs} {why} ({type(exc).__name__})")


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
