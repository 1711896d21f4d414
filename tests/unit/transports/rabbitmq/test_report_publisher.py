"""The RabbitMQ report publisher never waits on a channel it replaced, and never sends a frame
on a channel the broker has closed.

After three refusals in a row the publisher opens a fresh channel and closes the old one for
good (aio-pika never reopens a channel closed on purpose). A report that waited for its turn
while the channel was swapped goes out on the fresh channel: before, it took the old one,
waited for it to reopen while holding the order lock, and every later report waited behind it.

aiormq answers the broker's ``channel.close`` (a report over ``max_message_size``) at once and
marks the channel closed steps later; a report that took aiormq's channel lock in between went
out on the freed channel, and RabbitMQ 4.0 closed the whole connection (``504``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
import pytest
from aiormq import spec

from async_task_api_worker.errors import PublishError
from async_task_api_worker.protocol.reports import StartedReport, encode_report
from async_task_api_worker.transports.rabbitmq.reports import (
    REFUSALS_PER_CHANNEL,
    ReportPublisher,
)


class Underlay:
    """aiormq's channel: nacks the first ``nacks`` publishes (a full output queue); its lock
    is held while a publish's frames are written, and its close event is set (as aiormq's) when
    the broker's ``channel.close`` is answered, before ``is_closed``."""

    def __init__(self, name: str, nacks: int = 0) -> None:
        self.name = name
        self.nacks = nacks
        self.published: list[bytes] = []
        self.is_closed = False
        self.writing = asyncio.Lock()
        self._Channel__close_event = asyncio.Event()  # aiormq's own attribute

    @property
    def lock(self) -> asyncio.Lock:
        return self.writing

    def close_received(self) -> None:
        self._Channel__close_event.set()

    async def basic_publish(self, body: bytes, **_: Any) -> None:
        await asyncio.sleep(0)  # the confirm comes later
        if self.nacks:
            self.nacks -= 1
            raise aiormq.exceptions.DeliveryError(None, spec.Basic.Nack())
        self.published.append(body)


class Channel:
    """What the publisher uses of aio-pika's robust channel."""

    def __init__(self, name: str, nacks: int = 0) -> None:
        self.underlay = Underlay(name, nacks)
        self.is_closed = False
        self.reopen_callbacks: set[Any] = set()

    def reopen(self) -> Underlay:
        """aio-pika's robust channel reopened: a fresh aiormq channel behind it."""
        self.underlay = Underlay(f"{self.underlay.name}-reopened")
        for callback in self.reopen_callbacks:
            callback(self)
        return self.underlay

    async def get_underlay_channel(self) -> Underlay:
        return self.underlay

    async def close(self) -> None:
        self.is_closed = True


class Connection:
    """Opens the first channel at once; the next ones once ``gate`` is set (an RPC)."""

    def __init__(self) -> None:
        self.opened: list[Channel] = []
        self.gate = asyncio.Event()

    async def channel(self, **_: Any) -> Channel:
        if self.opened:
            await self.gate.wait()
        channel = Channel(f"channel-{len(self.opened)}", nacks=0 if self.opened else 3)
        self.opened.append(channel)
        return channel


class Link:
    """A connection whose sender can be held back (``unblocked``), as an alarm would."""

    def __init__(self) -> None:
        self.connection = Connection()
        self.unblocked = asyncio.Event()
        self.unblocked.set()
        self.blocked = False
        self.alive = True

    async def open(self) -> None:
        return None

    async def wait_unblocked(self) -> None:
        await self.unblocked.wait()


def started(task_id: str) -> Any:
    fields = {
        "protocol_version": 1,
        "task_id": task_id,
        "client_id": "c",
        "service": "svc",
        "attempt": 1,
        "timestamp": "2026-12-04T00:00:00.000000Z",
    }
    return encode_report(StartedReport.model_construct(**fields))


async def test_a_report_waiting_across_a_channel_swap_never_waits_on_the_replaced_channel() -> None:
    link = Link()
    publisher = ReportPublisher(link, "out")  # type: ignore[arg-type]
    await publisher.open()
    old = link.connection.opened[0]
    for n in range(REFUSALS_PER_CHANNEL):  # a full queue: the third refusal opens a fresh one
        with pytest.raises(PublishError):
            await publisher.send(started(f"t-{n}"))
    link.unblocked.clear()  # the next report takes its turn, and waits at the sender
    waiting = asyncio.create_task(publisher.send(started("t-waiting")))
    for _ in range(3):
        await asyncio.sleep(0)
    link.connection.gate.set()  # the fresh channel opens while that report has its turn
    for _ in range(3):
        await asyncio.sleep(0)
    link.unblocked.set()
    await asyncio.wait_for(waiting, timeout=5)  # it went out, on a channel still open
    await asyncio.wait_for(publisher.send(started("t-after")), timeout=5)
    fresh = link.connection.opened[1]
    assert old.is_closed
    assert fresh.underlay.published == [started("t-after").body]


async def test_a_report_behind_one_the_channel_was_closed_for_goes_out_after_the_reopen() -> None:
    link = Link()
    publisher = ReportPublisher(link, "out")  # type: ignore[arg-type]
    await publisher.open()
    channel = link.connection.opened[0]
    channel.underlay.nacks = 0
    closed = channel.underlay
    await closed.writing.acquire()  # a report too large is being written
    waiting = asyncio.create_task(publisher.send(started("t-behind")))
    for _ in range(3):
        await asyncio.sleep(0)
    closed.close_received()  # the broker closed the channel for it; aiormq answered close-ok
    closed.writing.release()  # its frames have left; aiormq does not count it closed yet
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done()  # no frame on the closed channel: it waits for the reopen
    reopened = channel.reopen()
    await asyncio.wait_for(waiting, timeout=5)
    assert closed.published == []
    assert reopened.published == [started("t-behind").body]
