"""The worker's control queue: cancels to the cancel handler, inspect requests answered.

An inspect request (AMQP ``type`` ``inspect``) is answered on the default exchange to its
direct reply-to address alone; any other message goes to the cancel decoder, as before.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from async_task_api_worker.transports.rabbitmq.control import Control, listen_for_cancels


class FakeChannel:
    def __init__(self) -> None:
        self.published: list[tuple[Any, str]] = []
        self.on_message: Any = None
        self.default_exchange = SimpleNamespace(publish=self._publish)

    async def _publish(self, message: Any, routing_key: str) -> None:
        self.published.append((message, routing_key))

    async def set_qos(self, prefetch_count: int) -> None:
        return None

    async def declare_exchange(self, name: str, *_: Any, **__: Any) -> Any:
        return SimpleNamespace(name=name)

    async def declare_queue(self, name: str, **_: Any) -> Any:
        async def bind(exchange: Any) -> None:
            return None

        async def consume(callback: Any, no_ack: bool) -> None:
            self.on_message = callback

        return SimpleNamespace(bind=bind, consume=consume)


def message(body: bytes, *, kind: str | None = None, reply_to: str | None = None) -> Any:
    return SimpleNamespace(body=body, type=kind, reply_to=reply_to, correlation_id="r-1")


def listening(control: Control) -> FakeChannel:
    channel = FakeChannel()

    async def connect() -> FakeChannel:
        return channel

    asyncio.run(listen_for_cancels(SimpleNamespace(channel=connect), "svc_control", control))
    return channel


def test_an_inspect_request_is_answered_to_its_direct_reply_to_address_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cancels: list[bytes] = []
    asked: list[tuple[bytes, str | None]] = []

    def answer(body: bytes, tag: str | None) -> bytes:
        asked.append((body, tag))
        return b"{}"

    channel = listening(Control(lambda: "atw/h/1/n", cancels.append, answer))
    to = "amq.rabbitmq.reply-to.g1h2AA"
    asyncio.run(channel.on_message(message(b"q", kind="inspect", reply_to=to)))
    ((reply, routing_key),) = channel.published
    assert (routing_key, reply.body, reply.correlation_id, reply.type) == (
        to,
        b"{}",
        "r-1",
        "inspect_reply",
    )
    assert asked == [(b"q", "atw/h/1/n")]
    with caplog.at_level(logging.WARNING):
        asyncio.run(channel.on_message(message(b"q", kind="inspect", reply_to="svc_queue_out")))
    assert len(channel.published) == 1  # never into a queue a publisher names
    assert "without a direct reply-to address was dropped" in caplog.text
    asyncio.run(channel.on_message(message(b"c", kind="cancel")))
    asyncio.run(channel.on_message(message(b"x")))
    assert cancels == [b"c", b"x"]


def test_without_an_inspect_answer_every_message_is_a_cancel() -> None:
    cancels: list[bytes] = []
    channel = listening(Control(lambda: None, cancels.append))
    asyncio.run(
        channel.on_message(message(b"q", kind="inspect", reply_to="amq.rabbitmq.reply-to.x"))
    )
    assert (cancels, channel.published) == ([b"q"], [])
