"""The Step Functions worker's own exceptions (seed 000, "Failure taxonomy").

They are raised by the worker, never dispatched from a subprocess's output: a child printing
``{"error": "AbortedStaleTask"}`` cannot fake one (the name registry leaves them out).
"""

from __future__ import annotations

__all__ = [
    "FRAMEWORK_EXCEPTIONS",
    "AbortedStaleTask",
    "MalformedMessage",
    "MalformedSubprocessOutput",
    "SubprocessCrashError",
    "SubprocessOutputTooLarge",
    "SubprocessTimeoutError",
    "UnknownSubprocessError",
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

    Its stdout was not a JSON object (exit 0), or not an ``ErrorOutput`` envelope (exit 1), or
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
