"""Workers the fault suite runs as real processes (``tests.faults.workers:NAME``).

Each handler call writes a marker file ``<task_id>.<attempt>.<pid>.<run>`` into
``$ATW_TEST_MARKERS``, so that the suite can count how often each task's handler ran;
:func:`beat` also writes the times it ran in it, so that the suite can tell which runs of one
task overlapped.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker
from tests.integration.workers import mark_started


class Input(BaseModel):
    """How long to work, and how large an answer to give."""

    seconds: float = 0.0
    size: int = 0
    #: A file the handler waits for before it works ``seconds``: the case writes it once its
    #: fault is in place (a memory alarm raised), so that the reports meet the fault.
    release: str = ""


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
    while task_input.release and not Path(task_input.release).exists():
        await asyncio.sleep(0.05)  # the case's release: a file, written by another process
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


#: Seconds between two beats of :func:`beat`: how late a run's end is seen, at most.
BEAT_S = 0.1

beating = Worker("steady")  # the same service, each task in a process of its own, beating


@beating.task(timeout=60, isolation="process")
def beat(task_input: Input, ctx: SyncTaskContext) -> Output:
    """Work ``seconds`` in the task's own process, writing ``time.monotonic()`` (one clock for
    every process of the machine) as a line of this run's marker every :data:`BEAT_S`: its
    first line is when the run started, its last when it was last seen running."""
    folder = Path(os.environ["ATW_TEST_MARKERS"])
    marker = folder / f"{ctx.task_id}.{ctx.attempt}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + task_input.seconds
    with marker.open("a") as beats:
        while True:
            now = time.monotonic()
            beats.write(f"{now:.3f}\n")
            beats.flush()
            if now >= deadline:
                return Output(attempt=ctx.attempt)
            time.sleep(BEAT_S)
