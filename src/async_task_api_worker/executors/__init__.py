"""Executors: how a handler is run (inline on the loop, in a thread pool, or in a process).

The process executor (its fork server, channel and child) is imported only when a task asks for
it: a worker without ``isolation="process"`` starts faster without it (a one-shot job's cold
start counts every import).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from async_task_api_worker.definition import HandlerKind, TaskDefinition
from async_task_api_worker.executors.inline import InlineExecutor
from async_task_api_worker.executors.thread import ThreadExecutor
from async_task_api_worker.ports import Executor, Lease

if TYPE_CHECKING:
    from async_task_api_worker.executors.process import ProcessExecutor

__all__ = ["InlineExecutor", "ProcessExecutor", "ThreadExecutor", "executor_for"]


def __getattr__(name: str) -> Any:
    if name == "ProcessExecutor":
        from async_task_api_worker.executors.process import ProcessExecutor

        return ProcessExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def executor_for(task: TaskDefinition, concurrency: int, lease: Lease | None = None) -> Executor:
    """The executor a task runs on.

    A child process per task with ``isolation="process"``, its group holding ``lease``, else
    the event loop for an ``async def`` handler, or a pool of ``concurrency`` threads for a
    ``def`` one (neither can be fenced: they run in the worker's own process).
    """
    if task.isolation == "process":
        from async_task_api_worker.executors.process import ProcessExecutor

        return ProcessExecutor(task, lease=lease)
    if task.kind is HandlerKind.ASYNC:
        return InlineExecutor()
    return ThreadExecutor(concurrency)
