"""TLS to the broker: the one context every connection uses, and why a handshake failed.

An ``amqps://`` URL gets a TLS context from :func:`tls_context`, built from the URL's own query
options, for the worker, ``submit``, ``cancel``, the :class:`~async_task_api_worker.TaskClient`
and the conformance kit alike (docs/tls.md):

- ``cafile``, ``capath``, ``cadata`` (base64 DER): the CAs to trust instead of the system's;
- ``certfile`` and ``keyfile``: the client certificate and its key (mutual TLS);
- ``no_verify_ssl=1``: no verification at all (never in production);
- ``server_name_indication``: the name the broker's certificate must carry and that is sent as
  SNI, when it is not the URL's host (a tunnel, an IP address, a load balancer's own name).

The first five are aiormq's own options, read the way it reads them; the last is the name the
RabbitMQ URI query parameters give it (rabbitmq.com/docs/uri-query-parameters), which aiormq has
no option for. The context is passed to aio-pika, so aiormq builds none of its own.

With TLS 1.3 the broker checks the client certificate after the client's handshake is done: its
refusal (an alert) and the client's first AMQP bytes cross, and the connection is usually reset
before the alert is read. :func:`read_refusal` then opens one more TLS connection that sends
nothing, to read the broker's alert (``failures.tls_refusal`` says what it means).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ssl
from typing import Final

from yarl import URL

from async_task_api_worker.broker_rules import AMQP_PORTS
from async_task_api_worker.errors import SettingsError
from async_task_api_worker.setting_flags import named
from async_task_api_worker.transports.rabbitmq.failures import closed_by_broker, tls_refusal

__all__ = ["TLS_PROBE_WAIT_S", "describe_tls", "read_refusal", "tls_context", "tls_failure"]

#: How long :func:`read_refusal` waits for the broker's alert after the handshake, in seconds.
#: A broker refuses a client certificate as soon as it has checked it, in milliseconds; one that
#: accepted it waits in silence for the AMQP header (its ``handshake_timeout``: 10 s).
TLS_PROBE_WAIT_S: Final = 2.0


class _BrokerContext(ssl.SSLContext):
    """A client context that may check (and send as SNI) another name than the URL's host."""

    server_name: str | None = None

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        # asyncio and uvloop both wrap the socket's data through wrap_bio, with the host.
        if not server_side and self.server_name is not None:
            server_hostname = self.server_name
        return super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)


#: How the errors name the setting (with its flag), as every setting error does.
_SUBJECT: Final = named("BROKER_URL")


def tls_context(url: str) -> ssl.SSLContext | None:
    """The TLS context of a connection to ``url``: ``None`` for ``amqp://``.

    Rule: the system's CAs unless ``cafile``, ``capath`` or ``cadata`` name others; a client
    certificate when ``certfile`` is given (its key in ``keyfile``, else in the same file);
    the host name checked against the certificate, or ``server_name_indication`` instead;
    ``no_verify_ssl=1`` turns every check off.

    Raises:
        SettingsError: a file cannot be read or holds no usable certificate or key; the one-line
            message names the option, never the URL.
    """
    parsed = URL(url)
    if parsed.scheme != "amqps":
        return None
    query = parsed.query
    context = _BrokerContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, certificate required
    cafile, capath = query.get("cafile") or None, query.get("capath") or None
    cadata = _cadata(query.get("cadata"))
    try:
        if cafile or capath or cadata:
            context.load_verify_locations(cafile, capath, cadata)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (OSError, ValueError) as exc:
        which = "cafile" if cafile else "capath" if capath else "cadata"
        raise SettingsError(f"invalid setting {_SUBJECT}: its {which} {_why(exc)}") from None
    certfile, keyfile = query.get("certfile") or None, query.get("keyfile") or None
    if keyfile and not certfile:
        raise SettingsError(f"invalid setting {_SUBJECT}: keyfile without certfile")
    if certfile:
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ValueError) as exc:
            raise SettingsError(
                f"invalid setting {_SUBJECT}: its certfile/keyfile {_why(exc)}"
            ) from None
    if query.get("no_verify_ssl", "0") != "0":  # aiormq's reading: anything but "0"
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.server_name = query.get("server_name_indication") or None
    return context


def describe_tls(url: str) -> str:
    """What :func:`tls_context` makes of ``url``, in words (for ``check``)."""
    query = URL(url).query
    if URL(url).scheme != "amqps":
        return "no TLS (amqp://)"
    if query.get("no_verify_ssl", "0") != "0":
        return "TLS, nothing verified (no_verify_ssl)"
    given = [name for name in ("cafile", "capath", "cadata") if query.get(name)]
    cas = f"the CAs of {' and '.join(given)}" if given else "the system's CAs"
    name = query.get("server_name_indication") or URL(url).host
    client = ", a client certificate (mutual TLS)" if query.get("certfile") else ""
    return f"TLS, the broker's certificate checked against {cas}, for the name {name}{client}"


def _cadata(value: str | None) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise SettingsError(f"invalid setting {_SUBJECT}: its cadata is not base64") from None


def _why(exc: BaseException) -> str:
    """A file's failure in words: ``cannot be read (No such file or directory)``."""
    if isinstance(exc, ssl.SSLError):  # OpenSSL's reason, when it gives one (not "PEM lib")
        return "holds no usable certificate or key" + (f" ({exc.reason})" if exc.reason else "")
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    return f"holds no usable certificate ({exc})"


async def tls_failure(
    exc: BaseException, url: str, context: ssl.SSLContext | None, remaining_s: float | None
) -> str | None:
    """Why a failed connect to ``url`` can never succeed over TLS, in words; else ``None``.

    ``failures.tls_refusal`` reads it from ``exc``; when the broker reset a TLS connection
    (before AMQP began), :func:`read_refusal` asks once more, waiting at most
    :data:`TLS_PROBE_WAIT_S` (and ``remaining_s``, the connect's time left).
    """
    why = tls_refusal(exc)
    if why is None and context is not None and closed_by_broker(exc):
        wait_s = min(TLS_PROBE_WAIT_S, remaining_s or TLS_PROBE_WAIT_S)
        why = tls_refusal(await read_refusal(url, context, wait_s))
    return why


async def read_refusal(url: str, context: ssl.SSLContext, wait_s: float) -> BaseException | None:
    """Shake hands with the broker of ``url`` once more, send nothing, and read its answer.

    Returns:
        What the read or the handshake raised (an ``ssl.SSLError`` naming the broker's alert, a
        reset...), or ``None`` when the broker stayed silent for ``wait_s`` seconds, as one
        that accepted the client certificate does.
    """
    parsed = URL(url)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(wait_s):
            port = parsed.explicit_port or AMQP_PORTS["amqps"]  # yarl knows none for amqps
            reader, writer = await asyncio.open_connection(parsed.host, port, ssl=context)
            await reader.read(1)
    except TimeoutError:
        return None
    except (OSError, EOFError) as exc:
        return exc
    finally:
        if writer is not None:
            writer.transport.abort()
    return ConnectionResetError("the broker closed the connection after the TLS handshake")
