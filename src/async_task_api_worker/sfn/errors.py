"""The Step Functions worker's own exceptions (seed 000, "Failure taxonomy").

They are raised by the worker, never dispatched from a subprocess's output: a child printing
``{"error": "AbortedStaleTask"}`` cannot fake one (the name registry leaves them out).
"""

from __future__ import annotations

from async_task_api_worker.conclusion import Failure

__all__ = [
    "FRAMEWORK_EXCEPTIONS",
    "AbortedStaleTask",
    "MalformedMessage",
    "MalformedSubprocessOutput",
    "SubprocessCrashError",
    "SubprocessOutputTooLarge",
    "SubprocessTimeoutError",
    "UnknownSubprocessError",
    "named_failure",
]


class AbortedStaleTask(Exception):
    """A heartbeat found the task token stale: the subprocess's group was killed.

    Nothing is sent to Step Functions for that token: the execution has moved on.
    """


class MalformedMessage(Exception):
    """The SQS body is not JSON, or fails ``request_schema``.

    A failure is sent (best effort) when the body is a JSON object with a non-empty string
    ``task_token``; the message is deleted regardless.
    """


class SubprocessCrashError(Exception):
    """The subprocess died from a signal the worker did not send (a segfault, the OOM killer)."""


class MalformedSubprocessOutput(Exception):
    """The subprocess left no valid output.

    Its stdout was not a conclusion with a response (exit 0), or with a failure (exit 1), or
    it exited with another code.
    """


class UnknownSubprocessError(Exception):
    """The subprocess reported an error name that is not in ``exception_levels``."""


class SubprocessOutputTooLarge(Exception):
    """The subprocess's result exceeds what Step Functions accepts as output (256 KiB)."""


class SubprocessTimeoutError(Exception):
    """The subprocess ran past ``message_processing_timeout_minutes``; its group was killed."""


#: Never looked up by name from a subprocess's output.
FRAMEWORK_EXCEPTIONS: tuple[type[Exception], ...] = (
    AbortedStaleTask,
    MalformedMessage,
    MalformedSubprocessOutput,
    SubprocessCrashError,
    SubprocessOutputTooLarge,
    SubprocessTimeoutError,
    UnknownSubprocessError,
)


def named_failure(exc: BaseException, message: str | None = None) -> Failure:
    """Seed 000's failure for ``exc``: its class name as the code, ``message`` or its text.

    The name is looked up in the consumer's ``exception_levels`` at the face's edge
    (``sfn.subprocesses``), never here.
    """
    return Failure(type(exc).__name__, str(exc) if message is None else message)
