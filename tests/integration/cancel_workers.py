"""Workers whose task waits until it is cancelled, for the cancel tests on RabbitMQ.

Each writes ``<marker>.started`` when its handler begins, so that the test cancels a task that
is really running; the ``def`` one writes ``<marker>.stopped`` once it saw ``ctx.cancelled``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker


class Nap(BaseModel):
    """Where to mark the handler's start (and, for ``def``, its stop)."""

    marker: str


class Done(BaseModel):
    """Never returned: the task is cancelled first."""

    ok: bool = True


napping = Worker("cancel-async")


@napping.task(timeout=120)
async def nap(task_input: Nap, ctx: TaskContext) -> Done:
    """Sleep until cancelled."""
    Path(f"{task_input.marker}.started").write_text(ctx.task_id)
    await asyncio.sleep(3600)
    return Done()


napping_in_a_thread = Worker("cancel-sync")


@napping_in_a_thread.task(timeout=120)
def nap_in_a_thread(task_input: Nap, ctx: SyncTaskContext) -> Done:
    """Poll ``ctx.cancelled`` until it is set, then unwind."""
    Path(f"{task_input.marker}.started").write_text(ctx.task_id)
    while not ctx.cancelled:
        time.sleep(0.01)  # a def handler's one way to see its cancel: it looks, between steps
    Path(f"{task_input.marker}.stopped").write_text(ctx.task_id)
    ctx.raise_if_cancelled()
    return Done()
