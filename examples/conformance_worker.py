"""This SDK's implementation of the conformance kit's reference task (docs/conformance.md).

The conformance kit (``async-task-api-worker conformance``) drives a worker of service
``conformance`` from outside, through the broker: each task's input names a behaviour, and the
kit checks the reports and the settlement that follow. A worker in another language implements
the same small contract to be checked the same way.

Run it, then the kit, against the same broker::

    uv run async-task-api-worker run examples.conformance_worker:worker
    uv run async-task-api-worker conformance --service conformance
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from async_task_api_worker import FatalError, RetryableError, TaskContext, Worker


class Input(BaseModel):
    """What the kit asks for; fields a behaviour does not use are ignored, unknown ones too."""

    model_config = ConfigDict(extra="ignore")

    behaviour: Literal["succeed", "fail", "retry", "progress", "sleep", "large_result", "crash"]
    output: dict[str, Any] = Field(default_factory=dict)
    code: str | None = None
    message: str = ""
    until_attempt: int | None = Field(default=None, ge=1)
    retry_delay_s: float | None = Field(default=None, ge=0)
    fractions: list[float] = Field(default_factory=list)
    payload: dict[str, Any] | None = None
    interval_s: float = Field(default=0.0, ge=0)
    seconds: float = Field(default=0.0, ge=0)
    size_bytes: int = Field(default=0, ge=0)


class Output(BaseModel):
    """The response: whatever the kit asked to get back (``output``), key for key."""

    model_config = ConfigDict(extra="allow")


worker = Worker("conformance")


@worker.task(timeout=60.0)
async def handle(task_input: Input, ctx: TaskContext) -> Output:
    """Do what ``task_input.behaviour`` names (docs/conformance.md, "The reference task")."""
    behaviour = task_input.behaviour
    if behaviour == "fail":
        raise FatalError(task_input.code or "CONFORMANCE_FAILURE", task_input.message)
    if behaviour == "retry" and (
        task_input.until_attempt is None or ctx.attempt < task_input.until_attempt
    ):
        raise RetryableError(
            task_input.code or "TRANSIENT_ERROR",
            task_input.message or "asked to retry",
            retry_delay_s=task_input.retry_delay_s,
        )
    if behaviour == "progress":
        for fraction in task_input.fractions:
            await ctx.progress(fraction, task_input.payload)
            if task_input.interval_s:
                await asyncio.sleep(task_input.interval_s)
    if behaviour == "sleep":
        await asyncio.sleep(task_input.seconds)
    if behaviour == "large_result":
        return Output.model_validate({"data": "x" * task_input.size_bytes})
    if behaviour == "crash":
        os._exit(70)  # no report, no settlement: the broker requeues the delivery
    return Output.model_validate(task_input.output)
