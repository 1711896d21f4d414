"""async-task-api-worker: write AsyncTaskAPI task workers that never lose a result.

Declare a :class:`Worker`, give it one task with ``@worker.task(timeout=...)``, and the SDK
does the rest: decoding, reports, time limits, retries, acknowledgements.
"""

from async_task_api_worker._version import __version__
from async_task_api_worker.context import SyncTaskContext, TaskContext
from async_task_api_worker.definition import Worker
from async_task_api_worker.errors import (
    AsyncTaskWorkerError,
    ConfigError,
    DefinitionError,
    FatalError,
    RetryableError,
    SettingsError,
    TaskCancelledError,
)
from async_task_api_worker.settings import WorkerSettings

__all__ = [
    # declaring a worker
    "SyncTaskContext",
    "TaskContext",
    "Worker",
    # failing a task on purpose
    "FatalError",
    "RetryableError",
    # a cancelled def handler unwinding (ctx.raise_if_cancelled)
    "TaskCancelledError",
    # the error root and misuse
    "AsyncTaskWorkerError",
    "ConfigError",
    "DefinitionError",
    "SettingsError",
    # settings
    "WorkerSettings",
    # version
    "__version__",
]
