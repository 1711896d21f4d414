"""The task channel: both halves of the worker-to-child protocol, frames and typed messages.

The channel is a socket of its own, never the child's stdout or stderr: whatever the handler,
a library or a C extension writes to file descriptors 1 and 2 cannot corrupt a result.

Frame: a 4-byte big-endian length, then that many bytes of JSON (``ensure_ascii``, so a lone
surrogate or a NUL in a string travels escaped and arrives identical).

Messages: the worker sends one :class:`TaskRequest`, then, when the request names a lease
(``lease_s``), one renewal byte per ``Lease.renew_every_s`` (:mod:`.lease`: the child's
watchdog reads them); the child sends any number of
:class:`ProgressMessage`, :class:`DropMessage` and :class:`LogMessage`, then exactly one
:class:`OutcomeMessage`: the conclusion the child's task call made
(:mod:`async_task_api_worker.task_call`), which the worker reports as it is. Each message is
written by its ``to_json`` and read by :func:`decode_child_message` or
:meth:`TaskRequest.from_json`, here alone; the worker trusts nothing a child sends, so every
field is checked on the way in (:class:`ChannelError`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Final

from async_task_api_worker.conclusion import Conclusion, conclusion_from_json, conclusion_to_json
from async_task_api_worker.context import ProgressDropReason, ProgressUpdate
from async_task_api_worker.errors import RemoteHandlerError
from async_task_api_worker.observability.logging import TASK_FIELDS
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.protocol.encoding import MAX_REPORT_BYTES
from async_task_api_worker.task_call import TaskFields

__all__ = [
    "MAX_CHILD_FRAME_BYTES",
    "ChannelError",
    "ChildChannel",
    "ChildMessage",
    "DropMessage",
    "LogMessage",
    "OutcomeMessage",
    "ProgressMessage",
    "TaskRequest",
    "decode_child_message",
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


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """What the worker sends down: the task's raw input, its fields, limits and log level.

    Attributes:
        raw_input: the envelope's ``input`` (the child validates it again).
        fields: who the call works for (``task_call.TaskFields``).
        memory_limit_bytes: the address-space limit, or ``None``.
        cpu_limit_s: the CPU-time limit in seconds, or ``None``.
        log_level: the worker's root log level (the child logs at it, through the channel).
        lease_s: the lease's expiry in seconds (``ports.Lease``): the child's group stops
            itself once no renewal came for that long; ``None``: no lease.
    """

    raw_input: dict[str, Any]
    fields: TaskFields
    memory_limit_bytes: int | None = None
    cpu_limit_s: float | None = None
    log_level: int = 20
    lease_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The request as the frame's JSON object."""
        return {
            "t": "request",
            "input": self.raw_input,
            "fields": self.fields.to_json(),
            "limits": {
                "memory_limit_bytes": self.memory_limit_bytes,
                "cpu_limit_s": self.cpu_limit_s,
            },
            "log_level": self.log_level,
            "lease_s": self.lease_s,
        }

    @classmethod
    def from_json(cls, message: dict[str, Any]) -> TaskRequest:
        """Read a request.

        Raises:
            ChannelError: not a request of this shape.
        """
        try:
            limits = message.get("limits") or {}
            memory, cpu = limits.get("memory_limit_bytes"), limits.get("cpu_limit_s")
            lease = message.get("lease_s")
            if message.get("t") != "request" or not isinstance(message.get("input"), dict):
                raise ValueError("not a request")
            return cls(
                raw_input=message["input"],
                fields=TaskFields.from_json(message["fields"]),
                memory_limit_bytes=None if memory is None else int(memory),
                cpu_limit_s=None if cpu is None else float(cpu),
                log_level=int(message.get("log_level", 20)),
                lease_s=None if lease is None else float(lease),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ChannelError(f"a request that breaks the rules ({type(exc).__name__})") from exc


@dataclass(frozen=True, slots=True)
class ProgressMessage:
    """A progress update the handler made, already checked by the child's context."""

    update: ProgressUpdate

    def to_json(self) -> dict[str, Any]:
        """The message as the frame's JSON object."""
        payload = None if self.update.payload is None else dict(self.update.payload)
        return {"t": "progress", "fraction": self.update.fraction, "payload": payload}


@dataclass(frozen=True, slots=True)
class DropMessage:
    """A progress update the child's context dropped, and why."""

    reason: ProgressDropReason

    def to_json(self) -> dict[str, Any]:
        """The message as the frame's JSON object."""
        return {"t": "drop", "reason": self.reason.value}


@dataclass(frozen=True, slots=True)
class LogMessage:
    """A log record of the child, for the worker to log in its own format.

    Attributes:
        level: the record's level number.
        name: its logger's name.
        msg: the formatted message (cut at :data:`MAX_LOG_CHARS`).
        extra: its ``extra`` fields, as JSON scalars.
        exc: its formatted traceback, if any.
    """

    level: int
    name: str
    msg: str
    extra: dict[str, Any] = field(default_factory=dict)
    exc: str | None = None

    def relay(self) -> None:
        """Log the record in the worker, as if logged here (the task fields are bound here)."""
        logger = logging.getLogger(self.name)
        if not logger.isEnabledFor(self.level):
            return
        record = logger.makeRecord(self.name, self.level, "(task process)", 0, self.msg, (), None)
        # Who the task is, the worker says (its bound fields), not the child; and the line says
        # where it came from, so that a child cannot pass its lines off as the worker's own.
        record.task_process = True
        for key, value in self.extra.items():
            name = str(key)
            if name not in _RESERVED_LOG_KEYS and not name.startswith("_"):
                record.__dict__.setdefault(name, value)
        if self.exc:
            record.exc_text = self.exc
        logger.handle(record)

    def to_json(self) -> dict[str, Any]:
        """The message as the frame's JSON object."""
        return {
            "t": "log",
            "level": self.level,
            "name": self.name,
            "msg": self.msg[:MAX_LOG_CHARS],
            "extra": self.extra,
            "exc": self.exc,
        }


@dataclass(frozen=True, slots=True)
class OutcomeMessage:
    """The child's last message: the conclusion of the task call.

    Attributes:
        conclusion: the task call's conclusion.
        raised: for an ``INTERNAL_ERROR``, the exception the handler raised as its type name
            and frames (``observability.redaction``: never its text), for the worker's error
            hooks; ``None`` otherwise.
    """

    conclusion: Conclusion
    raised: RemoteHandlerError | None = None

    def to_json(self) -> dict[str, Any]:
        """The message as the frame's JSON object."""
        message = {"t": "outcome", **conclusion_to_json(self.conclusion)}
        if self.raised is not None:
            message["raised"] = {
                "type": self.raised.remote_type_name,
                "frames": self.raised.remote_traceback,
            }
        return message


ChildMessage = ProgressMessage | DropMessage | LogMessage | OutcomeMessage

#: The SDK's own codes a child's outcome may carry: what its task call concludes, and its
#: memory limit (``WORKER_CRASHED``). A timeout or a dead worker is the worker's to say.
CHILD_CODES: Final = frozenset(
    {ErrorCode.INTERNAL_ERROR, ErrorCode.INVALID_RESULT, ErrorCode.WORKER_CRASHED}
)
#: Characters of a log message the child sends (a longer one is cut).
MAX_LOG_CHARS: Final = 32 * 1024
# Attributes a relayed record may not take from the child's ``extra``.
_RESERVED_LOG_KEYS: Final = frozenset(
    {"message", "asctime", "args", "msg", "exc_info", "task_process", *TASK_FIELDS}
)


def _progress(message: dict[str, Any]) -> ProgressMessage:
    fraction, payload = message.get("fraction"), message.get("payload")
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not 0.0 <= fraction < 1.0
        or not (payload is None or isinstance(payload, dict))
    ):
        raise ChannelError("a progress message that breaks the rules")
    return ProgressMessage(ProgressUpdate(float(fraction), payload))


