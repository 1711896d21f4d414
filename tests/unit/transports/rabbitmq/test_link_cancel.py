"""A connection attempt cut short by a cancel (a shutdown during startup) leaves nothing behind.

aio-pika's robust connection reconnects on a cancel of its own attempt unless it is closed: the
attempt's task then swallowed every cancel, and ``asyncio.run`` waited for it for ever as it
closed the loop (a worker given SIGTERM while it connected never exited). The broker here
accepts the TCP connection and never answers, so the attempt is in the AMQP handshake when it
is cancelled; ``asyncio.run`` runs on a thread of its own, so a hang fails the test.
"""

from __future__ import annotations

import asyncio
import threading

from async_task_api_worker.transports.rabbitmq.link import BrokerLink


async def _cancel_a_connect_in_its_handshake() -> None:
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # open, and never a word: the client waits in its handshake
        accepted.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = BrokerLink([f"amqp://guest:guest@127.0.0.1:{port}/"], heartbeat_s=15, name="t")
    opening = asyncio.ensure_future(link.open())
    await accepted.wait()
    opening.cancel()
    await asyncio.gather(opening, return_exceptions=True)
    for writer in held:
        writer.close()
    server.close()


def test_a_cancelled_connect_lets_the_event_loop_close() -> None:
    ended = threading.Event()

    def run() -> None:
        asyncio.run(_cancel_a_connect_in_its_handshake())  # closing cancels what is left
        ended.set()

    threading.Thread(target=run, name="cancelled-connect", daemon=True).start()
    assert ended.wait(30), "asyncio.run did not end: a task of the attempt ignores its cancel"
