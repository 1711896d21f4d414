"""Runs ``async def`` handlers on the event loop, cancelled by asyncio at their deadline."""

from __future__ import annotations

import asyncio
from typing import Any

from async_task_api_worker.errors import TaskTimeoutError
from async_task_api_worker.ports import ExecutionRequest

__all__ = ["HandlerExitError", "InlineExecutor"]


class HandlerExitError(RuntimeError):
    """A handler called ``sys.exit()``: reported as an internal error, the worker goes on."""


class InlineExecutor:
    """The executor of ``async def`` handlers.

    At the deadline the handler's task is cancelled (``asyncio.CancelledError`` is raised at
    its current ``await``) and :class:`~async_task_api_worker.errors.TaskTimeoutError` raised.
    A handler that blocks the event loop cannot be interrupted: use a ``def`` handler for
    blocking work.
    """

    async def execute(self, request: ExecutionRequest) -> Any:
        """Await ``request.handler(request.task_input, request.context)`` under the deadline.

        Raises:
            TaskTimeoutError: the deadline passed. A ``TimeoutError`` the handler raises itself
                is passed through unchanged (it is the handler's failure, not a timeout).
            HandlerExitError: the handler raised ``SystemExit``.
        """
        deadline = asyncio.timeout(request.timeout_s)
        try:
            async with deadline:
                return await request.handler(request.task_input, request.context)
        except TimeoutError as exc:
            if deadline.expired():
                raise TaskTimeoutError(f"handler ran past {request.timeout_s:g} s") from exc
            raise
        except SystemExit as exc:
            raise HandlerExitError("the handler called sys.exit()") from exc

    async def aclose(self) -> None:
        """Nothing to release."""