def _raised(raised: object) -> RemoteHandlerError | None:
    """An outcome's ``raised`` (type name and frames), or ``None`` if absent or not that shape."""
    if not isinstance(raised, dict):
        return None
    kind, frames = raised.get("type"), raised.get("frames")
    if not isinstance(kind, str) or not isinstance(frames, str):
        return None
    return RemoteHandlerError(kind[:MAX_LOG_CHARS], frames[:MAX_LOG_CHARS])


def _log(message: dict[str, Any]) -> LogMessage:
    level, extra, exc = message.get("level", 20), message.get("extra") or {}, message.get("exc")
    if (
        isinstance(level, bool)
        or not isinstance(level, int)
        or not isinstance(extra, dict)
        or not (exc is None or isinstance(exc, str))
    ):
        raise ChannelError("a log message that breaks the rules")
    name = str(message.get("name") or "root")
    return LogMessage(level, name, str(message.get("msg", ""))[:MAX_LOG_CHARS], extra, exc)


def decode_child_message(message: dict[str, Any]) -> ChildMessage:
    """The typed message a child sent.

    Raises:
        ChannelError: an unknown kind, or a field that breaks its message's rules (a forged or
            broken message: the task's result is then invalid).
    """
    kind = message.get("t")
    if kind == "progress":
        return _progress(message)
    if kind == "drop":
        try:
            return DropMessage(ProgressDropReason(str(message.get("reason"))))
        except ValueError as exc:
            raise ChannelError("a drop message with an unknown reason") from exc
    if kind == "log":
        return _log(message)
    if kind == "outcome":
        try:
            conclusion = conclusion_from_json(message, sdk_codes=CHILD_CODES)
        except ValueError as exc:
            raise ChannelError(f"an outcome that breaks the rules: {exc}") from exc
        return OutcomeMessage(conclusion, _raised(message.get("raised")))
    raise ChannelError("a message of an unknown kind")
