"""A process-isolated worker whose handler does nothing: what isolation itself costs."""

from __future__ import annotations

from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker


class Nothing(BaseModel):
    """No input."""


noop = Worker("noop")


@noop.task(timeout=60, isolation="process")
async def do_nothing(task_input: Nothing, ctx: TaskContext) -> Nothing:
    """Return at once."""
    return Nothing()
