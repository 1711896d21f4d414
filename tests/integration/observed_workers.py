"""Workers for the probes, metrics and logs tests, run as real processes.

``$ATW_TEST_MARKERS`` is the folder they share with the test: ``database-down`` makes the
readiness probe fail, ``probe-hold`` holds it, each probe call appends a line to
``probe-calls``, and a ``wait`` task waits for a file named ``release``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from async_task_api_worker import FatalError, RetryableError, SyncTaskContext, TaskContext, Worker


class Job(BaseModel):
    """What the handler does, and a text it may put in its error or its answer."""

    mode: Literal["ok", "wait", "fatal", "retry", "crash", "echo", "progress"] = "ok"
    text: str = ""


class Done(BaseModel):
    """The answer: ``echo`` returns the text."""

    echo: str = ""


def _folder() -> Path:
    return Path(os.environ["ATW_TEST_MARKERS"])


observed = Worker("observed")


@observed.readiness_probe(name="database")
async def database() -> bool:
    """Ready unless ``database-down`` exists; held while ``probe-hold`` exists."""
    with (_folder() / "probe-calls").open("a") as calls:
        calls.write("call\n")
    while (_folder() / "probe-hold").exists():
        await asyncio.sleep(0.01)  # the test, another process, lets it go by removing the file
    return not (_folder() / "database-down").exists()


@observed.task(timeout=60)
async def work(job: Job, ctx: TaskContext) -> Done:
    """Do what ``job.mode`` says; logs through a library logger and ``ctx.logger``."""
    logging.getLogger("some.lib").info("library line for %s", job.mode)
    ctx.logger.info("handler line")
    if job.mode == "wait":
        (_folder() / f"started-{ctx.task_id}").touch()
        while not (_folder() / "release").exists():
            await asyncio.sleep(0.02)  # the test, another process, releases it with a file
    elif job.mode == "fatal":
        raise FatalError("NOT_ALLOWED", "Not allowed.")
    elif job.mode == "retry" and ctx.attempt == 1:
        raise RetryableError("BUSY", "Busy.")
    elif job.mode == "crash":
        raise RuntimeError(f"the handler failed on {job.text}")
    elif job.mode == "echo":
        return Done(echo=job.text)
    elif job.mode == "progress":
        await ctx.progress(0.5)
        await ctx.progress(0.1)
    return Done()


threaded = Worker("threaded")


@threaded.task(timeout=60)
def work_in_a_thread(job: Job, ctx: SyncTaskContext) -> Done:
    """A ``def`` handler logging through a library logger."""
    logging.getLogger("some.lib").info("thread line")
    return Done()
