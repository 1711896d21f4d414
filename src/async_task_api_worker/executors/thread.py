"""Runs ``def`` handlers in a bounded thread pool.

A thread cannot be killed: at the deadline the task fails with ``TASK_TIMEOUT`` and the thread
is left running, recorded as stuck (:attr:`ThreadExecutor.stuck_task_ids`); the runtime ends the
process after the drain if one is still running (seed, "Running a worker").
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from async_task_api_worker.errors import TaskTimeoutError
from async_task_api_worker.executors.inline import HandlerExitError
from async_task_api_worker.ports import ExecutionRequest

__all__ = ["ThreadExecutor"]

_logger = logging.getLogger("async_task_api_worker.executors.thread")


def _call(request: ExecutionRequest) -> Any:
    try:
        return request.handler(request.task_input, request.context)
    except SystemExit as exc:
        raise HandlerExitError("the handler called sys.exit()") from exc


class ThreadExecutor:
    """The executor of ``def`` handlers.

    Args:
        max_threads: the pool's size (``WORKER_CONCURRENCY``).
    """

    def __init__(self, max_threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="task")
        self._running: dict[Future[Any], str] = {}
        self._abandoned: set[Future[Any]] = set()
        # Done callbacks run in pool threads; the loop reads the same maps.
        self._lock = threading.RLock()  # cancel() runs done callbacks inline

    @property
    def stuck_task_ids(self) -> tuple[str, ...]:
        """Task ids whose thread still runs after its task was concluded (timeout, shutdown)."""
        with self._lock:
            return tuple(self._running[f] for f in self._abandoned if f in self._running)

    async def execute(self, request: ExecutionRequest) -> Any:
        """Run the handler in a pool thread, with the caller's context variables.

        Raises:
            TaskTimeoutError: the deadline passed (the thread keeps running, recorded as stuck).
            HandlerExitError: the handler raised ``SystemExit``.
        """
        context = contextvars.copy_context()
        future = self._pool.submit(context.run, functools.partial(_call, request))
        with self._lock:
            self._running[future] = request.task_id
        future.add_done_callback(self._finished)
        deadline = asyncio.timeout(request.timeout_s)
        try:
            async with deadline:
                return await asyncio.wrap_future(future)
        except TimeoutError as exc:
            if deadline.expired():
                self._abandon(future)
                raise TaskTimeoutError(f"handler ran past {request.timeout_s:g} s") from exc
            raise
        except asyncio.CancelledError:
            self._abandon(future)
            raise

    def _abandon(self, future: Future[Any]) -> None:
        with self._lock:
            if future.cancel() or future.done():
                return
            self._abandoned.add(future)
            task_id = self._running.get(future)
        if task_id is not None:
            _logger.warning(
                "A handler thread is still running and cannot be stopped",
                extra={"task_id": task_id},
            )

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.pop(future, None)
            self._abandoned.discard(future)

    async def aclose(self) -> None:
        """Stop taking work; threads still running are left to finish (they cannot be killed)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
