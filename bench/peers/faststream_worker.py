"""FastStream peer: a ``RabbitBroker`` subscriber doing our worker's protocol work.

Run as ``python -m bench.peers.faststream_worker`` (FastStream's default: no QoS, so RabbitMQ
sends the whole queue and every message runs as its own asyncio task at once) or
``python -m bench.peers.faststream_worker prefetch8`` (``Channel(prefetch_count=8)``: at most 8
unacked, like a concurrency of 8; ``prefetch32`` likewise). One OS process:
``FastStream(broker).run()`` in-process (it handles SIGTERM/SIGINT itself), not the
``faststream run`` CLI.

For several processes, FastStream's own way is its CLI:
``python -m faststream run bench.peers.faststream_worker:cli_app --factory --workers 2``
(:func:`cli_app` builds the app in each process from the environment, the variant in
``BENCH_PEER_VARIANT``): a supervisor process that spawns the 2 workers (multiprocessing's
``spawn``: each is a fresh interpreter that imports the app) and stops them on SIGTERM, so
3 OS processes, plus multiprocessing's resource tracker. ``--log-level`` is not given (the
app quiets the per-message log itself, as below); the CLI then takes uvloop, as this module
does.

For every task (JSON ``{"task_id": ..., "input": {"text": ...}}`` on ``IN_QUEUE_NAME``, validated
into a pydantic model by FastStream): publish a ``started`` report, count the words, publish a
``success`` report (both JSON to ``OUT_QUEUE_NAME``, persistent, on the default exchange), mark
the task done, and return; FastStream then acks (``AckPolicy.REJECT_ON_ERROR``, its default:
ack after the handler returns, reject if it raises).

Publisher confirms: FastStream's default ``Channel`` has ``publisher_confirms=True`` and
``broker.publish`` awaits aio-pika's ``exchange.publish``, which returns only once the broker
confirmed; so each report is confirmed before the next step, as in our worker. By default the
subscriber consumes on that same channel; with ``prefetch8`` it consumes on a channel of its
own (with the QoS) and publishes on the default one. FastStream publishes with
``mandatory=True`` by default (an unroutable report comes back as a ``basic.return``).

Timing caveat for the default variant: with no QoS the whole backlog is delivered at once and
every handler interleaves with the others, so the first task finishes late (about 1 s after the
first delivery for 2,000 tasks, in a trial) and the span from the first to the last ``mark()``
leaves most of that out: it overstates the rate compared with bounded contenders. The
benchmark times it from its first ``started`` report instead.

Event loop: uvloop when installed, as ``faststream run`` picks (:func:`bench.peers._common.serve`).

Queues: ``IN_QUEUE_NAME`` and ``OUT_QUEUE_NAME``, durable; ``OUT_QUEUE_NAME`` is declared before
the subscriber starts. FastStream's ``RabbitQueue`` always sends ``x-queue-type`` (``classic``
by default, whatever the vhost's default: on a quorum vhost FastStream silently gets classic
queues), so both take the vhost's type (:func:`bench.peers._common.vhost_queue_type`). An
explicit ``x-queue-type`` equal to the queue's type is equivalent to none, so the harness may
declare the same queues without arguments.
``graceful_timeout`` is FastStream's default (15 s: how long stop waits for running handlers).
Log level from ``LOG_LEVEL`` (WARNING by default): at INFO or below FastStream's default
per-message access log ("Received", "Processed" to stdout) is on; above, it is emitted at DEBUG
and filtered out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

from faststream import FastStream
from faststream.rabbit import Channel, QueueType, RabbitBroker, RabbitQueue
from pydantic import BaseModel

from bench.peers import _common, _done

VARIANTS: dict[str, int | None] = {"default": None, "prefetch8": 8, "prefetch32": 32}
PUBLISH_BATCH = 500


class Text(BaseModel):
    """The task's input."""

    text: str


class Task(BaseModel):
    """The task's envelope."""

    task_id: str
    input: Text


