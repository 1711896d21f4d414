"""A worker written on aio-pika alone, the way a team in another stack would write one.

It serves the conformance kit's reference task (docs/conformance.md) and speaks the protocol
(docs/protocol.md) without this SDK's engine or runtime: it only borrows the SDK's protocol
module for decoding envelopes and encoding reports, as another language would use its own
protocol library. The kit is checked against it: a correct worker must pass every case, and each
``BREAK`` mode (a mutant), which breaks exactly one rule, must fail the one case that judges
that rule (docs/conformance.md, "Each mutant against the case that fails it"). ``BREAK`` takes
several modes at once, comma-separated, so that one worker carries mutants of different cases.

It is one module of about 1,000 lines, over the project's 400, on purpose: it stands for a whole
worker of another stack, read top to bottom, and the tests start it as one ``python -m``.

Run from the repository root::

    BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ python -m tests.conformance.raw_worker

Settings (environment): ``BROKER_URL``, ``SERVICE`` (``conformance``), ``IN_QUEUE_NAME`` and
``OUT_QUEUE_NAME`` (``<service>_queue_in`` / ``_out``), ``WORKER_DELIVERY_LIMIT`` (5),
``WORKER_PROGRESS_MIN_INTERVAL_S`` (1.0), ``WORKER_MAX_MESSAGE_BYTES`` (16 MiB),
``WORKER_CONCURRENCY`` (the prefetch, 8) and ``BREAK`` (empty: a correct worker; else modes of
:data:`BREAK_MODES`, comma-separated). It prints ``ready`` on stdout once it consumes, logs to
stderr, and exits 0 on SIGTERM or SIGINT without finishing anything: the broker requeues what
was unacked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from pydantic import ValidationError

from async_task_api_worker.errors import EnvelopeDecodeError, ReportEncodeError
from async_task_api_worker.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    ERROR_CODE_PATTERN,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_REPORT_BYTES,
    PROTOCOL_VERSION,
    RESERVED_ERROR_CODES,
    SERVICE_PATTERN,
    Envelope,
    FailureReport,
    PoisonReason,
    ProgressReport,
    ReportError,
    StartedReport,
    SuccessReport,
    decode_envelope,
    encode_report,
    format_timestamp,
)
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.envelope import (
    describe_validation_error,
    model_field_names,
    read_object,
)
from async_task_api_worker.transports.rabbitmq.topology import queue_type

__all__ = ["BREAK_MODES", "Config", "main"]

_logger = logging.getLogger("raw_worker")

#: The rules this worker can be told to break (``BREAK``), each with what the mutant does.
BREAK_MODES: Final = {
    "ack_early": "acks once the behaviour concluded, before its reports are confirmed",
    "unsorted_keys": "writes report bodies with their keys in insertion order",
    "progress_after_terminal": "publishes one more progress report after the terminal one",
    "local_attempts": "counts attempts per task id itself, not from `x-delivery-count`",
    "poison_requeued": "requeues a poison body instead of acking or rejecting it",
    "depth_unchecked": "runs an envelope nested deeper than 64 levels",
    "version_float": 'writes `"protocol_version":1.0` in every report (canonical bytes otherwise)',
    "client_id_null": "echoes `client_id` null in every report",
    "poison_acked": "acks a poison body without a readable task id instead of rejecting it",
    "timestamps_backwards": "stamps the terminal report a second before its `started`",
    "started_twice": "publishes `started` twice in every delivery",
    "non_persistent": "publishes the terminal report with `delivery_mode` 1",
    "progress_one": "publishes a handler's progress of 1.0 instead of dropping it",
    "message_uncut": "sends a failure's message of over 1,024 characters whole",
}
#: Modes that break one rule two ways: one worker cannot carry both.
_EXCLUSIVE_MODES: Final = ({"poison_requeued", "poison_acked"},)

#: What a classic queue allows: it only tells a first delivery from a redelivery.
CLASSIC_LIMIT: Final = 2
#: The requeue delay of a retry that names none (docs/conformance.md leaves it to the worker).
DEFAULT_RETRY_DELAY_S: Final = 0.1
#: The longest requeue delay, whatever the task asks (the SDK's WORKER_RETRY_BACKOFF_MAX_S).
MAX_RETRY_DELAY_S: Final = 30.0
#: A refused report is published again after 0.1 s, doubling up to 5 s, for this long; then the
#: delivery is given back (the SDK holds it until the consumer timeout instead).
REPORT_HOLD_S: Final = 30.0
REPORT_RETRY_FIRST_S: Final = 0.1
REPORT_RETRY_MAX_S: Final = 5.0
#: Reports refused in a row before the next goes out on a fresh channel (see Publisher).
REFUSALS_PER_CHANNEL: Final = 3
#: How long a confirm is waited for before the report counts as refused and goes out again.
CONFIRM_TIMEOUT_S: Final = 30.0
INTERNAL_ERROR_MESSAGE: Final = "the task failed with an internal error"

_SIZE_REFUSAL: Final = re.compile(r"message size \d+ is larger than configured max size (\d+)")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


# --- settings -------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A setting the worker cannot start with (exit 2)."""


