"""The event-loop lag watch: a stall is remembered for the window, not only for one sample."""

from __future__ import annotations

import asyncio
import time

from async_task_api_worker.observability.loop_lag import watch_loop_lag


async def test_a_stall_is_kept_for_the_window_then_forgotten() -> None:
    recorded: list[float] = []
    enough = asyncio.Event()

    def record(lag_s: float) -> None:
        recorded.append(lag_s)
        if len(recorded) >= 8:
            enough.set()

    watching = asyncio.ensure_future(watch_loop_lag(record, interval_s=0.01, window_s=60.0))
    await asyncio.sleep(0)  # the watch sets its first timer
    time.sleep(0.3)  # block the loop
    await enough.wait()
    watching.cancel()
    stall = max(recorded)
    assert stall >= 0.25
    # Every sample after the stall still reports it (the window is 60 s).
    after = recorded[recorded.index(stall) :]
    assert all(lag == stall for lag in after)
    recorded.clear()
    enough.clear()
    forgetting = asyncio.ensure_future(watch_loop_lag(record, interval_s=0.01, window_s=0.05))
    await enough.wait()
    forgetting.cancel()
    assert max(recorded) < 0.25
