"""The default executor under `run` knows which task each thread works for."""

from __future__ import annotations

import asyncio
import threading

from async_task_api_worker.context import bind_task_fields
from async_task_api_worker.runtime.threads import TaskAwareExecutor


async def test_running_calls_are_listed_by_task_until_they_end() -> None:
    executor = TaskAwareExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    release = threading.Event()
    started = threading.Event()

    def block() -> str:
        started.set()
        release.wait(10)
        return "done"

    with bind_task_fields({"task_id": "t-9"}):
        running = asyncio.ensure_future(asyncio.to_thread(block))
    anonymous = asyncio.ensure_future(asyncio.to_thread(lambda: "outside a task"))
    await asyncio.to_thread(started.wait, 5)
    assert executor.running_task_ids() == ("t-9",)
    assert await executor.wait_idle(0.05) == ("t-9",)
    release.set()
    assert await running == "done"
    assert await anonymous == "outside a task"
    assert await executor.wait_idle(1.0) == ()
