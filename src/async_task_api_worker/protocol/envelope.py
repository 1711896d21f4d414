"""The inbound envelope the AsyncTaskAPI publishes, and its decoder.

Source: docs/protocol.md, "The envelope". The decoder turns any bytes into either an
:class:`Envelope` or an :class:`~async_task_api_worker.errors.EnvelopeDecodeError` whose message
says what is wrong without echoing the body; it raises nothing else.
"""

from __future__ import annotations

import json
import re
import typing
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from async_task_api_worker.errors import EnvelopeDecodeError
from async_task_api_worker.protocol.codes import PoisonReason
from async_task_api_worker.protocol.encoding import (
    MAX_NESTING_DEPTH,
    NonFiniteNumberError,
    nesting_depth,
    strict_loads,
)

__all__ = [
    "ACQUIRED_COUNT_HEADER",
    "DEFAULT_MAX_BODY_BYTES",
    "DELIVERY_COUNT_HEADER",
    "ID_PATTERN",
    "PROTOCOL_VERSION",
    "SERVICE_PATTERN",
    "Envelope",
    "InputRef",
    "check_depth",
    "decode_envelope",
    "read_envelope",
    "describe_validation_error",
    "model_field_names",
    "read_object",
]

#: The protocol version this SDK speaks (the envelope's and reports' ``protocol_version``).
PROTOCOL_VERSION: Final = 1

#: Task and client ids: safe in AMQP short strings (255 bytes), log lines and file names.
ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"

#: A worker's service name (``Worker(name)``).
SERVICE_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

#: The default largest inbound body, in bytes (``WORKER_MAX_MESSAGE_BYTES``).
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024

#: The AMQP header in which RabbitMQ counts a quorum queue's earlier deliveries of a message
#: (docs/protocol.md, "Attempts and the delivery limit"); a producer must not set it.
DELIVERY_COUNT_HEADER: Final = "x-delivery-count"

#: The AMQP header in which RabbitMQ 4.3+ counts a quorum queue's earlier hand-outs of a
#: message, give-backs and consumer timeouts included (``WORKER_ACQUIRED_LIMIT``).
ACQUIRED_COUNT_HEADER: Final = "x-acquired-count"

_ID_RE = re.compile(ID_PATTERN)

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
ServiceName = Annotated[str, StringConstraints(pattern=SERVICE_PATTERN)]


def _must_be_utc(value: datetime) -> datetime:
    offset = value.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise ValueError("timestamp must be in UTC (Z or +00:00)")
    return value


#: An RFC 3339 ``date-time`` (section 5.6): pydantic alone would also take ``"1700000000"``,
#: a date without a time, or a time without seconds.
_RFC3339_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _must_be_text(value: object) -> object:
    if not isinstance(value, str) or not _RFC3339_RE.fullmatch(value):
        raise ValueError("timestamp must be an RFC 3339 string")
    return value


def _must_be_integer(value: object) -> object:
    # Literal[1] alone would take ``true`` and ``1.0`` (both equal 1 in Python).
    if type(value) is not int:
        raise ValueError("protocol_version must be an integer")
    return value


#: The ``protocol_version`` field: the JSON integer 1, nothing that merely equals it.
ProtocolVersion = Annotated[Literal[1], BeforeValidator(_must_be_integer)]


UtcDatetime = Annotated[
    datetime,
    BeforeValidator(_must_be_text),
    Field(strict=False),
    AfterValidator(_must_be_utc),
]


