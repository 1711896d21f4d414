"""Targets for the CLI loading tests."""

import asyncio

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker


class Model(BaseModel):
    """Any model."""


def good_factory() -> Worker:
    worker = Worker("from-factory")

    @worker.task(timeout=1)
    async def handle(task_input: Model, ctx: TaskContext) -> Model:
        return task_input

    return worker


def raising_factory() -> Worker:
    raise RuntimeError("boom")


def not_a_worker_factory() -> int:
    return 3


def misdefined_factory() -> Worker:
    worker = Worker("misdefined")

    @worker.task(timeout=1)
    async def handle(task_input: Model, ctx: SyncTaskContext) -> Model:
        return task_input

    return worker  # pragma: no cover


#: Never set: a task of ``waiting`` runs until it is stopped.
NEVER = asyncio.Event()

waiting = Worker("waiting")


@waiting.task(timeout=600)
async def wait_forever(task_input: Model, ctx: TaskContext) -> Model:
    """Runs until the worker stops it (its timeout is far away)."""
    await NEVER.wait()
    return task_input
