"""How a task fails: the errors a handler raises on purpose, and the SDK's own ends of a task.

A :class:`TaskError` carries a code under the protocol's code rule (``protocol.codes``); the
others have the SDK's reserved code of their class.
"""

from __future__ import annotations

from typing import ClassVar

from async_task_api_worker.errors.config import InvalidErrorCodeError
from async_task_api_worker.errors.root import AsyncTaskWorkerError
from async_task_api_worker.protocol.codes import (
    ERROR_CODE_PATTERN,
    MAX_ERROR_MESSAGE_CHARS,
    RESERVED_ERROR_CODES,
)

__all__ = [
    "FatalError",
    "IsolatedTaskError",
    "RemoteHandlerError",
    "RetryableError",
    "TaskCancelledError",
    "TaskError",
    "TaskTimeoutError",
    "is_well_formed",
]


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
