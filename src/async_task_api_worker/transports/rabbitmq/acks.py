"""The settles of one consume channel: queued at once, sent together, acks batched.

A settle (``basic.ack``, ``basic.nack``, ``basic.reject``) is taken when it is asked for, and
sent at the end of the event loop's turn with every other settle asked for in that turn, by a
task of this module's own: an awaiter that is cancelled does not take the settle back, and a
burst of tasks that end together (their reports confirmed by one ``basic.ack(multiple)`` from
the broker) costs one ack frame.

``multiple`` (AMQP 0-9-1, ``basic.ack``): the broker settles every outstanding delivery of the
channel up to and including the tag. It is used only over a run of tags that are all taken for
an ack: every tag of the channel at or below it that is still unsettled must be asked to be
acked in this batch, and every tag the broker handed out up to it must have been seen
(:meth:`ChannelSettles.received`). A tag that is still running, or whose delivery was never
seen, breaks the run, so ``multiple`` can never settle a delivery that was not decided.
Nacks and rejects always go one by one: from RabbitMQ 4.3 a reject counts towards the
delivery limit (``x-delivery-count``) and a nack does not (only ``x-acquired-count`` moves:
docs/brokers.md, "Attempt counting per version"), and each keeps its own ``requeue``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["ChannelSettles", "Frame", "Settle", "plan"]


class Settle(Enum):
    """A settle of one delivery: its AMQP method, and whether the broker requeues it."""

    ACK = ("ack", False)
    NACK_REQUEUE = ("nack", True)
    REJECT_REQUEUE = ("reject", True)
    REJECT = ("reject", False)

    @property
    def method(self) -> str:
        """``ack``, ``nack`` or ``reject`` (``basic.<method>``)."""
        return str(self.value[0])

    @property
    def requeue(self) -> bool:
        """The ``requeue`` flag of a nack or reject."""
        return bool(self.value[1])


@dataclass(frozen=True, slots=True)
class Frame:
    """One settle frame to send: ``basic.ack(tag, multiple)``, or a nack or reject of one tag."""

    settle: Settle
    tag: int
    multiple: bool = False


def plan(unsettled: Iterable[int], asked: Mapping[int, Settle]) -> list[Frame]:
    """The frames that settle ``asked``, in the order to send them.

    Args:
        unsettled: every tag of the channel that is not settled yet (asked ones included) and
            every tag the broker may have handed out without it being seen.
        asked: the settles to send now, by tag; each tag is in ``unsettled``.

    Returns:
        Frames in ascending tag order; a run of two or more consecutive unsettled tags that are
        all asked to be acked is one ``basic.ack(multiple=True)`` at the run's highest tag,
        which settles exactly that run (the tags below it are settled already, or are sent
        in this plan ahead of it).
    """
    frames: list[Frame] = []
    open_below = False  # an unsettled tag that is not asked for stays open below
    run_end, run_length = 0, 0

    def close_run() -> None:
        nonlocal run_end, run_length
        if run_length:
            frames.append(Frame(Settle.ACK, run_end, multiple=run_length > 1))
        run_end, run_length = 0, 0

    for tag in sorted(unsettled):
        settle = asked.get(tag)
        if settle is Settle.ACK and not open_below:
            run_end, run_length = tag, run_length + 1
            continue
        close_run()
        if settle is None:
            open_below = True  # from here on, ``multiple`` would settle it: acks go alone
        else:
            frames.append(Frame(settle, tag))
    close_run()
    return frames


class ChannelSettles:
    """The settles of one consume channel (its delivery tags start at 1).

    Args:
        channel: the channel's AMQP client object, with ``basic_ack``, ``basic_nack`` and
            ``basic_reject`` (aiormq's). Frames are sent one at a time, each awaited until it is
            written: the connection's write queue holds 10 frames, and a frame parked on a full
            queue of a connection that drops is never woken (a written frame's wait is failed
            when its channel closes).
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._unsettled: set[int] = set()
        self._highest_seen = 0
        self._asked: dict[int, Settle] = {}
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._flushing: asyncio.Task[None] | None = None

    def received(self, tag: int) -> None:
        """A delivery of ``tag`` was handed out; tags the broker skipped stay unsettled."""
        if tag > self._highest_seen:
            # Tags between the last one seen and this one, if any, were never seen here: they
            # stay unsettled, so that no ``multiple`` ever covers them.
            self._unsettled.update(range(self._highest_seen + 1, tag + 1))
            self._highest_seen = tag
        else:
            self._unsettled.add(tag)

    def settle(self, tag: int, settle: Settle) -> asyncio.Future[None]:
        """Take the settle of ``tag`` now; it is sent at the end of this turn of the loop.

        Returns:
            A future that resolves once its frame is written to the connection, or fails with
            the client's error (the channel closed...). Cancelling it does not take the
            settle back.
        """
        if tag not in self._unsettled:
            self.received(tag)
        self._asked[tag] = settle
        waiting = asyncio.get_running_loop().create_future()
        self._waiting[tag] = waiting
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())
        return waiting

    async def _flush(self) -> None:
        try:
            waiting: dict[int, asyncio.Future[None]] = {}
            while self._asked:
                asked, self._asked = self._asked, {}
                waiting = {tag: self._waiting.pop(tag) for tag in asked}
                frames = plan(self._unsettled, asked)
                settled_to = 0
                for frame in frames:
                    # A ``multiple`` ack settles the asked tags since the frame before it.
                    covered = (
                        [tag for tag in sorted(asked) if settled_to < tag <= frame.tag]
                        if frame.multiple
                        else [frame.tag]
                    )
                    error = await self._send(frame)
                    for tag in covered:
                        self._unsettled.discard(tag)
                        _resolve(waiting.pop(tag), error)
                    settled_to = frame.tag
        except BaseException as exc:  # the loop is closing: no awaiter may wait forever
            for pending in [*waiting.values(), *self._waiting.values()]:
                _resolve(pending, exc if isinstance(exc, Exception) else ConnectionError("closed"))
            raise
        finally:
            self._flushing = None

    async def _send(self, frame: Frame) -> BaseException | None:
        try:
            if frame.settle is Settle.ACK:
                await self.channel.basic_ack(frame.tag, multiple=frame.multiple)
            elif frame.settle is Settle.NACK_REQUEUE:
                await self.channel.basic_nack(frame.tag, requeue=True)
            else:
                await self.channel.basic_reject(frame.tag, requeue=frame.settle.requeue)
        except Exception as exc:
            return exc
        return None


def _resolve(waiting: asyncio.Future[None], error: BaseException | None) -> None:
    if waiting.done():  # its awaiter gave up on it; the settle went out all the same
        return
    if error is None:
        waiting.set_result(None)
    else:
        waiting.set_exception(error)
