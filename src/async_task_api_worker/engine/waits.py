"""Waiting on work that a deadline or a cancel token may cut short, in the caller's own task.

The work is awaited inline, not as a task of its own: a deadline or a token cancels the calling
task at the work's current ``await`` (``Task.cancel``), and the cut is taken back
(``Task.uncancel``) once the work has unwound, as ``asyncio.timeout`` does. A cancel of the
calling task from elsewhere still propagates. This runs for every report and every handler
call, so it makes no task, no waiter future and no extra turn of the event loop per call.
``asyncio.timeout`` cannot be cut by a :class:`CancelToken` nor say which cut came first (the
verdict needs to know: ``engine.verdict.Stopped``), and a ``TaskGroup`` would cost a task per
work; where a plain deadline is all there is (the tick's waits), ``asyncio.timeout`` is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from async_task_api_worker.ports import CancelToken

__all__ = ["CutShort", "until", "until_cut"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CutShort:
    """The work was cut short: by the token ``by``, or by the deadline when ``by`` is None."""

    by: CancelToken | None


_DEADLINE = CutShort(None)


async def until_cut(
    work: Awaitable[T], limit_s: float | None, *tokens: CancelToken | None
) -> T | CutShort:
    """Await ``work`` in this task for at most ``limit_s`` seconds, or until a token is cancelled.

    Args:
        work: a coroutine (closed unrun when the deadline or a token is already past), or a
            future (then cancelled).
        limit_s: the deadline, in seconds from now; ``None`` for none.
        tokens: cancelling any of them cuts the work short (``None`` entries are skipped).

    Returns:
        The work's result, or :class:`CutShort` naming what cut it short first.

    Raises:
        asyncio.CancelledError: the calling task was cancelled from elsewhere.
        Exception: whatever ``work`` raised.
    """
    armed = [token for token in tokens if token is not None]
    for token in armed:
        if token.cancelled:
            _drop(work)
            return CutShort(token)
    if limit_s is not None and limit_s <= 0:
        _drop(work)
        return _DEADLINE
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - always called from a task
        raise RuntimeError("until_cut() needs a running task")
    cut: list[CutShort] = []

    def cut_by(why: CutShort) -> None:
        # Callbacks run only while this task is suspended inside ``work``, so the cancel lands
        # at one of the work's own awaits, never after it.
        if not cut:
            cut.append(why)
            task.cancel()

    def cutter(token: CancelToken) -> Callable[[], None]:
        return lambda: cut_by(CutShort(token))

    removers = [token.add_callback(cutter(token)) for token in armed]
    timer = (
        None
        if limit_s is None
        else asyncio.get_running_loop().call_later(limit_s, cut_by, _DEADLINE)
    )
    try:
        result = await work
    except asyncio.CancelledError:
        if cut and task.uncancel() == 0:
            return cut[0]
        raise
    finally:
        if timer is not None:
            timer.cancel()
        for remove in removers:
            remove()
    if cut:
        # The work swallowed the cut and finished anyway: its result stands.
        task.uncancel()
    return result


def _drop(work: Awaitable[Any]) -> None:
    if isinstance(work, Coroutine):
        work.close()
    elif isinstance(work, asyncio.Future):
        work.cancel()


async def until(work: Awaitable[Any], limit_s: float | None, *tokens: CancelToken | None) -> bool:
    """Await ``work`` for at most ``limit_s`` seconds, or until a token is cancelled.

    Returns:
        ``True`` when ``work`` finished in time; ``False`` when it was cut short first.

    Raises:
        asyncio.CancelledError: the calling task was cancelled from elsewhere.
        Exception: whatever ``work`` raised.
    """
    return not isinstance(await until_cut(work, limit_s, *tokens), CutShort)
