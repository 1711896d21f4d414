"""The baseline: a raw aio-pika loop doing the protocol's work, nothing more.

Consume with manual acks (prefetch ``PREFETCH``), decode the envelope, count the words, publish
``started`` then ``success`` (each awaiting its publisher confirm), then ack. Run as
``python -m bench.baseline`` with ``BROKER_URL``, ``IN_QUEUE_NAME`` and ``OUT_QUEUE_NAME``;
``python -m bench.baseline uvloop`` runs the same loop on uvloop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import UTC, datetime

import aio_pika

from bench.loops import run


async def main() -> None:
    """Serve until SIGTERM."""
    connection = await aio_pika.connect(os.environ["BROKER_URL"])
    consume = await connection.channel()
    await consume.set_qos(prefetch_count=int(os.environ.get("PREFETCH", "1")))
    publish = await connection.channel(publisher_confirms=True)
    in_queue = await consume.declare_queue(os.environ["IN_QUEUE_NAME"], durable=True)
    out_name = os.environ["OUT_QUEUE_NAME"]
    await publish.declare_queue(out_name, durable=True)

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
        await report(envelope, "started")
        words = len(str(envelope["input"]["text"]).split())
        await report(envelope, "success", response={"words": words})
        await message.ack()

    await in_queue.consume(handle)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("Connected to the broker", flush=True)
    await stop.wait()
    await connection.close()


if __name__ == "__main__":
    run(main(), uvloop=sys.argv[1:] == ["uvloop"])
