"""One AMQP connection that stays up: several broker URLs, heartbeats, blocked publishers.

aio-pika's robust connection reconnects and restores channels, queues and consumers; this
module adds what a worker that must never lose a result also needs from it:

- **Several URLs** (the nodes of a cluster, ``BROKER_URL`` split at its commas): tried in turn
  at start, and the next one is used for every reconnect, so that a stopped node costs a
  reconnect interval, not its whole downtime.
- **A silent peer is a dead peer.** Each URL asks for an AMQP heartbeat of ``heartbeat_s``
  (unless it names its own ``?heartbeat=``). RabbitMQ then sends a frame at least every half
  heartbeat; a connection silent for two heartbeats (looked at twice) is dropped at once,
  which withdraws its deliveries and reconnects (aiormq alone waits ``3 * (heartbeat + 1)``
  seconds). It is not :attr:`alive` after one heartbeat of silence.
- **Blocked publishers.** RabbitMQ blocks a connection that publishes during a memory or disk
  alarm (``connection.blocked``): :attr:`blocked`, and :meth:`wait_unblocked`.

aiormq keeps the time of the last frame, the blocked state and the socket in private places;
they are read here alone (:func:`_last_frame_time`, :func:`_is_blocked`, :func:`_stream_writer`,
:func:`_release_blocked`), and a missing one disables only what needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Final

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from yarl import URL

from async_task_api_worker.errors import BrokerTLSError, BrokerUnavailableError
from async_task_api_worker.observability.redaction import redact_url
from async_task_api_worker.settings import SILENT_HEARTBEATS_TO_DEAD
from async_task_api_worker.transports.rabbitmq.failures import connect_failure, is_refusal, refused
from async_task_api_worker.transports.rabbitmq.tls import tls_context, tls_failure

__all__ = ["ATTEMPT_TIMEOUT_S", "SECOND_LOOK_S", "BrokerLink"]

_logger = logging.getLogger("async_task_api_worker.transports.rabbitmq")

#: How long one connection attempt to one URL may take, in seconds: a node behind a dead
#: network must not hold up the others.
ATTEMPT_TIMEOUT_S: Final = 10.0
#: How often a wait for an unblocked connection looks again at which connection is current.
RECHECK_S: Final = 0.5
#: The longest wait between two rounds of attempts over every URL, in seconds.
MAX_BACKOFF_S: Final = 30.0
#: Seconds between the look that finds a connection silent too long and the one that drops it.
SECOND_LOOK_S: Final = 0.1


def with_heartbeat(url: str, heartbeat_s: int) -> str:
    """``url`` asking for ``heartbeat_s`` (its own ``?heartbeat=`` is kept)."""
    parsed = URL(url)
    if "heartbeat" in parsed.query:
        return url
    return str(parsed.update_query(heartbeat=str(heartbeat_s)))


class BrokerLink:
    """A robust connection over ``urls``, with heartbeat and blocked-state tracking.

    Args:
        urls: the broker URLs, tried in this order (at least one).
        heartbeat_s: the AMQP heartbeat to ask for, in seconds.
        name: the connection's name, shown by the broker (``rabbitmqctl list_connections``).
        connect_timeout_s: give up connecting after this many seconds (``None``: never).
        reconnect_interval_s: aio-pika's wait between two reconnection attempts, in seconds.

    Raises:
        SettingsError: an ``amqps://`` URL's TLS files cannot be used (``tls.tls_context``).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        heartbeat_s: int,
        name: str,
        connect_timeout_s: float | None = None,
        reconnect_interval_s: float = 1.0,
    ) -> None:
        if not urls:
            raise ValueError("no broker URL")
        self._urls = tuple(with_heartbeat(url, heartbeat_s) for url in urls)
        self._urls_for_logs = tuple(redact_url(url) for url in urls)
        self._contexts = tuple(tls_context(url) for url in urls)
        self._heartbeat_s = float(heartbeat_s)
        self._name = name
        self._connect_timeout_s = connect_timeout_s
        self._reconnect_interval_s = reconnect_interval_s
        self._index = 0
        self._connection: AbstractRobustConnection | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        self._closings: set[asyncio.Future[Any]] = set()
        self._dropped: object = None

    @property
    def url_for_logs(self) -> str:
        """The URL in use, its password replaced by ``***``."""
        return self._urls_for_logs[self._index]

    @property
    def connection(self) -> AbstractRobustConnection:
        """The robust connection (after :meth:`open`)."""
        if self._connection is None:
            raise RuntimeError("open() first")
        return self._connection

    @property
    def connected(self) -> bool:
        """Whether a connection is open right now (``False`` while it reconnects)."""
        connection = self._connection
        return (
            connection is not None
            and not connection.is_closed
            and connection.connected.is_set()
            and connection.transport is not None
        )

    def silence_s(self) -> float | None:
        """Seconds since the last frame from the broker (``None``: not connected, or unknown)."""
        underlay = self._underlay()
        last = _last_frame_time(underlay)
        if underlay is None or last is None:
            return None
        return asyncio.get_running_loop().time() - last

    def heartbeat_s(self) -> float:
        """The heartbeat in force, in seconds (0: none).

        The one asked for, which a URL's own ``?heartbeat=`` replaces (aiormq sends its own
        value in ``Connection.TuneOk``).
        """
        value = getattr(self._underlay(), "heartbeat_timeout", None)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        return self._heartbeat_s

    @property
    def alive(self) -> bool:
        """Connected, and a frame arrived within the last heartbeat (when there is one)."""
        if not self.connected:
            return False
        silence, heartbeat_s = self.silence_s(), self.heartbeat_s()
        return silence is None or heartbeat_s == 0 or silence <= heartbeat_s

    @property
    def blocked(self) -> bool:
        """Whether the broker blocks this connection's publishes (``connection.blocked``)."""
        return self.connected and _is_blocked(self._underlay())

    async def wait_unblocked(self) -> None:
        """Wait until the connection is up and not blocked (cancel to stop waiting).

        It looks again at least every :data:`RECHECK_S`: a connection that closed while
        blocked stays blocked for good, and the wait must move on to its successor.
        """
        while True:
            underlay = self._underlay()
            if underlay is None or not self.connected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.connection.connected.wait(), RECHECK_S)
                continue
            if not _is_blocked(underlay):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(underlay.ready(), RECHECK_S)  # aiormq: unblocked

    async def open(self) -> AbstractRobustConnection:
        """Connect to the first URL that answers, trying them in turn with a backoff.

        A failure no retry can fix ends it at once: a refusal of the credentials or the vhost
        (one user database for every node), or of the TLS handshake (``tls.tls_failure``) by
        every URL (a node's certificate is its own). Anything else is retried, one warning per
        round naming each URL's cause (``failures.connect_failure``).

        Raises:
            BrokerRefusedError: a broker refused the credentials or the vhost.
            BrokerTLSError: the TLS handshake failed for a reason no retry can fix.
            BrokerUnavailableError: no URL answered within ``connect_timeout_s``.
        """
        loop = asyncio.get_running_loop()
        deadline = (
            None if self._connect_timeout_s is None else loop.time() + self._connect_timeout_s
        )
        delay_s = 0.5
        last_error: Exception | None = None
        last_of: dict[int, str] = {}  # each URL's last failure, for the final error
        tls_failed: dict[int, str] = {}  # URLs whose TLS no retry can fix: all of them exit 2
        while True:
            failures: list[str] = []
            for _ in self._urls:
                url = self._urls[self._index]
                remaining = None if deadline is None else max(0.1, deadline - loop.time())
                # Made here, not by ``connect_robust``: a failed or cancelled attempt (a shutdown in
                # startup) must close it, else its reconnect task swallows the cancel for ever.
                connection = aio_pika.RobustConnection(
                    URL(url),
                    reconnect_interval=self._reconnect_interval_s,
                    client_properties={"connection_name": self._name},
                    ssl_context=self._contexts[self._index],
                )
                attempt_s = min(ATTEMPT_TIMEOUT_S, remaining or ATTEMPT_TIMEOUT_S)
                try:
                    await connection.connect(attempt_s)
                except BaseException as exc:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(connection.close(), timeout=5.0)
                    if not isinstance(exc, Exception):  # a cancel
                        raise
                    if is_refusal(exc):
                        raise refused(exc, self.url_for_logs) from exc
                    context = self._contexts[self._index]
                    why = await tls_failure(exc, self._urls[self._index], context, remaining)
                    if why is not None:  # this node's certificate: another URL may do (rotation)
                        tls_failed[self._index] = f"TLS with {self.url_for_logs} failed: {why}"
                        if len(tls_failed) == len(self._urls):
                            raise BrokerTLSError(tls_failed[self._index]) from exc
                        _logger.warning("%s; trying the next URL", tls_failed[self._index])
                    failures.append(f"{self.url_for_logs} ({why or connect_failure(exc)})")
                    last_of[self._index] = failures[-1]
                    self._index = (self._index + 1) % len(self._urls)
                    last_error = exc
                    if deadline is not None and loop.time() >= deadline:
                        break
                    continue
                self._adopt(connection)
                return connection
            wait_s = delay_s
            if deadline is not None:
                if loop.time() >= deadline:
                    raise BrokerUnavailableError(
                        f"the broker was not reachable within {self._connect_timeout_s:g} s: "
                        + ", ".join(last_of[index] for index in sorted(last_of))
                    ) from last_error
                wait_s = min(delay_s, deadline - loop.time())  # the last try at the deadline
            _logger.warning(
                "Cannot reach the broker at %s; retrying in %.3g s", ", ".join(failures), wait_s
            )
            await asyncio.sleep(wait_s)
            delay_s = min(delay_s * 2, MAX_BACKOFF_S)

    def _adopt(self, connection: AbstractRobustConnection) -> None:
        self._connection = connection
        connection.close_callbacks.add(self._on_close)
        connection.reconnect_callbacks.add(self._on_reconnect)
        self._watchdog = asyncio.ensure_future(self._watch())

    def _on_close(self, _sender: object, exc: BaseException | None) -> None:
        if self._closing:
            return
        # A connection that closed while the broker blocked it (an alarm) stays "blocked" for
        # good: aio-pika's channel recovery, which races the reconnect, then waits on it for
        # ever (Channel._open awaits its ready()) holding the lock the reconnect needs. Mark it
        # unblocked, so that the recovery fails at once on the closed connection, and drop its
        # socket, so that its closing handshake cannot hang either.
        underlay = self._underlay()
        _release_blocked(underlay)
        _abort_socket(underlay)
        lost = self.url_for_logs
        if len(self._urls) > 1:
            # The next attempt goes to the next node: the one we lost may be the one that is down.
            self._next_url(log=False)
        _logger.warning(
            "The connection to %s (%s) closed (%s); reconnecting to %s",
            lost, self._name, connect_failure(exc) if exc else "closed", self.url_for_logs,
        )  # fmt: skip

    def _next_url(self, *, log: bool = True) -> None:
        self._index = (self._index + 1) % len(self._urls)
        connection = self._connection
        if connection is not None:
            # aio-pika reads its URL and its keyword arguments on each attempt (Connection.connect).
            connection.url = URL(self._urls[self._index])  # type: ignore[attr-defined]
            if isinstance(connection.kwargs, dict):
                connection.kwargs["context"] = self._contexts[self._index]
        if log:
            _logger.warning(
                "Still not connected (%s); trying %s (URL %d of %d) next",
                self._name, self.url_for_logs, self._index + 1, len(self._urls),
            )  # fmt: skip

    def _on_reconnect(self, _sender: object) -> None:
        _logger.info("Reconnected to %s (%s)", self.url_for_logs, self._name)

    async def _watch(self) -> None:
        """Drop a connection silent for two heartbeats; rotate URLs while reconnecting."""
        period_s = max(0.25, min(1.0, self._heartbeat_s / 4))
        down_since: float | None = None
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(period_s)
            if not self.connected:
                now = loop.time()
                down_since = down_since or now
                if len(self._urls) > 1 and now - down_since >= self._reconnect_interval_s * 2:
                    # An attempt failed meanwhile (aio-pika retries the same URL): move on.
                    self._next_url()
                    down_since = now
                continue
            down_since = None
            silence, heartbeat_s = self.silence_s(), self.heartbeat_s()
            if self._underlay() is self._dropped:
                continue  # dropped already, and still closing
            dead_after_s = SILENT_HEARTBEATS_TO_DEAD * heartbeat_s
            if silence is not None and heartbeat_s > 0 and silence > dead_after_s:
                # Resumed from a freeze, the loop runs due timers before it reads its sockets:
                # the frames that came meanwhile count, read before a second look.
                await asyncio.sleep(SECOND_LOOK_S)
                if (silence := self.silence_s() or 0.0) <= dead_after_s or self._closing:
                    continue
                _logger.warning(
                    "No frame from the broker at %s for %.1f s (heartbeat %g s): the "
                    "connection is taken for dead and dropped (%s)",
                    self.url_for_logs,
                    silence,
                    heartbeat_s,
                    self._name,
                )
                self.drop()

    def drop(self) -> None:
        """Drop the current connection at once, without a closing handshake; it reconnects.

        Its channels close (so a consumer's deliveries are withdrawn), and aio-pika opens a
        fresh connection, to the next URL when there are several.
        """
        underlay = self._underlay()
        if underlay is None:
            return
        self._dropped = underlay
        _release_blocked(underlay)
        reader = getattr(underlay, "_reader_task", None)
        if isinstance(reader, asyncio.Task) and not reader.done():
            # aiormq's own way out of a stuck connection: the writer then does not wait for a
            # Close-Ok that cannot come.
            reader.cancel()
        # A broker that stopped reading the socket (an alarm blocks the connection) never
        # completes a closing handshake, and aiormq's close waits for it: the socket goes now.
        _abort_socket(underlay)
        # A reader ended by a cancel alone leaves the connection open for a while (aiormq
        # closes it with the CancelledError, which its close skips): close it with a reason.
        closing = asyncio.ensure_future(underlay.close(ConnectionError("dropped")))
        self._closings.add(closing)
        closing.add_done_callback(self._closings.discard)

    async def close(self) -> None:
        """Close the connection (at most 5 s); idempotent."""
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        connection, self._connection = self._connection, None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=5.0)

    def _underlay(self) -> Any:
        connection = self._connection
        transport = getattr(connection, "transport", None)
        return getattr(transport, "connection", None)


