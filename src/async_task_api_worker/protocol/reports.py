"""The outbound reports a worker publishes for a task, and their AMQP properties.

Source: docs/protocol.md, "Reports". Every delivery that carries a task id ends with exactly one
terminal report (``success`` or ``failure``); ``started`` and ``progress`` may come before it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from async_task_api_worker.errors import ProtocolError, ReportEncodeError
from async_task_api_worker.protocol.codes import (
    ERROR_CODE_PATTERN,
    MAX_ERROR_MESSAGE_CHARS,
    ReportType,
)
from async_task_api_worker.protocol.encoding import (
    MAX_REPORT_BYTES,
    canonical_dumps,
    check_tree,
    strict_loads,
)
from async_task_api_worker.protocol.envelope import (
    ID_PATTERN,
    PROTOCOL_VERSION,
    SERVICE_PATTERN,
    ProtocolVersion,
    describe_validation_error,
)

__all__ = [
    "MAX_ERROR_MESSAGE_CHARS",
    "TIMESTAMP_PATTERN",
    "EncodedReport",
    "FailureReport",
    "MessageProperties",
    "ProgressReport",
    "Report",
    "ReportError",
    "StartedReport",
    "SuccessReport",
    "decode_report",
    "encode_report",
    "format_timestamp",
    "response_json",
]

#: Report timestamps: UTC, microseconds always written, ``Z`` suffix.
TIMESTAMP_PATTERN: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"


_Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


def format_timestamp(moment: datetime) -> str:
    """Format an aware datetime as a report timestamp (``2026-11-29T22:48:46.123456Z``)."""
    # isoformat is about three times faster than strftime, and this runs for every report.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


class _ReportBase(BaseModel):
    # The worker only builds reports (``model_construct``, which needs no validator); their
    # validators are built on the first validation, by a consumer: not at every start.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, defer_build=True)

    protocol_version: ProtocolVersion = PROTOCOL_VERSION
    task_id: _Identifier
    client_id: _Identifier | None
    service: Annotated[str, StringConstraints(pattern=SERVICE_PATTERN)]
    attempt: Annotated[int, Field(ge=1)]
    timestamp: Annotated[str, StringConstraints(pattern=TIMESTAMP_PATTERN)]


class StartedReport(_ReportBase):
    """The handler is about to run (published once per attempt, after input validation)."""

    type: Literal["started"] = "started"


class ProgressReport(_ReportBase):
    """The task's latest progress: ``fraction`` in [0, 1), never going back within an attempt."""

    type: Literal["progress"] = "progress"
    fraction: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
    payload: dict[str, Any] | None = None


class SuccessReport(_ReportBase):
    """The task succeeded; ``response`` is the handler's output model as a JSON object."""

    type: Literal["success"] = "success"
    response: dict[str, Any]


def _check_message_length(message: str) -> str:
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        raise ValueError(f"message is longer than {MAX_ERROR_MESSAGE_CHARS} characters")
    return message


class ReportError(BaseModel):
    """The ``error`` of a failure report: a stable ``code`` and a human-readable ``message``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    code: Annotated[str, StringConstraints(pattern=ERROR_CODE_PATTERN.pattern)]
    # Checked in Python rather than with ``max_length``: pydantic-core refuses a constrained
    # string holding a lone surrogate (``string_unicode``), and a handler's message may hold
    # one (a file name read with ``surrogateescape``), which the encoder writes as ``\udxxx``.
    message: Annotated[
        str,
        AfterValidator(_check_message_length),
        Field(json_schema_extra={"maxLength": MAX_ERROR_MESSAGE_CHARS}),
    ]


class FailureReport(_ReportBase):
    """The task failed; ``client_id`` is null for a poison body without a valid one, or a lost one.

    A lost one: a detached task whose marker and input could not be read (``WORKER_DIED``).
    """

    type: Literal["failure"] = "failure"
    error: ReportError


AnyReport = StartedReport | ProgressReport | SuccessReport | FailureReport
Report = Annotated[
    StartedReport | ProgressReport | SuccessReport | FailureReport, Field(discriminator="type")
]


@functools.cache
def _report_adapter() -> TypeAdapter[
    StartedReport | ProgressReport | SuccessReport | FailureReport
]:
    return TypeAdapter(Report)


@dataclass(frozen=True, slots=True)
class MessageProperties:
    """The AMQP basic properties of a published report (docs/protocol.md, "AMQP properties").

    Also those of a cancel request (``protocol.cancel.encode_cancel``; docs/protocol.md,
    "Cancelling a task"): there ``delivery_mode`` is 1 and ``app_id`` the client id.

    Attributes:
        message_id: ``<task_id>/<attempt>/<seq>``, ``seq`` counting the reports of one attempt
            from 0, so that a consumer can drop a duplicate.
        correlation_id: the task id.
        type: the report type.
        timestamp_s: publication time, whole seconds since the Unix epoch (AMQP ``timestamp``).
        app_id: the worker's service name.
        content_type: always ``application/json``.
        content_encoding: always ``utf-8``.
        delivery_mode: 2 (persistent) for a report.
        headers: AMQP headers: the trace context of the report's ``send`` span
            (``traceparent``, ``tracestate``), written just before it is first sent; empty
            when nothing is traced.
    """

    message_id: str
    correlation_id: str
    type: str
    timestamp_s: int
    app_id: str
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    delivery_mode: int = 2
    headers: dict[str, str] = field(default_factory=dict, compare=False)

    def recorded(self) -> dict[str, str | int]:
        """The properties as the golden vectors record them (``timestamp`` in seconds).

        The headers are left out: they carry a trace context, which no vector pins.
        """
        return {
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "delivery_mode": self.delivery_mode,
            "message_id": self.message_id,
            "correlation_id": self.correlation_id,
            "type": self.type,
            "timestamp": self.timestamp_s,
            "app_id": self.app_id,
        }


@dataclass(frozen=True, slots=True)
class EncodedReport:
    """A report ready to publish: the model, its canonical bytes and its AMQP properties."""

    report: StartedReport | ProgressReport | SuccessReport | FailureReport
    body: bytes
    properties: MessageProperties

    @property
    def type(self) -> ReportType:
        """The report's type."""
        return ReportType(self.report.type)

    @property
    def task_id(self) -> str:
        """The task the report is about."""
        return self.report.task_id


