"""What one delivery costs the event loop on RabbitMQ: the asyncio tasks the SDK creates for it.

The worker serves in this test's event loop (``await worker.serve()``) with a task factory that
notes which module asked for each new task (the first caller outside asyncio); the client runs
in a thread with a loop of its own, so that only the worker's tasks are counted. aio-pika's own
two tasks per delivery (its consumer, and one that runs the transport's callback) are not the
SDK's; ``bench/tasks_per_delivery.py`` prints every task, theirs included.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import async_task_api_worker
from async_task_api_worker import TaskContext, Worker
from tests.integration.conftest import Queues
from tests.integration.test_channel_failures import transport_says

PACKAGE = Path(async_task_api_worker.__file__).parent
#: The settles of a turn of the loop go out together, from one task for the whole batch.
SETTLE_BATCHES = PACKAGE / "transports" / "rabbitmq" / "acks.py"
TASKS = 60


class Text(BaseModel):
    text: str


class Words(BaseModel):
    words: int


worker = Worker("task-count")


@worker.task(timeout=30)
async def count_words(task_input: Text, ctx: TaskContext) -> Words:
    return Words(words=len(task_input.text.split()))


async def test_a_delivery_costs_three_tasks_of_the_sdk_and_no_task_per_report(
    queues: Queues, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in queues.env(WORKER_CONCURRENCY="8").items():
        monkeypatch.setenv(name, value)
    by_file: collections.Counter[Path] = collections.Counter()
    counting = threading.Event()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        if counting.is_set():
            by_file[_creator()] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop = asyncio.get_running_loop()
    loop.set_task_factory(factory)  # type: ignore[arg-type]
    serving = asyncio.ensure_future(worker.serve())
    try:
        # Its queues declared before the client declares them too: a loaded node's quorum
        # queue, declared by both at once, can close the client's connection (INTERNAL_ERROR).
        with transport_says("Connected to") as connected:
            await asyncio.wait_for(connected.reach(1), timeout=30)
        await asyncio.to_thread(asyncio.run, _submit_and_wait(queues, counting))
    finally:
        counting.clear()
        loop.set_task_factory(None)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    ours = {path: count for path, count in by_file.items() if path.is_relative_to(PACKAGE)}
    assert ours, by_file
    batches = ours.pop(SETTLE_BATCHES, 0)
    # The delivery's run, its held ``started`` and the handler: reports publish in the
    # delivery's own task, settles and waits make none.
    assert sum(ours.values()) == 3 * TASKS, ours
    assert batches <= TASKS


def _creator() -> Path:
    """The file of the first caller outside asyncio (and this module) on the stack."""
    frame = sys._getframe(2)
    while frame is not None and (
        "asyncio" in Path(frame.f_code.co_filename).parts or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
    return Path(frame.f_code.co_filename) if frame is not None else Path("?")


async def _submit_and_wait(queues: Queues, counting: threading.Event) -> None:
    async with queues.client("task-count") as client:
        warm_up = await client.submit({"text": "warm up"})
        assert [r.type async for r in client.reports(warm_up)][-1] == "success"
        counting.set()
        task_ids = await asyncio.gather(
            *(client.submit({"text": f"task {n}"}) for n in range(TASKS))
        )
        for task_id in task_ids:
            assert [r.type async for r in client.reports(task_id)][-1] == "success"
        counting.clear()
