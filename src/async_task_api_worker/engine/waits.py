"""Waiting on work that a deadline or a cancel token may cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from async_task_api_worker.ports import CancelToken

__all__ = ["until"]


async def until(work: Awaitable[None], limit_s: float, *tokens: CancelToken | None) -> bool:
    """Await ``work`` for at most ``limit_s`` seconds, or until a token is cancelled.

    Returns:
        ``True`` when ``work`` finished in time; ``False`` when it was cancelled first.

    Raises:
        Exception: whatever ``work`` raised.
    """
    running = asyncio.ensure_future(work)
    if limit_s <= 0:
        running.cancel()

    def stop() -> None:
        running.cancel()

    removers = [token.add_callback(stop) for token in tokens if token is not None]
    timer = asyncio.get_running_loop().call_later(max(0.0, limit_s), running.cancel)
    try:
        # Awaiting the task itself (not asyncio.wait): a cancel of our caller reaches the work
        # through it, and no waiter future is made per call (this runs for every report).
        await running
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if running.cancelled() and not (current is not None and current.cancelling()):
            return False
        raise
    finally:
        timer.cancel()
        for remove in removers:
            remove()
    return True