@dataclass(frozen=True, slots=True)
class Config:
    """The worker's settings, read from the environment (see the module)."""

    broker_url: str
    service: str
    in_queue: str
    out_queue: str
    delivery_limit: int
    progress_interval_s: float
    max_message_bytes: int
    concurrency: int
    breaks: frozenset[str]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        """Read the settings; raises :class:`ConfigError` naming the variable at fault."""
        service = env.get("SERVICE") or "conformance"
        if not re.fullmatch(SERVICE_PATTERN, service):
            raise ConfigError(f"SERVICE must match {SERVICE_PATTERN}")
        breaks = frozenset(mode.strip() for mode in env.get("BREAK", "").split(",") if mode.strip())
        if not breaks <= BREAK_MODES.keys():
            raise ConfigError(f"BREAK takes modes among {', '.join(sorted(BREAK_MODES))}")
        for exclusive in _EXCLUSIVE_MODES:
            if exclusive <= breaks:
                raise ConfigError(f"BREAK cannot have both {' and '.join(sorted(exclusive))}")
        return cls(
            broker_url=env.get("BROKER_URL") or "amqp://guest:guest@127.0.0.1:5672/",
            service=service,
            in_queue=env.get("IN_QUEUE_NAME") or f"{service}_queue_in",
            out_queue=env.get("OUT_QUEUE_NAME") or f"{service}_queue_out",
            delivery_limit=int(_number(env, "WORKER_DELIVERY_LIMIT", 5, minimum=1, integer=True)),
            progress_interval_s=_number(env, "WORKER_PROGRESS_MIN_INTERVAL_S", 1.0, minimum=0),
            max_message_bytes=int(
                _number(
                    env, "WORKER_MAX_MESSAGE_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1, integer=True
                )
            ),
            concurrency=int(_number(env, "WORKER_CONCURRENCY", 8, minimum=1, integer=True)),
            breaks=breaks,
        )


def _number(
    env: Mapping[str, str], name: str, default: float, *, minimum: float, integer: bool = False
) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise ConfigError(f"{name} must be {'an integer' if integer else 'a number'}") from None
    if not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}")
    return value


# --- the protocol's rules, one small function each -------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """A delivery's attempt number and the number of attempts its task gets."""

    number: int
    limit: int


def broker_attempt(
    message: AbstractIncomingMessage, *, quorum: bool, delivery_limit: int
) -> Attempt:
    """The attempt the broker says (docs/protocol.md, "Attempts and the delivery limit").

    A first delivery is attempt 1 whatever its headers say (a producer may forge
    ``x-delivery-count``); a quorum queue's redelivery is ``x-delivery-count + 1``, and one
    without the header is attempt 1 (RabbitMQ 4.3 sets none after a give-back or a consumer
    timeout: docs/brokers.md, "Attempt counting per version"). A classic queue (or an unusable
    count) only tells first from not first: 1 or 2, and the task gets at most two attempts.
    """
    if not message.redelivered:
        return Attempt(1, delivery_limit if quorum else min(delivery_limit, CLASSIC_LIMIT))
    count = message.headers.get("x-delivery-count", 0)
    if quorum and isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return Attempt(count + 1, delivery_limit)
    return Attempt(2, min(delivery_limit, CLASSIC_LIMIT))


class LocalAttempts:
    """BREAK=local_attempts: attempts counted per task id by this process, not by the broker.

    Wrong because another worker (or this one before a restart) may have run the earlier
    deliveries, and because the kit can hand out a delivery whose count it raised itself.
    """

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def next(self, task_id: str, *, quorum: bool, delivery_limit: int) -> Attempt:
        """Count one more delivery of ``task_id`` and return its attempt."""
        number = self._seen[task_id] = self._seen.get(task_id, 0) + 1
        return Attempt(number, delivery_limit if quorum else min(delivery_limit, CLASSIC_LIMIT))


def decode_body(body: bytes, *, service: str, max_body_bytes: int, check_depth: bool) -> Envelope:
    """The envelope of ``body``, for this service; any other body raises a poison error.

    Raises:
        EnvelopeDecodeError: a poison body (docs/protocol.md, "Decoding and poison messages"),
            with the ids recovered when the protocol says they can be.
    """
    envelope = (
        decode_envelope(body, max_body_bytes=max_body_bytes)
        if check_depth
        else _decode_without_depth_check(body, max_body_bytes=max_body_bytes)
    )
    if envelope.service != service:
        raise EnvelopeDecodeError(
            PoisonReason.WRONG_SERVICE,
            f"envelope is for another service than this worker's ({service})",
            task_id=envelope.task_id,
            client_id=envelope.client_id,
        )
    return envelope


