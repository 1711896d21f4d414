"""The AsyncTaskAPI wire protocol: envelope decoder, report models, cancel requests, codes.

docs/protocol.md is the normative text; the JSON Schemas under ``protocol/schemas/`` and the
golden vectors under ``conformance/vectors/`` are generated from and checked against this
package.
"""

from async_task_api_worker.protocol.cancel import (
    MAX_CANCEL_BYTES,
    CancelRequest,
    decode_cancel,
    encode_cancel,
)
from async_task_api_worker.protocol.codes import (
    ERROR_CODE_PATTERN,
    MAX_ERROR_MESSAGE_CHARS,
    RESERVED_ERROR_CODES,
    CancelDecodeReason,
    ErrorCode,
    PoisonReason,
    ReportType,
)
from async_task_api_worker.protocol.encoding import (
    MAX_NESTING_DEPTH,
    MAX_REPORT_BYTES,
    canonical_dumps,
)
from async_task_api_worker.protocol.envelope import (
    DEFAULT_MAX_BODY_BYTES,
    ID_PATTERN,
    PROTOCOL_VERSION,
    SERVICE_PATTERN,
    Envelope,
    InputRef,
    decode_envelope,
)
from async_task_api_worker.protocol.reports import (
    EncodedReport,
    FailureReport,
    MessageProperties,
    ProgressReport,
    Report,
    ReportError,
    StartedReport,
    SuccessReport,
    decode_report,
    encode_report,
    format_timestamp,
)

__all__ = [
    # envelope
    "DEFAULT_MAX_BODY_BYTES",
    "ID_PATTERN",
    "PROTOCOL_VERSION",
    "SERVICE_PATTERN",
    "Envelope",
    "InputRef",
    "decode_envelope",
    # reports
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
    # cancel requests
    "MAX_CANCEL_BYTES",
    "CancelDecodeReason",
    "CancelRequest",
    "decode_cancel",
    "encode_cancel",
    # encoding
    "MAX_NESTING_DEPTH",
    "MAX_REPORT_BYTES",
    "canonical_dumps",
    # codes and their rules
    "ERROR_CODE_PATTERN",
    "MAX_ERROR_MESSAGE_CHARS",
    "RESERVED_ERROR_CODES",
    "ErrorCode",
    "PoisonReason",
    "ReportType",
]