class InputRef(BaseModel):
    """A pointer to a large input stored elsewhere (an object store, a file share...).

    The SDK does not fetch it: the handler reads ``ctx.input_refs`` and fetches what it needs.

    Attributes:
        name: what the handler calls this input (``"video"``, ``"dataset"``), 1-128 characters.
        uri: where it is (``s3://bucket/key``, ``https://...``), 1-4,096 characters.
        content_type: its media type, if the producer knows it.
        size_bytes: its size in bytes, if known.
        sha256: its SHA-256 digest in lower-case hex, if known.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    uri: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    content_type: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = None
    size_bytes: Annotated[int, Field(ge=0)] | None = None
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None


class Envelope(BaseModel):
    """The inbound message: one task for one worker service.

    Unknown fields are ignored, so that a producer may add fields within protocol version 1.

    Attributes:
        protocol_version: always ``1`` for this SDK.
        task_id: the task's id, unique per task; every report carries it.
        client_id: who asked for the task; every report carries it.
        service: the worker service the task is for (the ``Worker``'s name).
        input: the task input, a JSON object, validated by the handler's input model.
        input_refs: pointers to inputs too large to travel in the message, in order.
        created_at: when the API accepted the task, in UTC, if the producer says.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    protocol_version: ProtocolVersion
    task_id: Identifier
    client_id: Identifier
    service: ServiceName
    input: dict[str, Any]
    input_refs: Annotated[tuple[InputRef, ...], Field(strict=False, max_length=256)] = ()
    created_at: UtcDatetime | None = None


def model_field_names(model: type[BaseModel]) -> frozenset[str]:
    """Every field name and alias of ``model`` and of the models nested in its annotations.

    A validation error's location may hold user data (the keys of a ``dict`` field, an
    unexpected key); only these names are safe to repeat in a message.
    """
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()
    pending: list[object] = [model]
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                continue
            seen.add(annotation)
            for name, field in annotation.model_fields.items():
                names.add(name)
                names.update(
                    alias
                    for alias in (field.alias, field.validation_alias)
                    if isinstance(alias, str)
                )
                pending.append(field.annotation)
        else:
            pending.extend(typing.get_args(annotation))
    return frozenset(names)


def describe_validation_error(
    error: ValidationError, *, known_names: frozenset[str] | None = None, limit: int = 10
) -> str:
    """Name the failing fields of a pydantic error without echoing any input value.

    Args:
        error: the validation error.
        known_names: the field names that may be shown (:func:`model_field_names`); any other
            location part that is not a list index is shown as ``<key>``. ``None`` shows all.
        limit: the most errors described.

    Returns:
        ``"field.path: error_type; ..."`` for at most ``limit`` errors (the pydantic error
        ``type``s, which never contain input, e.g. ``missing``, ``string_too_short``).
    """
    parts = []
    for item in error.errors(include_url=False, include_input=False, include_context=False)[:limit]:
        location = ".".join(
            str(part)
            if isinstance(part, int) or known_names is None or part in known_names
            else "<key>"
            for part in item["loc"]
        )
        parts.append(f"{location or '(root)'}: {item['type']}")
    more = error.error_count() - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def _recover_id(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    if isinstance(value, str) and _ID_RE.fullmatch(value):
        return value
    return None


_ENVELOPE_NAMES = model_field_names(Envelope)


def read_object(body: bytes, *, max_body_bytes: int) -> tuple[dict[str, Any], str]:
    """Read a body as one strict JSON object: the first half of every inbound decoder.

    Args:
        body: the message body.
        max_body_bytes: the largest body accepted, in bytes.

    Returns:
        The object and its text.

    Raises:
        EnvelopeDecodeError: too large, not UTF-8, not strict JSON (NaN, 1e400, an integer past
            4,300 digits, too deep for the parser), or not an object; no task id is known yet.
    """
    if len(body) > max_body_bytes:
        raise EnvelopeDecodeError(
            PoisonReason.TOO_LARGE, f"body of {len(body)} bytes exceeds {max_body_bytes} bytes"
        )
    # The decode errors below are raised `from None` on purpose: the parser's exceptions hold
    # the whole body (JSONDecodeError.doc), which must not travel into logs with a traceback.
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvelopeDecodeError(
            PoisonReason.INVALID_UTF8, f"body is not UTF-8 (invalid byte at offset {exc.start})"
        ) from None
    try:
        document = strict_loads(text)
    except json.JSONDecodeError as exc:
        raise EnvelopeDecodeError(
            PoisonReason.INVALID_JSON,
            f"body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except RecursionError:
        raise EnvelopeDecodeError(
            PoisonReason.TOO_DEEP, f"body nests deeper than {MAX_NESTING_DEPTH} levels"
        ) from None
    except NonFiniteNumberError:
        raise EnvelopeDecodeError(
            PoisonReason.INVALID_JSON, "body is not JSON: a number is NaN or infinite"
        ) from None
    except ValueError:  # the only other one: an integer over the interpreter's digit limit
        raise EnvelopeDecodeError(
            PoisonReason.INVALID_JSON, "body is not JSON: an integer is too long"
        ) from None
    if not isinstance(document, dict):
        raise EnvelopeDecodeError(
            PoisonReason.NOT_AN_OBJECT, f"body is a JSON {_json_kind(document)}, not an object"
        )
    return document, text


def check_depth(
    document: dict[str, Any], text: str, *, task_id: str | None, client_id: str | None
) -> None:
    """Refuse a body that nests deeper than :data:`MAX_NESTING_DEPTH` levels.

    Raises:
        EnvelopeDecodeError: it does (``too_deep``), with the ids given, so that the task can
            still be told.
    """
    # Every array or object opens with a bracket, so a text with at most MAX_NESTING_DEPTH of
    # them cannot nest deeper: the walk (a few percent of a task's CPU) is only for the rest.
    brackets = text.count("{") + text.count("[")
    if brackets > MAX_NESTING_DEPTH and nesting_depth(document) > MAX_NESTING_DEPTH:
        raise EnvelopeDecodeError(
            PoisonReason.TOO_DEEP,
            f"body nests deeper than {MAX_NESTING_DEPTH} levels",
            task_id=task_id,
            client_id=client_id,
        )


def decode_envelope(body: bytes, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Envelope:
    """Decode an inbound body into an :class:`Envelope`.

    Args:
        body: the message body, as the broker delivered it.
        max_body_bytes: the largest body accepted, in bytes.

    Returns:
        The validated envelope.

    Raises:
        EnvelopeDecodeError: the body is not a valid envelope; ``reason`` is one of
            :class:`~async_task_api_worker.protocol.codes.PoisonReason`, and ``task_id`` /
            ``client_id`` are set when the body is a JSON object carrying valid ones. Nothing
            else is raised, whatever the bytes.
    """
    document, text = read_object(body, max_body_bytes=max_body_bytes)
    task_id = _recover_id(document, "task_id")
    client_id = _recover_id(document, "client_id")
    check_depth(document, text, task_id=task_id, client_id=client_id)
    version = document.get("protocol_version")
    if version != PROTOCOL_VERSION and isinstance(version, int) and not isinstance(version, bool):
        raise EnvelopeDecodeError(
            PoisonReason.UNSUPPORTED_VERSION,
            f"protocol_version {_shorten(str(version))} is not supported "
            f"(this worker speaks {PROTOCOL_VERSION})",
            task_id=task_id,
            client_id=client_id,
        )
    try:
        return Envelope.model_validate(document)
    except ValidationError as exc:
        raise EnvelopeDecodeError(
            PoisonReason.INVALID_ENVELOPE,
            f"invalid envelope: {describe_validation_error(exc, known_names=_ENVELOPE_NAMES)}",
            task_id=task_id,
            client_id=client_id,
        ) from None


def _shorten(text: str, limit: int = 20) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def read_envelope(
    body: bytes, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> Envelope | EnvelopeDecodeError:
    """:func:`decode_envelope`, with the error returned rather than raised.

    What a transport puts on a delivery (``ports.Delivery.envelope``): the envelope, or why the
    body is poison, for the engine's admission to settle.
    """
    try:
        return decode_envelope(body, max_body_bytes=max_body_bytes)
    except EnvelopeDecodeError as exc:
        return exc
