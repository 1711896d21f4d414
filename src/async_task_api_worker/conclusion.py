"""How one handler call ended: a response, or a failure code and message.

The task call (:mod:`async_task_api_worker.task_call`) makes a :data:`Conclusion`; every face
reports it as it is. It crosses process boundaries (a process-isolated child's answer, a
detached worker's result file, a Step Functions child's stdout) as one JSON shape, written and
read here alone::

    {"ok": true, "response": {...}}
    {"ok": false, "error": {"code": "...", "message": "...", "retryable": false,
                            "retry_delay_s": null}}

The reader trusts nothing it reads: a shape, a code or a message that breaks the protocol's
rules (``protocol/codes.py``) is a :class:`ValueError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from async_task_api_worker.protocol.codes import (
    ERROR_CODE_PATTERN,
    MAX_ERROR_MESSAGE_CHARS,
    RESERVED_ERROR_CODES,
)
from async_task_api_worker.protocol.encoding import utf8_json

__all__ = [
    "Conclusion",
    "ExecutionResult",
    "Failure",
    "HandedOff",
    "LeaseLapsed",
    "Response",
    "conclusion_from_json",
    "conclusion_to_json",
    "dump_conclusion",
]


@dataclass(frozen=True, slots=True)
class Response:
    """The handler returned; ``value`` is its output model dumped as a JSON object."""

    value: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failure:
    """The task failed with ``code`` and ``message`` (the failure report's ``error``).

    Attributes:
        code: a protocol error code (``^[A-Z][A-Z0-9_]{0,63}$``).
        message: at most 1,024 characters (``MAX_ERROR_MESSAGE_CHARS``; longer is cut).
        retryable: a ``RetryableError``: the delivery may be tried again while attempts remain.
        retry_delay_s: the ``RetryableError``'s own delay, in seconds, or ``None``.
    """

    code: str
    message: str
    retryable: bool = False
    retry_delay_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.message) > MAX_ERROR_MESSAGE_CHARS:
            object.__setattr__(self, "message", self.message[:MAX_ERROR_MESSAGE_CHARS])


Conclusion = Response | Failure


@dataclass(frozen=True, slots=True)
class HandedOff:
    """The call was handed to a worker that outlives the delivery (a detached worker).

    Its terminal report follows later, from whoever collects that worker's result (the
    ``tick`` command's sweep); the delivery is acked now, its hand-off being durable.

    Attributes:
        already: the task had been handed off before (a redelivery): nothing was handed off
            now, and no ``started`` was published for it.
    """

    already: bool = False


@dataclass(frozen=True, slots=True)
class LeaseLapsed:
    """The task's process held a lease its worker did not renew in time (``ports.Lease``).

    It stopped itself (or the worker stopped it), and the broker may have handed the task to
    another worker meanwhile: whatever the process concluded is not reported, and the
    delivery goes back (the engine's give-back, or nothing where the transport has withdrawn
    it already).
    """


#: What an executor's ``execute`` returns: a conclusion, a durable hand-off, or a run whose
#: lease lapsed.
ExecutionResult = Conclusion | HandedOff | LeaseLapsed


def conclusion_to_json(conclusion: Conclusion) -> dict[str, Any]:
    """``conclusion`` as the JSON object of the module's docstring."""
    if isinstance(conclusion, Response):
        return {"ok": True, "response": conclusion.value}
    return {
        "ok": False,
        "error": {
            "code": conclusion.code,
            "message": conclusion.message,
            "retryable": conclusion.retryable,
            "retry_delay_s": conclusion.retry_delay_s,
        },
    }


def dump_conclusion(conclusion: Conclusion) -> bytes:
    r"""``conclusion`` as its JSON object in strict UTF-8 text (a child's answer on a pipe).

    A lone surrogate is written as its ``\u`` escape, the one form UTF-8 can carry: a failure's
    message may hold one; a response holding one is refused where it is reported
    (``protocol.encoding.check_tree``), whatever wrote it.

    Raises:
        ValueError: the response holds NaN or an infinity (not JSON).
        TypeError: the response holds a value JSON has no form for.
    """
    document = conclusion_to_json(conclusion)
    return utf8_json(document, allow_nan=False, separators=(",", ":")).encode("utf-8")


def conclusion_from_json(
    document: object,
    *,
    sdk_codes: frozenset[str] = frozenset(),
    names: bool = False,
) -> Conclusion:
    """Read a conclusion back, checking every field.

    Args:
        document: the JSON object.
        sdk_codes: the reserved codes (``protocol.codes.RESERVED_ERROR_CODES``) its writer may
            claim: a child process cannot claim a timeout or a dead worker, only what its task
            call concludes.
        names: the code may also be a name its reader translates (seed 000's exception class
            names, ``sfn.subprocesses``): any non-empty string.

    Raises:
        ValueError: not the shape of the module's docstring, or a code, message or delay that
            breaks the protocol's rules, or a reserved code outside ``sdk_codes``.
    """
    if not isinstance(document, dict) or not isinstance(document.get("ok"), bool):
        raise ValueError("not a conclusion (no boolean 'ok')")
    if document["ok"]:
        response = document.get("response")
        if not isinstance(response, dict):
            raise ValueError("a response that is not a JSON object")
        return Response(response)
    error = document.get("error")
    if not isinstance(error, dict):
        raise ValueError("a failure without its 'error' object")
    code, message = error.get("code"), error.get("message")
    retryable, delay = error.get("retryable", False), error.get("retry_delay_s")
    if not isinstance(code, str) or not (ERROR_CODE_PATTERN.fullmatch(code) or (names and code)):
        raise ValueError("a failure whose code breaks the code rule")
    if code in RESERVED_ERROR_CODES and code not in sdk_codes:
        raise ValueError(f"a failure with the SDK's own code {code}, which its writer cannot claim")
    if not isinstance(message, str) or len(message) > MAX_ERROR_MESSAGE_CHARS:
        raise ValueError("a failure whose message is not a string of at most 1,024 characters")
    if not isinstance(retryable, bool):
        raise ValueError("a failure whose 'retryable' is not a boolean")
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not (delay >= 0 and math.isfinite(delay))
    ):
        raise ValueError("a failure whose retry delay is not a finite number of seconds >= 0")
    return Failure(code, message, retryable, None if delay is None else float(delay))
