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
so that no span ever changes a delivery's outcome.

The package is the one place that imports OpenTelemetry (an import-linter contract), in
``api`` alone; ``carriers`` moves a trace context in and out of messages and processes, and
``spans`` makes the worker's spans.
"""

from __future__ import annotations

from async_task_api_worker.observability.tracing.api import ENABLED, live, provider_from_env
from async_task_api_worker.observability.tracing.carriers import (
    ENV_VARIABLES,
    TRACE_HEADERS,
    carrier,
    carrier_from_env,
    carrier_to_env,
    continued,
    current_ids,
)
from async_task_api_worker.observability.tracing.spans import (
    DeliverySpan,
    Traced,
    processing,
    sending,
    settling,
)

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
    "provider_from_env",
    "sending",
    "settling",
]
