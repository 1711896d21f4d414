"""Executors: how a handler is run (inline on the loop, or in a thread pool)."""

from async_task_api_worker.executors.inline import InlineExecutor
from async_task_api_worker.executors.thread import ThreadExecutor

__all__ = ["InlineExecutor", "ThreadExecutor"]
