"""A report consumer whose ``basic.consume`` met a closing connection starts again."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import aiormq
import pytest
from aio_pika.abc import AbstractQueue, AbstractRobustChannel

from async_task_api_worker.errors import BrokerRefusedError, BrokerUnavailableError
from async_task_api_worker.transports.rabbitmq.client import start_consumer

#: What RabbitMQ 3.10 sent CI when a loaded quorum queue did not answer ``basic.consume``.
INTERNAL_ERROR = aiormq.exceptions.ConnectionInternalError("INTERNAL_ERROR")


class FakeQueue:
    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.attempts = 0
        self.consuming: Any = None

    async def consume(self, callback: Any) -> str:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.consuming = callback
        return "ctag"


class FakeChannel:
    def __init__(self) -> None:
        self.back = asyncio.Event()
        self.waiting = asyncio.Event()
        self.waits = 0

    async def ready(self) -> None:
        self.waits += 1
        self.waiting.set()
        await self.back.wait()


async def on_message(_message: Any) -> None:
    return None


def start(queue: FakeQueue, channel: FakeChannel, timeout_s: float = 10.0) -> Any:
    return start_consumer(
        cast("AbstractQueue", queue),
        cast("AbstractRobustChannel", channel),
        on_message,
        timeout_s=timeout_s,
        url="amqp://guest:******@h:5672/v",
    )


async def test_a_consume_cut_by_an_internal_error_starts_again_once_the_channel_is_back() -> None:
    queue, channel = FakeQueue(INTERNAL_ERROR), FakeChannel()
    starting = asyncio.ensure_future(start(queue, channel))
    await channel.waiting.wait()
    assert queue.consuming is None
    channel.back.set()
    await starting
    assert queue.attempts == 2
    assert queue.consuming is on_message


async def test_a_channel_not_back_in_time_is_broker_unavailable_naming_the_broker() -> None:
    queue = FakeQueue(INTERNAL_ERROR)
    with pytest.raises(BrokerUnavailableError, match=r"within 0\.05 s \(amqp://guest:\*{6}@h"):
        await start(queue, FakeChannel(), timeout_s=0.05)


async def test_a_refused_consumer_is_refused_at_once() -> None:
    refusal = aiormq.exceptions.ChannelAccessRefused("ACCESS_REFUSED - access to queue 'q'")
    queue, channel = FakeQueue(refusal), FakeChannel()
    with pytest.raises(BrokerRefusedError):
        await start(queue, channel)
    assert channel.waits == 0
