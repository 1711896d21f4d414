"""Workers with an error hook (module level: a process-isolated child finds its handler)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from async_task_api_worker import FatalError, SyncTaskContext, TaskContext, TaskErrorInput, Worker

#: What a handler's exception says: it must reach the hook, and never a log line.
SECRET = "card 4111-1111-1111-1111 of customer 42"


class Job(BaseModel):
    mode: Literal["ok", "crash", "fatal"] = "ok"


class Done(BaseModel):
    ok: bool = True


class Tracker:
    """A fake error tracker: what it was handed, and an event per capture."""

    def __init__(self) -> None:
        self.captured: list[TaskErrorInput] = []
        self.arrived = threading.Event()

    def capture(self, error: TaskErrorInput) -> None:
        self.captured.append(error)
        self.arrived.set()


def _act(job: Job) -> Done:
    if job.mode == "crash":
        raise ValueError(SECRET)
    if job.mode == "fatal":
        raise FatalError("NO_GOOD", "refused on purpose")
    return Done()


def async_worker(*hooks: Callable[[TaskErrorInput], object]) -> Worker:
    worker = Worker("hooked")
    for hook in hooks:
        worker.on_task_error(hook)

    @worker.task(timeout=5)
    async def handle(job: Job, ctx: TaskContext) -> Done:
        return _act(job)

    return worker


def sync_worker(tracker: Tracker) -> Worker:
    """A ``def`` handler, and an ``async def`` hook declared after the task."""
    worker = Worker("hooked")

    @worker.task(timeout=5)
    def handle(job: Job, ctx: SyncTaskContext) -> Done:
        return _act(job)

    @worker.on_task_error
    async def report(error: TaskErrorInput) -> None:
        tracker.capture(error)

    return worker


#: The process-isolated worker's tracker (the hook runs in the worker's process).
ISOLATED_TRACKER = Tracker()
isolated = Worker("hooked")


@isolated.task(timeout=10, isolation="process")
def handle_isolated(job: Job, ctx: SyncTaskContext) -> Done:
    return _act(job)


@isolated.on_task_error
def report_isolated(error: TaskErrorInput) -> None:
    ISOLATED_TRACKER.capture(error)
