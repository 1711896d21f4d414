"""One handler, declared for every face that runs it: in-process (async def and def) and in a
child process."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

from pydantic import BaseModel

from async_task_api_worker import FatalError, RetryableError, SyncTaskContext, TaskContext, Worker


class Job(BaseModel):
    """What the handler does."""

    mode: Literal[
        "succeed",
        "fatal",
        "retryable",
        "internal",
        "invalid_result",
        "exit",
        "hang",
        "nan",
        "surrogate",
        "surrogate_key",
    ]


class Answer(BaseModel):
    """A valid result."""

    value: float
    notes: list[str] = []
    tags: dict[str, int] = {}


#: Set by a test once it is done: a ``def`` handler left hanging then returns.
RELEASE = threading.Event()


def behave(job: Job) -> Answer:
    """The same behaviour, whatever face runs it."""
    if job.mode == "fatal":
        raise FatalError("NOT_ALLOWED", "Not allowed for this account.")
    if job.mode == "retryable":
        raise RetryableError("UPSTREAM_BUSY", "The upstream is busy.", retry_delay_s=0.0)
    if job.mode == "internal":
        raise ValueError("a secret the client must never see")
    if job.mode == "invalid_result":
        return {"value": "not a number"}  # type: ignore[return-value]
    if job.mode == "exit":
        raise SystemExit(3)
    if job.mode == "nan":
        return Answer(value=float("nan"))  # valid for the model, not JSON for a report
    if job.mode == "surrogate_key":  # pydantic's JSON dump would write it as U+FFFD
        return Answer(value=1, tags={"ok": 1, "half \udc00": 2})
    if job.mode == "surrogate":
        return Answer(value=1, notes=["fine", "half of a pair: \ud800"])  # not valid Unicode
    return Answer(value=42)


inline = Worker("faces")


@inline.task(timeout=30)
async def handle(job: Job, ctx: TaskContext) -> Answer:
    """In the worker's own process, on its event loop."""
    if job.mode == "hang":
        await asyncio.Event().wait()
    return behave(job)


threaded = Worker("faces")


@threaded.task(timeout=30)
def handle_in_a_thread(job: Job, ctx: SyncTaskContext) -> Answer:
    """In the worker's own process, in a thread."""
    if job.mode == "hang":
        RELEASE.wait()
    return behave(job)


isolated = Worker("faces")


@isolated.task(timeout=30, isolation="process")
async def handle_isolated(job: Job, ctx: TaskContext) -> Answer:
    """In a child process of its own."""
    if job.mode == "hang":
        await asyncio.Event().wait()
    return behave(job)
