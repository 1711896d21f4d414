"""Taskiq peer: taskiq-aio-pika's ``AioPikaBroker`` and an ``async def`` task.

Run as ``python -m bench.peers.taskiq_worker``. One OS process: a ``taskiq.receiver.Receiver``
is run in-process the way one worker process of ``taskiq worker`` runs it (the CLI forks
``--workers``, 2 by default, under a supervisor), with the CLI's defaults: ``max_async_tasks=100``,
``max_prefetch=0``, ``ack_type=when_saved`` (ack once the result is "saved": there is no result
backend, so right after the task returns), a thread pool for sync tasks (unused here), and on
SIGTERM/SIGINT it stops fetching, waits for running tasks, then shuts the broker down. It runs
on uvloop when installed, as ``taskiq worker`` does (:func:`bench.peers._common.serve`).

Broker settings (taskiq-aio-pika's defaults otherwise): ``qos=10`` (prefetch 10 on the
consuming channel, so at most 10 tasks run at once despite ``max_async_tasks=100``), a durable
topic exchange ``taskiq``, a dead-letter queue ``taskiq.dead_letter``, and one task queue named
``IN_QUEUE_NAME`` bound to the exchange with that routing key, dead-lettering to
``taskiq.dead_letter``. taskiq-aio-pika always sets ``x-queue-type`` itself (quorum by default,
whatever the vhost's default: on a classic vhost taskiq would get quorum queues), so both queues
take the vhost's type (:func:`bench.peers._common.vhost_queue_type`); ``publish`` and the worker
agree on it (a different ``x-queue-type`` fails the second declaration).

The worker opens two connections (one to publish, one to consume, as taskiq-aio-pika does in a
worker). ``publish`` uses ``task.kiq(text)``: taskiq's JSON envelope in a persistent message to
the ``taskiq`` exchange, on a channel with publisher confirms (aio-pika's default), 500 awaited
at a time. ``OUT_QUEUE_NAME`` is not used: taskiq sends no reports.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskiq import AsyncTaskiqDecoratedTask
from taskiq.receiver import Receiver
from taskiq_aio_pika import AioPikaBroker, Queue, QueueType

from bench.peers import _common, _done

TASK_NAME = "bench_count_words"
PUBLISH_BATCH = 500
MAX_ASYNC_TASKS = 100  # taskiq worker's --max-async-tasks default
SHUTDOWN_TIMEOUT_S = 5.0  # taskiq worker's --shutdown-timeout default


def build(
    url: str, queue: str, kind: str
) -> tuple[AioPikaBroker, AsyncTaskiqDecoratedTask[[str], Any]]:
    """The broker, its queues (of type ``kind``), the task."""
    queue_type = QueueType(kind)
    broker = AioPikaBroker(
        url,
        task_queues=[Queue(name=queue, type=queue_type)],
        dead_letter_queue=Queue(name="taskiq.dead_letter", type=queue_type),
    )

    @broker.task(task_name=TASK_NAME)
    async def count_words(text: str) -> int:
        words = _common.count_words(text)
        _done.mark()
        return words

    return broker, count_words


async def _publish(url: str, queue: str, count: int) -> None:
    broker, task = build(url, queue, await _common.vhost_queue_type(url))
    await broker.startup()  # declares the exchange and the queues
    try:
        for start in range(0, count, PUBLISH_BATCH):
            await asyncio.gather(
                *(task.kiq(_common.TEXT) for _ in range(start, min(start + PUBLISH_BATCH, count)))
            )
    finally:
        await broker.shutdown()


def publish(url: str, queue: str, count: int) -> None:
    """Send ``count`` tasks with ``task.kiq``."""
    asyncio.run(_publish(url, queue, count))


async def _serve() -> None:
    url = _common.env("BROKER_URL")
    broker, _ = build(url, _common.env("IN_QUEUE_NAME"), await _common.vhost_queue_type(url))
    broker.is_worker_process = True
    finish = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, finish.set)
    loop.add_signal_handler(signal.SIGINT, finish.set)
    try:
        with ThreadPoolExecutor() as executor:
            receiver = Receiver(
                broker=broker,
                executor=executor,
                max_async_tasks=MAX_ASYNC_TASKS,
            )
            await receiver.listen(finish)  # runs broker.startup() first
    finally:
        await asyncio.wait_for(broker.shutdown(), SHUTDOWN_TIMEOUT_S)


def main(argv: list[str]) -> None:
    """Serve until SIGTERM or SIGINT."""
    if argv:
        raise SystemExit(f"taskiq_worker takes no variant, got {argv}")
    logging.basicConfig(level=_common.log_level())
    _common.env("BENCH_DONE_FILE")
    _common.serve(_serve())


if __name__ == "__main__":
    main(sys.argv[1:])