def _queue(name: str, kind: str) -> RabbitQueue:
    if kind == "quorum":
        return RabbitQueue(name, queue_type=QueueType.QUORUM)
    return RabbitQueue(name, durable=True)


def _report(task_id: str, kind: str, **more: Any) -> dict[str, Any]:
    return {
        "protocol_version": 1,
        "task_id": task_id,
        "attempt": 1,
        "timestamp": datetime.now(UTC).isoformat(),
        "type": kind,
        **more,
    }


def build(url: str, queue: str, out_queue: str, prefetch: int | None, kind: str) -> FastStream:
    """The app: the broker, the subscriber, the out queue's declaration."""
    # FastStream logs every message ("Received", "Processed") at the broker's ``log_level``
    # through a logger whose threshold is INFO; below LOG_LEVEL=INFO they go at DEBUG instead
    # (FastStream's documented way to quiet them). ``faststream run --log-level WARNING`` would
    # instead raise both, and still log every message.
    level = _common.log_level()
    broker = RabbitBroker(url, log_level=logging.INFO if level <= logging.INFO else logging.DEBUG)
    out = _queue(out_queue, kind)

    async def declare_out_queue() -> None:
        await broker.connect()
        await broker.declare_queue(out)

    channel = Channel(prefetch_count=prefetch) if prefetch else None

    @broker.subscriber(_queue(queue, kind), channel=channel)
    async def handle(task: Task) -> None:
        await broker.publish(
            _report(task.task_id, "started"),
            queue=out_queue,
            persist=True,
            message_type="started",
        )
        words = _common.count_words(task.input.text)
        await broker.publish(
            _report(task.task_id, "success", response={"words": words}),
            queue=out_queue,
            persist=True,
            message_type="success",
        )
        _done.mark()

    logging.getLogger("faststream").setLevel(level)
    return FastStream(broker, on_startup=[declare_out_queue])


async def _publish(url: str, queue: str, count: int) -> None:
    kind = await _common.vhost_queue_type(url)
    async with RabbitBroker(url, logger=None) as broker:
        await broker.declare_queue(_queue(queue, kind))
        for start in range(0, count, PUBLISH_BATCH):
            await asyncio.gather(
                *(
                    broker.publish(
                        {"task_id": f"t-{number}", "input": {"text": _common.TEXT}},
                        queue=queue,
                        persist=True,
                    )
                    for number in range(start, min(start + PUBLISH_BATCH, count))
                )
            )


def publish(url: str, queue: str, count: int) -> None:
    """Publish ``count`` JSON tasks with ``broker.publish`` (confirmed, 500 at a time)."""
    asyncio.run(_publish(url, queue, count))


def cli_app() -> FastStream:
    """For ``faststream run bench.peers.faststream_worker:cli_app --factory``: the app."""
    variant = os.environ.get("BENCH_PEER_VARIANT") or "default"
    if variant not in VARIANTS:
        raise SystemExit(f"faststream_worker: BENCH_PEER_VARIANT {variant!r} is unknown")
    return build(
        _common.env("BROKER_URL"),
        _common.env("IN_QUEUE_NAME"),
        _common.env("OUT_QUEUE_NAME"),
        VARIANTS[variant],
        _common.env("BENCH_QUEUE_TYPE"),
    )


def main(argv: list[str]) -> None:
    """Serve until SIGTERM or SIGINT."""
    variant = argv[0] if argv else "default"
    if variant not in VARIANTS or len(argv) > 1:
        raise SystemExit(f"usage: python -m bench.peers.faststream_worker [{'|'.join(VARIANTS)}]")
    url = _common.env("BROKER_URL")
    app = build(
        url,
        _common.env("IN_QUEUE_NAME"),
        _common.env("OUT_QUEUE_NAME"),
        VARIANTS[variant],
        _common.queue_type(url),
    )
    _common.env("BENCH_DONE_FILE")
    _common.serve(app.run(log_level=_common.log_level()))


if __name__ == "__main__":
    main(sys.argv[1:])
