"""aio-pika and aiormq exceptions, translated into the SDK's (``raise ... from exc``)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import ssl
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Final

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
    "closed_by_broker",
    "connect_failure",
    "is_refusal",
    "publish_errors",
    "refused",
    "settle_errors",
    "setup_error",
    "size_limit_of",
    "tls_refusal",
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
    """Why a connect failed, in a few words for a log line: the cause, not the wrapper's type.

    aiormq wraps the socket's error in ``AMQPConnectionError`` (``raise ... from`` the
    ``OSError``, or the TLS error); the cause says what happened: ``name not resolved: Name or
    service not known``, ``connection refused``, ``timed out``, ``connection reset by the
    broker``, ``TLS: ...`` (:func:`tls_refusal`'s words when no retry can help). Anything else
    is named by its type.
    """
    why = tls_refusal(exc)
    if why is not None:
        return f"TLS: {why}"
    for seen in _causes(exc):
        if isinstance(seen, socket.gaierror):
            return f"name not resolved: {seen.strerror}"
        if isinstance(seen, ssl.SSLError):
            return f"TLS: {_alert_words(seen)}"
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, ConnectionResetError | BrokenPipeError | asyncio.IncompleteReadError):
            return "connection reset by the broker"
        if isinstance(seen, TimeoutError):  # asyncio's wait, or the system's ETIMEDOUT
            return "timed out"
        if isinstance(seen, aiormq.exceptions.IncompatibleProtocolError):
            return "the broker closed the connection before AMQP began"
        if isinstance(seen, aiormq.exceptions.ConnectionClosed) and seen.strerror:
            # Its errno is the AMQP reply code (320), which os.strerror calls "Unknown error".
            return f"closed by the broker: {seen.errno} {seen.strerror}"
    for seen in _causes(exc):  # no cause of those kinds: the system's words for its errno
        if isinstance(seen, OSError) and isinstance(seen.errno, int) and seen.errno > 0:
            return os.strerror(seen.errno)
    return type(exc).__name__


#: OpenSSL's verify codes of a certificate that does not carry the name connected to
#: (X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH).
_NAME_MISMATCH: Final = frozenset({62, 64})
#: The alerts (OpenSSL's reasons) a broker sends about the client's certificate.
_CLIENT_CERTIFICATE_ALERTS: Final = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    }
)
#: The alerts of a handshake the two sides cannot agree on, whatever the retries.
_HANDSHAKE_REFUSALS: Final = frozenset(
    {
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "TLSV1_ALERT_PROTOCOL_VERSION",
        "TLSV1_ALERT_INSUFFICIENT_SECURITY",
        "UNSUPPORTED_PROTOCOL",
        "NO_PROTOCOLS_AVAILABLE",
    }
)


def tls_refusal(exc: BaseException | None) -> str | None:
    """The TLS failure of a connect that no retry can fix, in words; ``None`` for any other.

    Which: the broker's certificate is not trusted (an unknown CA, self-signed, expired), does
    not carry the name connected to, the broker refused the client certificate (none given
    where it requires one, or one it does not trust), the two sides share no TLS version or
    cipher, or the port does not speak TLS. The words end with what to change (docs/tls.md).
    """
    for seen in _causes(exc):
        if isinstance(seen, ssl.SSLCertVerificationError):
            detail = seen.verify_message or seen.reason
            if seen.verify_code in _NAME_MISMATCH:
                return (
                    f"the broker's certificate does not match the host name ({detail}): connect "
                    "to a name the certificate carries, or give that name with "
                    "?server_name_indication="
                )
            return (
                f"the broker's certificate is not trusted ({detail}): give the CA that signed "
                "it with ?cafile="
            )
        if not isinstance(seen, ssl.SSLError):
            continue
        reason = seen.reason or ""
        if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
            return (
                "the broker refused the connection without a client certificate (mutual TLS): "
                "give one with ?certfile=&keyfile="
            )
        if reason in _CLIENT_CERTIFICATE_ALERTS:
            return (
                f"the broker refused the client certificate ({_alert_words(seen)}): give one "
                "signed by a CA the broker trusts (?certfile=&keyfile=)"
            )
        if reason in _HANDSHAKE_REFUSALS:
            return (
                f"the broker refused the TLS handshake ({_alert_words(seen)}): no TLS version "
                "or cipher in common, or it requires a client certificate (?certfile=&keyfile=)"
            )
        if reason == "WRONG_VERSION_NUMBER":
            return (
                "the port does not speak TLS (an amqps:// URL to a plain AMQP port?): use the "
                "broker's TLS port (5671 by default) or amqp://"
            )
    return None


def closed_by_broker(exc: BaseException) -> bool:
    """Whether the broker reset or closed the connection (after a TLS handshake: see tls.py)."""
    return any(
        isinstance(seen, ConnectionResetError | BrokenPipeError | asyncio.IncompleteReadError)
        for seen in _causes(exc)
    )


def _alert_words(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words: ``TLSV1_ALERT_UNKNOWN_CA`` is ``tlsv1 alert unknown ca``."""
    return (exc.reason or type(exc).__name__).lower().replace("_", " ")


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then its causes (``__cause__``, else ``__context__``), each once (they loop)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


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
