"""Traces across the queue: W3C trace context in messages, spans after OpenTelemetry's conventions.

Off, and free, without the ``otel`` extra (``opentelemetry-api``): every function here is then a
constant no-op. With it, the spans go wherever the application's tracer provider sends them (the
SDK and an exporter are the application's choice; ``docs/observability.md``); with no provider
set, the API's own no-op tracer records nothing, and no context is written into a message.

What is traced (semantic conventions for messaging spans, v1.27 and later):

- ``send <queue>`` (PRODUCER), by :class:`~async_task_api_worker.client.TaskClient`: its
  context goes into the envelope's AMQP headers (``traceparent``, ``tracestate``).
- ``process <queue>`` (CONSUMER), one per delivery, the child of the producer's context found in
  the delivery's headers; it is the current span while the handler runs, so the handler's own
  spans are its children, and every log line of the task carries its ``trace_id`` and
  ``span_id``.
- ``send <queue>`` (PRODUCER) for each report, a child of ``process``; the report's headers carry
  its context.
- ``ack <queue>``, ``nack <queue>``, ``reject <queue>`` (CLIENT) for the settlement.

A child process (process isolation, a detached worker, a Step Functions subprocess) continues
the trace from the carrier it is handed (:func:`continued`): in its task fields, or in the
``TRACEPARENT``/``TRACESTATE`` environment variables (OpenTelemetry's environment carrier).

Tracing is best effort: whatever OpenTelemetry raises (a span processor, a propagator or a
provider the environment names but that is not installed) is said once and goes no further,
so that no span ever changes a delivery's outcome. The module is over 400 lines for that: it is
the one module that imports OpenTelemetry (an import-linter contract), so every call into it is
guarded here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Final, Protocol

from async_task_api_worker._version import __version__
from async_task_api_worker.ports import Outcome, Settlement

__all__ = [
    "ENABLED",
    "ENV_VARIABLES",
    "TRACE_HEADERS",
    "DeliverySpan",
    "Traced",
    "carrier",
    "carrier_from_env",
    "carrier_to_env",
    "continued",
    "current_ids",
    "live",
    "processing",
    "sending",
    "settling",
]

_logger = logging.getLogger("async_task_api_worker.tracing")

#: Why tracing is off although the extra is installed (its configuration failed), if it is.
_BROKEN: list[str] = []

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.propagators.textmap import Getter
except ImportError:  # the `otel` extra is not installed
    ENABLED: Final = False
except Exception as exc:  # e.g. OTEL_PROPAGATORS names one not installed (ValueError)
    ENABLED = False  # type: ignore[misc]  # set once, here
    _BROKEN.append(f"{type(exc).__name__}: {exc}")
else:
    ENABLED = True  # type: ignore[misc]  # set once, by the import above

#: What failed in OpenTelemetry already, said once each (a failure is never the task's).
_SAID: set[str] = set()


def _failed(what: str, exc: BaseException) -> None:
    """Say once per ``what`` that tracing failed there; the worker goes on without it."""
    if what not in _SAID:
        _SAID.add(what)
        _logger.warning(
            "Tracing failed to %s (%s: %s); the task goes on, this span may be missing",
            what,
            type(exc).__name__,
            exc,
        )


#: The headers that carry a trace context (W3C Trace Context).
TRACE_HEADERS: Final = ("traceparent", "tracestate")
#: The environment variables a child process reads its parent's context from.
_ENV_OF: Final = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE"}
#: Those variables' names.
ENV_VARIABLES: Final = tuple(_ENV_OF.values())

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

#: The tracer of the provider last seen: ``(provider, tracer)``.
_tracer_of: list[Any] = [None, None]


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else None


class _Getter(Getter[Mapping[str, Any]] if ENABLED else object):  # type: ignore[misc]
    """Reads the W3C trace context of a carrier whose values may be AMQP long strings (bytes).

    Only ``traceparent`` and ``tracestate``, the headers the worker writes: a producer's
    ``baggage`` is not the worker's to read (its propagator logs a bad one, 64 KiB of someone
    else's text per delivery).
    """

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        if key not in TRACE_HEADERS:
            return None
        value = _text(carrier.get(key))
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [key for key in carrier if key in TRACE_HEADERS]


_GETTER: Final = _Getter()


class Traced(Protocol):
    """What names a span's messaging attributes: a transport (``ports.Transport``), a client."""

    def span_attributes(self, delivery: Any) -> Mapping[str, str | int]:
        """Of consuming ``delivery``, or (``None``) of publishing a message (a report)."""
        ...


