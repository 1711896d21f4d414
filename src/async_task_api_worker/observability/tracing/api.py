"""OpenTelemetry, when the ``otel`` extra is installed: the one module that imports it.

:data:`ENABLED` says whether it could be imported; :func:`tracer` finds the tracer of the
application's provider; :func:`failed` says once that a call into OpenTelemetry failed, so that
tracing never changes a task's outcome; :func:`provider_from_env` sets up the SDK's provider
for a command that is its own application (``submit``, ``cancel``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from typing import IO, Any, Final

from async_task_api_worker._version import __version__
from async_task_api_worker.errors import SettingsError

#: ``context``, ``propagate``, ``trace`` and ``Getter`` are OpenTelemetry's own, for the
#: package's other modules; they exist only when :data:`ENABLED`.
__all__ = [
    "ENABLED",
    "HEADER_LOGGERS",
    "Getter",
    "OncePerKind",
    "context",
    "failed",
    "live",
    "propagate",
    "provider_from_env",
    "trace",
    "tracer",
]

_logger = logging.getLogger("async_task_api_worker.tracing")

#: Why tracing is off although the extra is installed (its configuration failed), if it is.
_BROKEN: list[str] = []

try:
    from opentelemetry import context, propagate, trace
    from opentelemetry.propagators.textmap import Getter
except ImportError:  # the `otel` extra is not installed
    ENABLED: Final = False
except Exception as exc:  # e.g. OTEL_PROPAGATORS names one not installed (ValueError)
    ENABLED = False  # type: ignore[misc]  # set once, here
    _BROKEN.append(f"{type(exc).__name__}: {exc}")
else:
    ENABLED = True  # type: ignore[misc]  # set once, by the import above

#: The loggers of OpenTelemetry's W3C propagator and of its ``TraceState``: each warns about a
#: bad incoming header (too long, a malformed ``tracestate`` member...) every time it reads one.
HEADER_LOGGERS: Final = ("opentelemetry.trace.propagation.tracecontext", "opentelemetry.trace.span")


class OncePerKind(logging.Filter):
    """Lets through the first record of each kind, a kind being its logger and message format.

    A producer that sends a 10 KB ``traceparent`` sends it with every task: the API's warning
    about it is said once, not once per delivery (the API itself says it every time). Costs
    nothing until a record comes; then a set lookup.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, object]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is the first of its kind (said with a note that it is once)."""
        kind = (record.name, record.msg)
        if kind in self._seen:
            return False
        self._seen.add(kind)
        record.msg = f"{record.msg} (a bad trace header; said once, later ones are not logged)"
        return True


if ENABLED:
    for _name in HEADER_LOGGERS:
        logging.getLogger(_name).addFilter(OncePerKind())

#: What failed in OpenTelemetry already, said once each (a failure is never the task's).
_SAID: set[str] = set()


def failed(what: str, exc: BaseException) -> None:
    """Say once per ``what`` that tracing failed there; the worker goes on without it."""
    if what not in _SAID:
        _SAID.add(what)
        _logger.warning(
            "Tracing failed to %s (%s: %s); the task goes on, this span may be missing",
            what,
            type(exc).__name__,
            exc,
        )


#: The tracer of the provider last seen: ``(provider, tracer)``.
_tracer_of: list[Any] = [None, None]


def live() -> bool:
    """Whether spans may record: the extra is installed and a tracer provider was set.

    Until the application sets one, the API's provider is a proxy whose spans record nothing:
    the spans are then skipped altogether, so that tracing costs nothing on the hot path.
    """
    return tracer() is not None


def tracer() -> Any:
    """The tracer of the global provider, or ``None`` when none was set (see :func:`live`).

    Asked for every span the worker may make, so it reads the API's global: the public
    ``get_tracer_provider()`` looks the environment up on each call until a provider is set,
    which cost 1.2 us a call, 5 us a task. The public call remains the fallback, and the one
    way a provider named by ``OTEL_PYTHON_TRACER_PROVIDER`` gets loaded.
    """
    if not ENABLED:
        if _BROKEN:
            failed("start", RuntimeError(_BROKEN[0]))
        return None
    provider: Any = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _PROVIDER_FROM_ENV:
        return None
    try:
        if provider is None or provider is _UNKNOWN:
            provider = trace.get_tracer_provider()
            if isinstance(provider, trace.ProxyTracerProvider):
                return None
        if _tracer_of[0] is not provider:  # asked once per provider (a test may set another)
            _tracer_of[:] = provider, provider.get_tracer("async_task_api_worker", __version__)
    except Exception as exc:  # OTEL_PYTHON_TRACER_PROVIDER names none installed, say
        failed("get the tracer provider", exc)
        return None
    return _tracer_of[1]


#: What stands for an API without the global above (a future version): ask it publicly.
_UNKNOWN: Final = object()
#: Whether ``OTEL_PYTHON_TRACER_PROVIDER`` names a provider for the API to load on first use
#: (read at import, as the API's own configuration is: a lookup costs 1 us).
_PROVIDER_FROM_ENV: Final = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


#: The entry-point group of the SDK's span exporters, as ``OTEL_TRACES_EXPORTER`` names them.
EXPORTERS_GROUP: Final = "opentelemetry_traces_exporter"


def provider_from_env(stream: IO[str]) -> Any:
    """Set a tracer provider up as the OpenTelemetry SDK's environment variables say.

    For a command that is an application of its own (``submit``, ``cancel``): its ``send``
    span then records, and its context leaves in the message. Nothing is set up without the
    SDK (``opentelemetry-sdk``), without any ``OTEL_`` variable, with ``OTEL_SDK_DISABLED=true``,
    or when a provider is set already (by the application, or ``OTEL_PYTHON_TRACER_PROVIDER``).
    Otherwise: the resource is ``Resource.create()`` (``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``), the sampler the SDK's (``OTEL_TRACES_SAMPLER``), and each
    exporter ``OTEL_TRACES_EXPORTER`` names (comma-separated; default ``otlp`` when it is
    installed; ``none``: none) is loaded from the SDK's entry points
    (``opentelemetry_traces_exporter``) behind a batch processor. ``console`` writes to
    ``stream``, since the commands' stdout carries their output. The provider flushes when the
    interpreter exits (the SDK's ``shutdown_on_exit``).

    Returns:
        The provider set up, or ``None``.

    Raises:
        SettingsError: ``OTEL_TRACES_EXPORTER`` names an exporter that is not installed.
    """
    environ = os.environ
    if not ENABLED or not any(name.startswith("OTEL_") for name in environ):
        return None
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or _PROVIDER_FROM_ENV:
        return None
    if getattr(trace, "_TRACER_PROVIDER", None) is not None:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:  # the API alone: it passes contexts on, and records nothing
        return None
    named = environ.get("OTEL_TRACES_EXPORTER")
    exporters = []
    for name in (part.strip() for part in (named or "otlp").split(",")):
        if not name or name == "none":
            continue
        found = importlib.metadata.entry_points(group=EXPORTERS_GROUP, name=name)
        if not found:
            if named is None:  # the default, not installed: no exporter, as none was asked
                continue
            raise SettingsError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed "
                f"(no {EXPORTERS_GROUP} entry point of that name; the package "
                f"opentelemetry-exporter-{name} would provide it)"
            )
        exporter = next(iter(found)).load()
        exporters.append(exporter(out=stream) if name == "console" else exporter())
    provider = TracerProvider(resource=Resource.create())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider
