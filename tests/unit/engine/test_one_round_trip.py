"""``started`` is confirmed while the handler runs: one confirm round trip per task.

The terminal report goes out behind ``started`` without waiting for its confirm, the delivery
is acked only once both are confirmed, and the order on the wire never changes, whatever the
broker refuses and when.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from async_task_api_worker.errors import MessageTooLargeError, PublishError
from async_task_api_worker.ports import Action, Delivery, Outcome
from async_task_api_worker.protocol import EncodedReport
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.unit.engine.test_pushback import deliver, engine_for

#: A hold with room for a retry (the last try starts 0.5 s before the hold ends).
ROOM_TO_RETRY = {"hold_s": 2.5}
SHORT_HOLD = {"hold_s": 0.5}


class Input(BaseModel):
    pass


class Output(BaseModel):
    text: str = "done"


class Watched(InMemoryTransport):
    """Sets ``sent[type]`` as each report goes on the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[str, asyncio.Event] = {}

    def event(self, report_type: str) -> asyncio.Event:
        return self.sent.setdefault(report_type, asyncio.Event())

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        await super().publish(delivery, report)
        self.event(report.type).set()


def quick_worker(calls: list[str]) -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        calls.append("ran")
        return Output()

    return worker


def types(transport: InMemoryTransport) -> list[str]:
    return [sent.report.type for sent in transport.published]


async def test_the_terminal_report_goes_out_before_started_is_confirmed() -> None:
    transport = Watched()
    transport.hold_confirms()
    handling = asyncio.create_task(
        engine_for(quick_worker([]), transport).handle(deliver(transport))
    )
    await transport.event("success").wait()
    # Both are on the wire, in order, and neither is confirmed: the delivery is not acked yet.
    assert types(transport) == ["started", "success"]
    assert not transport.acked and not handling.done()
    transport.release_confirms()
    settlement = await handling
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert len(transport.acked) == 1
    assert [sent.report.properties.message_id for sent in transport.published] == [
        "t-1/1/0",
        "t-1/1/1",
    ]


async def test_progress_waits_for_the_started_confirm() -> None:
    transport = Watched()
    transport.hold_confirms()
    asked = asyncio.Event()
    go_on = asyncio.Event()
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.5)
        asked.set()
        await go_on.wait()
        return Output()

    handling = asyncio.create_task(
        engine_for(worker, transport, worker_progress_min_interval_s=0.0).handle(deliver(transport))
    )
    await asked.wait()
    await asyncio.sleep(0)  # the throttle's publish has started, and waits
    assert types(transport) == ["started"]
    transport.release_confirms()
    await transport.event("progress").wait()
    go_on.set()
    settlement = await handling
    assert settlement.outcome is Outcome.SUCCESS
    assert types(transport) == ["started", "progress", "success"]


async def test_a_started_refused_behind_a_confirmed_terminal_report_still_acks_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = Watched()
    transport.hold_confirms()
    transport.refuse_next_confirm("started")
    handling = asyncio.create_task(
        engine_for(quick_worker([]), transport).handle(deliver(transport))
    )
    await transport.event("success").wait()
    transport.release_confirms()
    settlement = await handling
    # Giving it back would run the task again and report it twice: the one terminal stands.
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert types(transport) == ["success"]
    assert "without started" in caplog.text


async def test_when_both_are_refused_started_is_sent_again_ahead_of_the_terminal_report() -> None:
    transport = Watched()
    transport.hold_confirms()
    transport.refuse_next_confirm("started")
    transport.refuse_next_confirm("success")
    handling = asyncio.create_task(
        engine_for(quick_worker([]), transport, **ROOM_TO_RETRY).handle(deliver(transport))
    )
    await transport.event("success").wait()
    transport.release_confirms()
    settlement = await handling
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert types(transport) == ["started", "success"]  # the second tries, in order
    assert [sent.report.properties.message_id for sent in transport.published] == [
        "t-1/1/0",
        "t-1/1/1",
    ]


