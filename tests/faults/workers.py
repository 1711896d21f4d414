"""Workers the fault suite runs as real processes (``tests.faults.workers:NAME``).

Each handler call writes a marker file ``<task_id>.<attempt>.<pid>`` into ``$ATW_TEST_MARKERS``,
so that the suite can count how often each task's handler ran.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from tests.integration.workers import mark_started


class Input(BaseModel):
    """How long to work, and how large an answer to give."""

    seconds: float = 0.0
    size: int = 0


class Output(BaseModel):
    """The attempt that answered, and ``size`` characters."""

    attempt: int
    text: str = ""


steady = Worker("steady")


@steady.task(timeout=60)
async def work(task_input: Input, ctx: TaskContext) -> Output:
    """Work ``seconds`` on every attempt, then answer."""
    mark_started(ctx)
    await ctx.progress(0.5)
    await asyncio.sleep(task_input.seconds)
    return Output(attempt=ctx.attempt, text="x" * task_input.size)


isolated = Worker("steady")  # the same service, each task in a process of its own


@isolated.task(timeout=60, isolation="process")
async def work_isolated(task_input: Input, ctx: TaskContext) -> Output:
    """:func:`work`, in the task's own process (killed as a whole process group)."""
    return await work(task_input, ctx)


quick = Worker("quick")


@quick.task(timeout=60)
async def answer(task_input: Input, ctx: TaskContext) -> Output:
    """Answer at once, with ``size`` characters: the terminal report right behind ``started``."""
    mark_started(ctx)
    return Output(attempt=ctx.attempt, text="x" * task_input.size)


crashy = Worker("crashy")


@crashy.task(timeout=60)
async def stall_then_work(task_input: Input, ctx: TaskContext) -> Output:
    """Stall ``seconds`` on the first two attempts (to be killed meanwhile), answer on the third."""
    mark_started(ctx)
    if ctx.attempt < 3:
        await asyncio.sleep(task_input.seconds)
    return Output(attempt=ctx.attempt)
