"""The cancel request a client publishes to a service's control exchange, and its codec.

Source: docs/protocol.md, "Cancelling a task". A client publishes one canonical JSON object to
the fanout exchange ``<service>_control`` (``CONTROL_EXCHANGE_NAME``); every worker bound to it
receives it, and the one running the task (or remembering the request) concludes the task with
``failure`` ``TASK_CANCELLED``. The encoder gives the canonical bytes and the AMQP properties;
the decoder turns any bytes into a :class:`CancelRequest` or a
:class:`~async_task_api_worker.errors.CancelDecodeError` whose message never echoes the body,
and raises nothing else.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationError

from async_task_api_worker.errors import CancelDecodeError, EnvelopeDecodeError
from async_task_api_worker.protocol.codes import CancelDecodeReason
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.envelope import (
    ID_PATTERN,
    PROTOCOL_VERSION,
    Identifier,
    ProtocolVersion,
    check_depth,
    describe_validation_error,
    model_field_names,
    read_object,
)
from async_task_api_worker.protocol.reports import (
    TIMESTAMP_PATTERN,
    MessageProperties,
    format_timestamp,
)

__all__ = [
    "CANCEL_DELIVERY_MODE",
    "CANCEL_TYPE",
    "CONTROL_EXCHANGE_AUTO_DELETE",
    "CONTROL_EXCHANGE_DURABLE",
    "CONTROL_EXCHANGE_TYPE",
    "MAX_CANCEL_BYTES",
    "TASK_CANCELLED_MESSAGE",
    "CancelRequest",
    "cancel_message_id",
    "decode_cancel",
    "encode_cancel",
]

#: The largest cancel request body, in bytes. A request is about 150 bytes; the limit bounds
#: what a worker parses from an exchange any client may publish to, while leaving room for the
#: fields a later minor revision may add (unknown fields are ignored).
MAX_CANCEL_BYTES: Final = 64 * 1024

#: The request's ``type`` field, and its AMQP ``type`` property.
CANCEL_TYPE: Final = "cancel"

#: AMQP ``delivery_mode`` of a cancel request: 1, transient. The queues it reaches are the
#: workers' exclusive, auto-delete ones, which a broker restart deletes with the connections
#: that own them, so a persistent request would not outlive a restart either: writing it to
#: disk would only cost. What does outlive a restart is the task's own delivery, which is then
#: delivered again and runs again: its client must cancel again (docs/protocol.md).
CANCEL_DELIVERY_MODE: Final = 1

#: How workers and clients alike declare the control exchange (with no arguments): a fanout,
#: durable (a client may cancel before any worker started), not auto-delete. A declare with
#: other flags fails with ``PRECONDITION_FAILED`` (docs/protocol.md, "Cancelling a task").
CONTROL_EXCHANGE_TYPE: Final = "fanout"
CONTROL_EXCHANGE_DURABLE: Final = True
CONTROL_EXCHANGE_AUTO_DELETE: Final = False

#: The ``error.message`` of every ``failure TASK_CANCELLED`` (vector ``reports/034``).
TASK_CANCELLED_MESSAGE: Final = "the task was cancelled at its client's request"

_ID_RE = re.compile(ID_PATTERN)
# TIMESTAMP_PATTERN says ASCII digits (docs/protocol.md, "Reports"), but pydantic-core's regex
# engine reads ``\d`` as any Unicode digit; Python's ``re`` with ASCII does not.
_TIMESTAMP_RE = re.compile(TIMESTAMP_PATTERN, re.ASCII)


def _must_be_a_moment(value: str) -> str:
    if not _TIMESTAMP_RE.fullmatch(value):
        raise ValueError("timestamp must be YYYY-MM-DDThh:mm:ss.ffffffZ in ASCII digits")
    try:
        # The pattern alone lets month 13 or hour 25 through; requested_at must not raise.
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("timestamp is not a valid date and time") from None
    return value


#: A report-style timestamp: UTC, six fraction digits, ``Z``; a real moment.
CancelTimestamp = Annotated[
    str, StringConstraints(pattern=TIMESTAMP_PATTERN), AfterValidator(_must_be_a_moment)
]


class CancelRequest(BaseModel):
    """A client's request to cancel one task of a worker service.

    Unknown fields are ignored, as in the envelope, so that a later revision of protocol
    version 1 may add fields.

    Attributes:
        protocol_version: always ``1``.
        type: always ``"cancel"``.
        task_id: the task to cancel (the envelope's ``task_id``).
        client_id: who asks (the id pattern); it need not be the client that submitted the
            task.
        timestamp: when the client asked, UTC, as in the reports:
            ``2026-11-29T22:48:46.123456Z``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    protocol_version: ProtocolVersion
    type: Literal["cancel"]
    task_id: Identifier
    client_id: Identifier
    timestamp: CancelTimestamp

    @property
    def requested_at(self) -> datetime:
        """:attr:`timestamp` as an aware UTC datetime."""
        return datetime.fromisoformat(self.timestamp)


_CANCEL_NAMES = model_field_names(CancelRequest)


def cancel_message_id(task_id: str) -> str:
    """The AMQP ``message_id`` of a cancel request for ``task_id``: ``<task_id>/cancel``."""
    return f"{task_id}/{CANCEL_TYPE}"


def encode_cancel(
    task_id: str, client_id: str, moment: datetime
) -> tuple[bytes, MessageProperties]:
    """Encode a cancel request to its canonical bytes and AMQP properties.

    Args:
        task_id: the task to cancel (``ID_PATTERN``).
        client_id: who asks (``ID_PATTERN``).
        moment: when, an aware datetime; written in UTC to the microsecond.

    Returns:
        ``(body, properties)``: the canonical JSON bytes
        (``{"client_id":…,"protocol_version":1,"task_id":…,"timestamp":…,"type":"cancel"}``)
        and the properties to publish them with: ``content_type`` ``application/json``,
        ``content_encoding`` ``utf-8``, ``delivery_mode`` 1, ``message_id``
        ``<task_id>/cancel``, ``correlation_id`` the task id, ``type`` ``cancel``,
        ``timestamp_s`` the request's timestamp in whole seconds (rounded down), ``app_id``
        the client id, no headers.

    Raises:
        ValueError: ``moment`` is naive, or ``task_id`` or ``client_id`` breaks the id pattern
            (the message names the field and the rule broken, not the value).
    """
    if moment.utcoffset() is None:
        raise ValueError("moment must be an aware datetime (with a time zone)")
    document = {
        "protocol_version": PROTOCOL_VERSION,
        "type": CANCEL_TYPE,
        "task_id": task_id,
        "client_id": client_id,
        "timestamp": format_timestamp(moment),
    }
    try:
        request = CancelRequest.model_validate(document)
    except ValidationError as exc:
        detail = describe_validation_error(exc, known_names=_CANCEL_NAMES)
        raise ValueError(f"not a valid cancel request: {detail}") from None
    # Flat strings and an integer: nothing for check_tree to refuse.
    body = canonical_dumps(document, tree_checked=True)
    properties = MessageProperties(
        message_id=cancel_message_id(request.task_id),
        correlation_id=request.task_id,
        type=CANCEL_TYPE,
        timestamp_s=math.floor(request.requested_at.timestamp()),
        app_id=request.client_id,
        delivery_mode=CANCEL_DELIVERY_MODE,
    )
    return body, properties


def _recover_task_id(document: dict[str, Any]) -> str | None:
    value = document.get("task_id")
    return value if isinstance(value, str) and _ID_RE.fullmatch(value) else None


def decode_cancel(body: bytes) -> CancelRequest:
    """Decode a body from the control exchange into a :class:`CancelRequest`.

    The checks, in order (docs/protocol.md, "Cancelling a task"): at most
    :data:`MAX_CANCEL_BYTES` bytes, UTF-8, strict JSON, an object, at most 64 levels deep,
    ``protocol_version`` 1 if it is an integer, then the fields.

    Args:
        body: the message body, as the broker delivered it.

    Returns:
        The validated request.

    Raises:
        CancelDecodeError: the body is not a valid cancel request; ``reason`` is one of
            :class:`~async_task_api_worker.protocol.codes.CancelDecodeReason`, and ``task_id``
            is set when the body is a JSON object carrying a valid one. Nothing else is
            raised, whatever the bytes.
    """
    # The envelope's reader, so that both bodies are read by the same strict rules; its
    # errors carry the same reasons (too_large ... not_an_object), renamed into ours.
    try:
        document, text = read_object(body, max_body_bytes=MAX_CANCEL_BYTES)
    except EnvelopeDecodeError as exc:
        raise CancelDecodeError(CancelDecodeReason(exc.reason), exc.detail) from None
    task_id = _recover_task_id(document)
    try:
        check_depth(document, text, task_id=None, client_id=None)
    except EnvelopeDecodeError as exc:
        raise CancelDecodeError(CancelDecodeReason.TOO_DEEP, exc.detail, task_id=task_id) from None
    version = document.get("protocol_version")
    if version != PROTOCOL_VERSION and isinstance(version, int) and not isinstance(version, bool):
        shown = str(version) if len(str(version)) <= 20 else f"{str(version)[:20]}..."
        raise CancelDecodeError(
            CancelDecodeReason.UNSUPPORTED_VERSION,
            f"protocol_version {shown} is not supported (this worker speaks {PROTOCOL_VERSION})",
            task_id=task_id,
        )
    try:
        return CancelRequest.model_validate(document)
    except ValidationError as exc:
        detail = describe_validation_error(exc, known_names=_CANCEL_NAMES)
        raise CancelDecodeError(
            CancelDecodeReason.INVALID_CANCEL, f"invalid cancel request: {detail}", task_id=task_id
        ) from None
