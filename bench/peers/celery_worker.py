"""Celery peer: the RabbitMQ broker through kombu's py-amqp transport, no result backend.

Run as ``python -m bench.peers.celery_worker prefork`` (pool ``prefork``, concurrency 2: the
main process plus 2 forked pool processes, so 3 OS processes; the fork is inherent to the
prefork pool) or ``python -m bench.peers.celery_worker threads`` (pool ``threads``,
concurrency 8: one OS process). The worker is started in-process with ``app.worker_main``.

Settings (Celery's defaults otherwise):

- ``task_acks_late=True`` (ack after the task returns), no result backend,
  ``worker_prefetch_multiplier`` left at 4: prefetch = 4 x concurrency (8 for prefork,
  32 for threads), set as *global* (per-channel) QoS on classic queues, Celery's default on
  RabbitMQ.
- ``--without-gossip --without-mingle --without-heartbeat``: mingle waits for replies from
  other workers at start-up and gossip/heartbeat need an event queue of their own; task events
  (``-E``) stay off, as by default. Remote control (the ``celery.pidbox`` exchange and an
  auto-delete reply queue) stays on, as by default.
- Queue ``IN_QUEUE_NAME`` as ``task_default_queue``, declared durable by ``publish`` and the
  worker. Celery sets no ``x-queue-type`` unless ``task_default_queue_type="quorum"``, and it
  uses *global* QoS unless it knows a queue is quorum, which quorum queues refuse
  (``NOT_IMPLEMENTED - queue ... does not support global qos``: the worker reconnects in a loop
  and never consumes). So on a quorum vhost (:func:`bench.peers._common.vhost_queue_type`)
  both ``publish`` and the worker set ``task_default_queue_type="quorum"``, Celery's documented
  quorum setup: the queue is declared with ``x-queue-type: quorum``, global QoS is off, and the
  worker also declares Celery's native delayed delivery topology at start-up (28
  ``celery_delayed_*`` quorum queues and their exchanges), which lengthens its start-up.
- ``publish`` uses ``apply_async`` on one producer: Celery's protocol-2 envelope (JSON),
  persistent, no publisher confirms (kombu's default).
- Queue ``IN_QUEUE_NAME`` is bound to a direct exchange of the same name (Celery's default
  routing), to which ``publish`` sends.
- Log level from ``LOG_LEVEL`` (WARNING by default; at INFO Celery logs every task). Celery
  prints its banner to stdout and, run as root, a ``SecurityWarning`` to stderr.

SIGTERM starts Celery's warm shutdown (exit code 0), but since Celery 5.3 the handler only sets
a flag that the worker's event loop reads when it next wakes up; idle, kombu's hub sleeps up to
10 s between timers, so the exit comes 4-10 s after the signal (about 4 s for prefork, 10 s for
threads here).

``OUT_QUEUE_NAME`` is not used: Celery sends no reports.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery, Task

from bench.peers import _common, _done

TASK_NAME = "bench.count_words"
VARIANTS: dict[str, list[str]] = {
    "prefork": ["--pool=prefork", "--concurrency=2"],
    "threads": ["--pool=threads", "--concurrency=8"],
}


def build(url: str, queue: str) -> tuple[Celery, Task[Any, Any]]:
    """The app, its settings and the task."""
    app = Celery("bench_peer", broker=url, set_as_current=False)
    settings: dict[str, Any] = {
        "task_acks_late": True,
        "result_backend": None,
        "task_default_queue": queue,
        "broker_connection_retry_on_startup": True,
    }
    if _common.queue_type(url) == "quorum":
        settings["task_default_queue_type"] = "quorum"
    app.conf.update(settings)

    @app.task(name=TASK_NAME)
    def count_words(text: str) -> int:
        words = _common.count_words(text)
        _done.mark()
        return words

    return app, count_words


def publish(url: str, queue: str, count: int) -> None:
    """Send ``count`` tasks with ``apply_async`` (declares the queue)."""
    app, task = build(url, queue)
    try:
        with app.producer_or_acquire() as producer:
            for _ in range(count):
                task.apply_async(args=(_common.TEXT,), producer=producer)
    finally:
        app.close()


def main(argv: list[str]) -> None:
    """Serve until SIGTERM (Celery's warm shutdown)."""
    variant = argv[0] if argv else "prefork"
    if variant not in VARIANTS or len(argv) > 1:
        raise SystemExit(f"usage: python -m bench.peers.celery_worker [{'|'.join(VARIANTS)}]")
    app, _ = build(_common.env("BROKER_URL"), _common.env("IN_QUEUE_NAME"))
    _common.env("BENCH_DONE_FILE")
    app.worker_main(
        [
            "worker",
            *VARIANTS[variant],
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            f"--loglevel={logging.getLevelName(_common.log_level())}",
        ]
    )


if __name__ == "__main__":
    main(sys.argv[1:])