def carrier() -> dict[str, str]:
    """The current trace context as headers (``{"traceparent": ...}``); empty when there is none.

    Empty without the extra, without a tracer provider, or outside any span.
    """
    if not ENABLED:
        return {}
    headers: dict[str, str] = {}
    try:
        _propagate.inject(headers)
    except Exception as exc:
        _failed("write a trace context", exc)
        return {}
    return {name: headers[name] for name in TRACE_HEADERS if name in headers}


def carrier_to_env() -> dict[str, str]:
    """The current trace context as environment variables (``TRACEPARENT``, ``TRACESTATE``)."""
    return {_ENV_OF[name]: value for name, value in carrier().items()}


def carrier_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trace context a parent process left in the environment (see :func:`carrier_to_env`)."""
    environ = os.environ if environ is None else environ
    return {name: environ[env] for name, env in _ENV_OF.items() if environ.get(env)}


@contextlib.contextmanager
def continued(headers: Mapping[str, Any]) -> Iterator[None]:
    """Make the trace context in ``headers`` the current one (a child process's parent).

    A no-op for an empty carrier, or without the extra.
    """
    token = _attach_parent(headers) if ENABLED and headers else None
    try:
        yield
    finally:
        if token is not None:
            _context.detach(token)


def _attach_parent(headers: Mapping[str, Any]) -> Any:
    try:
        return _context.attach(_propagate.extract(headers, getter=_GETTER))
    except Exception as exc:
        _failed("read a trace context", exc)
        return None


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span, in hex, or ``None`` (for log lines)."""
    if not ENABLED:
        return None
    try:
        span_context = _trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return None
        return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")
    except Exception:  # a hostile span in the context: the line goes without the ids
        return None


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
            _failed("name a delivery's task", exc)

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
                self._span.set_status(_trace.StatusCode.ERROR, error)
        except Exception as exc:
            _failed("record a delivery's outcome", exc)


_NO_SPAN: Final = DeliverySpan()


def live() -> bool:
    """Whether spans may record: the extra is installed and a tracer provider was set.

    Until the application sets one, the API's provider is a proxy whose spans record nothing:
    the spans are then skipped altogether, so that tracing costs nothing on the hot path.
    """
    return _tracer() is not None


def _tracer() -> Any:
    """The tracer of the global provider, or ``None`` when none was set (see :func:`live`).

    Asked for every span the worker may make, so it reads the API's global: the public
    ``get_tracer_provider()`` looks the environment up on each call until a provider is set,
    which cost 1.2 us a call, 5 us a task. The public call remains the fallback, and the one
    way a provider named by ``OTEL_PYTHON_TRACER_PROVIDER`` gets loaded.
    """
    if not ENABLED:
        if _BROKEN:
            _failed("start", RuntimeError(_BROKEN[0]))
        return None
    provider: Any = getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _PROVIDER_FROM_ENV:
        return None
    try:
        if provider is None or provider is _UNKNOWN:
            provider = _trace.get_tracer_provider()
            if isinstance(provider, _trace.ProxyTracerProvider):
                return None
        if _tracer_of[0] is not provider:  # asked once per provider (a test may set another)
            _tracer_of[:] = provider, provider.get_tracer("async_task_api_worker", __version__)
    except Exception as exc:  # OTEL_PYTHON_TRACER_PROVIDER names none installed, say
        _failed("get the tracer provider", exc)
        return None
    return _tracer_of[1]


#: What stands for an API without the global above (a future version): ask it publicly.
_UNKNOWN: Final = object()
#: Whether ``OTEL_PYTHON_TRACER_PROVIDER`` names a provider for the API to load on first use
#: (read at import, as the API's own configuration is: a lookup costs 1 us).
_PROVIDER_FROM_ENV: Final = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


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
    tracer = _tracer()
    return _NOT_PROCESSING if tracer is None else _processing(tracer, source, delivery)


def sending(target: Traced, message_id: str | None) -> AbstractContextManager[Mapping[str, str]]:
    """A ``send <queue>`` PRODUCER span; gives the headers that carry its context.

    The span is not made current: it covers one message's publishing until its confirm (its
    retries included), and nothing runs under it.

    Args:
        target: what publishes; its ``span_attributes(None)`` name the destination.
        message_id: the message's id (``messaging.message.id``).
    """
    tracer = _tracer()
    return _NOT_SENDING if tracer is None else _sending(tracer, target, message_id)


def settling(source: Traced, delivery: Any, method: str) -> AbstractContextManager[None]:
    """The ``<method> <queue>`` CLIENT span of a settlement (``ack``, ``nack``, ``reject``)."""
    tracer = _tracer()
    return _NOT_SETTLING if tracer is None else _settling(tracer, source, delivery, method)


def _start(
    tracer: Any, name: str, kind: Any, attributes: Mapping[str, Any], parent: Any = None
) -> Any:
    """A started span, or ``None`` if OpenTelemetry failed to start it (a span processor)."""
    try:
        return tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
    except Exception as exc:
        _failed(f"start a span ({name.partition(' ')[0]})", exc)
        return None


def _end(span: Any, what: str) -> None:
    """End ``span``; a span processor that fails then changes nothing of the decision."""
    try:
        span.end()
    except Exception as exc:
        _failed(f"end a span ({what})", exc)


@contextlib.contextmanager
def _current(span: Any) -> Iterator[None]:
    """``span`` as the current span for the block (if it started, and can be attached)."""
    token = None
    if span is not None:
        try:
            token = _context.attach(_trace.set_span_in_context(span))
        except Exception as exc:
            _failed("make a span current", exc)
    try:
        yield
    finally:
        if token is not None:
            _context.detach(token)


@contextlib.contextmanager
def _processing(tracer: Any, source: Traced, delivery: Any) -> Iterator[DeliverySpan]:
    attributes = source.span_attributes(delivery)
    parent = None
    if delivery.headers:
        try:
            parent = _propagate.extract(delivery.headers, getter=_GETTER)
        except Exception as exc:
            _failed("read a delivery's trace context", exc)
    span = _start(
        tracer,
        f"process {attributes.get(DESTINATION, '')}".rstrip(),
        _trace.SpanKind.CONSUMER,
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
        _trace.SpanKind.PRODUCER,
        {**attributes, OPERATION_TYPE: "send", OPERATION_NAME: "send"},
    )
    headers: dict[str, str] = {}
    if span is not None:
        try:
            # Also for a span that does not record: the consumer learns the sampling decision.
            if span.get_span_context().is_valid:
                _propagate.inject(headers, context=_trace.set_span_in_context(span))
        except Exception as exc:
            _failed("write a report's trace context", exc)
    try:
        yield headers
    except BaseException as exc:
        if span is not None:
            with contextlib.suppress(Exception):
                span.set_attribute(ERROR_TYPE, type(exc).__name__)
                span.set_status(_trace.StatusCode.ERROR, type(exc).__name__)
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
        _trace.SpanKind.CLIENT,
        {**attributes, OPERATION_TYPE: "settle", OPERATION_NAME: method},
    )
    try:
        with _current(span):
            yield
    finally:
        if span is not None:
            _end(span, "settle")
