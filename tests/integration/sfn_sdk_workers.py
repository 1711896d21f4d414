"""SDK workers (``Worker`` + ``@worker.task``) that the Step Functions tests serve on sqs-sfn."""

from __future__ import annotations

import asyncio
import sys

from pydantic import BaseModel, ConfigDict

from async_task_api_worker import FatalError, TaskContext, Worker


class Nap(BaseModel):
    """Sleeps ``seconds``, then answers; ``fail`` fails it with its own code."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = 0.0
    fail: bool = False


class Slept(BaseModel):
    slept: float


napper = Worker("napper")


@napper.task(timeout=30.0)
async def nap(task_input: Nap, ctx: TaskContext) -> Slept:
    print("a line on stderr from the handler", file=sys.stderr)
    if task_input.fail:
        raise FatalError("NAP_REFUSED", "This nap was refused.")
    await ctx.progress(0.1)
    await asyncio.sleep(task_input.seconds)
    return Slept(slept=task_input.seconds)
