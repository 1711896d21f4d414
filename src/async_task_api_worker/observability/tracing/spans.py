"""The worker's spans: ``process`` per delivery, ``send`` per report, the settle's.

Each is skipped altogether (a constant no-op context manager) until the application sets a
tracer provider (:func:`~async_task_api_worker.observability.tracing.api.live`). Without one,
a delivery that carries a ``traceparent`` still passes its context on, as OpenTelemetry's API
does for a library with no SDK behind it: the context is current while the delivery is
processed (the task's log lines and child processes carry it), and each report's headers carry
it unchanged, so the producer's trace reaches the reports' consumer.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Final, Protocol

from async_task_api_worker.observability.tracing import api
from async_task_api_worker.observability.tracing.api import ENABLED, failed, tracer
from async_task_api_worker.observability.tracing.carriers import HEADER_GETTER, carrier, continued
from async_task_api_worker.ports import Outcome, Settlement

__all__ = ["DeliverySpan", "Traced", "processing", "sending", "settling"]

# Attribute names of the messaging semantic conventions (the tests check them against
# opentelemetry-semantic-conventions).
SYSTEM: Final = "messaging.system"
DESTINATION: Final = "messaging.destination.name"
OPERATION_TYPE: Final = "messaging.operation.type"
OPERATION_NAME: Final = "messaging.operation.name"
MESSAGE_ID: Final = "messaging.message.id"
CONVERSATION_ID: Final = "messaging.message.conversation_id"
ERROR_TYPE: Final = "error.type"

#: The outcomes of a failed attempt: the span's status is ``ERROR``.
_FAILED: Final = frozenset(
    {
        Outcome.FAILURE,
        Outcome.RETRY,
        Outcome.POISON,
        Outcome.ENGINE_ERROR,
        Outcome.PUBLISH_FAILED,
    }
)


class Traced(Protocol):
    """What names a span's messaging attributes: a transport (``ports.Transport``), a client."""

    def span_attributes(self, delivery: Any) -> Mapping[str, str | int]:
        """Of consuming ``delivery``, or (``None``) of publishing a message (a report)."""
        ...


class DeliverySpan:
    """The ``process`` span of one delivery, or nothing (no extra, or nothing records).

    The engine names the task once it is admitted, and ends it with the settlement's code.
    """

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def task(self, task_id: str | None, client_id: str | None) -> None:
        """Name the task the delivery carries (``messaging.message.id`` = the task id)."""
        if self._span is None or task_id is None:
            return
        try:
            self._span.set_attribute(MESSAGE_ID, task_id)
            if client_id is not None:
                self._span.set_attribute("async_task_api.client_id", client_id)
        except Exception as exc:
            failed("name a delivery's task", exc)

    def ended(self, settlement: Settlement) -> None:
        """Record how the delivery ended: its outcome, and as ``error.type`` its failure code.

        A failed attempt (failure, retry, poison, engine error, a report that could not get
        out) also sets the span's status to ``ERROR``.
        """
        if self._span is None:
            return
        outcome = settlement.outcome
        try:
            self._span.set_attribute("async_task_api.outcome", outcome.value)
            if outcome in _FAILED:
                error = settlement.code or outcome.value
                self._span.set_attribute(ERROR_TYPE, error)
                self._span.set_status(api.trace.StatusCode.ERROR, error)
        except Exception as exc:
            failed("record a delivery's outcome", exc)


_NO_SPAN: Final = DeliverySpan()


