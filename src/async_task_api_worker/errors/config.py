"""Misuse and configuration: the :class:`ConfigError` branch, kept apart from runtime failures.

Each also inherits the builtin a caller would expect (``ValueError``; ``TypeError`` for a
mistake in a Worker definition). Retrying cannot help: fix the code or the environment.
"""

from __future__ import annotations

from async_task_api_worker.errors.root import AsyncTaskWorkerError

__all__ = [
    "BrokerRefusedError",
    "BrokerTLSError",
    "ConfigError",
    "ContextParameterError",
    "DefinitionError",
    "DuplicateTaskError",
    "ErrorDeclarationError",
    "HandlerKindError",
    "HandlerSignatureError",
    "HookNotAsyncError",
    "InputModelError",
    "InvalidErrorCodeError",
    "InvalidProbeNameError",
    "InvalidTimeoutError",
    "InvalidWorkerNameError",
    "IsolationError",
    "NoTaskError",
    "OutputModelError",
    "SettingsError",
    "TargetError",
    "TimeBudgetError",
]


class ConfigError(AsyncTaskWorkerError, ValueError):
    """Misuse or configuration: fix the code or the environment, retrying will not help."""


class SettingsError(ConfigError):
    """An invalid setting; the message is one line naming the variable, never its value."""


class TimeBudgetError(SettingsError):
    """The task timeout does not fit under the broker's consumer timeout.

    Rule (RabbitMQ closes a channel whose delivery stays unacked past ``consumer_timeout``):
    ``task timeout + WORKER_RETRY_BACKOFF_MAX_S + 60 s < WORKER_CONSUMER_TIMEOUT_S``.
    """


class BrokerRefusedError(ConfigError):
    """The broker refused us: wrong credentials, no access to the vhost, or to one of its queues.

    Retrying cannot help, so the worker exits 2 at once instead of reconnecting forever.
    """


class BrokerTLSError(BrokerRefusedError):
    """The TLS handshake with the broker failed for a reason no retry can fix.

    The broker's certificate is not trusted (unknown CA, self-signed), does not match the host
    name, or the broker refused the client certificate (none given, or one it does not trust):
    the worker exits 2 with one line saying which (docs/tls.md).
    """


class TargetError(ConfigError):
    """``module:attribute`` does not name an importable Worker (or a factory returning one)."""


class InvalidErrorCodeError(ConfigError):
    """An error code outside ``^[A-Z][A-Z0-9_]{0,63}$``, or one reserved for the SDK."""


class DefinitionError(ConfigError, TypeError):
    """A mistake in a :class:`~async_task_api_worker.Worker` definition."""


class InvalidWorkerNameError(DefinitionError):
    """The worker's name is not a valid service name."""


class DuplicateTaskError(DefinitionError):
    """A second ``@worker.task`` on a worker that already has its one task."""


class NoTaskError(DefinitionError):
    """The worker is used before a ``@worker.task`` was declared."""


class InvalidTimeoutError(DefinitionError):
    """``timeout`` is not a positive, finite number of seconds."""


class HandlerSignatureError(DefinitionError):
    """The handler's signature is not ``(task_input: Model, ctx: Context) -> Model``."""


class HandlerKindError(HandlerSignatureError):
    """The handler is not a plain ``def`` or ``async def`` function (a generator, a class...)."""


class ContextParameterError(HandlerSignatureError):
    """The context parameter is not annotated exactly ``TaskContext`` / ``SyncTaskContext``."""


class InputModelError(HandlerSignatureError):
    """The input parameter is not annotated with a pydantic model class."""


class OutputModelError(HandlerSignatureError):
    """The return annotation is not a pydantic model class."""


class IsolationError(DefinitionError):
    """``isolation=``, ``memory_limit_bytes=`` or ``cpu_limit_s=`` of ``@worker.task`` is wrong."""


class ErrorDeclarationError(DefinitionError):
    """``errors=`` of ``@worker.task`` holds a bad or reserved code, or a blank description."""


class HookNotAsyncError(DefinitionError):
    """A hook or readiness probe is not an ``async def`` function."""


class InvalidProbeNameError(DefinitionError):
    """A readiness probe name is reserved, invalid, or already used."""
