"""What goes wrong on the wire: bytes that break the protocol, broker operations that fail.

Adapters raise the :class:`TransportError` branch from their client library's errors
(``raise PublishError(...) from exc``); the protocol package raises the :class:`ProtocolError`
branch.
"""

from __future__ import annotations

from typing import ClassVar

from async_task_api_worker.errors.root import AsyncTaskWorkerError

__all__ = [
    "BrokerUnavailableError",
    "CancelDecodeError",
    "EnvelopeDecodeError",
    "MessageTooLargeError",
    "ProtocolError",
    "PublishError",
    "ReportEncodeError",
    "ReportRefusedError",
    "SettleError",
    "TransportError",
]


class ProtocolError(AsyncTaskWorkerError):
    """Bytes that do not follow the AsyncTaskAPI protocol (docs/protocol.md)."""


class EnvelopeDecodeError(ProtocolError):
    """An inbound body is not a valid envelope: a poison message.

    The message says what is wrong and never echoes the body.

    Attributes:
        reason: one of the fixed poison reasons (``protocol.codes.PoisonReason`` values).
        task_id: the task id, when the body carries a valid one, so that a failure report can
            still reach the client; otherwise ``None``.
        client_id: the client id, when it can be recovered the same way.
    """

    code: ClassVar[str] = "POISON_MESSAGE"

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        task_id: str | None = None,
        client_id: str | None = None,
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.task_id = task_id
        self.client_id = client_id
        super().__init__(f"{reason}: {detail}")


class CancelDecodeError(ProtocolError):
    """A body from the control exchange is not a valid cancel request; the worker drops it.

    No report follows (a cancel request concludes nothing by itself), so the task id is kept
    for the log line alone. The message says what is wrong and never echoes the body.

    Attributes:
        reason: one of the fixed reasons (``protocol.codes.CancelDecodeReason`` values):
            ``too_large``, ``invalid_utf8``, ``invalid_json``, ``not_an_object``, ``too_deep``,
            ``unsupported_version`` or ``invalid_cancel``.
        detail: what is wrong: a size, a position, field paths and error kinds.
        task_id: the body's top-level ``task_id`` when it is a JSON object carrying a valid
            one; otherwise ``None``.
    """

    def __init__(self, reason: str, detail: str, *, task_id: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.task_id = task_id
        super().__init__(f"{reason}: {detail}")


class ReportEncodeError(ProtocolError):
    """A report cannot be encoded: not JSON-compatible, or over the size limit."""

    code: ClassVar[str] = "INVALID_RESULT"

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        self.too_large = too_large
        super().__init__(message)


class TransportError(AsyncTaskWorkerError):
    """A broker operation failed; adapters raise this from the client library's error."""

    retryable: ClassVar[bool] = True


class PublishError(TransportError):
    """A report was not published, or the broker did not confirm it."""


class ReportRefusedError(PublishError):
    """The broker refused a report for what it holds, not for a passing condition.

    Publishing it again cannot help: the task concludes with ``INVALID_RESULT`` instead (Step
    Functions' ``InvalidOutput``), or ``RESULT_TOO_LARGE`` when ``too_large`` is true.
    """

    code: ClassVar[str] = "INVALID_RESULT"
    retryable: ClassVar[bool] = False
    too_large: ClassVar[bool] = False


class MessageTooLargeError(ReportRefusedError):
    """The broker refused a report for its size (``max_message_size``, 256 KiB of output).

    RabbitMQ's ``max_message_size``, or Step Functions' limit on a task's output. Publishing
    it again cannot help: the task concludes with ``RESULT_TOO_LARGE``.
    """

    code: ClassVar[str] = "RESULT_TOO_LARGE"
    too_large: ClassVar[bool] = True


class SettleError(TransportError):
    """An ack, requeue or reject did not reach the broker (for instance, the channel closed)."""


class BrokerUnavailableError(TransportError):
    """The broker could not be reached (refused, unresolvable, timed out) within the deadline."""
