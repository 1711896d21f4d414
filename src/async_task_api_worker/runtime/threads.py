"""The event loop's default executor under ``run``: it knows which task each thread works for.

An ``async def`` handler that calls ``asyncio.to_thread`` (or ``loop.run_in_executor(None,
...)``) starts a thread the SDK cannot stop. After the drain, such a thread gets 2 s; one still
running then is logged with its task id and ``run`` exits at once with 1 (seed, "Running a
worker"), since asyncio would otherwise wait for it forever on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from async_task_api_worker.context import current_task_fields

__all__ = ["TaskAwareExecutor"]

P = ParamSpec("P")
T = TypeVar("T")


class TaskAwareExecutor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` that records the task id of each call while it runs."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="to-thread")
        self._running: dict[int, str | None] = {}
        self._lock = threading.Lock()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Submit ``fn``, remembering the task of the code that submitted it."""
        fields = current_task_fields()
        task_id = None if fields is None else fields.get("task_id")
        marker = object()

        def call() -> T:
            with self._lock:
                self._running[id(marker)] = task_id
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._running.pop(id(marker), None)
                    waiter = self._waiter
                if waiter is not None:
                    with contextlib.suppress(RuntimeError):  # the loop is gone
                        waiter[0].call_soon_threadsafe(waiter[1].set)

        return super().submit(call)

    def running_task_ids(self) -> tuple[str, ...]:
        """The task ids of the calls running now (calls made outside a task are not listed)."""
        with self._lock:
            return tuple(task_id for task_id in self._running.values() if task_id is not None)

    async def wait_idle(self, timeout_s: float) -> tuple[str, ...]:
        """Wait up to ``timeout_s`` for the task calls to end; returns those still running."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        changed = asyncio.Event()
        with self._lock:
            self._waiter = (loop, changed)
        try:
            while (running := self.running_task_ids()) and loop.time() < deadline:
                changed.clear()
                if self.running_task_ids() != running:  # ended between the two reads
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=deadline - loop.time())
        finally:
            with self._lock:
                self._waiter = None
        return running
