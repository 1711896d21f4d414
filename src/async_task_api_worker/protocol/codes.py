"""The protocol's fixed vocabularies and rules: error codes, report types, refusal reasons.

Source: docs/protocol.md, sections "Reports", "Error codes" and "Cancelling a task". The code
rule, the reserved codes and the message limit live here alone; ``errors`` and the report
models use them. This module imports nothing of the package, so that ``errors`` can import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "ERROR_CODE_PATTERN",
    "MAX_ERROR_MESSAGE_CHARS",
    "RESERVED_ERROR_CODES",
    "CancelDecodeReason",
    "ErrorCode",
    "PoisonReason",
    "ReportType",
]

#: The rule for error codes (docs/protocol.md, "Error codes"): an upper-case letter, then up to
#: 63 upper-case letters, digits or underscores. It keeps codes usable as metric label values.
ERROR_CODE_PATTERN: Final = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")

#: The longest ``error.message`` of a failure report, in characters; the SDK cuts longer ones.
MAX_ERROR_MESSAGE_CHARS: Final = 1024


class ReportType(StrEnum):
    """The ``type`` of an outbound report (also the AMQP ``type`` property)."""

    STARTED = "started"
    PROGRESS = "progress"
    SUCCESS = "success"
    FAILURE = "failure"

    @property
    def terminal(self) -> bool:
        """Whether this report ends the task (``success`` or ``failure``)."""
        return self in (ReportType.SUCCESS, ReportType.FAILURE)


class ErrorCode(StrEnum):
    """The codes the SDK itself publishes in ``failure`` reports.

    User codes (``FatalError``, ``RetryableError``) follow ``ERROR_CODE_PATTERN`` and may not be
    one of the reserved codes; ``INVALID_INPUT`` is the one SDK code a handler may also raise.
    What each code means is its :attr:`description`.
    """

    INVALID_INPUT = "INVALID_INPUT"
    TASK_TIMEOUT = "TASK_TIMEOUT"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    TASK_ABANDONED_AFTER_REDELIVERIES = "TASK_ABANDONED_AFTER_REDELIVERIES"
    POISON_MESSAGE = "POISON_MESSAGE"
    INVALID_RESULT = "INVALID_RESULT"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    TRANSIENT_ERROR = "TRANSIENT_ERROR"
    WORKER_CRASHED = "WORKER_CRASHED"
    WORKER_DIED = "WORKER_DIED"
    TASK_CANCELLED = "TASK_CANCELLED"

    @property
    def description(self) -> str:
        """What the code means, one sentence (docs/protocol.md, "Error codes")."""
        return _DESCRIPTIONS[self]


# Kept as data rather than as the members' docstrings: the AsyncAPI document
# (`async-task-api-worker asyncapi`) publishes them, and attribute docstrings vanish at run time.
_DESCRIPTIONS: Final[Mapping[ErrorCode, str]] = MappingProxyType(
    {
        ErrorCode.INVALID_INPUT: (
            "The task input failed the handler's input model; the message names the fields."
        ),
        ErrorCode.TASK_TIMEOUT: (
            "The handler ran past its timeout and was cancelled (or abandoned, for a thread)."
        ),
        ErrorCode.INTERNAL_ERROR: (
            "The handler raised an unexpected exception; its text is never published."
        ),
        ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES: (
            "The delivery came back more times than the delivery limit (a crash loop)."
        ),
        ErrorCode.POISON_MESSAGE: (
            "The inbound body is not a valid envelope, but its task id could be recovered."
        ),
        ErrorCode.INVALID_RESULT: (
            "The handler's return value failed its output model, or no valid result came back."
        ),
        ErrorCode.RESULT_TOO_LARGE: "The success report would exceed the report size limit.",
        ErrorCode.TRANSIENT_ERROR: (
            "Default code of a RetryableError that exhausted its attempts."
        ),
        ErrorCode.WORKER_CRASHED: (
            "An isolated task's process died from a signal the SDK did not send."
        ),
        ErrorCode.WORKER_DIED: "A detached worker left no result before its deadline.",
        ErrorCode.TASK_CANCELLED: (
            "The task was cancelled at its client's request: stopped while it ran, or never run."
        ),
    }
)


class PoisonReason(StrEnum):
    """Why an inbound body was refused (the ``reason`` of a poison message; a fixed set)."""

    TOO_LARGE = "too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    TOO_DEEP = "too_deep"
    INVALID_ENVELOPE = "invalid_envelope"
    UNSUPPORTED_VERSION = "unsupported_version"
    WRONG_SERVICE = "wrong_service"


class CancelDecodeReason(StrEnum):
    """Why a cancel request's body was refused (``CancelDecodeError.reason``; a fixed set).

    The checks and their order are the envelope's (:class:`PoisonReason`), with the body limit
    at 64 KiB, ``invalid_cancel`` for the fields, and no service to compare.
    """

    TOO_LARGE = "too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    TOO_DEEP = "too_deep"
    UNSUPPORTED_VERSION = "unsupported_version"
    INVALID_CANCEL = "invalid_cancel"


#: Codes only the SDK may assert: a handler cannot claim a timeout or a poison message.
#: ``INVALID_INPUT`` (a handler may refuse input it finds unusable) and ``TRANSIENT_ERROR`` (the
#: default code of a ``RetryableError``) are the SDK codes a handler may also raise.
RESERVED_ERROR_CODES: Final = frozenset(
    code.value
    for code in ErrorCode
    if code not in (ErrorCode.INVALID_INPUT, ErrorCode.TRANSIENT_ERROR)
)
