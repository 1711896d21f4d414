"""The probes server: ``/health``, ``/ready`` and ``/metrics`` over plain HTTP/1.1.

Source: seed "Probes, metrics and logs". The server runs on the worker's event loop, so
``/health`` answers exactly as long as that loop is free (a handler or a hook blocking it makes
the liveness probe fail, which is the point). It is bounded, whatever a client does:

- at most :data:`MAX_CONNECTIONS` connections are served at once; the others are closed as
  soon as they are accepted;
- reading the request, writing the answer and closing each take at most ``io_timeout_s``
  (5 s): a client that sends nothing, or reads nothing, is cut off;
- a request head larger than ``max_request_bytes`` (8 KiB) gets a 400; a body is never read
  (every answer closes the connection), so a flood cannot grow memory;
- concurrent ``/ready`` requests share one evaluation of the readiness probes.

Errors use the platform's format ``{"status": "error", "error": {"code", "message"}}``: 404
``NOT_FOUND``, 405 ``METHOD_NOT_ALLOWED``, 500 ``PROBE_FAILED``, 400 ``BAD_REQUEST``, and 503
``NOT_READY`` with the failing components named.

With several worker processes (``runtime.processes``), each process serves its probes on a
loopback socket its supervisor gives it, and the supervisor's ``/ready`` reads theirs
(``observability.processes.fetch_readiness``): the rule of what makes a process ready stays
here and in the runner.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from async_task_api_worker.observability.redaction import exception_type_name

__all__ = [
    "IO_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "PROBE_TIMEOUT_S",
    "ProbesServer",
    "ReadinessCheck",
]

_logger = logging.getLogger("async_task_api_worker.observability.probes")

#: Connections served at once; more are closed at once.
MAX_CONNECTIONS: Final = 32
#: Seconds each of reading a request, writing its answer and closing may take.
IO_TIMEOUT_S: Final = 5.0
#: Seconds a readiness probe hook gets before it counts as failing.
PROBE_TIMEOUT_S: Final = 3.0
#: Bytes a request line and its headers may take.
MAX_REQUEST_BYTES: Final = 8192

_PATHS: Final = ("/health", "/ready", "/metrics")
_METHODS: Final = ("GET", "HEAD")
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_JSON: Final = "application/json"

Probe = Callable[[], Awaitable[object]]


class ReadinessCheck:
    """Evaluates readiness: the runtime's own components, then the worker's probe hooks.

    Args:
        builtin: returns the runtime's failing components (``broker``, ``draining``) and why;
            empty when they are fine.
        probes: the worker's ``readiness_probe`` hooks by component name; each is ready when
            it returns a true value within ``probe_timeout_s`` seconds, and failing when it
            returns a false value, raises, or runs out of time.
        probe_timeout_s: seconds each hook gets.
        delegated: returns more failing components, and why, gathered from elsewhere (a
            supervisor asking its worker processes); it bounds its own time. Awaited beside
            the hooks; an exception it raises propagates as ``builtin``'s does.

    Concurrent :meth:`evaluate` calls share one evaluation: the hooks run once for all of them.
    """

    def __init__(
        self,
        builtin: Callable[[], Mapping[str, str]],
        probes: Mapping[str, Probe],
        *,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        delegated: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
    ) -> None:
        self._builtin = builtin
        self._delegated = delegated
        self._probes = dict(probes)
        self._probe_timeout_s = probe_timeout_s
        self._pending: asyncio.Future[dict[str, str]] | None = None
        self._last: dict[str, str] | None = None
        self._abandoned: set[asyncio.Future[str | None]] = set()
        self.waiting = 0
        """Callers waiting for the evaluation in progress."""

    async def evaluate(self) -> dict[str, str]:
        """The failing components and why (empty: ready).

        Raises:
            Exception: whatever ``builtin`` raised (the probe hooks' errors are caught).
        """
        if self._pending is None:
            pending = asyncio.ensure_future(self._evaluate())
            self._pending = pending
            pending.add_done_callback(self._evaluated)
        self.waiting += 1
        try:
            # Shielded: a client hanging up must not cancel what the others wait for.
            return await asyncio.shield(self._pending)
        finally:
            self.waiting -= 1

    def _evaluated(self, _: asyncio.Future[dict[str, str]]) -> None:
        self._pending = None

    async def _evaluate(self) -> dict[str, str]:
        names = list(self._probes)
        results, delegated = await asyncio.gather(
            asyncio.gather(*(self._run(name) for name in names)), self._gather_delegated()
        )
        failing = dict(self._builtin())
        failing.update(delegated)
        failing.update((name, why) for name, why in zip(names, results, strict=True) if why)
        if failing != self._last:
            if failing:
                _logger.warning(
                    "Not ready: %s",
                    ", ".join(f"{name} ({why})" for name, why in sorted(failing.items())),
                )
            elif self._last is not None:
                _logger.info("Ready")
            self._last = failing
        return failing

    async def _gather_delegated(self) -> Mapping[str, str]:
        return {} if self._delegated is None else await self._delegated()

    @property
    def stuck_probes(self) -> int:
        """Probe hooks that ran out of time and have not stopped since (they ignore cancels)."""
        return len(self._abandoned)

    async def _run(self, name: str) -> str | None:
        # A task of its own, waited for with a timeout but never awaited after its cancel: a
        # hook that ignores the cancel cannot hold the answer (nor the other hooks) past it.
        call = asyncio.ensure_future(self._call(name))
        done, _ = await asyncio.wait({call}, timeout=self._probe_timeout_s)
        if not done:
            call.cancel()
            self._abandoned.add(call)
            call.add_done_callback(self._forget)
            return f"no answer within {self._probe_timeout_s:g} s"
        return call.result()

    def _forget(self, call: asyncio.Future[str | None]) -> None:
        self._abandoned.discard(call)
        if not call.cancelled():
            call.exception()

    async def _call(self, name: str) -> str | None:
        try:
            ok = await self._probes[name]()
            ready = bool(ok)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return "raised CancelledError"
        except BaseException as exc:  # SystemExit too: a probe must never end the worker
            # The type only: a probe's message may hold a connection string.
            return f"raised {exception_type_name(exc)}"
        return None if ready else "returned false"


def _error(status: int, code: str, message: str, **more: Any) -> tuple[int, bytes, str]:
    body = {"status": "error", "error": {"code": code, "message": message}, **more}
    return status, json.dumps(body).encode(), _JSON


class ProbesServer:
    """The HTTP server behind the pod's probes and the Prometheus scrape.

    Args:
        host: address to bind (``HEALTH_CHECK_HOST``).
        port: port to bind (``HEALTH_CHECK_PORT``; 0 picks a free one, see :attr:`port`).
        readiness: what ``/ready`` evaluates.
        metrics: returns the metrics body and its content type for an ``Accept`` header.
        max_connections: connections served at once.
        io_timeout_s: seconds for each of reading, writing and closing.
        max_request_bytes: bytes a request line and its headers may take.
        sock: a bound socket to serve on instead of ``host`` and ``port`` (a worker process's
            loopback socket, bound by its supervisor); the server owns it from then on.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        readiness: ReadinessCheck,
        metrics: Callable[[str | None], tuple[bytes, str]],
        max_connections: int = MAX_CONNECTIONS,
        io_timeout_s: float = IO_TIMEOUT_S,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        sock: socket.socket | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._sock = sock
        self._readiness = readiness
        self._metrics = metrics
        self._max_connections = max_connections
        self._io_timeout_s = io_timeout_s
        self._max_request_bytes = max_request_bytes
        self._server: asyncio.Server | None = None
        self._active: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    @property
    def port(self) -> int:
        """The port the server listens on (after :meth:`start`)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def readiness(self) -> ReadinessCheck:
        """What ``/ready`` evaluates."""
        return self._readiness

    @property
    def connections(self) -> int:
        """Connections being served right now."""
        return len(self._active)

    async def start(self) -> None:
        """Bind and start serving.

        Raises:
            OSError: the address cannot be bound (in use, not local, not resolvable).
        """
        if self._sock is not None:
            self._host = str(self._sock.getsockname()[0])
            self._server = await asyncio.start_server(
                self._connected, sock=self._sock, limit=self._max_request_bytes
            )
        else:
            self._server = await asyncio.start_server(
                self._connected, self._host, self._port, limit=self._max_request_bytes
            )
        host = f"[{self._host}]" if ":" in self._host else self._host
        _logger.info("Probes server listening on http://%s:%d", host, self.port)

    async def close(self) -> None:
        """Stop listening and cut the connections being served; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Aborting the connections ends their tasks (a read or write fails); cancelling them
        # instead makes Python 3.11's streams log a traceback for each.
        for writer in list(self._active.values()):
            writer.transport.abort()
        if self._active:
            await asyncio.wait(set(self._active), timeout=self._io_timeout_s)
        await server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._active) >= self._max_connections:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - start_server runs each connection as a task
        self._active[task] = writer
        try:
            answer = await self._read_and_answer(reader)
            if answer is not None:
                writer.write(answer)
                await asyncio.wait_for(writer.drain(), timeout=self._io_timeout_s)
        except (TimeoutError, ConnectionError):
            pass
        except Exception:  # a bug here must never take the worker down
            _logger.exception("The probes server failed on a request")
        finally:
            await self._close(writer)
            self._active.pop(task, None)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), timeout=self._io_timeout_s)
        except (Exception, asyncio.CancelledError):
            # Not closed in time (a peer that reads nothing), or the server is closing.
            writer.transport.abort()

    async def _read_and_answer(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=self._io_timeout_s)
        except asyncio.LimitOverrunError:
            return _encode(
                *_error(400, "BAD_REQUEST", "the request head is too large"), head_only=False
            )
        except asyncio.IncompleteReadError:
            return None  # the client went away
        try:
            # Lines end with CRLF; a bare LF inside a header is a line end too, never part of a
            # value that could reach an answer.
            request_line, *header_lines = [
                line.rstrip("\r") for line in head.decode("latin-1").split("\n")
            ]
            method, target, version = request_line.split(" ")
        except ValueError:
            return _encode(*_error(400, "BAD_REQUEST", "malformed request line"), head_only=False)
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            return _encode(*_error(400, "BAD_REQUEST", "HTTP/1.0 or 1.1 only"), head_only=False)
        path = _path_of(target)
        if path not in _PATHS:
            status, body, content_type = _error(
                404, "NOT_FOUND", "no such path; the paths are /health, /ready and /metrics"
            )
            return _encode(status, body, content_type, head_only=method == "HEAD")
        if method not in _METHODS:
            status, body, content_type = _error(
                405, "METHOD_NOT_ALLOWED", f"{path} answers GET and HEAD only"
            )
            return _encode(status, body, content_type, head_only=False, allow=True)
        accept = _header(header_lines, "accept")
        try:
            status, body, content_type = await self._answer(path, accept)
        except Exception as exc:
            _logger.error("%s failed (%s)", path, exception_type_name(exc))
            status, body, content_type = _error(
                500, "PROBE_FAILED", f"{path} could not be evaluated"
            )
        return _encode(status, body, content_type, head_only=method == "HEAD")

    async def _answer(self, path: str, accept: str | None) -> tuple[int, bytes, str]:
        if path == "/health":
            return 200, b'{"status":"ok"}', _JSON
        if path == "/metrics":
            body, content_type = self._metrics(accept)
            return 200, body, content_type
        failing = await self._readiness.evaluate()
        if not failing:
            return 200, b'{"status":"ready"}', _JSON
        return _error(
            503,
            "NOT_READY",
            f"not ready: {', '.join(sorted(failing))}",
            components=dict(sorted(failing.items())),
        )


def _path_of(target: str) -> str:
    """The path of a request target, origin form (``/ready?x``) or absolute form."""
    if "://" in target:
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    return target.split("?", 1)[0]


def _header(lines: list[str], wanted: str) -> str | None:
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == wanted:
            return value.strip()
    return None


def _encode(
    status: int, body: bytes, content_type: str, *, head_only: bool, allow: bool = False
) -> bytes:
    head = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
    ]
    if allow:
        head.append("Allow: GET, HEAD")
    encoded = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    return encoded if head_only else encoded + body
