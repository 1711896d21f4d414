"""A trace context in and out of messages (AMQP headers) and child processes (environment).

The W3C Trace Context headers only: ``traceparent`` and ``tracestate``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Final

from async_task_api_worker.observability.tracing import api
from async_task_api_worker.observability.tracing.api import ENABLED, failed

__all__ = [
    "ENV_VARIABLES",
    "HEADER_GETTER",
    "TRACE_HEADERS",
    "carrier",
    "carrier_from_env",
    "carrier_to_env",
    "continued",
    "current_ids",
]

#: The headers that carry a trace context (W3C Trace Context).
TRACE_HEADERS: Final = ("traceparent", "tracestate")
#: The environment variables a child process reads its parent's context from.
_ENV_OF: Final = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE"}
#: Those variables' names.
ENV_VARIABLES: Final = tuple(_ENV_OF.values())


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else None


class _Getter(api.Getter[Mapping[str, Any]] if ENABLED else object):  # type: ignore[misc]
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


HEADER_GETTER: Final = _Getter()


def carrier() -> dict[str, str]:
    """The current trace context as headers (``{"traceparent": ...}``); empty when there is none.

    Empty without the extra, without a tracer provider, or outside any span.
    """
    if not ENABLED:
        return {}
    headers: dict[str, str] = {}
    try:
        api.propagate.inject(headers)
    except Exception as exc:
        failed("write a trace context", exc)
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
            api.context.detach(token)


def _attach_parent(headers: Mapping[str, Any]) -> Any:
    try:
        return api.context.attach(api.propagate.extract(headers, getter=HEADER_GETTER))
    except Exception as exc:
        failed("read a trace context", exc)
        return None


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span, in hex, or ``None`` (for log lines)."""
    if not ENABLED:
        return None
    try:
        span_context = api.trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return None
        return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")
    except Exception:  # a hostile span in the context: the line goes without the ids
        return None
