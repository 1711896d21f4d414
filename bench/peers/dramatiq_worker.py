"""Dramatiq peer: its ``RabbitmqBroker`` (pika) and ``dramatiq.Worker`` with 8 threads.

Run as ``python -m bench.peers.dramatiq_worker [results]`` (one OS process: the Worker is
started in-process, not through the ``dramatiq`` CLI, which forks a supervisor and worker
processes). For several processes, Dramatiq's own way is its CLI:
``python -m dramatiq bench.peers.dramatiq_worker:cli_setup --processes 2 --threads 8``
(:func:`cli_setup` builds the broker in each process from the environment, with the variant
in ``BENCH_PEER_VARIANT``): a main process that forks 2 worker processes, forwards SIGTERM
to them and collects their logs through pipes (3 OS processes).

Settings: Dramatiq's defaults except ``worker_threads=8`` (also Dramatiq's own default).

- ``results``: the Results middleware on Redis (``RedisBackend`` on ``BENCH_REDIS_URL``, the
  machine's Redis; keys under the namespace ``BENCH_RUN_ID``, the run's vhost; Dramatiq's
  default result TTL of 10 minutes) and an actor with ``store_results=True`` that returns the
  count. This is Dramatiq's nearest equivalent of our reports: after the actor returns, the
  middleware stores the result in Redis (a pipelined DELETE, LPUSH and PEXPIRE), then the
  message is acked. The completion line (:func:`bench.peers._done.mark`) is written by a
  middleware hook that runs right after the store returns, so the bench times the variant by
  the moment each result was readable. A fair reader should know: the result goes to Redis,
  not through RabbitMQ, so the broker does no more work than without it; there is no
  ``started`` equivalent.

- Middleware: the default list (AgeLimit, TimeLimit, ShutdownNotifications, Callbacks,
  Pipelines, Retries). Dramatiq 2.x no longer adds its Prometheus middleware by default, so
  nothing opens a port and nothing had to be dropped.
- Prefetch: ``2 x worker_threads`` = 16 unacked messages on the queue's consumer (8000 on the
  delay queue's). Each consumer has a pika connection of its own (4 connections in all with
  the broker's own); the worker threads send their acks through the consumer's connection.
- Acks after the actor returns (and the middleware ran). No result backend. The actor is a plain
  ``def``; it runs in one of the worker threads. It returns ``None``: an actor that returns a
  value without the Results middleware makes Dramatiq log a WARNING for every message.
- Queues: ``IN_QUEUE_NAME`` (durable, dead-lettering to ``<name>.XQ``), plus ``<name>.DQ``
  (delays) and ``<name>.XQ`` (dead letters, with an ``x-message-ttl``), none with
  ``x-queue-type``, so a vhost's default queue type applies (works on quorum vhosts).
- ``publish`` uses ``actor.send``: Dramatiq's JSON envelope, ``delivery_mode=2``, no publisher
  confirms (``confirm_delivery=False`` is Dramatiq's default).

On SIGTERM: ``worker.stop()`` (lets running messages finish, requeues prefetched ones), then
``broker.close()``. It takes about 2 s: the worker and consumer threads notice the stop at
their next ``worker_timeout`` tick (1000 ms, Dramatiq's default), one after the other.

``OUT_QUEUE_NAME`` is not used: Dramatiq sends no reports. Each task calls
:func:`bench.peers._done.mark_start` (a no-op unless ``bench.cold_start`` set
``BENCH_START_FILE``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware

from bench.peers import _common, _done

ACTOR_NAME = "bench_count_words"
WORKER_THREADS = 8
VARIANTS = ("", "results")


def _count_words(text: str) -> None:
    # Returns nothing: without the Results middleware Dramatiq logs a warning for every
    # actor that returns a value.
    _done.mark_start()
    _common.count_words(text)
    _done.mark()


def _count_words_with_result(text: str) -> int:
    _done.mark_start()
    return _common.count_words(text)


class _MarkStored(Middleware):
    """Writes the completion line once the Results middleware has stored the result.

    Added before ``Results``: Dramatiq runs the ``after_*`` hooks in reverse order.
    """

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if exception is None:
            _done.mark()


def _results_backend() -> Any:
    from dramatiq.results import Results
    from dramatiq.results.backends.redis import RedisBackend

    backend = RedisBackend(
        url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        namespace=os.environ.get("BENCH_RUN_ID", "bench-manual"),
    )
    return Results(backend=backend), Results


def build(
    url: str, queue: str, variant: str = ""
) -> tuple[RabbitmqBroker, dramatiq.Actor[..., Any]]:
    """The broker and the actor on ``queue`` (``results``: with the Results middleware)."""
    if variant not in VARIANTS:
        raise SystemExit(f"dramatiq_worker: unknown variant {variant!r}, not one of {VARIANTS}")
    broker = RabbitmqBroker(url=url)
    options: dict[str, Any] = {}
    if variant == "results":
        results, results_type = _results_backend()
        broker.add_middleware(results)
        broker.add_middleware(_MarkStored(), before=results_type)
        options["store_results"] = True
    dramatiq.set_broker(broker)
    actor: dramatiq.Actor[..., Any] = dramatiq.actor(
        broker=broker, queue_name=queue, actor_name=ACTOR_NAME, **options
    )(_count_words_with_result if variant == "results" else _count_words)
    return broker, actor


def cli_setup() -> None:
    """For ``dramatiq bench.peers.dramatiq_worker:cli_setup``: the broker, from the environment."""
    logging.getLogger("dramatiq").setLevel(_common.log_level())
    build(
        _common.env("BROKER_URL"),
        _common.env("IN_QUEUE_NAME"),
        os.environ.get("BENCH_PEER_VARIANT", ""),
    )


def publish(url: str, queue: str, count: int) -> None:
    """Enqueue ``count`` tasks with ``actor.send`` (declares the queues)."""
    broker, actor = build(url, queue)
    try:
        for _ in range(count):
            actor.send(_common.TEXT)
    finally:
        broker.close()


def main(argv: list[str]) -> None:
    """Serve until SIGTERM or SIGINT."""
    if len(argv) > 1 or (argv and argv[0] not in VARIANTS):
        raise SystemExit("usage: python -m bench.peers.dramatiq_worker [results]")
    logging.basicConfig(level=_common.log_level())
    broker, _ = build(
        _common.env("BROKER_URL"), _common.env("IN_QUEUE_NAME"), argv[0] if argv else ""
    )
    _common.env("BENCH_DONE_FILE")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker = dramatiq.Worker(broker, worker_threads=WORKER_THREADS)
    worker.start()
    while not stop.wait(0.5):
        pass
    worker.stop()
    broker.close()


if __name__ == "__main__":
    main(sys.argv[1:])
