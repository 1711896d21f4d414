"""Executors: how a handler is run (inline on the loop, in a thread pool, or in a process)."""

from async_task_api_worker.definition import HandlerKind, TaskDefinition
from async_task_api_worker.executors.inline import InlineExecutor
from async_task_api_worker.executors.process import ProcessExecutor
from async_task_api_worker.executors.thread import ThreadExecutor
from async_task_api_worker.ports import Executor

__all__ = ["InlineExecutor", "ProcessExecutor", "ThreadExecutor", "executor_for"]


def executor_for(task: TaskDefinition, concurrency: int) -> Executor:
    """The executor a task runs on.

    A child process per task with ``isolation="process"``, else the event loop for an
    ``async def`` handler, or a pool of ``concurrency`` threads for a ``def`` one.
    """
    if task.isolation == "process":
        return ProcessExecutor(task)
    if task.kind is HandlerKind.ASYNC:
        return InlineExecutor()
    return ThreadExecutor(concurrency)
