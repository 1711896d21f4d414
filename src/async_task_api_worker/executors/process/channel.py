"""The task channel: length-prefixed JSON messages over a Unix socket between worker and child.

The channel is a socket of its own, never the child's stdout or stderr: whatever the handler,
a library or a C extension writes to file descriptors 1 and 2 cannot corrupt a result.

Frame: a 4-byte big-endian length, then that many bytes of JSON (``ensure_ascii``, so a lone
surrogate or a NUL in a string travels escaped and arrives identical). The request goes down
once; the child sends ``progress``, ``drop`` and ``log`` messages, then exactly one of
``result``, ``error``, ``invalid_result`` or ``crash``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from typing import Any, Final

from async_task_api_worker.protocol.encoding import MAX_REPORT_BYTES

__all__ = [
    "MAX_CHILD_FRAME_BYTES",
    "ChannelError",
    "ChildChannel",
    "encode_frame",
    "read_frame",
]

_HEADER: Final = struct.Struct(">I")
#: The largest message a child may send: a report's limit (16 MiB), ASCII-escaped JSON making
#: a character up to six bytes, plus room. A larger result could not be reported anyway.
MAX_CHILD_FRAME_BYTES: Final = 6 * MAX_REPORT_BYTES + (1 << 20)
#: The largest request sent down (an envelope is at most WORKER_MAX_MESSAGE_BYTES; JSON
#: escaping can grow it, six bytes for one).
MAX_REQUEST_FRAME_BYTES: Final = 2**31


class ChannelError(Exception):
    """The other side broke the framing (a frame too large, or not a JSON object).

    Attributes:
        too_large: the frame was larger than allowed.
    """

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def encode_frame(message: dict[str, Any]) -> bytes:
    """``message`` as one frame.

    Raises:
        ValueError: the message cannot be encoded as JSON (``NaN`` is allowed: the receiver's
            validation decides about it).
    """
    body = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return _HEADER.pack(len(body)) + body


def _decode(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ChannelError(f"a frame is not JSON ({type(exc).__name__})") from exc
    if not isinstance(message, dict):
        raise ChannelError("a frame is not a JSON object")
    return message


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> dict[str, Any] | None:
    """The next message from ``reader``; ``None`` at a clean end of stream.

    Raises:
        ChannelError: the frame is larger than ``max_bytes``, cut short, or not a JSON object.
    """
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ChannelError("the stream ended inside a frame header") from exc
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_bytes:
        raise ChannelError(f"a frame of {size} bytes exceeds {max_bytes} bytes", too_large=True)
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ChannelError("the stream ended inside a frame") from exc
    return _decode(body)


class ChildChannel:
    """The child's end: blocking reads of the request, thread-safe sends.

    Args:
        sock: the connected socket inherited from the worker.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def receive(self) -> dict[str, Any]:
        """Read one message (the request).

        Raises:
            ChannelError: the worker closed the channel or sent a broken frame.
        """
        (size,) = _HEADER.unpack(self._read_exactly(_HEADER.size))
        return _decode(self._read_exactly(size))

    def _read_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self._sock.recv(min(size - len(chunks), 1 << 20))
            if not chunk:
                raise ChannelError("the worker closed the channel")
            chunks += chunk
        return bytes(chunks)

    def send(self, message: dict[str, Any]) -> None:
        """Send one message; safe from any thread.

        Raises:
            ValueError: the message cannot be encoded.
            OSError: the worker is gone.
        """
        frame = encode_frame(message)
        with self._lock:
            self._sock.sendall(frame)
