"""Draining a child's stdout or stderr while it runs, keeping only a bounded tail.

A child that writes a lot cannot block on a full pipe (it is read as it writes) nor grow the
worker's memory (only the last ``max_bytes`` are kept, for the log). What reaches a log line is
redacted as every other line is (``observability.logging.redact_secrets``), whatever formatter
the application uses, and starts at a line's start: a tail cut in the middle of a URL could
otherwise show a password without the ``scheme://`` that marks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Final

from async_task_api_worker.observability.logging import redact_secrets

__all__ = ["OutputTail"]

_CHUNK: Final = 65536


class OutputTail:
    """A pipe for one of a child's output streams, read on the event loop.

    Args:
        name: ``stdout`` or ``stderr`` (for the log).
        max_bytes: bytes of the end of the output to keep.
    """

    def __init__(self, name: str, max_bytes: int) -> None:
        self.name = name
        self._max_bytes = max_bytes
        self._read_fd, self.write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._tail = bytearray()
        self.total = 0
        """Bytes read in all."""
        self._ended: asyncio.Event | None = None
        self._reading = False

    @property
    def data(self) -> bytes:
        """The last bytes read (at most ``max_bytes``)."""
        return bytes(self._tail)

    def text(self) -> str:
        """The tail for a log line: decoded leniently, from a line's start, secrets redacted.

        When the output was longer than the tail, the first (cut) line is left out.
        """
        text = self._tail.decode("utf-8", "replace")
        if self.total > len(self._tail):
            _, newline, rest = text.partition("\n")
            text = rest if newline else ""
        return redact_secrets(text)

    def close_write_end(self) -> None:
        """Close the worker's copy of the write end (the child has its own); idempotent."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def start(self) -> None:
        """Start reading on the running loop."""
        self._ended = asyncio.Event()
        asyncio.get_running_loop().add_reader(self._read_fd, self._on_readable)
        self._reading = True

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._read_fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._stop_reading()
            return
        self.total += len(chunk)
        self._tail += chunk
        if len(self._tail) > self._max_bytes:
            del self._tail[: len(self._tail) - self._max_bytes]

    def _stop_reading(self) -> None:
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._read_fd)
            self._reading = False
        if self._ended is not None:
            self._ended.set()

    async def finish(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the end of the output, then close the pipe."""
        if self._ended is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), timeout_s)
        self._stop_reading()
        self.close_write_end()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
