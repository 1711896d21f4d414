"""The input queue's consumer: a new tag each time, and what a broker's cancel withdraws."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiormq import spec

from async_task_api_worker.cancel_token import CancelToken
from async_task_api_worker.ports import CancelCause
from async_task_api_worker.transports.rabbitmq.consumer import TIMEOUT_TOLERANCE_S, Consumer
from async_task_api_worker.transports.rabbitmq.watch import ChannelWatch


class FakeClient:
    """aiormq's channel, as the consumer uses it: each consume makes a new tag up."""

    def __init__(self) -> None:
        self.on_consumer_cancel_callbacks: set[Any] = set()
        self.consumed: list[dict[str, Any] | None] = []
        self.cancelled: list[str] = []
        self.again = asyncio.Event()
        self.channel: FakeChannel | None = None

    async def reopen(self) -> None:
        """What aio-pika does once the channel is open again: its reopen callbacks."""
        assert self.channel is not None
        for callback in list(self.channel.reopen_callbacks):
            await callback(self.channel)

    async def basic_consume(
        self, queue: str, callback: Any, *, arguments: Any, consumer_tag: str = ""
    ) -> Any:
        self.consumed.append(arguments)
        self.again.set()
        return SimpleNamespace(consumer_tag=f"ctag1.{len(self.consumed)}")

    async def basic_cancel(self, tag: str, *, timeout: float) -> None:
        self.cancelled.append(tag)

    def cancel_from_broker(self, tag: str) -> None:
        for callback in list(self.on_consumer_cancel_callbacks):
            callback(spec.Basic.Cancel(consumer_tag=tag))


