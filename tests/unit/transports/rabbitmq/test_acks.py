"""The consume channel's settles: sent at the end of the loop's turn, acks batched with multiple."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_task_api_worker.transports.rabbitmq.acks import ChannelSettles, Frame, Settle, plan


def apply(outstanding: set[int], frames: list[Frame]) -> dict[int, Settle]:
    """What a broker does with ``frames`` (AMQP 0-9-1): each tag settled, and how.

    An unknown tag closes the channel (PRECONDITION_FAILED): here, an assertion.
    """
    settled: dict[int, Settle] = {}
    for frame in frames:
        assert frame.tag in outstanding, f"unknown delivery tag {frame.tag}"
        covered = (
            {tag for tag in outstanding if tag <= frame.tag} if frame.multiple else {frame.tag}
        )
        assert frame.settle is Settle.ACK or not frame.multiple
        for tag in covered:
            settled[tag] = frame.settle
        outstanding -= covered
    return settled


@st.composite
def channels(draw: st.DrawFn) -> tuple[set[int], dict[int, Settle]]:
    """Unsettled tags of a channel, and the settles asked for some of them."""
    unsettled = draw(st.sets(st.integers(min_value=1, max_value=40), max_size=30))
    # Each unsettled tag still runs (None) or is asked for one settle: acks most often.
    choices = st.sampled_from([None, Settle.ACK, Settle.ACK, *Settle])
    asked = {tag: settle for tag in sorted(unsettled) if (settle := draw(choices)) is not None}
    return unsettled, asked


@given(channels())
def test_a_plan_settles_exactly_what_was_asked_each_as_asked(
    channel: tuple[set[int], dict[int, Settle]],
) -> None:
    unsettled, asked = channel
    frames = plan(unsettled, asked)
    outstanding = set(unsettled)
    assert apply(outstanding, frames) == asked  # nothing else, not a tag still running
    assert outstanding == unsettled - set(asked)
    assert [frame.tag for frame in frames] == sorted(frame.tag for frame in frames)


def test_consecutive_acks_go_as_one_multiple_ack() -> None:
    frames = plan({3, 4, 5, 6}, dict.fromkeys((3, 4, 5, 6), Settle.ACK))
    assert frames == [Frame(Settle.ACK, 6, multiple=True)]


def test_a_running_delivery_breaks_the_run_and_the_acks_above_it_go_alone() -> None:
    asked = {1: Settle.ACK, 2: Settle.ACK, 4: Settle.ACK, 5: Settle.ACK}
    frames = plan({1, 2, 3, 4, 5}, asked)  # 3 still runs
    assert frames == [
        Frame(Settle.ACK, 2, multiple=True),
        Frame(Settle.ACK, 4),
        Frame(Settle.ACK, 5),
    ]


def test_a_nack_between_acks_goes_alone_and_never_inside_a_multiple() -> None:
    asked = {1: Settle.ACK, 2: Settle.NACK_REQUEUE, 3: Settle.ACK, 4: Settle.ACK}
    assert plan({1, 2, 3, 4}, asked) == [
        Frame(Settle.ACK, 1),
        Frame(Settle.NACK_REQUEUE, 2),
        Frame(Settle.ACK, 4, multiple=True),
    ]


class RecordingChannel:
    """Records the settle frames as aiormq's channel would write them."""

    def __init__(self, *, fail: bool = False) -> None:
        self.frames: list[tuple[str, int, bool]] = []
        self.fail = fail

    async def basic_ack(self, tag: int, *, multiple: bool) -> None:
        if self.fail:
            raise ConnectionError("channel closed")
        self.frames.append(("ack", tag, multiple))

    async def basic_nack(self, tag: int, *, requeue: bool) -> None:
        self.frames.append(("nack", tag, requeue))

    async def basic_reject(self, tag: int, *, requeue: bool) -> None:
        self.frames.append(("reject", tag, requeue))


async def test_acks_asked_in_one_turn_are_sent_as_one_frame() -> None:
    channel = RecordingChannel()
    settles = ChannelSettles(channel)
    for tag in range(1, 9):
        settles.received(tag)
    await asyncio.gather(*(settles.settle(tag, Settle.ACK) for tag in range(1, 9)))
    assert channel.frames == [("ack", 8, True)]


async def test_a_settle_stands_when_its_awaiter_is_cancelled() -> None:
    channel = RecordingChannel()
    settles = ChannelSettles(channel)
    settles.received(1)
    settles.received(2)
    waiting = settles.settle(1, Settle.REJECT_REQUEUE)
    waiting.cancel()
    await settles.settle(2, Settle.REJECT)
    assert channel.frames == [("reject", 1, True), ("reject", 2, False)]


async def test_a_tag_never_seen_keeps_every_ack_above_it_single() -> None:
    channel = RecordingChannel()
    settles = ChannelSettles(channel)
    settles.received(1)
    settles.received(3)  # 2 was handed out, but never seen here
    settles.received(4)
    await asyncio.gather(*(settles.settle(tag, Settle.ACK) for tag in (1, 3, 4)))
    assert channel.frames == [("ack", 1, False), ("ack", 3, False), ("ack", 4, False)]


async def test_a_settle_the_channel_refuses_fails_its_awaiter() -> None:
    settles = ChannelSettles(RecordingChannel(fail=True))
    settles.received(1)
    with pytest.raises(ConnectionError):
        await settles.settle(1, Settle.ACK)


async def test_settles_asked_while_a_batch_is_sent_go_in_the_next_batch() -> None:
    channel = RecordingChannel()
    settles = ChannelSettles(channel)
    for tag in (1, 2, 3):
        settles.received(tag)
    first = settles.settle(1, Settle.ACK)
    await asyncio.sleep(0)  # the batch of tag 1 is on its way
    await asyncio.gather(first, settles.settle(2, Settle.ACK), settles.settle(3, Settle.ACK))
    assert channel.frames == [("ack", 1, False), ("ack", 3, True)]
