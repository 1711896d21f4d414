"""The worker of the attempt-counting tests (``tests.integration.counting_workers:counting``).

The first call of a task does what its input says (raise a ``RetryableError``, sleep for an
hour, block the event loop ``block_s`` and then sleep, answer); every later call answers with
the attempt at once. "First" is kept in a marker file (``$ATW_TEST_MARKERS/<task id>.first``),
not read from the attempt, which is what the tests measure.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from async_task_api_worker import RetryableError, TaskContext, Worker


class Plan(BaseModel):
    """What the first call does."""

    first: Literal["retry", "sleep", "block", "answer"] = "answer"
    block_s: float = 0.0  # "block": how long ``time.sleep`` holds the event loop, in seconds


class Output(BaseModel):
    """The attempt the worker gave the call."""

    attempt: int


counting = Worker("counting")


@counting.task(timeout=600)
async def first_call_does(plan: Plan, ctx: TaskContext) -> Output:
    """Do ``plan.first`` on the task's first call; answer on every other."""
    marker = Path(os.environ["ATW_TEST_MARKERS"]) / f"{ctx.task_id}.first"
    if not marker.exists():
        marker.touch()
        if plan.first == "retry":
            raise RetryableError("UPSTREAM_DOWN", "The first call fails for now.")
        if plan.first == "block":
            # A handler that blocks its loop outlives the worker's own timeout: only the
            # broker's consumer timeout ends the delivery. Then it never answers.
            time.sleep(plan.block_s)
        if plan.first in ("sleep", "block"):
            await asyncio.sleep(3600)
    return Output(attempt=ctx.attempt)