async def test_a_started_that_gives_up_stops_the_running_handler_and_gives_the_delivery_back() -> (
    None
):
    transport = InMemoryTransport()
    transport.fail_next_publish("started", times=None)
    cancelled = asyncio.Event()
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Output()

    settlement = await engine_for(worker, transport, **SHORT_HOLD).handle(deliver(transport))
    assert cancelled.is_set()
    assert (settlement.outcome, settlement.action) == (Outcome.PUBLISH_FAILED, Action.NACK_REQUEUE)
    assert settlement.requeue_counted is False
    assert settlement.reason == "report_held_until_consumer_timeout"
    assert transport.published == []


async def test_a_handler_done_before_started_gives_up_publishes_nothing_after_it() -> None:
    calls: list[str] = []
    transport = InMemoryTransport()
    transport.fail_next_publish("started", times=None)
    settlement = await engine_for(quick_worker(calls), transport, **SHORT_HOLD).handle(
        deliver(transport)
    )
    assert calls == ["ran"]
    assert settlement.outcome is Outcome.PUBLISH_FAILED
    assert transport.published == []  # the success waited for started, and went nowhere


async def test_a_retry_settles_without_waiting_for_a_held_started() -> None:
    transport = InMemoryTransport()
    transport.hold_confirms()
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        from async_task_api_worker import RetryableError

        raise RetryableError("LATER", "try again", retry_delay_s=0)

    settlement = await engine_for(worker, transport).handle(deliver(transport))
    assert (settlement.outcome, settlement.action) == (Outcome.RETRY, Action.NACK_REQUEUE)
    assert settlement.requeue_counted is True


class ClosesOnTooLarge(Watched):
    """A broker whose channel closes on a report over ``limit`` bytes, with all unconfirmed.

    The ``started`` ahead of the large report is lost with the channel (its confirm fails)
    before the size refusal is raised, as RabbitMQ's channel close does.
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        if len(report.body) > self.limit:
            self.release_confirms()  # the close fails every pending confirm...
            await self.event("started-lost").wait()  # ...and the worker sees it first
            raise MessageTooLargeError(f"message size {len(report.body)} > {self.limit}")
        await super().publish(delivery, report)

    async def send(
        self,
        delivery: Delivery,
        report: EncodedReport,
        *,
        placed: Callable[[], None] | None = None,
    ) -> None:
        try:
            await super().send(delivery, report, placed=placed)
        except PublishError:
            if report.type == "started":
                self.event("started-lost").set()
            raise


async def test_a_result_too_large_fails_with_its_code_even_when_started_was_lost_with_it() -> None:
    transport = ClosesOnTooLarge(limit=2048)
    transport.hold_confirms()
    transport.refuse_next_confirm("started")
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output(text="x" * 5000)

    settlement = await engine_for(worker, transport, **ROOM_TO_RETRY).handle(deliver(transport))
    # The failure carries the lost started ahead of itself: no give-back, no second run.
    assert (settlement.outcome, settlement.action) == (Outcome.FAILURE, Action.CONCLUDE)
    assert settlement.code == "RESULT_TOO_LARGE"
    assert types(transport) == ["started", "failure"]


async def test_a_delivery_runs_in_two_tasks_besides_its_own() -> None:
    """The lean path: ``started`` held in the background, and the handler.

    Waits, stops and the settle run in the delivery's own task (``engine.waits``), so a
    successful task costs no task per report, per stop signal or per settle; the handler's
    own task is the one task of the call (a handler that swallows its cancel can be abandoned).
    """
    transport = InMemoryTransport()
    handler_tasks: list[asyncio.Task[Any] | None] = []
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        handler_tasks.append(asyncio.current_task())
        return Output()

    engine = engine_for(worker, transport)
    loop = asyncio.get_running_loop()
    created: list[asyncio.Future[Any]] = []
    default_factory = loop.get_task_factory()

    def counting_factory(
        event_loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        if default_factory is not None:
            task = default_factory(event_loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=event_loop, **kwargs)
        created.append(task)
        return task

    delivery = deliver(transport)
    loop.set_task_factory(counting_factory)  # type: ignore[arg-type]
    try:
        settlement = await engine.handle(delivery)
    finally:
        loop.set_task_factory(default_factory)
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert len(created) == 2
    assert handler_tasks != [asyncio.current_task()] and handler_tasks[0] in created
