"""The SDK's exceptions, all rooted at :class:`AsyncTaskWorkerError`.

The tree::

    AsyncTaskWorkerError
    ├── TaskError                  raised by handlers on purpose; carries a protocol code
    │   ├── FatalError             conclude the task now with this code
    │   └── RetryableError         requeue and try again, up to the delivery limit
    ├── TaskTimeoutError           the handler ran past its timeout (code TASK_TIMEOUT)
    ├── IsolatedTaskError          a task's child process crashed or left no valid result
    ├── RemoteHandlerError         a handler raised in its child process (INTERNAL_ERROR)
    ├── ProtocolError              bytes that do not follow docs/protocol.md
    │   ├── EnvelopeDecodeError    an inbound body that is not a valid envelope (a poison message)
    │   ├── CancelDecodeError      a control message that is not a valid cancel request
    │   └── ReportEncodeError      a report that cannot be encoded (too large, not JSON)
    ├── TransportError             a broker operation failed (mapped from the client library)
    │   ├── PublishError           a report was not confirmed by the broker
    │   │   └── MessageTooLargeError   the broker refused it for its size, for good
    │   ├── SettleError            an ack, requeue or reject did not reach the broker
    │   └── BrokerUnavailableError the broker could not be reached in time
    └── ConfigError (ValueError)   misuse and configuration, kept apart from runtime failures
        ├── SettingsError          an invalid setting (the CLI exits 2)
        │   └── TimeBudgetError    the task timeout does not fit under the consumer timeout
        ├── BrokerRefusedError     the broker refused the credentials, vhost or a queue (exit 2)
        ├── TargetError            ``module:attribute`` does not name a loadable Worker
        ├── InvalidErrorCodeError  a FatalError / RetryableError code outside the code rule
        └── DefinitionError (TypeError)   a mistake in a Worker definition
            ├── InvalidWorkerNameError
            ├── DuplicateTaskError
            ├── NoTaskError
            ├── InvalidTimeoutError
            ├── HandlerSignatureError
            │   ├── HandlerKindError
            │   ├── ContextParameterError
            │   ├── InputModelError
            │   └── OutputModelError
            ├── IsolationError
            ├── ErrorDeclarationError
            ├── HookNotAsyncError
            └── InvalidProbeNameError

Every class has a class-level ``code`` (from the protocol's error-code table, see
``protocol.codes``) and ``retryable``; instances of :class:`TaskError` carry their own code.
The module is over 400 lines because it is the whole tree above, one short class after
another: splitting it would only scatter the list.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AsyncTaskWorkerError",
    "BrokerRefusedError",
    "BrokerUnavailableError",
    "CancelDecodeError",
    "ConfigError",
    "ContextParameterError",
    "DefinitionError",
    "DuplicateTaskError",
    "EnvelopeDecodeError",
    "ErrorDeclarationError",
    "FatalError",
    "HandlerKindError",
    "HandlerSignatureError",
    "HookNotAsyncError",
    "InputModelError",
    "InvalidErrorCodeError",
    "InvalidProbeNameError",
    "InvalidTimeoutError",
    "InvalidWorkerNameError",
    "IsolatedTaskError",
    "IsolationError",
    "MessageTooLargeError",
    "NoTaskError",
    "OutputModelError",
    "ProtocolError",
    "PublishError",
    "RemoteHandlerError",
    "ReportEncodeError",
    "ReportRefusedError",
    "RetryableError",
    "SettingsError",
    "SettleError",
    "TargetError",
    "TaskError",
    "TaskTimeoutError",
    "TimeBudgetError",
    "TransportError",
]


class AsyncTaskWorkerError(Exception):
    """Root of every exception the SDK raises on purpose."""

    code: ClassVar[str] = "INTERNAL_ERROR"
    retryable: ClassVar[bool] = False


def _check_code(code: str) -> str:
    if not isinstance(code, str) or not ERROR_CODE_PATTERN.fullmatch(code):
        raise InvalidErrorCodeError(
            f"error code {code!r} does not match {ERROR_CODE_PATTERN.pattern}"
        )
    if code in RESERVED_ERROR_CODES:
        raise InvalidErrorCodeError(f"error code {code} is reserved for the SDK")
    return code


class TaskError(AsyncTaskWorkerError):
    """A failure a handler raises on purpose, with a code the client can match.

    Attributes:
        task_code: the code published in the ``failure`` report.
        message: the human-readable message published with it (at most 1,024 characters;
            a longer one is cut).
    """

    def __init__(self, code: str, message: str) -> None:
        self.task_code = _check_code(code)
        self.message = str(message)[:MAX_ERROR_MESSAGE_CHARS]
        super().__init__(f"{self.task_code}: {self.message}")


def is_well_formed(error: TaskError) -> bool:
    """Whether a handler's error still carries a usable code, message and retry delay.

    A subclass that skipped ``super().__init__``, or a code changed after construction, would
    otherwise put an invalid report on the wire; such an error is an ``INTERNAL_ERROR``
    instead (docs/protocol.md, "Error codes").
    """
    code = getattr(error, "task_code", None)
    delay = getattr(error, "retry_delay_s", None)
    return (
        isinstance(code, str)
        and ERROR_CODE_PATTERN.fullmatch(code) is not None
        and code not in RESERVED_ERROR_CODES
        and isinstance(getattr(error, "message", None), str)
        and (delay is None or (isinstance(delay, float) and 0 <= delay < float("inf")))
    )


class FatalError(TaskError):
    """Fail the task now: one ``failure`` report with ``code`` and ``message``, input acked.

    Args:
        code: the error code, matching ``^[A-Z][A-Z0-9_]{0,63}$`` and not one of the SDK's
            reserved codes (docs/protocol.md, "Error codes").
        message: a message for the client. It is published as is: keep secrets out of it.

    Raises:
        InvalidErrorCodeError: ``code`` breaks the code rule.
    """

    retryable: ClassVar[bool] = False


class RetryableError(TaskError):
    """A transient failure: the delivery is requeued and tried again.

    The delivery is requeued (counted as a failed attempt) after a backoff, until the attempt
    reaches ``WORKER_DELIVERY_LIMIT``; that last attempt concludes the task with a ``failure``
    report carrying this error's code and message.

    Args:
        code: the code of the final failure report (default ``TRANSIENT_ERROR``), under the
            same rule as :class:`FatalError`.
        message: the message of the final failure report.
        retry_delay_s: wait this many seconds before the requeue instead of the exponential
            backoff; always capped by ``WORKER_RETRY_BACKOFF_MAX_S``.

    Raises:
        InvalidErrorCodeError: ``code`` breaks the code rule.
        ValueError: ``retry_delay_s`` is negative or not finite.
    """

    retryable: ClassVar[bool] = True

    def __init__(
        self,
        code: str = "TRANSIENT_ERROR",
        message: str = "The task failed with a transient error.",
        *,
        retry_delay_s: float | None = None,
    ) -> None:
        super().__init__(code, message)
        if retry_delay_s is not None and not (0.0 <= float(retry_delay_s) < float("inf")):
            raise ValueError("retry_delay_s must be a finite number of seconds >= 0")
        self.retry_delay_s = None if retry_delay_s is None else float(retry_delay_s)


class TaskTimeoutError(AsyncTaskWorkerError):
    """The handler did not finish within its timeout (protocol code ``TASK_TIMEOUT``)."""

    code: ClassVar[str] = "TASK_TIMEOUT"


class TaskCancelledError(AsyncTaskWorkerError):
    """The task's client cancelled it (protocol code ``TASK_CANCELLED``).

    Raised by ``ctx.raise_if_cancelled()`` in a handler, to unwind a ``def`` handler that a
    cancel reached: the worker has concluded the task already (docs/protocol.md, "Cancelling a
    task"), so what the handler does after it is not reported.
    """

    code: ClassVar[str] = "TASK_CANCELLED"


class IsolatedTaskError(AsyncTaskWorkerError):
    """A process-isolated task ended without a usable result.

    Its process died from a signal the SDK did not send (a segfault, the OOM killer, a CPU
    limit: ``WORKER_CRASHED``), hit its memory limit (``WORKER_CRASHED``), or exited without a
    valid result (``INVALID_RESULT``). The engine publishes ``task_code`` with ``message``.

    Attributes:
        task_code: the SDK's error code for the failure report.
        message: what happened, without the task's data.
    """

    def __init__(self, task_code: str, message: str) -> None:
        self.task_code = task_code
        self.message = message
        super().__init__(f"{task_code}: {message}")


class RemoteHandlerError(AsyncTaskWorkerError):
    """A handler running in a child process raised an exception that is not a ``TaskError``.

    Reported as ``INTERNAL_ERROR``, as in process. Only the exception's type and its frames
    cross the process boundary, never its message (docs/protocol.md, "Payloads and secrets").

    Attributes:
        remote_type_name: ``module.QualifiedName`` of the exception raised in the child.
        remote_traceback: its frames and types (no message, no source line).
    """

    def __init__(self, remote_type_name: str, remote_traceback: str) -> None:
        self.remote_type_name = remote_type_name
        self.remote_traceback = remote_traceback
        super().__init__(f"the handler raised {remote_type_name} in its process")


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


class ConfigError(AsyncTaskWorkerError, ValueError):
    """Misuse or configuration: fix the code or the environment, retrying will not help."""


class SettingsError(ConfigError):
    """An invalid setting; the message is one line naming the variable, never its value."""


class TimeBudgetError(SettingsError):
    """The task timeout does not fit under the broker's consumer timeout.

    Rule (RabbitMQ closes a channel whose delivery stays unacked past ``consumer_timeout``):
    ``task timeout + WORKER_RETRY_BACKOFF_MAX_S + 60 s < WORKER_CONSUMER_TIMEOUT_S``.
    """


class BrokerRefusedError(ConfigError):
    """The broker refused us: wrong credentials, no access to the vhost, or to one of its queues.

    Retrying cannot help, so the worker exits 2 at once instead of reconnecting forever.
    """


class TargetError(ConfigError):
    """``module:attribute`` does not name an importable Worker (or a factory returning one)."""


class InvalidErrorCodeError(ConfigError):
    """An error code outside ``^[A-Z][A-Z0-9_]{0,63}$``, or one reserved for the SDK."""


class DefinitionError(ConfigError, TypeError):
    """A mistake in a :class:`~async_task_api_worker.Worker` definition."""


class InvalidWorkerNameError(DefinitionError):
    """The worker's name is not a valid service name."""


class DuplicateTaskError(DefinitionError):
    """A second ``@worker.task`` on a worker that already has its one task."""


class NoTaskError(DefinitionError):
    """The worker is used before a ``@worker.task`` was declared."""


class InvalidTimeoutError(DefinitionError):
    """``timeout`` is not a positive, finite number of seconds."""


class HandlerSignatureError(DefinitionError):
    """The handler's signature is not ``(task_input: Model, ctx: Context) -> Model``."""


class HandlerKindError(HandlerSignatureError):
    """The handler is not a plain ``def`` or ``async def`` function (a generator, a class...)."""


class ContextParameterError(HandlerSignatureError):
    """The context parameter is not annotated exactly ``TaskContext`` / ``SyncTaskContext``."""


class InputModelError(HandlerSignatureError):
    """The input parameter is not annotated with a pydantic model class."""


class OutputModelError(HandlerSignatureError):
    """The return annotation is not a pydantic model class."""


class IsolationError(DefinitionError):
    """``isolation=``, ``memory_limit_bytes=`` or ``cpu_limit_s=`` of ``@worker.task`` is wrong."""


class ErrorDeclarationError(DefinitionError):
    """``errors=`` of ``@worker.task`` holds a bad or reserved code, or a blank description."""


class HookNotAsyncError(DefinitionError):
    """A hook or readiness probe is not an ``async def`` function."""


class InvalidProbeNameError(DefinitionError):
    """A readiness probe name is reserved, invalid, or already used."""


# Imported last, once every class above exists: the protocol package imports this module's
# exceptions, and the code rule and the message limit are the protocol's (protocol/codes.py).
from async_task_api_worker.protocol.codes import (  # noqa: E402
    ERROR_CODE_PATTERN,
    MAX_ERROR_MESSAGE_CHARS,
    RESERVED_ERROR_CODES,
)
