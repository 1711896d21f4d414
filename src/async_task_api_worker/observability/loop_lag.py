"""Measuring how late the event loop runs (``event_loop_lag_seconds``).

A timer is set every ``interval_s``; the lag is how much later than asked it fired. A handler or
hook that blocks the loop shows up here (and stops ``/health`` from answering).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

__all__ = ["LOOP_LAG_INTERVAL_S", "watch_loop_lag"]

#: Seconds between two measurements.
LOOP_LAG_INTERVAL_S: Final = 0.5


async def watch_loop_lag(
    record: Callable[[float], None], *, interval_s: float = LOOP_LAG_INTERVAL_S
) -> None:
    """Call ``record(lag_s)`` every ``interval_s`` seconds, until cancelled.

    Args:
        record: receives the lag of the last timer, in seconds (0 or more).
        interval_s: seconds between measurements.
    """
    loop = asyncio.get_running_loop()
    while True:
        asked_at = loop.time()
        await asyncio.sleep(interval_s)
        record(max(0.0, loop.time() - asked_at - interval_s))