def _release_blocked(underlay: Any) -> None:
    """Wake whatever waits for ``underlay`` (a closed connection) to be unblocked."""
    unblocked = getattr(underlay, "_Connection__connection_unblocked", None)
    if isinstance(unblocked, asyncio.Event):
        unblocked.set()


def _abort_socket(underlay: Any) -> None:
    """Close ``underlay``'s socket at once (no flush, no handshake), if it has one."""
    if (writer := _stream_writer(underlay)) is not None:
        writer.transport.abort()


def _stream_writer(underlay: Any) -> asyncio.StreamWriter | None:
    """The socket's writer, which aiormq keeps only in its writer task's frame."""
    task = getattr(underlay, "_writer_task", None)
    if not isinstance(task, asyncio.Task) or task.done():
        return None
    frame = getattr(task.get_coro(), "cr_frame", None)
    writer = frame.f_locals.get("writer") if frame is not None else None
    return writer if isinstance(writer, asyncio.StreamWriter) else None


def _last_frame_time(underlay: Any) -> float | None:
    value = getattr(underlay, "_Connection__last_frame_time", None)
    return value if isinstance(value, float) else None


def _is_blocked(underlay: Any) -> bool:
    unblocked = getattr(underlay, "_Connection__connection_unblocked", None)
    return isinstance(unblocked, asyncio.Event) and not unblocked.is_set()