def _document(
    report: StartedReport | ProgressReport | SuccessReport | FailureReport,
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "protocol_version": report.protocol_version,
        "type": report.type,
        "task_id": report.task_id,
        "client_id": report.client_id,
        "service": report.service,
        "attempt": report.attempt,
        "timestamp": report.timestamp,
    }
    if isinstance(report, ProgressReport):
        document["fraction"] = float(report.fraction)
        document["payload"] = report.payload
    elif isinstance(report, SuccessReport):
        document["response"] = report.response
    elif isinstance(report, FailureReport):
        document["error"] = {"code": report.error.code, "message": report.error.message}
    return document


def encode_report(
    report: StartedReport | ProgressReport | SuccessReport | FailureReport,
    *,
    seq: int = 0,
    max_bytes: int = MAX_REPORT_BYTES,
) -> EncodedReport:
    """Encode a report to its canonical bytes and AMQP properties.

    Args:
        report: the report.
        seq: the report's position among the reports of its attempt, from 0.
        max_bytes: the largest encoded report accepted, in bytes.

    Returns:
        The encoded report.

    Raises:
        ReportEncodeError: a payload or response is not canonical JSON or not valid Unicode
            (a lone surrogate), or the encoded report exceeds ``max_bytes`` (``too_large`` is
            then true).
    """
    document = _document(report)
    # Only the handler's response or payload can hold what JSON would change (a non-string
    # key, a lone surrogate) or nest too deep; they sit at the document's second level.
    for user_part in ("response", "payload"):
        if user_part in document:
            check_tree(document[user_part], depth=2, valid_unicode=True)
    body = canonical_dumps(document, tree_checked=True)
    if len(body) > max_bytes:
        raise ReportEncodeError(
            f"{report.type} report of {len(body)} bytes exceeds {max_bytes} bytes", too_large=True
        )
    # fromisoformat reads the Z suffix since Python 3.11, 25 times faster than strptime: this
    # runs for every report.
    moment = datetime.fromisoformat(report.timestamp)
    properties = MessageProperties(
        message_id=f"{report.task_id}/{report.attempt}/{seq}",
        correlation_id=report.task_id,
        type=report.type,
        timestamp_s=int(moment.timestamp()),
        app_id=report.service,
    )
    return EncodedReport(report=report, body=body, properties=properties)


def response_json(encoded: EncodedReport) -> bytes:
    """The canonical bytes of a ``success`` report's response, read from its encoded body.

    They are the same bytes ``canonical_dumps(response)`` gives (the encoder is the same, and
    a value encodes alike at any depth), taken from where :func:`encode_report` wrote them
    rather than encoded again. The body's keys are sorted: ``response`` follows ``attempt``,
    ``client_id`` and ``protocol_version`` (a number and identifiers, which hold no quote) and
    precedes ``service`` (then ``task_id``, ``timestamp``, ``type``: identifiers too), so the
    first ``"response":`` and the last ``,"service":`` bound it.

    Raises:
        ValueError: ``encoded`` is not a ``success`` report.
    """
    if not isinstance(encoded.report, SuccessReport):
        raise ValueError(f"a {encoded.type} report has no response")
    body = encoded.body
    start = body.index(b'"response":') + len(b'"response":')
    return body[start : body.rindex(b',"service":')]


def decode_report(body: bytes) -> StartedReport | ProgressReport | SuccessReport | FailureReport:
    """Decode and validate a report's bytes (what a consumer of the output queue does).

    Raises:
        ProtocolError: the bytes are not a valid report; the message names the failing fields.
    """
    try:
        document = strict_loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"report is not UTF-8 JSON: {type(exc).__name__}") from exc
    try:
        return _report_adapter().validate_python(document)
    except ValidationError as exc:
        raise ProtocolError(f"invalid report: {describe_validation_error(exc)}") from None
