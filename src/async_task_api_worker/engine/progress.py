"""The progress throttle: at most one ``progress`` report per interval, latest state wins.

Source: seed "Declaring a worker" (progress is latest-state, throttled to one report per
``WORKER_PROGRESS_MIN_INTERVAL_S``, a newer update replacing a held one).

The window is trailing: an update waits until the interval has passed since the last progress
report (or since the task started), so a burst inside one interval becomes one report carrying
its latest update. When the handler ends, a held update is published before the terminal report
(:meth:`ProgressThrottle.close`), so the last state the client sees is never stale.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from async_task_api_worker.context import ProgressDropReason, ProgressUpdate

__all__ = ["ProgressThrottle"]


class ProgressThrottle:
    """A :class:`~async_task_api_worker.context.ProgressSink` for one task attempt.

    Args:
        interval_s: the least time between two progress reports, in seconds.
        publish: publishes one update; returns whether it went out (it never raises).
        on_drop: counts an update that was not published.
        clock: monotonic clock, in seconds.
    """

    def __init__(
        self,
        *,
        interval_s: float,
        publish: Callable[[ProgressUpdate], Awaitable[bool]],
        on_drop: Callable[[ProgressDropReason], None],
        clock: Callable[[], float],
    ) -> None:
        self._interval_s = interval_s
        self._publish = publish
        self._on_drop = on_drop
        self._clock = clock
        self._last_report_at = clock()
        self._held: ProgressUpdate | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._closed = False

    def offer(self, update: ProgressUpdate) -> None:
        """Hold ``update`` until the window opens (replacing, and counting, a held one)."""
        if self._closed:
            self._on_drop(ProgressDropReason.AFTER_END)
            return
        if self._held is not None:
            self._on_drop(ProgressDropReason.SUPERSEDED)
        self._held = update
        if self._timer is None and self._flushing is None:
            self._schedule()

    def drop(self, reason: ProgressDropReason) -> None:
        """Count an update the context refused."""
        self._on_drop(reason)

    def _schedule(self) -> None:
        delay = max(0.0, self._last_report_at + self._interval_s - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            await self._send_held()
        finally:
            self._flushing = None
            if self._held is not None and not self._closed:
                self._schedule()

    async def _send_held(self) -> None:
        update, self._held = self._held, None
        if update is not None:
            await self._publish(update)
            self._last_report_at = self._clock()

    @property
    def closed(self) -> bool:
        """Whether the attempt ended (:meth:`close` or :meth:`abandon`)."""
        return self._closed

    def abandon(self) -> None:
        """End the attempt at once, without waiting: a held update is dropped and counted.

        For a delivery whose task is being cancelled: nothing may be published for it later.
        """
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held is not None:
            self._held = None
            self._on_drop(ProgressDropReason.AFTER_END)

    async def idle(self) -> None:
        """Wait until no progress publish is on the wire (one already sent is let finish)."""
        if self._flushing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flushing)

    async def close(self, *, flush: bool) -> None:
        """End the attempt: no update is taken after this.

        Args:
            flush: publish a held update now (before the terminal report); ``False`` drops it
                (the delivery is given back, or cancelled).
        """
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Let a publish already on the wire finish, so reports keep their order.
        await self.idle()
        if flush:
            await self._send_held()
        elif self._held is not None:
            self._held = None
            self._on_drop(ProgressDropReason.AFTER_END)
