"""The baseline: a raw aio-pika loop doing the protocol's work, nothing more.

Consume with manual acks (prefetch ``PREFETCH``, 1 by default), decode the envelope, publish
``started``, count the words, publish ``success``, then ack once both are confirmed. Run from
the repository's root with ``BROKER_URL``, ``IN_QUEUE_NAME`` and ``OUT_QUEUE_NAME``::

    python -m bench.baseline [uvloop] [serial] [once] [--processes N]

- By default the two reports **overlap**: ``success`` is published without waiting for
  ``started``'s confirm, and the ack waits for both confirms, so a task costs one confirm
  round trip. Both publishes go out on one channel in order: aiormq writes a publish's frames
  under the channel's lock, which is first come first served, and ``started``'s publish is
  scheduled first. This is what our worker does.
- ``serial``: the old loop, which awaits ``started``'s confirm before it counts the words and
  publishes ``success`` (two confirm round trips per task).
- ``uvloop``: the same loop on uvloop.
- ``once``: a one-shot job (``bench.cold_start``): prefetch 1, exit 0 after the first task is
  acked, as our worker's job mode does with ``WORKER_JOB_MAX_DELIVERIES=1``.
- ``--processes N``: a minimal supervisor (this module, without aio-pika imported) starts N
  such loops as child processes, forwards SIGTERM and SIGINT to them, and exits with the
  highest of their exit codes. The bench sums the tree's CPU and memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

WORDS = ("uvloop", "serial", "once")


def _parse(argv: list[str]) -> tuple[set[str], int]:
    words: set[str] = set()
    processes = 1
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        if word == "--processes" and rest:
            processes = int(rest.pop(0))
        elif word.startswith("--processes="):
            processes = int(word.split("=", 1)[1])
        elif word in WORDS:
            words.add(word)
        else:
            raise SystemExit(
                "usage: python -m bench.baseline [uvloop] [serial] [once] [--processes N]"
            )
    if processes < 1:
        raise SystemExit("--processes must be at least 1")
    return words, processes


def supervise(words: set[str], processes: int) -> int:
    """Run ``processes`` loops as children until they exit; forward SIGTERM and SIGINT."""
    children = [
        subprocess.Popen([sys.executable, "-m", "bench.baseline", *sorted(words)])  # noqa: S603
        for _ in range(processes)
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)


async def main(words: set[str]) -> None:
    """Serve until SIGTERM (or, with ``once``, until the first task is acked)."""
    import asyncio
    import json
    from datetime import UTC, datetime

    import aio_pika

    once = "once" in words
    overlap = "serial" not in words
    connection = await aio_pika.connect(os.environ["BROKER_URL"])
    consume = await connection.channel()
    await consume.set_qos(prefetch_count=1 if once else int(os.environ.get("PREFETCH", "1")))
    publish = await connection.channel(publisher_confirms=True)
    in_queue = await consume.declare_queue(os.environ["IN_QUEUE_NAME"], durable=True)
    out_name = os.environ["OUT_QUEUE_NAME"]
    await publish.declare_queue(out_name, durable=True)
    stop = asyncio.Event()

    async def report(envelope: dict[str, object], kind: str, **more: object) -> None:
        body = {
            "protocol_version": 1,
            "task_id": envelope["task_id"],
            "client_id": envelope["client_id"],
            "service": envelope["service"],
            "attempt": 1,
            "timestamp": datetime.now(UTC).isoformat(),
            "type": kind,
            **more,
        }
        message = aio_pika.Message(
            json.dumps(body, separators=(",", ":"), sort_keys=True).encode(),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            type=kind,
        )
        await publish.default_exchange.publish(message, routing_key=out_name)

    async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        envelope = json.loads(message.body)
        if overlap:
            # Scheduled now, it takes the channel's lock before ``success``'s publish can.
            started = asyncio.ensure_future(report(envelope, "started"))
            words = len(str(envelope["input"]["text"]).split())
            await asyncio.gather(started, report(envelope, "success", response={"words": words}))
        else:
            await report(envelope, "started")
            words = len(str(envelope["input"]["text"]).split())
            await report(envelope, "success", response={"words": words})
        await message.ack()
        if once:
            stop.set()

    await in_queue.consume(handle)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("Connected to the broker", flush=True)
    await stop.wait()
    await connection.close()


if __name__ == "__main__":
    chosen, count = _parse(sys.argv[1:])
    if count > 1:
        sys.exit(supervise(chosen, count))
    from bench.loops import run

    run(main(chosen), uvloop="uvloop" in chosen)