class _Nothing:
    """A context manager that does nothing and gives ``value``: the untraced path's."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *_: object) -> None:
        return None


_NOT_PROCESSING: Final = _Nothing(_NO_SPAN)
_NOT_SENDING: Final = _Nothing(MappingProxyType({}))
_NOT_SETTLING: Final = _Nothing(None)


def processing(source: Traced, delivery: Any) -> AbstractContextManager[DeliverySpan]:
    """The ``process <queue>`` CONSUMER span of a delivery, current for the block.

    Args:
        source: the transport that handed the delivery out; its ``span_attributes(delivery)``
            give ``messaging.system``, ``messaging.destination.name`` and the system's own.
        delivery: the delivery (``ports.Delivery``); its headers may hold the producer's
            context, which becomes the span's parent.
    """
    tracer_ = tracer()
    if tracer_ is not None:
        return _processing(tracer_, source, delivery)
    if ENABLED and "traceparent" in delivery.headers:  # a producer's context to pass on
        return _passing_on(delivery.headers)
    return _NOT_PROCESSING


def sending(target: Traced, message_id: str | None) -> AbstractContextManager[Mapping[str, str]]:
    """A ``send <queue>`` PRODUCER span; gives the headers that carry its context.

    The span is not made current: it covers one message's publishing until its confirm (its
    retries included), and nothing runs under it.

    Args:
        target: what publishes; its ``span_attributes(None)`` name the destination.
        message_id: the message's id (``messaging.message.id``).

    With no tracer provider, the headers given are those of the delivery whose context
    :func:`processing` passes on, if it does (read once per delivery), else none.
    """
    tracer_ = tracer()
    if tracer_ is not None:
        return _sending(tracer_, target, message_id)
    if ENABLED:
        return _PASSED_ON.get()
    return _NOT_SENDING


def settling(source: Traced, delivery: Any, method: str) -> AbstractContextManager[None]:
    """The ``<method> <queue>`` CLIENT span of a settlement (``ack``, ``nack``, ``reject``)."""
    tracer_ = tracer()
    return _NOT_SETTLING if tracer_ is None else _settling(tracer_, source, delivery, method)


#: The headers a report passes on with no tracer provider (:func:`sending`), as the context
#: manager that gives them: set by :func:`_passing_on` for one delivery.
_PASSED_ON: Final = contextvars.ContextVar("passed_on", default=_NOT_SENDING)


@contextlib.contextmanager
def _passing_on(headers: Mapping[str, Any]) -> Iterator[DeliverySpan]:
    """The delivery's context current for the block, with no span of ours (no provider).

    Its headers, as the API writes them from the extracted context (a malformed one writes
    none), are what the delivery's reports carry.
    """
    with continued(headers):
        token = _PASSED_ON.set(_Nothing(MappingProxyType(carrier())))
        try:
            yield _NO_SPAN
        finally:
            _PASSED_ON.reset(token)


def _start(
    tracer: Any, name: str, kind: Any, attributes: Mapping[str, Any], parent: Any = None
) -> Any:
    """A started span, or ``None`` if OpenTelemetry failed to start it (a span processor)."""
    try:
        return tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
    except Exception as exc:
        failed(f"start a span ({name.partition(' ')[0]})", exc)
        return None


def _end(span: Any, what: str) -> None:
    """End ``span``; a span processor that fails then changes nothing of the decision."""
    try:
        span.end()
    except Exception as exc:
        failed(f"end a span ({what})", exc)


@contextlib.contextmanager
def _current(span: Any) -> Iterator[None]:
    """``span`` as the current span for the block (if it started, and can be attached)."""
    token = None
    if span is not None:
        try:
            token = api.context.attach(api.trace.set_span_in_context(span))
        except Exception as exc:
            failed("make a span current", exc)
    try:
        yield
    finally:
        if token is not None:
            api.context.detach(token)


@contextlib.contextmanager
def _processing(tracer: Any, source: Traced, delivery: Any) -> Iterator[DeliverySpan]:
    attributes = source.span_attributes(delivery)
    parent = None
    if delivery.headers:
        try:
            parent = api.propagate.extract(delivery.headers, getter=HEADER_GETTER)
        except Exception as exc:
            failed("read a delivery's trace context", exc)
    span = _start(
        tracer,
        f"process {attributes.get(DESTINATION, '')}".rstrip(),
        api.trace.SpanKind.CONSUMER,
        {**attributes, OPERATION_TYPE: "process", OPERATION_NAME: "process"},
        parent,
    )
    try:
        with _current(span):
            yield _NO_SPAN if span is None or not span.is_recording() else DeliverySpan(span)
    finally:
        if span is not None:
            _end(span, "process")


@contextlib.contextmanager
def _sending(tracer: Any, target: Traced, message_id: str | None) -> Iterator[Mapping[str, str]]:
    attributes = dict(target.span_attributes(None))
    if message_id is not None:
        attributes[MESSAGE_ID] = message_id
    span = _start(
        tracer,
        f"send {attributes.get(DESTINATION, '')}".rstrip(),
        api.trace.SpanKind.PRODUCER,
        {**attributes, OPERATION_TYPE: "send", OPERATION_NAME: "send"},
    )
    headers: dict[str, str] = {}
    if span is not None:
        try:
            # Also for a span that does not record: the consumer learns the sampling decision.
            if span.get_span_context().is_valid:
                api.propagate.inject(headers, context=api.trace.set_span_in_context(span))
        except Exception as exc:
            failed("write a report's trace context", exc)
    try:
        yield headers
    except BaseException as exc:
        if span is not None:
            with contextlib.suppress(Exception):
                span.set_attribute(ERROR_TYPE, type(exc).__name__)
                span.set_status(api.trace.StatusCode.ERROR, type(exc).__name__)
        raise
    finally:
        if span is not None:
            _end(span, "send")


@contextlib.contextmanager
def _settling(tracer: Any, source: Traced, delivery: Any, method: str) -> Iterator[None]:
    attributes = source.span_attributes(delivery)
    span = _start(
        tracer,
        f"{method} {attributes.get(DESTINATION, '')}".rstrip(),
        api.trace.SpanKind.CLIENT,
        {**attributes, OPERATION_TYPE: "settle", OPERATION_NAME: method},
    )
    try:
        with _current(span):
            yield
    finally:
        if span is not None:
            _end(span, "settle")