class FakeChannel:
    """aio-pika's robust channel: the client under it, and its reopen callbacks."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.reopen_callbacks: set[Any] = set()
        self.is_closed = False

    async def get_underlay_channel(self) -> FakeClient:
        return self.client


class Held:
    """A delivery in flight for ``seconds``, as the watch withdraws it."""

    def __init__(self, seconds: float, consumer_tag: str = "ctag1.1") -> None:
        self.consumer_tag = consumer_tag
        self.received_at = time.monotonic() - seconds
        self.lost = False
        self.cancel_token = CancelToken()


def held(seconds: float, consumer_tag: str = "ctag1.1") -> Any:
    return Held(seconds, consumer_tag)


async def started(
    timeout_s: float | None = 10.0,
) -> tuple[Consumer, FakeClient, ChannelWatch, list[CancelCause]]:
    watch = ChannelWatch("in", 30.0, connected=lambda: True, gave_up=lambda _: None)
    causes: list[CancelCause] = []

    async def on_message(_: Any) -> None:
        return None

    consumer = Consumer("in", watch, on_message, causes.append)
    client = FakeClient()
    client.channel = FakeChannel(client)
    consumer.attach(client.channel)  # type: ignore[arg-type]
    if timeout_s is not None:
        consumer.timeout_s = timeout_s
        consumer.arguments = {"x-consumer-timeout": round(timeout_s * 1000)}
    await consumer.start()
    return consumer, client, watch, causes


async def test_a_consumer_timeout_withdraws_only_what_was_held_past_it_and_consumes_anew() -> None:
    consumer, client, watch, causes = await started(timeout_s=10.0)
    first_tag = consumer.tag
    timed_out = held(10.0 - TIMEOUT_TOLERANCE_S / 2)
    recent = held(1.0)
    watch.in_flight.update({timed_out, recent})
    client.again.clear()
    assert first_tag is not None
    client.cancel_from_broker(first_tag)
    assert consumer.tag is None  # not consuming until the new consumer is confirmed
    await client.again.wait()
    await asyncio.sleep(0)  # the start's last step: the tag
    assert causes == [CancelCause.CONSUMER_TIMEOUT]
    assert (timed_out.lost, timed_out.cancel_token.cancelled) == (True, True)
    assert (recent.lost, recent.cancel_token.cancelled) == (False, False)
    assert watch.in_flight == {recent}  # settled as usual, on the same channel
    assert consumer.tag not in (None, first_tag)  # a new tag: 4.3 refuses the old one
    assert client.consumed == [{"x-consumer-timeout": 10000}] * 2


async def test_a_cancel_with_nothing_held_past_the_timeout_withdraws_nothing() -> None:
    consumer, client, watch, causes = await started(timeout_s=None)
    running = held(3600.0)  # no timeout of the worker's own: not a consumer timeout
    watch.in_flight.add(running)
    client.again.clear()
    assert consumer.tag is not None
    client.cancel_from_broker(consumer.tag)
    await client.again.wait()
    assert causes == [CancelCause.OTHER]
    assert running.lost is False
    assert client.consumed == [None, None]


async def test_an_old_consumers_cancel_and_one_while_stopping_are_ignored() -> None:
    consumer, client, watch, causes = await started()
    client.cancel_from_broker("ctag1.0")  # not the consumer's tag
    tag = consumer.tag
    watch.stopping = True
    assert tag is not None
    client.cancel_from_broker(tag)
    assert causes == []
    assert consumer.tag == tag


async def test_stop_cancels_the_consumer_once() -> None:
    consumer, client, _, _ = await started()
    tag = consumer.tag
    await consumer.stop()
    await consumer.stop()
    assert client.cancelled == [tag]
    assert consumer.tag is None


async def test_a_reopened_channel_gets_a_consumer_with_a_new_tag() -> None:
    consumer, client, watch, _ = await started()
    first_tag = consumer.tag
    watch.closed(None, ConnectionError("lost"))
    await client.reopen()
    assert watch.open
    assert consumer.tag not in (None, first_tag)


@pytest.mark.parametrize("arguments", [None, {"x-consumer-timeout": 5000}])
async def test_the_arguments_go_with_every_consume(arguments: dict[str, int] | None) -> None:
    consumer, client, _, _ = await started(timeout_s=None)
    consumer.arguments = arguments
    await client.reopen()
    assert client.consumed == [None, arguments]


async def test_a_cancel_right_after_a_late_settle_is_that_deliverys_timeout() -> None:
    # A handler that blocked the event loop past the timeout ends, and its delivery is settled
    # (given back at the hold's end), before the loop reads the broker's cancel.
    consumer, client, watch, causes = await started(timeout_s=10.0)
    late = held(10.0)
    watch.in_flight.add(late)
    consumer.settled(late)
    assert watch.in_flight == set()
    client.again.clear()
    assert consumer.tag is not None
    client.cancel_from_broker(consumer.tag)
    await client.again.wait()
    assert causes == [CancelCause.CONSUMER_TIMEOUT]


async def test_a_settle_in_time_makes_no_later_cancel_a_timeout() -> None:
    consumer, client, watch, causes = await started(timeout_s=10.0)
    on_time = held(2.0)
    watch.in_flight.add(on_time)
    consumer.settled(on_time)
    assert consumer.tag is not None
    client.cancel_from_broker(consumer.tag)
    assert causes == [CancelCause.OTHER]


async def test_a_later_cancel_of_an_earlier_consumer_withdraws_its_timed_out_deliveries() -> None:
    # RabbitMQ 4.3 times each delivery of a cancelled consumer out on its own, with another
    # basic.cancel of the old tag: only that consumer's delivery held past the timeout goes.
    consumer, client, watch, causes = await started(timeout_s=10.0)
    first_tag = consumer.tag
    assert first_tag is not None
    client.again.clear()
    client.cancel_from_broker(first_tag)
    await client.again.wait()
    await asyncio.sleep(0)
    current = consumer.tag
    older = held(10.0, first_tag)  # ran on after the first cancel, timed out since
    newer = held(10.0, str(current))
    watch.in_flight.update({older, newer})
    client.cancel_from_broker(first_tag)
    assert (older.lost, newer.lost) == (True, False)
    assert consumer.tag == current  # today's consumer is not touched
    assert causes == [CancelCause.OTHER, CancelCause.CONSUMER_TIMEOUT]
    assert len(client.consumed) == 2
