"""async-task-api-worker: write AsyncTaskAPI task workers that never lose a result.

Declare a :class:`Worker`, give it one task with ``@worker.task(timeout=...)``, and the SDK
does the rest: decoding, reports, time limits, retries, acknowledgements.
"""

from async_task_api_worker import definition as _definition
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
from async_task_api_worker.task_definition import TaskErrorInput


class _Runtime:
    """``Worker.run`` and ``Worker.serve``, wired to the runtime when the package is imported.

    The definition is a foundation module and the runtime sits layers above it: wiring it in
    here keeps every import pointing down, and the runtime's own imports (the engine, the
    transports) load only when a worker is run, not when a handler's module is imported.
    """

    def run(self, worker: Worker) -> int:
        from async_task_api_worker.runtime.entry import run_worker

        return int(run_worker(worker))

    async def serve(self, worker: Worker) -> None:
        from async_task_api_worker.runtime.entry import serve_worker

        await serve_worker(worker)


_definition.wire_runtime(_Runtime())

__all__ = [
    # declaring a worker
    "SyncTaskContext",
    "TaskContext",
    "Worker",
    # an error tracker's hook (@worker.on_task_error)
    "TaskErrorInput",
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
