"""One handler, declared for the faces that run it in-process and in a child process."""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel

from async_task_api_worker import FatalError, RetryableError, TaskContext, Worker


class Job(BaseModel):
    """What the handler does."""

    mode: Literal[
        "succeed", "fatal", "retryable", "internal", "invalid_result", "exit", "hang", "nan"
    ]


class Answer(BaseModel):
    """A valid result."""

    value: float


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
    return Answer(value=42)


inline = Worker("faces")


@inline.task(timeout=30)
async def handle(job: Job, ctx: TaskContext) -> Answer:
    """In the worker's own process."""
    if job.mode == "hang":
        await asyncio.sleep(60)
    return behave(job)


isolated = Worker("faces")


@isolated.task(timeout=30, isolation="process")
async def handle_isolated(job: Job, ctx: TaskContext) -> Answer:
    """In a child process of its own."""
    if job.mode == "hang":
        await asyncio.sleep(60)
    return behave(job)
