"""OpenTelemetry, when the ``otel`` extra is installed: the one module that imports it.

:data:`ENABLED` says whether it could be imported; :func:`tracer` finds the tracer of the
application's provider; :func:`failed` says once that a call into OpenTelemetry failed, so that
tracing never changes a task's outcome.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

from async_task_api_worker._version import __version__

#: ``context``, ``propagate``, ``trace`` and ``Getter`` are OpenTelemetry's own, for the
#: package's other modules; they exist only when :data:`ENABLED`.
__all__ = ["ENABLED", "Getter", "context", "failed", "live", "propagate", "trace", "tracer"]

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
