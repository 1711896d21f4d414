"""Runs ``async def`` handlers on the event loop, cancelled by asyncio at their deadline."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from async_task_api_worker.broker_rules import CANCEL_GRACE_S
from async_task_api_worker.conclusion import Conclusion
from async_task_api_worker.context import task_log_extra
from async_task_api_worker.ports import ExecutionRequest
from async_task_api_worker.task_call import call_async, call_in_time

__all__ = ["CANCEL_GRACE_S", "InlineExecutor"]

_logger = logging.getLogger("async_task_api_worker.executors.inline")


class InlineExecutor:
    """The executor of ``async def`` handlers.

    The handler runs as its own task. At the deadline it is cancelled
    (``asyncio.CancelledError`` at its current ``await``) and the task fails with
    :class:`~async_task_api_worker.errors.TaskTimeoutError`, even if the handler swallows the
    cancel and returns late. A handler that still has not stopped ``CANCEL_GRACE_S`` after the
    cancel (``broker_rules``: the time budget counts it) is abandoned and listed in
    :attr:`stuck_task_ids`. A handler that blocks the event loop (``time.sleep``, CPU work)
    cannot be interrupted at all: use a ``def`` handler for that.

    Args:
        cancel_grace_s: how long a cancelled handler gets to unwind, in seconds.
    """

    def __init__(self, *, cancel_grace_s: float = CANCEL_GRACE_S) -> None:
        self._cancel_grace_s = cancel_grace_s
        self._stuck: dict[asyncio.Task[Any], str] = {}

    @property
    def stuck_task_ids(self) -> tuple[str, ...]:
        """Task ids of handlers that ignored their cancel and still run."""
        return tuple(self._stuck.values())

    async def execute(self, request: ExecutionRequest) -> Conclusion:
        """Run the task call (``task_call.call_async``) as the handler's task, under its deadline.

        The one task per call is the handler's: a handler that swallows its cancel can only be
        abandoned if it is not the caller's own task.

        Returns:
            The call's conclusion (``TASK_TIMEOUT`` when the deadline passed).
        """
        # The task copies the caller's context: the handler's records carry the task fields.
        handler = asyncio.ensure_future(call_async(request))
        return await call_in_time(
            handler, request.timeout_s, lambda: self._stop(handler, request.task_id)
        )

    async def _stop(self, handler: asyncio.Task[Any], task_id: str) -> None:
        handler.cancel()
        done, _ = await asyncio.wait({handler}, timeout=self._cancel_grace_s)
        if done:
            return
        self._stuck[handler] = task_id
        handler.add_done_callback(lambda task: self._stuck.pop(task, None))
        _logger.warning(
            "A cancelled handler has not stopped after %g s; it is abandoned",
            self._cancel_grace_s,
            extra=task_log_extra({"task_id": task_id}),
        )

    async def start(self) -> None:
        """Nothing to prepare."""

    async def aclose(self) -> None:
        """Nothing to release (abandoned handlers end with the event loop)."""
