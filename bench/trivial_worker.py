"""The benchmark's workers: count the words of a text, with no progress report.

The same protocol work as the baseline (``bench/baseline.py``): decode, count, ``started`` and
``success`` confirmed, then the ack.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker


class Text(BaseModel):
    """The input."""

    text: str


class Words(BaseModel):
    """The output."""

    words: int


worker = Worker("bench")


@worker.task(timeout=30)
async def count(task_input: Text, ctx: TaskContext) -> Words:
    """Count the words, on the event loop."""
    return Words(words=len(task_input.text.split()))


sync_worker = Worker("bench")


@sync_worker.task(timeout=30)
def count_in_a_thread(task_input: Text, ctx: SyncTaskContext) -> Words:
    """Count the words, in the thread pool."""
    return Words(words=len(task_input.text.split()))


isolated_worker = Worker("bench")


@isolated_worker.task(timeout=30, isolation="process")
def count_in_a_process(task_input: Text, ctx: SyncTaskContext) -> Words:
    """Count the words, in a child process of its own."""
    return Words(words=len(task_input.text.split()) + 0 * os.getpid())
