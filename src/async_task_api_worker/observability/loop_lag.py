"""Measuring how late the event loop runs (``event_loop_lag_seconds``).

A timer is set every ``interval_s``; the lag is how much later than asked it fired. A handler or
hook that blocks the loop shows up here (and stops ``/health`` from answering). The value
recorded is the largest lag of the last ``window_s`` seconds: a stall between two scrapes is
still seen by the next one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Final

__all__ = ["LOOP_LAG_INTERVAL_S", "LOOP_LAG_WINDOW_S", "watch_loop_lag"]

#: Seconds between two measurements.
LOOP_LAG_INTERVAL_S: Final = 0.5
#: Seconds over which the largest lag is kept (longer than a scrape interval).
LOOP_LAG_WINDOW_S: Final = 60.0


async def watch_loop_lag(
    record: Callable[[float], None],
    *,
    interval_s: float = LOOP_LAG_INTERVAL_S,
    window_s: float = LOOP_LAG_WINDOW_S,
) -> None:
    """Call ``record(lag_s)`` every ``interval_s`` seconds, until cancelled.

    Args:
        record: receives the largest timer lag of the last ``window_s`` seconds (0 or more).
        interval_s: seconds between measurements.
        window_s: seconds a lag is remembered.
    """
    loop = asyncio.get_running_loop()
    seen: deque[tuple[float, float]] = deque()
    while True:
        asked_at = loop.time()
        await asyncio.sleep(interval_s)
        now = loop.time()
        seen.append((now, max(0.0, now - asked_at - interval_s)))
        while seen[0][0] < now - window_s:
            seen.popleft()
        record(max(lag for _, lag in seen))
