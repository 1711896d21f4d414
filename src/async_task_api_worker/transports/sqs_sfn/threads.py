"""A small pool of daemon threads for the transport's blocking AWS calls.

Daemon on purpose. ``concurrent.futures.ThreadPoolExecutor`` joins its threads when the
interpreter exits, so one call stuck in botocore's retries (five tries of up to 10 s each, on a
hanging endpoint) would keep the process alive long past the shutdown bound that ``check``
prints. Left behind at exit, such a call is harmless: a heartbeat, a report or a delete that
never finishes is what a killed worker leaves too, and Step Functions' heartbeat timeout covers
it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DaemonPool"]

_STOP = object()


class DaemonPool(concurrent.futures.Executor):
    """``workers`` daemon threads taking calls in order (an ``Executor`` for asyncio).

    Args:
        workers: how many calls may run at once.
        name: the threads' name prefix.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._shut = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Queue ``fn(*args, **kwargs)``; its future resolves on a pool thread.

        Raises:
            RuntimeError: the pool was shut down.
        """
        if self._shut:
            raise RuntimeError("the pool is shut down")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = False) -> None:
        """Take no more calls; the threads end once the calls queued before are done.

        Nothing is waited for (``wait`` is ignored: the threads are daemons).
        """
        if self._shut:
            return
        self._shut = True
        for _ in self._threads:
            self._calls.put(_STOP)

    def _work(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, as concurrent.futures does
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(exc)
            else:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_result(result)