_ENVELOPE_NAMES: Final = model_field_names(Envelope)


def _decode_without_depth_check(body: bytes, *, max_body_bytes: int) -> Envelope:
    """BREAK=depth_unchecked: ``decode_envelope``, but a body nested too deep is not refused.

    The SDK's decoder has no switch for its nesting check, so for a body it refuses as
    ``too_deep`` its later steps are done here on the parsed object: the version rule, then the
    envelope model. Every other body gets the SDK's own verdict. A body too deep for the parser
    itself is still refused by ``read_object``.
    """
    try:
        return decode_envelope(body, max_body_bytes=max_body_bytes)
    except EnvelopeDecodeError as error:
        if error.reason != PoisonReason.TOO_DEEP:
            raise
        ids = {"task_id": error.task_id, "client_id": error.client_id}
    document, _text = read_object(body, max_body_bytes=max_body_bytes)
    version = document.get("protocol_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != PROTOCOL_VERSION:
        shown = str(version) if len(str(version)) <= 20 else f"{str(version)[:20]}..."
        raise EnvelopeDecodeError(
            PoisonReason.UNSUPPORTED_VERSION,
            f"protocol_version {shown} is not supported (this worker speaks {PROTOCOL_VERSION})",
            **ids,
        )
    try:
        return Envelope.model_validate(document)
    except ValidationError as exc:
        why = describe_validation_error(exc, known_names=_ENVELOPE_NAMES)
        raise EnvelopeDecodeError(
            PoisonReason.INVALID_ENVELOPE, f"invalid envelope: {why}", **ids
        ) from None


def poison_message(error: EnvelopeDecodeError) -> str:
    """The ``error.message`` of a ``POISON_MESSAGE`` failure, worded as the SDK words it."""
    return f"the message was refused: {error.reason}: {error.detail}"


def abandoned_message(attempt: Attempt) -> str:
    """The message of ``TASK_ABANDONED_AFTER_REDELIVERIES``."""
    return (
        f"the task was delivered {attempt.number} times, more than its limit of "
        f"{attempt.limit}; it was not run again"
    )


def retry_delay(requested_s: float | None) -> float:
    """How long a retried delivery waits before it is requeued."""
    return min(DEFAULT_RETRY_DELAY_S if requested_s is None else requested_s, MAX_RETRY_DELAY_S)


def usable_code(code: str) -> bool:
    """Whether a task may fail with ``code``: the code rule, and not one of the SDK's own."""
    return ERROR_CODE_PATTERN.fullmatch(code) is not None and code not in RESERVED_ERROR_CODES


# --- the reference task ----------------------------------------------------------------------


BEHAVIOURS: Final = frozenset(
    {"succeed", "fail", "retry", "progress", "sleep", "large_result", "crash"}
)


@dataclass(frozen=True, slots=True)
class TaskInput:
    """The reference task's input (docs/conformance.md, "The reference task")."""

    behaviour: str
    output: dict[str, Any]
    code: str | None
    message: str
    until_attempt: int | None
    retry_delay_s: float | None
    fractions: tuple[float, ...]
    payload: dict[str, Any] | None
    interval_s: float
    seconds: float
    size_bytes: int


def _is_integer(value: object) -> bool:
    # JSON has one number type: 3.0 is taken as an integer, as a JavaScript worker would.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer beyond a double
        return False


#: ``name: (JSON kind, default, nullable, minimum)``; a missing field takes its default.
_FIELDS: Final[dict[str, tuple[str, Any, bool, float | None]]] = {
    "output": ("object", None, False, None),
    "code": ("string", None, True, None),
    "message": ("string", "", False, None),
    "until_attempt": ("integer", None, True, 1),
    "retry_delay_s": ("number", None, True, 0),
    "fractions": ("numbers", (), False, None),
    "payload": ("object", None, True, None),
    "interval_s": ("number", 0.0, False, 0),
    "seconds": ("number", 0.0, False, 0),
    "size_bytes": ("integer", 0, False, 0),
}

_KIND_CHECKS: Final[dict[str, Callable[[object], bool]]] = {
    "object": lambda value: isinstance(value, dict),
    "string": lambda value: isinstance(value, str),
    "integer": _is_integer,
    "number": _is_number,
    "numbers": lambda value: isinstance(value, list) and all(_is_number(item) for item in value),
}


def validate_input(raw: dict[str, Any]) -> TaskInput | str:
    """The task input, or why it is not one (field names and rule names, never values)."""
    problems: list[str] = []
    behaviour = raw.get("behaviour")
    if not isinstance(behaviour, str) or behaviour not in BEHAVIOURS:
        problems.append("behaviour: missing" if "behaviour" not in raw else "behaviour: unknown")
    values: dict[str, Any] = {}
    for name, (kind, default, nullable, minimum) in _FIELDS.items():
        if name not in raw:
            values[name] = default
            continue
        value = raw[name]
        if value is None and nullable:
            values[name] = None
        elif not _KIND_CHECKS[kind](value):
            problems.append(f"{name}: {kind}_expected")
        elif minimum is not None and value < minimum:
            problems.append(f"{name}: less_than_{minimum:g}")
        else:
            values[name] = value
    if problems:
        return "invalid input: " + "; ".join(problems)
    return TaskInput(
        behaviour=str(behaviour),
        output=values["output"] or {},
        code=values["code"],
        message=values["message"],
        until_attempt=None if values["until_attempt"] is None else int(values["until_attempt"]),
        retry_delay_s=None if values["retry_delay_s"] is None else float(values["retry_delay_s"]),
        fractions=tuple(float(item) for item in values["fractions"]),
        payload=values["payload"],
        interval_s=float(values["interval_s"]),
        seconds=float(values["seconds"]),
        size_bytes=int(values["size_bytes"]),
    )


@dataclass(frozen=True, slots=True)
class Succeed:
    """Conclude with ``success``."""

    response: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Fail:
    """Conclude with ``failure``."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Requeue the delivery after ``delay_s``, without a terminal report."""

    delay_s: float


Outcome = Succeed | Fail | Retry
ProgressSink = Callable[[float, dict[str, Any] | None], None]


async def run_behaviour(task: TaskInput, attempt: Attempt, progress: ProgressSink) -> Outcome:
    """Do what the task asks; examples/conformance_worker.py is the SDK's twin of this."""
    if task.behaviour == "fail":
        return _task_error(task.code or "CONFORMANCE_FAILURE", task.message)
    if task.behaviour == "retry" and (
        task.until_attempt is None or attempt.number < task.until_attempt
    ):
        failure = _task_error(task.code or "TRANSIENT_ERROR", task.message or "asked to retry")
        if failure.code == "INTERNAL_ERROR" or attempt.number >= attempt.limit:
            return failure  # the last attempt concludes with the retry's own code
        return Retry(retry_delay(task.retry_delay_s))
    if task.behaviour == "progress":
        for fraction in task.fractions:
            progress(fraction, task.payload)
            if task.interval_s:
                await asyncio.sleep(task.interval_s)
    if task.behaviour == "sleep":
        await asyncio.sleep(task.seconds)
    if task.behaviour == "large_result":
        # Past the report limit the outcome is RESULT_TOO_LARGE whatever the size: do not
        # build a string of an absurd size to learn it.
        return Succeed({"data": "x" * min(task.size_bytes, MAX_REPORT_BYTES + 1)})
    if task.behaviour == "crash":
        os._exit(70)  # no report, no settlement: the broker requeues the delivery
    return Succeed(task.output)


def _task_error(code: str, message: str) -> Fail:
    # A code the protocol does not let a task use is this worker's bug, not the task's code.
    if not usable_code(code):
        return Fail("INTERNAL_ERROR", INTERNAL_ERROR_MESSAGE)
    return Fail(code, message)  # cut when it is reported (DeliveryReports.conclude)


# --- progress throttle -----------------------------------------------------------------------


class ProgressThrottle:
    """At most one ``progress`` report per interval; a newer update replaces a held one.

    The window opens ``interval_s`` after the last progress report, or after the task started.
    :meth:`close` ends the attempt: a held update is published then (before the terminal
    report) or dropped, and nothing is taken afterwards.
    """

    def __init__(
        self,
        interval_s: float,
        publish: Callable[[float, dict[str, Any] | None], Awaitable[bool]],
        *,
        takes_one: bool = False,
    ) -> None:
        self._interval_s = interval_s
        self._publish = publish
        self._takes_one = takes_one  # BREAK=progress_one: 1.0 is taken too
        self._last_sent_at = time.monotonic()
        self._floor = 0.0
        self._held: tuple[float, dict[str, Any] | None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._publishing = False
        self._closed = False

    def offer(self, fraction: float, payload: dict[str, Any] | None) -> None:
        """Take an update; one out of [0, 1), or below an earlier one, is dropped."""
        in_range = self._floor <= fraction < 1.0 or (self._takes_one and fraction == 1.0)
        if self._closed or not in_range:
            _logger.info("progress %r dropped", fraction)
            return
        self._floor = fraction
        self._held = (fraction, None if payload is None else dict(payload))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_when_due())

    async def _send_when_due(self) -> None:
        try:
            while self._held is not None and not self._closed:
                await asyncio.sleep(self._last_sent_at + self._interval_s - time.monotonic())
                # close() cancels this sleep, so the held update is still here after it.
                update, self._held = self._held, None
                self._publishing = True
                try:
                    await self._publish(*update)
                finally:
                    self._publishing = False
                self._last_sent_at = time.monotonic()
        finally:
            self._sender = None

    async def close(self, *, flush: bool) -> None:
        """End the attempt; ``flush`` publishes a held update now, else it is dropped."""
        self._closed = True
        sender = self._sender
        if sender is not None:
            if self._publishing:
                await sender  # let a report on the wire finish: reports keep their order
            else:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
        held, self._held = self._held, None
        if flush and held is not None:
            await self._publish(*held)


# --- publishing reports ----------------------------------------------------------------------


class ReportRefused(Exception):
    """The broker did not confirm a report (nack, unroutable, channel closed, timeout)."""


class ReportTooLargeForBroker(Exception):
    """The broker refused a report for its size (its ``max_message_size``), for good."""


class Publisher:
    """Publishes reports to the output queue on a channel of its own, with confirms.

    RabbitMQ 3.10 keeps refusing (``basic.nack``) a channel that a quorum queue refused for
    ``reject-publish`` even once the queue has room again; only a new channel is heard. So
    after :data:`REFUSALS_PER_CHANNEL` refusals in a row the reports go out on a fresh one.
    """

    def __init__(self, connection: AbstractRobustConnection, out_queue: str) -> None:
        self._connection = connection
        self._out_queue = out_queue
        self._channel: AbstractChannel | None = None
        self._refusals = 0
        self._replacing = False

    async def open(self) -> None:
        """Open the publishing channel (publisher confirms on)."""
        self._channel = await self._connection.channel(publisher_confirms=True)

    async def publish(
        self, body: bytes, properties: dict[str, Any], *, persistent: bool = True
    ) -> None:
        """Publish one report and wait for its confirm (``persistent``: ``delivery_mode`` 2).

        Raises:
            ReportRefused: it was not confirmed; publishing it again may work.
            ReportTooLargeForBroker: the broker closed the channel for its size.
        """
        assert self._channel is not None  # open() comes first
        mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        message = aio_pika.Message(body, delivery_mode=mode, **properties)
        try:
            confirm = await self._channel.default_exchange.publish(
                message, routing_key=self._out_queue, timeout=CONFIRM_TIMEOUT_S
            )
        except aiormq.exceptions.DeliveryError as exc:
            await self._refused()
            raise ReportRefused("refused by the broker (basic.nack)") from exc
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            # Every publish waiting on the closed channel gets this; only a report over the
            # limit is refused for its size, the others go out again on the reopened channel.
            limit = _SIZE_REFUSAL.search(str(exc))
            if limit is not None and len(body) > int(limit.group(1)):
                raise ReportTooLargeForBroker(str(exc)) from exc
            raise ReportRefused(type(exc).__name__) from exc
        except (
            aiormq.exceptions.AMQPError,
            aiormq.exceptions.ChannelInvalidStateError,
            ConnectionError,
            TimeoutError,
        ) as exc:
            # A closed channel or connection, or no confirm in time. A robust channel the
            # broker closed reopens by itself: the next try may go out.
            raise ReportRefused(type(exc).__name__) from exc
        if not isinstance(confirm, aiormq.spec.Basic.Ack):
            raise ReportRefused("returned as unroutable")
        self._refusals = 0

    async def _refused(self) -> None:
        self._refusals += 1
        if self._refusals < REFUSALS_PER_CHANNEL or self._replacing:
            return
        self._replacing = True
        try:
            fresh = await self._connection.channel(publisher_confirms=True)
        except Exception as exc:  # the next refusals try again
            _logger.warning("no fresh report channel (%s)", type(exc).__name__)
            return
        finally:
            self._replacing = False
        old, self._channel, self._refusals = self._channel, fresh, 0
        _logger.warning("reports refused %d times in a row: new channel", REFUSALS_PER_CHANNEL)
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()  # its publishes in flight fail, and are sent again


class DeliveryReports:
    """The reports of one delivery: their fields, their ``seq`` and their publication.

    ``seq`` counts from 0 in the order the reports are made; a report that never got out keeps
    its number (gaps are allowed, reuse is not). ``breaks``: the ``BREAK`` modes in force.
    """

    def __init__(
        self,
        publisher: Publisher,
        *,
        service: str,
        task_id: str,
        client_id: str | None,
        attempt: int,
        breaks: frozenset[str],
    ) -> None:
        self._publisher = publisher
        self._service = service
        self._task_id = task_id
        self._client_id = None if "client_id_null" in breaks else client_id
        self._attempt = attempt
        self._breaks = breaks
        self._seq = 0
        self._started: asyncio.Future[bool] | None = None
        self._started_at: datetime | None = None
        self.last_progress: tuple[float, dict[str, Any] | None] | None = None

    def _fields(self, moment: datetime | None = None) -> dict[str, Any]:
        return {
            "task_id": self._task_id,
            "client_id": self._client_id,
            "service": self._service,
            "attempt": self._attempt,
            "timestamp": format_timestamp(moment or datetime.now(UTC)),
        }

    def begin_started(self) -> None:
        """Publish ``started`` in the background: the behaviour runs while it is confirmed."""
        self._started_at = datetime.now(UTC)
        started = [self._encode(StartedReport.model_construct(**self._fields(self._started_at)))]
        if "started_twice" in self._breaks:
            started.append(self._encode(StartedReport.model_construct(**self._fields())))
        self._started = asyncio.ensure_future(self._publish_in_turn(started))

    async def _publish_in_turn(self, reports: list[tuple[bytes, dict[str, Any]]]) -> bool:
        for body, properties in reports:
            if not await self._publish_held(body, properties, hold=True):
                return False
        return True

    async def started_confirmed(self) -> bool:
        """Wait for ``started``'s confirm; ``False`` if it gave up (nothing may follow it)."""
        # Shielded: a waiter that is cancelled (a progress report) must not stop started.
        return self._started is None or await asyncio.shield(self._started)

    def abandon(self) -> None:
        """Stop publishing ``started`` (the delivery's handling was cancelled)."""
        if self._started is not None:
            self._started.cancel()

    async def progress(self, fraction: float, payload: dict[str, Any] | None) -> bool:
        """Publish ``progress``, best effort: one try, dropped if refused or not encodable."""
        if not await self.started_confirmed():
            return False
        report = ProgressReport.model_construct(
            **self._fields(), fraction=fraction, payload=payload
        )
        try:
            sent = await self._send(report, hold=False)
        except (ReportEncodeError, ReportTooLargeForBroker):
            sent = False
        if sent:
            self.last_progress = (fraction, payload)
        return sent

    async def conclude(self, outcome: Succeed | Fail) -> bool:
        """Publish the terminal report; a response that cannot go out becomes a failure.

        A failure's message is cut to its first ``MAX_ERROR_MESSAGE_CHARS`` characters.
        """
        moment = None
        if "timestamps_backwards" in self._breaks and self._started_at is not None:
            moment = self._started_at - timedelta(seconds=1)
        persistent = "non_persistent" not in self._breaks
        if isinstance(outcome, Succeed):
            report = SuccessReport.model_construct(
                **self._fields(moment), response=outcome.response
            )
            try:
                return await self._send(report, hold=True, persistent=persistent)
            except (ReportEncodeError, ReportTooLargeForBroker) as exc:
                too_large = isinstance(exc, ReportTooLargeForBroker) or exc.too_large
                outcome = Fail(
                    "RESULT_TOO_LARGE" if too_large else "INVALID_RESULT",
                    f"the handler's result cannot be reported: {exc}",
                )
        message = outcome.message
        if "message_uncut" not in self._breaks:
            message = message[:MAX_ERROR_MESSAGE_CHARS]
        error = ReportError.model_construct(code=outcome.code, message=message)
        failure = FailureReport.model_construct(**self._fields(moment), error=error)
        return await self._send(failure, hold=True, persistent=persistent)

    async def _send(
        self,
        report: StartedReport | ProgressReport | SuccessReport | FailureReport,
        *,
        hold: bool,
        persistent: bool = True,
    ) -> bool:
        body, properties = self._encode(report)
        return await self._publish_held(body, properties, hold=hold, persistent=persistent)

    def _encode(
        self, report: StartedReport | ProgressReport | SuccessReport | FailureReport
    ) -> tuple[bytes, dict[str, Any]]:
        """The report's body and AMQP properties; it takes the next ``seq``."""
        encoded = encode_report(report, seq=self._seq)
        self._seq += 1
        body = encoded.body
        if "unsorted_keys" in self._breaks:
            body = unsorted_body(report)
        if "version_float" in self._breaks:
            # A float 1.0 is canonical as "1.0": the bytes are canonical, the type is not.
            body = canonical_dumps({**json.loads(body), "protocol_version": 1.0})
        props = encoded.properties
        properties = {
            "content_type": props.content_type,
            "content_encoding": props.content_encoding,
            "message_id": props.message_id,
            "correlation_id": props.correlation_id,
            "type": props.type,
            "timestamp": props.timestamp_s,
            "app_id": props.app_id,
        }
        return body, properties

    async def _publish_held(
        self, body: bytes, properties: dict[str, Any], *, hold: bool, persistent: bool = True
    ) -> bool:
        """Publish until confirmed, with a backoff; ``False`` once the hold is over."""
        give_up_at = time.monotonic() + REPORT_HOLD_S
        delay_s = REPORT_RETRY_FIRST_S
        while True:
            try:
                await self._publisher.publish(body, properties, persistent=persistent)
            except ReportRefused as exc:
                _logger.warning("%s not confirmed (%s)", properties["message_id"], exc)
                if not hold or time.monotonic() + delay_s > give_up_at:
                    return False
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, REPORT_RETRY_MAX_S)
                continue
            return True


