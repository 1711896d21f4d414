"""The in-memory broker behaves like a quorum (or classic) queue where the engine cares."""

from __future__ import annotations

import asyncio

import pytest

from async_task_api_worker.errors import PublishError, SettleError
from async_task_api_worker.ports import Transport
from async_task_api_worker.protocol import StartedReport, encode_report
from async_task_api_worker.transports.memory import InMemoryTransport, MemoryDelivery


def report(kind: str = "started") -> object:
    started = StartedReport(
        task_id="t", client_id="c", service="s", attempt=1, timestamp="2026-01-01T00:00:00.000000Z"
    )
    return encode_report(started)


def test_it_implements_the_transport_protocol() -> None:
    assert isinstance(InMemoryTransport(), Transport)


async def test_the_first_delivery_has_no_count_header_then_counts_rise() -> None:
    transport = InMemoryTransport()
    transport.put(b"x", {"h": 1})
    first = transport.take()
    assert first is not None
    assert (first.delivery_count, first.redelivered, first.headers) == (0, False, {"h": 1})
    await first.retry()
    second = transport.take()
    assert second is not None
    assert (second.delivery_count, second.redelivered) == (1, True)
    assert second.headers["x-delivery-count"] == 1
    await second.give_back()
    third = transport.take()
    assert third is not None and third.delivery_count == 1


async def test_a_classic_queue_gives_no_count() -> None:
    transport = InMemoryTransport(count_deliveries=False)
    assert transport.counts_deliveries is False
    transport.put(b"x")
    first = transport.take()
    assert first is not None and first.delivery_count is None
    await first.retry()
    second = transport.take()
    assert second is not None
    assert (second.delivery_count, second.redelivered) == (None, True)
    assert "x-delivery-count" not in second.headers


async def test_the_queue_delivery_limit_dead_letters() -> None:
    transport = InMemoryTransport(queue_delivery_limit=1)
    transport.put(b"x")
    for _ in range(2):
        delivery = transport.take()
        assert delivery is not None
        await delivery.retry()
    assert transport.ready_count == 0
    assert [letter.reason for letter in transport.dead_letters] == ["delivery_limit"]


async def test_settling_twice_is_refused() -> None:
    transport = InMemoryTransport()
    transport.put(b"x")
    delivery = transport.take()
    assert delivery is not None
    await delivery.ack()
    for settle in (delivery.ack(), delivery.reject()):
        with pytest.raises(SettleError):
            await settle


async def test_deliveries_respect_the_prefetch_and_stop() -> None:
    transport = InMemoryTransport(prefetch=2)
    await transport.connect()
    for n in range(3):
        transport.put(str(n).encode())
    received: list[MemoryDelivery] = []
    arrived = asyncio.Event()

    async def consume() -> None:
        async for delivery in transport.deliveries():
            received.append(delivery)
            arrived.set()

    async def until_received(count: int) -> None:
        while len(received) < count:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 5)

    consumer = asyncio.create_task(consume())
    await until_received(2)
    await asyncio.sleep(0)  # one more turn for the consumer: the prefetch holds the third back
    assert len(received) == 2 and transport.unacked_count == 2
    await received[0].ack()
    await until_received(3)
    await received[1].ack()
    await received[2].ack()
    await transport.join()
    await transport.close()
    await consumer
    assert [d.message_id for d in received] == [1, 2, 3]  # in the order put


async def test_fail_next_publish_fails_once_for_the_named_type() -> None:
    transport = InMemoryTransport()
    transport.put(b"x")
    delivery = transport.take()
    assert delivery is not None
    transport.fail_next_publish("success")
    await transport.publish(delivery, report())  # type: ignore[arg-type]  # a started passes
    transport.fail_next_publish()
    with pytest.raises(PublishError):
        await transport.publish(delivery, report())  # type: ignore[arg-type]
    await transport.publish(delivery, report())  # type: ignore[arg-type]
    assert len(transport.published) == 2


def test_take_by_id_leaves_the_others() -> None:
    transport = InMemoryTransport()
    first = transport.put(b"1")
    second = transport.put(b"2")
    assert transport.take(second.message_id) is not None
    assert transport.take(second.message_id) is None
    delivery = transport.take()
    assert delivery is not None and delivery.message_id == first.message_id
    assert transport.take() is None
