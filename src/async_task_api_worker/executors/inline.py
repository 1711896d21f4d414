"""Runs ``async def`` handlers on the event loop, cancelled by asyncio at their deadline."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from async_task_api_worker.conclusion import Conclusion
from async_task_api_worker.context import task_log_extra
from async_task_api_worker.ports import ExecutionRequest
from async_task_api_worker.task_call import conclude_error, conclude_value, timed_out

__all__ = ["CANCEL_GRACE_S", "HandlerExitError", "InlineExecutor"]

_logger = logging.getLogger("async_task_api_worker.executors.inline")

#: How long a cancelled handler gets to unwind (its ``finally`` blocks) before it is abandoned.
CANCEL_GRACE_S: Final = 1.0


class HandlerExitError(RuntimeError):
    """A handler raised ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException``.

    It is reported as ``INTERNAL_ERROR``; the worker goes on.
    """


async def _call(request: ExecutionRequest) -> Any:
    try:
        return await request.handler(request.task_input, request.context)
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as exc:
        # Left alone, asyncio would re-raise SystemExit/KeyboardInterrupt out of the event loop
        # and take the whole worker down for one handler's mistake.
        raise HandlerExitError(f"the handler raised {type(exc).__name__}") from exc


class InlineExecutor:
    """The executor of ``async def`` handlers.

    The handler runs as its own task. At the deadline it is cancelled
    (``asyncio.CancelledError`` at its current ``await``) and the task fails with
    :class:`~async_task_api_worker.errors.TaskTimeoutError`, even if the handler swallows the
    cancel and returns late. A handler that still has not stopped :data:`CANCEL_GRACE_S` after
    the cancel is abandoned and listed in :attr:`stuck_task_ids`. A handler that blocks the event
    loop (``time.sleep``, CPU work) cannot be interrupted at all: use a ``def`` handler for that.

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
        """Await ``request.handler(request.task_input, request.context)`` under the deadline.

        Returns:
            The call's conclusion: ``TASK_TIMEOUT`` when the deadline passed (a ``TimeoutError``
            the handler raises itself is its own failure, an ``INTERNAL_ERROR``); a
            ``BaseException`` (``SystemExit``...) or a cancel by something other than the SDK
            is an ``INTERNAL_ERROR`` (:class:`HandlerExitError`).
        """
        # The task copies the caller's context: the handler's records carry the task fields.
        handler = asyncio.ensure_future(_call(request))
        try:
            done, _ = await asyncio.wait({handler}, timeout=request.timeout_s)
        except asyncio.CancelledError:
            await self._stop(handler, request.task_id)
            raise
        if not done:
            await self._stop(handler, request.task_id)
            return timed_out(request.timeout_s)
        if handler.cancelled():
            exc: BaseException = HandlerExitError(
                "the handler was cancelled by something other than the SDK"
            )
        elif (exc_or_none := handler.exception()) is None:
            return conclude_value(request.output_model, handler.result())
        else:
            exc = exc_or_none
        return conclude_error(exc)

    async def _stop(self, handler: asyncio.Task[Any], task_id: str) -> None:
        handler.cancel()
        done, _ = await asyncio.wait({handler}, timeout=self._cancel_grace_s)
        if done:
            if not handler.cancelled():
                handler.exception()  # retrieved: the outcome is already decided
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
