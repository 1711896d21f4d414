"""When the broker pushes back on reports: held deliveries, late confirms, size refusals."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from async_task_api_worker.engine import Engine, StopSignal
from async_task_api_worker.engine.hold import PLACED_CONFIRM_WAIT_S
from async_task_api_worker.errors import MessageTooLargeError
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.ports import Action, Delivery, Outcome, Settlement
from async_task_api_worker.protocol import EncodedReport
from async_task_api_worker.runtime.hooks import GIVE_BACK_TIMEOUT_S
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.conftest import decision_records

BODY = b'{"protocol_version":1,"task_id":"t-1","client_id":"c","service":"svc","input":{}}'


class Input(BaseModel):
    pass


class Output(BaseModel):
    text: str = ""


def worker_returning(text: str, calls: list[int]) -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        calls.append(1)
        return Output(text=text)

    return worker


class SlowConfirm(InMemoryTransport):
    """Confirms each terminal report only once ``confirm`` is set (a late confirm)."""

    def __init__(self) -> None:
        super().__init__()
        self.confirm = asyncio.Event()
        self.waiting = asyncio.Event()

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        if report.type == "success":
            self.waiting.set()
            await self.confirm.wait()
        await super().publish(delivery, report)


class SizeLimited(InMemoryTransport):
    """A broker whose ``max_message_size`` is ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.refused: list[int] = []

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        if len(report.body) > self.limit:
            self.refused.append(len(report.body))
            size = len(report.body)
            raise MessageTooLargeError(f"message size {size} is larger than {self.limit}")
        await super().publish(delivery, report)


def engine_for(
    worker: Worker, transport: InMemoryTransport, hold_s: float | None = None, **settings: object
) -> Engine:
    return Engine(
        worker,
        load_settings(settings, read_environment=False),
        transport,
        InlineExecutor(),
        hold_s=hold_s,
    )


def deliver(transport: InMemoryTransport) -> Delivery:
    transport.put(BODY)
    delivery = transport.take()
    assert delivery is not None
    return delivery


async def grace_over_once(
    transport: InMemoryTransport, reached: asyncio.Event
) -> tuple[asyncio.Task[Settlement], float]:
    """Handle one delivery; once ``reached`` is set, drain and end the grace period at once.

    Returns the delivery's task and when the grace period ended, on the loop's clock.
    """
    engine = engine_for(worker_returning("ok", []), transport)
    stop = StopSignal()
    handling = asyncio.create_task(engine.handle(deliver(transport), stop))
    await reached.wait()
    stop.draining.cancel("shutdown")
    aborted_at = asyncio.get_running_loop().time()
    stop.aborted.cancel("grace period over")
    return handling, aborted_at


async def test_a_late_confirm_is_waited_for_not_taken_as_a_refusal() -> None:
    transport = SlowConfirm()
    engine = engine_for(worker_returning("ok", []), transport)
    handling = asyncio.create_task(engine.handle(deliver(transport)))
    await transport.waiting.wait()
    await asyncio.sleep(0.3)  # past the old 0.1 s first retry: nothing was given up meanwhile
    assert not handling.done()
    transport.confirm.set()
    settlement = await handling
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert [r.report.type for r in transport.published] == ["started", "success"]


async def test_a_report_held_when_the_grace_period_ends_is_given_back_as_a_shutdown() -> None:
    transport = SlowConfirm()
    handling, _ = await grace_over_once(transport, transport.waiting)
    settlement = await asyncio.wait_for(handling, 5)
    assert (settlement.outcome, settlement.action) == (
        Outcome.SHUTDOWN_REQUEUED,
        Action.NACK_REQUEUE,
    )
    assert settlement.requeue_counted is False
    assert settlement.reason == "grace_period_over"


class ConfirmsHeldAfterStarted(InMemoryTransport):
    """Holds every confirm from the terminal report on: it is on the wire, unconfirmed."""

    def __init__(self) -> None:
        super().__init__()
        self.on_wire = asyncio.Event()

    async def send(self, delivery: Delivery, report: EncodedReport, *, placed: Any = None) -> None:
        if report.type in ("success", "failure"):
            self.hold_confirms()

        def on_wire() -> None:
            if placed is not None:
                placed()
            if report.type in ("success", "failure"):
                self.on_wire.set()

        await super().send(delivery, report, placed=on_wire)


async def test_a_terminal_report_on_the_wire_when_the_grace_ends_gets_its_confirm_not_a_rerun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The breaker's duplicate: the success was in the broker, its confirm on the way, and the
    end of the grace period gave the delivery back, so the task ran and reported again."""
    transport = ConfirmsHeldAfterStarted()
    handling, _ = await grace_over_once(transport, transport.on_wire)
    asyncio.get_running_loop().call_soon(transport.release_confirms)  # the confirm arrives
    settlement = await asyncio.wait_for(handling, 5)
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert [r.report.type for r in transport.published] == ["started", "success"]


async def test_a_terminal_report_on_the_wire_waits_for_its_confirm_a_bounded_time() -> None:
    transport = ConfirmsHeldAfterStarted()
    handling, aborted_at = await grace_over_once(transport, transport.on_wire)
    settlement = await asyncio.wait_for(handling, PLACED_CONFIRM_WAIT_S + 5)
    waited_s = asyncio.get_running_loop().time() - aborted_at
    assert (settlement.outcome, settlement.reason) == (
        Outcome.SHUTDOWN_REQUEUED,
        "grace_period_over",
    )
    assert PLACED_CONFIRM_WAIT_S <= waited_s < GIVE_BACK_TIMEOUT_S  # within the drain's allowance


async def test_a_report_the_broker_refuses_for_its_size_concludes_at_once_as_too_large(
    decisions: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    transport = SizeLimited(limit=2048)
    engine = engine_for(worker_returning("x" * 5000, calls), transport)
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action) == (Outcome.FAILURE, Action.CONCLUDE)
    assert settlement.code == "RESULT_TOO_LARGE"
    assert calls == [1]  # the handler ran once
    assert len(transport.refused) == 1  # and the refused report was not tried again
    failure = json.loads(transport.published[-1].report.body)
    assert failure["type"] == "failure"
    assert failure["error"]["code"] == "RESULT_TOO_LARGE"
    assert len(transport.published[-1].report.body) < 2048
    assert len(decision_records(decisions)) == 1


async def test_a_report_over_worker_max_report_bytes_is_not_published() -> None:
    calls: list[int] = []
    transport = InMemoryTransport()
    engine = engine_for(
        worker_returning("x" * 5000, calls), transport, worker_max_report_bytes=4096
    )
    settlement = await engine.handle(deliver(transport))
    assert settlement.code == "RESULT_TOO_LARGE"
    assert [r.report.type for r in transport.published] == ["started", "failure"]
    assert max(len(r.report.body) for r in transport.published) <= 4096
