"""Taskiq peer: taskiq-aio-pika's ``AioPikaBroker`` and an ``async def`` task.

Run as ``python -m bench.peers.taskiq_worker [redis|once|redis-once]``. One OS process: a
``taskiq.receiver.Receiver``
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

Variants:

- ``redis``: taskiq-redis's ``RedisAsyncResultBackend`` on ``BENCH_REDIS_URL`` (the machine's
  Redis), taskiq's nearest equivalent of our reports. After the task returns, the receiver
  stores its ``TaskiqResult`` (pickled, taskiq-redis's default serializer) with one ``SET``,
  then acks (``ack_type=when_saved``). Keys are ``<the run's vhost>:<task id>`` and expire after
  600 s (``result_ex_time``; taskiq-redis keeps results forever by default, which would fill
  the machine's Redis run after run). The completion line is written by a middleware's
  ``post_save`` hook, which the receiver calls right after the store returns, so the bench
  times the variant by the moment each result was readable. A fair reader should know: the
  result goes to Redis, not through RabbitMQ, and there is no ``started`` equivalent.
- ``once`` (and ``redis-once``): the receiver's ``max_tasks_to_execute=1`` (the CLI's
  ``--max-tasks-per-child``): it stops fetching after one task, finishes it and exits. This
  is taskiq's nearest one-shot run, for ``bench.cold_start``.

For several processes, taskiq's own way is its CLI:
``python -m taskiq worker bench.peers.taskiq_worker:cli_broker --workers 2 --log-level WARNING``
(:func:`cli_broker` builds the broker in each worker process from the environment, with the
variant in ``BENCH_PEER_VARIANT``): a main process that forks the 2 workers, restarts one that
dies and stops them on SIGTERM (3 OS processes). The CLI's other defaults are those above.
Each task calls :func:`bench.peers._done.mark_start` (a no-op unless ``bench.cold_start`` set
``BENCH_START_FILE``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskiq import AsyncTaskiqDecoratedTask, TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.receiver import Receiver
from taskiq_aio_pika import AioPikaBroker, Queue, QueueType

from bench.peers import _common, _done

TASK_NAME = "bench_count_words"
PUBLISH_BATCH = 500
MAX_ASYNC_TASKS = 100  # taskiq worker's --max-async-tasks default
SHUTDOWN_TIMEOUT_S = 5.0  # taskiq worker's --shutdown-timeout default
RESULT_EX_TIME_S = 600
VARIANTS = ("", "redis", "once", "redis-once")


class _MarkSaved(TaskiqMiddleware):
    """Writes the completion line once the result backend has stored the result."""

    def post_save(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        _done.mark()


def build(
    url: str, queue: str, kind: str, *, redis: bool = False
) -> tuple[AioPikaBroker, AsyncTaskiqDecoratedTask[[str], Any]]:
    """The broker, its queues (of type ``kind``), the task (``redis``: a result backend)."""
    queue_type = QueueType(kind)
    broker = AioPikaBroker(
        url,
        task_queues=[Queue(name=queue, type=queue_type)],
        dead_letter_queue=Queue(name="taskiq.dead_letter", type=queue_type),
    )
    if redis:
        from taskiq_redis import RedisAsyncResultBackend

        backend: RedisAsyncResultBackend[Any] = RedisAsyncResultBackend(
            os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
            result_ex_time=RESULT_EX_TIME_S,
            prefix_str=os.environ.get("BENCH_RUN_ID", "bench-manual"),
        )
        broker = broker.with_result_backend(backend).with_middlewares(_MarkSaved())

        @broker.task(task_name=TASK_NAME)
        async def count_words(text: str) -> int:
            _done.mark_start()
            return _common.count_words(text)

    else:

        @broker.task(task_name=TASK_NAME)
        async def count_words(text: str) -> int:
            _done.mark_start()
            words = _common.count_words(text)
            _done.mark()
            return words

    return broker, count_words


def cli_broker() -> AioPikaBroker:
    """For ``taskiq worker bench.peers.taskiq_worker:cli_broker``: the broker, from the env."""
    variant = os.environ.get("BENCH_PEER_VARIANT", "")
    if variant not in ("", "redis"):
        raise SystemExit(f"taskiq_worker: BENCH_PEER_VARIANT {variant!r} is not '' or 'redis'")
    broker, _ = build(
        _common.env("BROKER_URL"),
        _common.env("IN_QUEUE_NAME"),
        _common.env("BENCH_QUEUE_TYPE"),
        redis=variant == "redis",
    )
    return broker


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


async def _serve(variant: str) -> None:
    url = _common.env("BROKER_URL")
    broker, _ = build(
        url,
        _common.env("IN_QUEUE_NAME"),
        await _common.vhost_queue_type(url),
        redis=variant.startswith("redis"),
    )
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
                max_tasks_to_execute=1 if variant.endswith("once") else None,
            )
            await receiver.listen(finish)  # runs broker.startup() first
    finally:
        await asyncio.wait_for(broker.shutdown(), SHUTDOWN_TIMEOUT_S)


def main(argv: list[str]) -> None:
    """Serve until SIGTERM or SIGINT."""
    if len(argv) > 1 or (argv and argv[0] not in VARIANTS):
        raise SystemExit(f"usage: python -m bench.peers.taskiq_worker [{'|'.join(VARIANTS[1:])}]")
    logging.basicConfig(level=_common.log_level())
    _common.env("BENCH_DONE_FILE")
    _common.serve(_serve(argv[0] if argv else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
