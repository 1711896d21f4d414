"""The ``inspect`` request an operator publishes to a service's control exchange, and the reply.

Source: docs/protocol.md, "Inspecting a service's workers" (an extension of this SDK, not part
of protocol version 1's contract). The request travels on the control exchange beside the
cancel requests, told apart by its AMQP ``type`` property, ``inspect``; its body's ``type`` is
``inspect`` too, so that a worker that reads every control message as a cancel request (another
stack, or this SDK before the extension) refuses it as ``invalid_cancel``, as it refuses any
foreign control message, and touches no task. A worker that knows it answers with one
:class:`InspectReply` to the request's ``reply_to``, which must be RabbitMQ's direct reply-to
(``amq.rabbitmq.reply-to.*``): a worker never publishes a reply anywhere else. The decoders turn
any bytes into a model or a :class:`~async_task_api_worker.errors.ProtocolError` whose message
never echoes the body.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from async_task_api_worker.errors import EnvelopeDecodeError, ProtocolError
from async_task_api_worker.protocol.cancel import CancelTimestamp
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.envelope import (
    PROTOCOL_VERSION,
    Identifier,
    ProtocolVersion,
    describe_validation_error,
    model_field_names,
    read_object,
)
from async_task_api_worker.protocol.reports import format_timestamp

__all__ = [
    "INSPECT_REPLY_TYPE",
    "INSPECT_TYPE",
    "MAX_INSPECT_BYTES",
    "REPLY_TO",
    "InspectReply",
    "InspectRequest",
    "RunningTask",
    "consumer_tag",
    "decode_inspect_reply",
    "decode_inspect_request",
    "encode_inspect_reply",
    "encode_inspect_request",
    "tag_owner",
]

#: The request's AMQP ``type`` property and its body's ``type``.
INSPECT_TYPE: Final = "inspect"
#: The reply's AMQP ``type`` property and its body's ``type``.
INSPECT_REPLY_TYPE: Final = "inspect_reply"
#: RabbitMQ's direct reply-to pseudo-queue: the requester consumes it (no queue of its own),
#: and the broker rewrites a request's ``reply_to`` to ``amq.rabbitmq.reply-to.<id>``.
REPLY_TO: Final = "amq.rabbitmq.reply-to"
#: The largest request a worker reads, and the largest reply the command reads, in bytes.
MAX_INSPECT_BYTES: Final = 64 * 1024
#: The most running tasks one reply lists (a worker's concurrency is at most this in practice;
#: the reply says how many it left out).
MAX_LISTED_TASKS: Final = 1000
#: A consumer tag of the SDK's workers: ``atw/<host>/<pid>/<nonce>`` (AMQP allows 255 bytes).
_TAG_PREFIX: Final = "atw"
_MAX_HOST_BYTES: Final = 200


class InspectRequest(BaseModel):
    """An operator's request that every worker of a service say what it runs now.

    Unknown fields are ignored, as in the other messages.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    protocol_version: ProtocolVersion
    type: Literal["inspect"]
    request_id: Identifier
    client_id: Identifier
    timestamp: CancelTimestamp


class RunningTask(BaseModel):
    """One task a worker runs now: its id, its attempt, and seconds since its delivery came."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    task_id: str
    attempt: int
    elapsed_s: float


class InspectReply(BaseModel):
    """One worker process's answer to an :class:`InspectRequest`.

    Attributes:
        request_id: the request's.
        service: the worker's service name.
        host: the worker's host name (a container's: its pod or container name).
        pid: the worker process's id on that host.
        sdk: ``async-task-api-worker <version>``.
        concurrency: the tasks it runs at once at most (``WORKER_CONCURRENCY``).
        uptime_s: seconds since the process started serving.
        consumer_tag: its consumer tag on the input queue, ``None`` when it consumes nothing
            now (draining, or reconnecting).
        tasks: the tasks it runs now, at most :data:`MAX_LISTED_TASKS`.
        tasks_left_out: how many more it runs.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    protocol_version: ProtocolVersion
    type: Literal["inspect_reply"]
    request_id: str
    service: str
    host: str
    pid: int
    sdk: str
    concurrency: int
    uptime_s: float
    consumer_tag: str | None
    tasks: tuple[RunningTask, ...] = Field(default=())
    tasks_left_out: int = 0


_M = TypeVar("_M", bound=BaseModel)
_REQUEST_NAMES = model_field_names(InspectRequest)
_REPLY_NAMES = model_field_names(InspectReply)