def unsorted_body(report: StartedReport | ProgressReport | SuccessReport | FailureReport) -> bytes:
    """BREAK=unsorted_keys: the canonical bytes but for the key order (insertion order)."""
    document: dict[str, Any] = {
        "protocol_version": PROTOCOL_VERSION,
        "type": report.type,
        "task_id": report.task_id,
        "client_id": report.client_id,
        "service": report.service,
        "attempt": report.attempt,
        "timestamp": report.timestamp,
    }
    if isinstance(report, ProgressReport):
        document.update(fraction=float(report.fraction), payload=report.payload)
    elif isinstance(report, SuccessReport):
        document.update(response=report.response)
    elif isinstance(report, FailureReport):
        document.update(error={"code": report.error.code, "message": report.error.message})
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # A lone surrogate has no UTF-8 form: escaped as the canonical encoding does.
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text).encode()


# --- the worker ------------------------------------------------------------------------------


async def settle(action: Awaitable[None]) -> None:
    """Ack, nack or reject; a delivery whose channel closed is left alone (already requeued)."""
    try:
        await action
    except (
        aiormq.exceptions.AMQPError,
        aiormq.exceptions.ChannelInvalidStateError,
        ConnectionError,
    ) as exc:
        _logger.warning("settle failed (%s): the broker requeued the delivery", type(exc).__name__)


