"""Celery peer: the RabbitMQ broker through kombu's py-amqp transport; no result, or ``rpc://``.

Run as ``python -m bench.peers.celery_worker VARIANT``; the worker is started in-process with
``app.worker_main``:

- ``prefork`` (the default): pool ``prefork``, concurrency 2, the main process plus 2 forked
  pool processes, so 3 OS processes (the fork is inherent to the prefork pool). This is also
  Celery's own way to run 2 processes (the bench's ``-x2`` rows of the other contenders).
- ``threads``: pool ``threads``, concurrency 8, one OS process.
- ``rpc-prefork``, ``rpc-threads``: the same, with the ``rpc://`` result backend (below).
- ``solo``: pool ``solo`` (one task at a time, in the main thread, one OS process), for
  ``bench.cold_start``: the leanest one-message run, since Celery has no mode that exits after
  a number of tasks.

Settings (Celery's defaults otherwise):

- ``task_acks_late=True`` (ack after the task returns and its result, if any, was sent),
  ``worker_prefetch_multiplier`` left at 4: prefetch = 4 x concurrency (8 for prefork,
  32 for threads), set as *global* (per-channel) QoS on classic queues, Celery's default on
  RabbitMQ.
- No result backend, except in the ``rpc-*`` variants: ``result_backend="rpc://"``, Celery's
  nearest equivalent of our reports. The worker sends the task's return value and state
  (``SUCCESS``) as one message to the task's ``reply_to`` queue on the default exchange, before
  the late ack. ``publish`` sets ``reply_to`` to the bench's output queue (a client's own
  reply queue is one named after its app's id), and the bench times the variant by the
  results that arrive there: the time each result was readable. A fair reader should know:
  the result is *transient* (``result_persistent=False``, Celery's default) and sent without a
  publisher confirm (kombu's default), and there is no ``started`` message
  (``task_track_started=False``, the default): one unconfirmed transient publish per task
  against our two confirmed persistent ones. The tasks themselves write no completion line.
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
  persistent, no publisher confirms (kombu's default); ``reply_to`` as above.
- Queue ``IN_QUEUE_NAME`` is bound to a direct exchange of the same name (Celery's default
  routing), to which ``publish`` sends.
- Log level from ``LOG_LEVEL`` (WARNING by default; at INFO Celery logs every task). Celery
  prints its banner to stdout and, run as root, a ``SecurityWarning`` to stderr.

SIGTERM starts Celery's warm shutdown (exit code 0), but since Celery 5.3 the handler only sets
a flag that the worker's event loop reads when it next wakes up; idle, kombu's hub sleeps up to
10 s between timers, so the exit comes 4-10 s after the signal (about 4 s for prefork, 10 s for
threads here).

``OUT_QUEUE_NAME`` is not read: the results go where ``publish`` said (``reply_to``). Each task
calls :func:`bench.peers._done.mark_start` (a no-op unless ``bench.cold_start`` set
``BENCH_START_FILE``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery, Task

from bench.peers import _common, _done

TASK_NAME = "bench.count_words"
POOLS: dict[str, list[str]] = {
    "prefork": ["--pool=prefork", "--concurrency=2"],
    "threads": ["--pool=threads", "--concurrency=8"],
    "solo": ["--pool=solo"],
}
VARIANTS: dict[str, list[str]] = {
    **POOLS,
    **{f"rpc-{pool}": POOLS[pool] for pool in ("prefork", "threads")},
}


def build(url: str, queue: str, *, rpc: bool = False) -> tuple[Celery, Task[Any, Any]]:
    """The app, its settings and the task (``rpc``: with the ``rpc://`` result backend)."""
    app = Celery("bench_peer", broker=url, set_as_current=False)
    settings: dict[str, Any] = {
        "task_acks_late": True,
        "result_backend": "rpc://" if rpc else None,
        "task_default_queue": queue,
        "broker_connection_retry_on_startup": True,
    }
    if _common.queue_type(url) == "quorum":
        settings["task_default_queue_type"] = "quorum"
    app.conf.update(settings)

    if rpc:

        @app.task(name=TASK_NAME)
        def count_words(text: str) -> int:
            _done.mark_start()
            return _common.count_words(text)

    else:

        @app.task(name=TASK_NAME)
        def count_words(text: str) -> int:
            _done.mark_start()
            words = _common.count_words(text)
            _done.mark()
            return words

    return app, count_words


def publish(url: str, queue: str, count: int, *, reply_to: str | None = None) -> None:
    """Send ``count`` tasks with ``apply_async`` (declares the queue); results to ``reply_to``."""
    app, task = build(url, queue)
    try:
        with app.producer_or_acquire() as producer:
            for _ in range(count):
                task.apply_async(args=(_common.TEXT,), producer=producer, reply_to=reply_to)
    finally:
        app.close()


def main(argv: list[str]) -> None:
    """Serve until SIGTERM (Celery's warm shutdown)."""
    variant = argv[0] if argv else "prefork"
    if variant not in VARIANTS or len(argv) > 1:
        raise SystemExit(f"usage: python -m bench.peers.celery_worker [{'|'.join(VARIANTS)}]")
    app, _ = build(
        _common.env("BROKER_URL"), _common.env("IN_QUEUE_NAME"), rpc=variant.startswith("rpc-")
    )
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
