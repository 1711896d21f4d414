"""Dramatiq peer: its ``RabbitmqBroker`` (pika) and ``dramatiq.Worker`` with 8 threads.

Run as ``python -m bench.peers.dramatiq_worker`` (one OS process: the Worker is started
in-process, not through the ``dramatiq`` CLI, which forks a supervisor and worker processes).

Settings: Dramatiq's defaults except ``worker_threads=8`` (also Dramatiq's own default).

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

``OUT_QUEUE_NAME`` is not used: Dramatiq sends no reports.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.peers import _common, _done

ACTOR_NAME = "bench_count_words"
WORKER_THREADS = 8


def _count_words(text: str) -> None:
    # Returns nothing: without the Results middleware Dramatiq logs a warning for every
    # actor that returns a value.
    _common.count_words(text)
    _done.mark()


def build(url: str, queue: str) -> tuple[RabbitmqBroker, dramatiq.Actor[[str], None]]:
    """The broker and the actor on ``queue``."""
    broker = RabbitmqBroker(url=url)
    dramatiq.set_broker(broker)
    actor: dramatiq.Actor[[str], None] = dramatiq.actor(
        broker=broker, queue_name=queue, actor_name=ACTOR_NAME
    )(_count_words)
    return broker, actor


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
    if argv:
        raise SystemExit(f"dramatiq_worker takes no variant, got {argv}")
    logging.basicConfig(level=_common.log_level())
    broker, _ = build(_common.env("BROKER_URL"), _common.env("IN_QUEUE_NAME"))
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
