"""The SQS + Step Functions message format, both ways: a body in, the token's end out.

Inbound, an SQS body is what a ``sqs:sendMessage.waitForTaskToken`` state sends: one JSON
object holding ``task_token`` and the task input's fields side by side (docs/sfn.md)::

    {"task_token": "AQB8...", "text": "hello big world"}

:func:`read_body` takes the token out (it is the delivery's reply address) and gives the engine
the protocol's :class:`~async_task_api_worker.protocol.envelope.Envelope`: the SQS message id as
``task_id``, ``step-functions`` as ``client_id``, the rest of the object as ``input`` (or the
whole object, token included, for seed 000's ``request_schema``, which declares it).

Outbound, each report maps to the Step Functions API (:func:`output_of`, :func:`failure_of`):
``success`` to ``SendTaskSuccess`` with the response as ``output`` (strict JSON, at most 256 KiB
of UTF-8), ``failure`` to ``SendTaskFailure`` with the code as ``error`` (at most 256
characters) and the message as ``cause`` (at most 32,768).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from async_task_api_worker.errors import EnvelopeDecodeError, MessageTooLargeError
from async_task_api_worker.protocol.codes import PoisonReason
from async_task_api_worker.protocol.envelope import (
    ID_PATTERN,
    PROTOCOL_VERSION,
    Envelope,
    check_depth,
    read_object,
)
from async_task_api_worker.protocol.reports import EncodedReport, FailureReport, response_json

__all__ = [
    "trace_headers",
    "MAX_CAUSE_CHARS",
    "MAX_ERROR_CHARS",
    "MAX_OUTPUT_BYTES",
    "STEP_FUNCTIONS_CLIENT",
    "TOKEN_FIELD",
    "ReadBody",
    "failure_of",
    "output_of",
    "read_body",
    "salvage_token",
]

#: Step Functions' limit on a task's output (``SendTaskSuccess``'s ``output``), in bytes.
MAX_OUTPUT_BYTES: Final = 256 * 1024
#: ``SendTaskFailure``'s limits, in characters (AWS API reference).
MAX_ERROR_CHARS: Final = 256
MAX_CAUSE_CHARS: Final = 32768
#: The body's field that holds the task token (``"task_token.$": "$$.Task.Token"``).
TOKEN_FIELD: Final = "task_token"  # noqa: S105 - a field name, not a secret
#: The ``client_id`` of every task that comes from Step Functions.
STEP_FUNCTIONS_CLIENT: Final = "step-functions"

_ID_RE: Final = re.compile(ID_PATTERN)
_TOKEN_IN_TEXT: Final = re.compile(r'"task_token"\s*:\s*"([^"\\]+)"')
_NO_TOKEN: Final = "no task token to report to"  # noqa: S105 - a message


@dataclass(frozen=True, slots=True)
class ReadBody:
    """What an SQS body holds.

    Attributes:
        token: the task token, or ``None`` when the body has no usable one (nobody to tell).
        envelope: the task's envelope, or ``None`` when the body is refused.
        error: why the body is refused (a poison message), or ``None``. With a token, its
            ``task_id`` is set: the refusal is reported, so the token is ended.
    """

    token: str | None
    envelope: Envelope | None = None
    error: EnvelopeDecodeError | None = None


def _token_of(document: Mapping[str, Any]) -> str | None:
    token = document.get(TOKEN_FIELD)
    return token if isinstance(token, str) and token.strip() else None


def salvage_token(body: bytes) -> str | None:
    """The task token of a body the strict reader refuses, when it can still be found.

    A body too large, nested past the parser, with ``NaN``, ``1e400``, an endless integer or a
    byte-order mark still holds a token Step Functions waits on: it is read leniently (numbers
    ignored), or, when even that fails, taken from the one ``"task_token": "..."`` in the text.
    """
    text = body.decode("utf-8", "replace").lstrip("\ufeff")
    try:
        document = json.loads(
            text,
            parse_constant=lambda _constant: None,
            parse_float=lambda _number: None,
            parse_int=lambda _number: None,
        )
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict):
        return _token_of(document)
    found = _TOKEN_IN_TEXT.findall(text)
    return found[0] if len(found) == 1 and found[0].strip() else None


def read_body(
    body: bytes, *, message_id: str, service: str, keep_token: bool, max_body_bytes: int
) -> ReadBody:
    """Read an SQS body (see the module); never raises.

    Args:
        body: the body, UTF-8 bytes.
        message_id: the SQS message id: the task's ``task_id`` (a UUID); one that breaks the
            protocol's id rule is refused.
        service: the worker's service name, the envelope's ``service``.
        keep_token: keep ``task_token`` in the input (seed 000's ``request_schema`` declares
            it); otherwise it is removed before the input is validated.
        max_body_bytes: ``WORKER_MAX_MESSAGE_BYTES``.
    """
    if not _ID_RE.fullmatch(message_id):
        # No id the reports could carry: a refusal still ends the token under this one.
        message_id = "sqs-message"
    try:
        document, text = read_object(body, max_body_bytes=max_body_bytes)
    except EnvelopeDecodeError as exc:
        salvaged = salvage_token(body)
        if salvaged is None:
            detail = f"{exc.detail}; {_NO_TOKEN} (SQS message {message_id})"
            return ReadBody(None, error=EnvelopeDecodeError(exc.reason, detail))
        refused = EnvelopeDecodeError(
            exc.reason, exc.detail, task_id=message_id, client_id=STEP_FUNCTIONS_CLIENT
        )
        return ReadBody(salvaged, error=refused)  # refused, and reported: the token ends
    token = _token_of(document)
    if token is None:
        return ReadBody(
            None,
            error=EnvelopeDecodeError(
                PoisonReason.INVALID_ENVELOPE,
                f"the body has no {TOKEN_FIELD} (a non-empty string); {_NO_TOKEN} "
                f"(SQS message {message_id})",
            ),
        )
    try:
        check_depth(document, text, task_id=message_id, client_id=STEP_FUNCTIONS_CLIENT)
    except EnvelopeDecodeError as exc:
        return ReadBody(token, error=exc)
    task_input = (
        document
        if keep_token
        else {key: value for key, value in document.items() if key != TOKEN_FIELD}
    )
    envelope = Envelope.model_validate(
        {
            "protocol_version": PROTOCOL_VERSION,
            "task_id": message_id,
            "client_id": STEP_FUNCTIONS_CLIENT,
            "service": service,
            "input": task_input,
        }
    )
    return ReadBody(token, envelope=envelope)


def output_of(report: EncodedReport) -> str:
    r"""The ``output`` of ``SendTaskSuccess`` for a ``success`` report: its response.

    The response's canonical JSON (strict: no NaN, and valid Unicode: the report's encoder
    refused a response holding a lone surrogate, ``protocol.encoding.check_tree``).

    Raises:
        MessageTooLargeError: its UTF-8 bytes exceed :data:`MAX_OUTPUT_BYTES`.
    """
    output = response_json(report)  # as encoded for the report: not encoded a second time
    if len(output) > MAX_OUTPUT_BYTES:
        raise MessageTooLargeError(
            f"the output is {len(output)} bytes; Step Functions takes {MAX_OUTPUT_BYTES}"
        )
    return output.decode("utf-8")


def failure_of(report: EncodedReport, error_names: Mapping[str, str]) -> tuple[str, str]:
    """``error`` and ``cause`` of ``SendTaskFailure`` for a ``failure`` report.

    Args:
        report: the failure report.
        error_names: the ``error`` to send for a code, where a face names it otherwise (seed
            000's names: ``TASK_TIMEOUT`` is ``SubprocessTimeoutError``); other codes go as
            they are.

    Returns:
        ``error`` (the code, at most 256 characters) and ``cause`` (the report's message, at
        most 32,768: it never holds the task's input or result).
    """
    assert isinstance(report.report, FailureReport)  # noqa: S101 - the transport's own call
    code = report.report.error.code
    error = error_names.get(code, code)
    return error[:MAX_ERROR_CHARS], report.report.error.message[:MAX_CAUSE_CHARS]


def trace_headers(message: Mapping[str, Any]) -> dict[str, str]:
    """The ``traceparent`` and ``tracestate`` message attributes of an SQS message, if any."""
    attributes = message.get("MessageAttributes") or {}
    return {
        name: str(value["StringValue"])
        for name, value in attributes.items()
        if name in ("traceparent", "tracestate")
        and isinstance(value, Mapping)
        and "StringValue" in value
    }
