"""How many asyncio tasks one delivery costs, on the RabbitMQ transport, and which they are.

Run from the repository's root (RabbitMQ on 127.0.0.1:5672, ``rabbitmqctl`` usable)::

    uv run python -m bench.tasks_per_delivery [--tasks 500] [--concurrency 32]

The worker of ``bench/trivial_worker.py`` (an ``async def`` handler, no progress) serves in
this process (``await worker.serve()``) on a quorum queue of a vhost of its own, with a task
factory on the event loop that counts every task created while ``--tasks`` tasks are submitted
and their terminal reports arrive. It prints the tasks per delivery, and which coroutines they
ran (aio-pika's and aiormq's own included), so that a change to the hot path shows what it
added or removed. The count covers the window from the first measured submit to the last
terminal report (a warm-up task runs before it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import threading
import urllib.parse
import uuid
from collections.abc import Coroutine
from typing import Any

from async_task_api_worker.client import TaskClient

BROKER_URL = os.environ.get("ATW_RABBITMQ_URL") or "amqp://guest:guest@127.0.0.1:5672/"


def _rabbitmqctl(*arguments: str) -> None:
    command = os.environ.get("ATW_RABBITMQCTL", "rabbitmqctl").split()
    subprocess.run([*command, *arguments], check=True, capture_output=True)  # noqa: S603


def _name(coro: Coroutine[Any, Any, Any] | Any) -> str:
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    module = getattr(coro, "__module__", None) or (
        code.co_filename.rsplit("site-packages/", 1)[-1] if code is not None else "?"
    )
    return f"{getattr(coro, '__qualname__', type(coro).__name__)} ({module})"


async def measure(tasks: int, concurrency: int) -> collections.Counter[str]:
    """Serve the trivial worker and count the tasks created while ``tasks`` tasks run.

    The client runs in a thread with an event loop of its own, so that only the worker's
    tasks are counted.
    """
    from bench.trivial_worker import worker

    vhost = f"tasks-per-delivery-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", vhost, "--default-queue-type", "quorum")
    _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    url = urllib.parse.urlsplit(BROKER_URL)._replace(path="/" + vhost).geturl()
    os.environ.update(
        BROKER_URL=url,
        IN_QUEUE_NAME="bench_queue_in",
        OUT_QUEUE_NAME="bench_queue_out",
        WORKER_CONCURRENCY=str(concurrency),
        HEALTH_CHECK_PORT="0",
        LOG_LEVEL="WARNING",
    )
    loop = asyncio.get_running_loop()
    created: collections.Counter[str] = collections.Counter()
    counting = threading.Event()

    def factory(event_loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        if counting.is_set():
            created[_name(coro)] += 1
        return asyncio.Task(coro, loop=event_loop, **kwargs)

    loop.set_task_factory(factory)
    serving = asyncio.ensure_future(worker.serve())
    try:
        await asyncio.to_thread(asyncio.run, _client_side(url, tasks, counting))
    finally:
        counting.clear()
        loop.set_task_factory(None)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        _rabbitmqctl("delete_vhost", vhost)
    return created


async def _client_side(url: str, tasks: int, counting: threading.Event) -> None:
    async with TaskClient(url=url, service="bench", out_queue="bench_queue_out") as client:
        await _finished(client, [await client.submit({"text": "warm up"})])
        counting.set()
        task_ids = list(
            await asyncio.gather(*(client.submit({"text": "one two three"}) for _ in range(tasks)))
        )
        await _finished(client, task_ids)
        counting.clear()


async def _finished(client: TaskClient, task_ids: list[str]) -> None:
    for task_id in task_ids:
        async for report in client.reports(task_id):
            if report.type not in ("started", "progress"):
                break


def main() -> None:
    """Print the tasks per delivery and their coroutines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    arguments = parser.parse_args()
    created = asyncio.run(measure(arguments.tasks, arguments.concurrency))
    total = sum(created.values())
    print(
        f"{total / arguments.tasks:.2f} asyncio tasks per delivery "
        f"({total} for {arguments.tasks} tasks, concurrency {arguments.concurrency})"
    )
    for name, count in created.most_common():
        print(f"  {count / arguments.tasks:5.2f}  {name}")


if __name__ == "__main__":
    main()