class RawWorker:
    """Consumes the input queue, runs each task, publishes its reports, settles its delivery."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.quorum = False
        self._publisher: Publisher | None = None
        self._local_attempts = LocalAttempts()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Declare the queues, learn the input queue's type, and consume."""
        for name in (self.config.in_queue, self.config.out_queue):
            await declare_queue(connection, name)
        self.quorum = await queue_type(connection, self.config.in_queue) == "quorum"
        self._publisher = Publisher(connection, self.config.out_queue)
        await self._publisher.open()
        consume_channel = await connection.channel()
        await consume_channel.set_qos(prefetch_count=self.config.concurrency)
        queue = await consume_channel.declare_queue(self.config.in_queue, passive=True)
        await queue.consume(self.on_message)
        _logger.info(
            "consuming %s (%s), reporting to %s, BREAK=%r",
            self.config.in_queue,
            "quorum" if self.quorum else "not quorum",
            self.config.out_queue,
            ",".join(sorted(self.config.breaks)),
        )

    async def stop(self) -> None:
        """Stop every task in flight: nothing is finished, the broker requeues the deliveries."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """aio-pika runs this in a task of its own for each delivery."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self.handle(message)
        except Exception:
            # A bug here: leave the delivery unsettled, the broker hands it out again later.
            _logger.exception("delivery %s not handled", message.message_id)
        finally:
            if task is not None:
                self._tasks.discard(task)

    def _breaks(self, rule: str) -> bool:
        return rule in self.config.breaks

    def _attempt(self, message: AbstractIncomingMessage, task_id: str | None) -> Attempt:
        if self._breaks("local_attempts") and task_id is not None:
            return self._local_attempts.next(
                task_id, quorum=self.quorum, delivery_limit=self.config.delivery_limit
            )
        return broker_attempt(
            message, quorum=self.quorum, delivery_limit=self.config.delivery_limit
        )

    def _reports(self, task_id: str, client_id: str | None, attempt: Attempt) -> DeliveryReports:
        assert self._publisher is not None  # set by start(), before the consumer
        return DeliveryReports(
            self._publisher,
            service=self.config.service,
            task_id=task_id,
            client_id=client_id,
            attempt=attempt.number,
            breaks=self.config.breaks,
        )

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """One delivery, from its body to its settlement (docs/protocol.md)."""
        try:
            envelope = decode_body(
                message.body,
                service=self.config.service,
                max_body_bytes=self.config.max_message_bytes,
                check_depth=not self._breaks("depth_unchecked"),
            )
        except EnvelopeDecodeError as error:
            await self.refuse_poison(message, error)
            return
        attempt = self._attempt(message, envelope.task_id)
        reports = self._reports(envelope.task_id, envelope.client_id, attempt)
        if attempt.number > attempt.limit:
            _logger.info("%s attempt %d past the limit", envelope.task_id, attempt.number)
            failure = Fail("TASK_ABANDONED_AFTER_REDELIVERIES", abandoned_message(attempt))
            await self.conclude(message, reports, failure)
            return
        task_input = validate_input(envelope.input)
        if isinstance(task_input, str):
            await self.conclude(message, reports, Fail("INVALID_INPUT", task_input))
            return
        try:
            await self.run(message, reports, task_input, attempt)
        finally:
            reports.abandon()  # a no-op once started is settled; else the handling was cancelled

    async def run(
        self,
        message: AbstractIncomingMessage,
        reports: DeliveryReports,
        task_input: TaskInput,
        attempt: Attempt,
    ) -> None:
        """Run an admitted task: started, the behaviour, then the terminal report or a retry."""
        reports.begin_started()
        throttle = ProgressThrottle(
            self.config.progress_interval_s,
            reports.progress,
            takes_one=self._breaks("progress_one"),
        )
        try:
            outcome = await run_behaviour(task_input, attempt, throttle.offer)
        except Exception:
            _logger.exception("%s: the behaviour raised", message.message_id)
            outcome = Fail("INTERNAL_ERROR", INTERNAL_ERROR_MESSAGE)
        acked = False
        if self._breaks("ack_early") and not isinstance(outcome, Retry):
            await settle(message.ack())  # before any report of the delivery is confirmed
            acked = True
        if not await reports.started_confirmed():
            await throttle.close(flush=False)
            if not acked:
                await settle(message.nack(requeue=True))  # given back: the broker was not taking
            return
        if isinstance(outcome, Retry):
            await throttle.close(flush=False)
            await asyncio.sleep(outcome.delay_s)
            # basic.reject, not basic.nack: RabbitMQ 4.3+ counts only a reject as an attempt.
            await settle(message.reject(requeue=True))
            return
        await throttle.close(flush=True)
        await self.conclude(message, reports, outcome, acked=acked)
        if self._breaks("progress_after_terminal") and reports.last_progress is not None:
            await reports.progress(*reports.last_progress)

    async def conclude(
        self,
        message: AbstractIncomingMessage,
        reports: DeliveryReports,
        outcome: Succeed | Fail,
        *,
        acked: bool = False,
    ) -> None:
        """Publish the terminal report, then ack; give the delivery back if it never got out."""
        confirmed = await reports.conclude(outcome)
        if acked:
            return
        await settle(message.ack() if confirmed else message.nack(requeue=True))

    async def refuse_poison(
        self, message: AbstractIncomingMessage, error: EnvelopeDecodeError
    ) -> None:
        """A body that is not an envelope for us: one ``POISON_MESSAGE`` if someone can be told."""
        _logger.info("poison: %s (task id %s)", error, error.task_id)
        requeue = self._breaks("poison_requeued")
        if error.task_id is None:
            if self._breaks("poison_acked"):
                await settle(message.ack())  # nothing reaches a dead-letter exchange
                return
            await settle(message.nack(requeue=True) if requeue else message.reject(requeue=False))
            return
        attempt = self._attempt(message, error.task_id)
        reports = self._reports(error.task_id, error.client_id, attempt)
        confirmed = await reports.conclude(Fail("POISON_MESSAGE", poison_message(error)))
        await settle(message.ack() if confirmed and not requeue else message.nack(requeue=True))


async def declare_queue(connection: AbstractRobustConnection, name: str) -> None:
    """Declare ``name`` durable with no arguments, or find it as the platform made it.

    A queue that exists with arguments (a quorum queue, a max length...) makes RabbitMQ refuse
    the plain declare with PRECONDITION_FAILED and close the channel; a passive declare on a new
    channel then checks that it exists.
    """
    channel = await connection.channel()
    try:
        await channel.declare_queue(name, durable=True)
    except aiormq.exceptions.ChannelPreconditionFailed:
        spare = await connection.channel()
        try:
            await spare.declare_queue(name, passive=True)
        finally:
            await spare.close()
    finally:
        with contextlib.suppress(Exception):
            await channel.close()


async def serve(config: Config) -> None:
    """Run until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    connection = await aio_pika.connect_robust(config.broker_url)
    worker = RawWorker(config)
    try:
        await worker.start(connection)
        print("ready", flush=True)  # the one line on stdout, for whoever waits
        await stop.wait()
        _logger.info("stopping")
        await worker.stop()
    finally:
        await connection.close()


def main() -> int:
    """Entry point: exit 0 on a signal, 2 on a bad setting."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        config = Config.from_env(os.environ)
    except ConfigError as exc:
        print(f"raw_worker: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
