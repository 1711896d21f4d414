"""A TCP proxy of the tests' own, for silent partitions between a worker and its broker.

``pause()`` stops forwarding in both directions without closing anything: bytes already sent
wait in the proxy (as they would in a network that went quiet), and are forwarded on
``resume()`` to whichever side is still connected. ``cut()`` closes every connection at once.
It runs on a thread of its own, so that a test can drive it from synchronous code. A ``tap``
sees every chunk the target sends, per connection (to read the frames a broker sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port``.

    Args:
        target_host: where connections are forwarded.
        target_port: the target's port.
        tap: called on the proxy's thread with each connection's number and every chunk the
            target sends on it, before it is forwarded.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        tap: Callable[[int, bytes], None] | None = None,
    ) -> None:
        self.target = (target_host, target_port)
        self._tap = tap
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self.connections = 0

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def pause(self) -> None:
        """Stop forwarding, both ways; nothing is closed and nothing is dropped."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def resume(self) -> None:
        """Forward again, the held bytes first."""
        self._loop.call_soon_threadsafe(self._flowing.set)

    def cut(self) -> None:
        """Close every proxied connection at once (a reset, as a network failure gives)."""
        self._call(self._close_all())

    def _call(self, coroutine: object) -> None:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)  # type: ignore[arg-type]
        future.result(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._flowing.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, target_writer))
        await asyncio.gather(
            self._pipe(reader, target_writer),
            self._pipe(target_reader, writer, number),
            return_exceptions=True,
        )
        for each in (writer, target_writer):
            self._writers.discard(each)
            each.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tapped: int = 0
    ) -> None:
        try:
            while data := await reader.read(65536):
                if tapped and self._tap is not None:
                    self._tap(tapped, data)
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                if writer.can_write_eof():
                    writer.write_eof()

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def _shutdown(self) -> None:
        await self._close_all()
        if self._server is not None:
            self._server.close()


@contextlib.contextmanager
def proxy_to(
    host: str, port: int, tap: Callable[[int, bytes], None] | None = None
) -> Iterator[TcpProxy]:
    """A running :class:`TcpProxy` to ``host:port``."""
    with TcpProxy(host, port, tap) as proxy:
        yield proxy
