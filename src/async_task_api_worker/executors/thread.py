"""Runs ``def`` handlers on a bounded set of daemon threads.

A thread cannot be killed: at the deadline the task fails with ``TASK_TIMEOUT`` and the thread
is left running, listed in :attr:`ThreadExecutor.stuck_task_ids`; the runtime ends the process
after the drain if one is still running (seed, "Running a worker"). The threads are daemon
threads, so a stuck one never holds the interpreter open at exit (``concurrent.futures``'s pool
joins its threads at exit, which is why it is not used here).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from async_task_api_worker.conclusion import Conclusion
from async_task_api_worker.context import task_log_extra
from async_task_api_worker.ports import ExecutionRequest
from async_task_api_worker.task_call import call_in_time, call_sync

__all__ = ["ThreadExecutor"]

_logger = logging.getLogger("async_task_api_worker.executors.thread")

_Call = tuple[Future[Any], Callable[[], Any]]


class _DaemonThreads:
    """Daemon threads started on demand, taking calls from a queue.

    At most ``max_threads`` threads serve calls, not counting threads whose call was abandoned
    (:meth:`abandoned`): a stuck thread keeps running, but a fresh one takes its place, so a
    task never waits for a slot that will not come back (and times out without having run).
    """

    def __init__(self, max_threads: int, prefix: str) -> None:
        self._max_threads = max_threads
        self._prefix = prefix
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stuck = 0
        self._closed = False

    def abandoned(self, count: int) -> None:
        """Tell the pool that ``count`` more (or, negative, fewer) threads are stuck."""
        with self._lock:
            self._stuck += count

    def submit(self, function: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the thread executor is closed")
            self._calls.put((future, function))
            alive = [thread for thread in self._threads if thread.is_alive()]
            self._threads = alive
            limit = self._max_threads + self._stuck
            if not self._idle.acquire(blocking=False) and len(alive) < limit:
                thread = threading.Thread(
                    target=self._work, name=f"{self._prefix}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return future

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                self._calls.put(None)  # let the next thread see it too
                return
            future, function = call
            if future.set_running_or_notify_cancel():
                try:
                    result = function()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del call, future, function
            self._idle.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        self._calls.put(None)


class ThreadExecutor:
    """The executor of ``def`` handlers.

    Args:
        max_threads: the most threads running handlers at once (``WORKER_CONCURRENCY``).
    """

    def __init__(self, max_threads: int) -> None:
        self._threads = _DaemonThreads(max_threads, "task")
        self._running: dict[Future[Any], str] = {}
        self._abandoned: set[Future[Any]] = set()
        # Done callbacks run in the handler threads; the loop reads the same maps.
        self._lock = threading.RLock()  # cancel() runs done callbacks inline

    @property
    def stuck_task_ids(self) -> tuple[str, ...]:
        """Task ids whose thread still runs after its task was concluded (timeout, shutdown)."""
        with self._lock:
            return tuple(self._running[f] for f in self._abandoned if f in self._running)

    async def execute(self, request: ExecutionRequest) -> Conclusion:
        """Run the task call (``task_call.call_sync``) in a thread, with the caller's context.

        Returns:
            The call's conclusion; ``TASK_TIMEOUT`` when the deadline passed (the thread keeps
            running, recorded as stuck).
        """
        context = contextvars.copy_context()
        future = self._threads.submit(functools.partial(context.run, call_sync, request))
        with self._lock:
            self._running[future] = request.task_id
        future.add_done_callback(self._finished)

        async def abandon() -> None:
            self._abandon(future)

        return await call_in_time(asyncio.wrap_future(future), request.timeout_s, abandon)

    def _abandon(self, future: Future[Any]) -> None:
        with self._lock:
            if future.cancel() or future.done():
                return
            self._abandoned.add(future)
            self._threads.abandoned(1)
            task_id = self._running.get(future)
        _logger.warning(
            "A handler thread is still running and cannot be stopped",
            extra=task_log_extra({"task_id": task_id}),
        )

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.pop(future, None)
            if future in self._abandoned:
                self._abandoned.discard(future)
                self._threads.abandoned(-1)

    async def start(self) -> None:
        """Nothing to prepare."""

    async def aclose(self) -> None:
        """Stop taking work; threads still running are left to finish (they cannot be killed)."""
        self._threads.close()
