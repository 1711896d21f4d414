"""The worker's error hooks (``@worker.on_task_error``), told of a handler's unexpected exception.

The task call tells them (:func:`tell`) of an exception it concluded as ``INTERNAL_ERROR``
(``conclude.conclude_error`` decides that, once), after the conclusion is made. They run on one
thread of their own, one call at a time, so that a hook that raises, blocks or hangs changes no
conclusion and holds no task up: what waits for a hook is bounded (:data:`MAX_WAITING`), and
what goes past the bound is dropped with a warning. What the logs say of a hook's failure
follows the logs' rule: the exception's type and frames, never its text
(``observability.redaction``).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import queue
import threading
import time
from typing import Final

from async_task_api_worker.context import SyncTaskContext, TaskContext
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.task_definition import TaskErrorHook, TaskErrorInput, qualified

__all__ = ["MAX_WAITING", "ErrorHooks", "drain", "error_of", "tell"]

_logger = logging.getLogger("async_task_api_worker.engine")

#: Errors that may wait for a hook that has not returned; one more is dropped (and said).
MAX_WAITING: Final = 100
#: Seconds the process waits, as it exits, for the hooks to take the errors handed to them.
EXIT_WAIT_S: Final = 5.0


def error_of(exc: BaseException, context: TaskContext | SyncTaskContext) -> TaskErrorInput:
    """The hooks' input: ``exc`` and the fields of the task whose context is ``context``."""
    return TaskErrorInput(
        exception=exc,
        task_id=context.task_id,
        client_id=context.client_id,
        service=context.service,
        attempt=context.attempt,
        delivery_limit=context.delivery_limit,
    )


class ErrorHooks:
    """One thread that calls error hooks in turn, fed through a bounded queue.

    The thread starts with the first error (a worker whose tasks never fail has none); it is
    a daemon thread: as the interpreter exits, it waits up to :data:`EXIT_WAIT_S` for the
    hooks to take what was handed to them, then a hook still running is cut short.

    Args:
        max_waiting: how many errors may wait while a hook runs (see :data:`MAX_WAITING`).
    """

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self._queue: queue.Queue[tuple[tuple[TaskErrorHook, ...], TaskErrorInput]] = queue.Queue(
            max_waiting
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._dropping = False
        self._exit_wait_s = EXIT_WAIT_S

    def tell(self, hooks: tuple[TaskErrorHook, ...], error: TaskErrorInput) -> None:
        """Hand ``error`` to ``hooks`` on the hooks' thread; never blocks, never raises."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="atw-error-hooks", daemon=True
                )
                self._thread.start()
                atexit.register(lambda: self.wait_idle(self._exit_wait_s))
        try:
            self._queue.put_nowait((hooks, error))
        except queue.Full:
            if not self._dropping:  # said once until the hook catches up
                self._dropping = True
                _logger.warning(
                    "The on_task_error hooks are %d errors behind (one has not returned): "
                    "the error of task %s (%s) and the next ones are not handed to them",
                    self._queue.maxsize,
                    error.task_id,
                    exception_type_name(error.exception),
                )
            return
        self._dropping = False

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for every error handed over to be taken."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def drain(self, timeout_s: float) -> bool:
        """:meth:`wait_idle` as a worker shuts down, within its bound: the exit waits no more."""
        self._exit_wait_s = 0.0
        return self.wait_idle(timeout_s)

    def _run(self) -> None:
        while True:
            hooks, error = self._queue.get()
            for hook in hooks:
                _call(hook, error)
            del hooks, error  # the exception and its frames go before the next wait
            self._queue.task_done()


def _call(hook: TaskErrorHook, error: TaskErrorInput) -> None:
    try:
        result = hook(error)
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except BaseException as exc:  # a SystemExit would end the thread, and every later call
        _logger.error(
            "The on_task_error hook %s raised %s on the error of task %s; ignored\n%s",
            qualified(hook),
            exception_type_name(exc),
            error.task_id,
            safe_traceback(exc),
        )


#: The process's hooks' thread.
_HOOKS: Final = ErrorHooks()


def drain(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for the hooks to take what they were handed (shutdown).

    Returns:
        Whether they did; the process's exit then waits for them no more.
    """
    return _HOOKS.drain(timeout_s)


def tell(
    hooks: tuple[TaskErrorHook, ...],
    exc: BaseException | None,
    context: TaskContext | SyncTaskContext,
) -> None:
    """Hand ``exc``, raised by the handler whose context is ``context``, to ``hooks``.

    Nothing for no hook, or no exception (a process-isolated task's answer without one).
    """
    if hooks and exc is not None:
        _HOOKS.tell(hooks, error_of(exc, context))