def encode_inspect_request(request_id: str, client_id: str, moment: datetime) -> bytes:
    """The canonical bytes of an inspect request.

    Raises:
        ValueError: an id breaks the id pattern, or ``moment`` is naive.
    """
    if moment.utcoffset() is None:
        raise ValueError("moment must be an aware datetime (with a time zone)")
    document = {
        "protocol_version": PROTOCOL_VERSION,
        "type": INSPECT_TYPE,
        "request_id": request_id,
        "client_id": client_id,
        "timestamp": format_timestamp(moment),
    }
    try:
        InspectRequest.model_validate(document)
    except ValidationError as exc:
        detail = describe_validation_error(exc, known_names=_REQUEST_NAMES)
        raise ValueError(f"not a valid inspect request: {detail}") from None
    return canonical_dumps(document, tree_checked=True)


def decode_inspect_request(body: bytes) -> InspectRequest:
    """Decode an inspect request; the checks of a cancel request's body, then the fields.

    Raises:
        ProtocolError: it is not one (the message names why, never quoting the body).
    """
    return _decoded(body, InspectRequest, "an inspect request", _REQUEST_NAMES)


def _decoded(body: bytes, model: type[_M], what: str, names: frozenset[str]) -> _M:
    """``body`` read as one JSON object within :data:`MAX_INSPECT_BYTES`, then as ``model``."""
    try:
        document, _ = read_object(body, max_body_bytes=MAX_INSPECT_BYTES)
        return model.model_validate(document)
    except EnvelopeDecodeError as exc:
        raise ProtocolError(f"not {what} ({exc.reason}): {exc.detail}") from None
    except ValidationError as exc:
        detail = describe_validation_error(exc, known_names=names)
        raise ProtocolError(f"not {what}: {detail}") from None


def encode_inspect_reply(
    request: InspectRequest,
    *,
    service: str,
    host: str,
    pid: int,
    sdk: str,
    concurrency: int,
    uptime_s: float,
    consumer_tag: str | None,
    tasks: list[tuple[str, int, float]],
) -> bytes:
    """The canonical bytes of a reply to ``request``; ``tasks``: ``(task id, attempt, elapsed_s)``.

    Seconds are rounded to the millisecond; past :data:`MAX_LISTED_TASKS` tasks the rest are
    counted, not listed.
    """
    listed = sorted(tasks, key=lambda task: -task[2])[:MAX_LISTED_TASKS]
    document = {
        "protocol_version": PROTOCOL_VERSION,
        "type": INSPECT_REPLY_TYPE,
        "request_id": request.request_id,
        "service": service,
        "host": host,
        "pid": pid,
        "sdk": sdk,
        "concurrency": concurrency,
        "uptime_s": round(uptime_s, 3),
        "consumer_tag": consumer_tag,
        "tasks": [
            {"task_id": task_id, "attempt": attempt, "elapsed_s": round(elapsed_s, 3)}
            for task_id, attempt, elapsed_s in listed
        ],
        "tasks_left_out": len(tasks) - len(listed),
    }
    return canonical_dumps(document)


def decode_inspect_reply(body: bytes) -> InspectReply:
    """Decode a worker's reply.

    Raises:
        ProtocolError: it is not one (the message names why, never quoting the body).
    """
    return _decoded(body, InspectReply, "an inspect reply", _REPLY_NAMES)


def consumer_tag(host: str, pid: int, nonce: str) -> str:
    """A worker's consumer tag on its input queue: ``atw/<host>/<pid>/<nonce>``.

    The host and pid make the consumer findable where consumers are listed (``rabbitmqctl
    list_consumers``, the management UI) and let ``inspect`` name one that did not answer; the
    nonce keeps a tag from being used twice (a reconnect takes a new one).
    """
    host = host.encode()[:_MAX_HOST_BYTES].decode("utf-8", "ignore")  # a shortstr: 255 bytes
    return f"{_TAG_PREFIX}/{host}/{pid}/{nonce}"


def tag_owner(tag: str) -> tuple[str, int] | None:
    """``(host, pid)`` of a tag made by :func:`consumer_tag`; ``None`` for another's tag."""
    parts = tag.split("/")
    pid = parts[-2] if len(parts) >= 4 else ""
    if parts[0] != _TAG_PREFIX or not (pid.isascii() and pid.isdigit()):
        return None
    return "/".join(parts[1:-2]), int(parts[-2])
