"""Shutdown, cancellation, classic queues, and settles that fail: still one settlement each."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import BaseModel

from async_task_api_worker import RetryableError, TaskContext, Worker
from async_task_api_worker.conclusion import LeaseLapsed
from async_task_api_worker.engine import Engine, StopSignal
from async_task_api_worker.engine.engine import retry_backoff_s
from async_task_api_worker.errors import PublishError, SettleError
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.ports import (
    AckFailed,
    Action,
    Delivery,
    DeliverySettled,
    EngineEvent,
    Outcome,
    ProgressDropped,
    Settlement,
    TaskStarted,
)
from async_task_api_worker.protocol import EncodedReport
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.conftest import decision_records

BODY = b'{"protocol_version":1,"task_id":"t-1","client_id":"c","service":"svc","input":{}}'


class Input(BaseModel):
    pass


class Output(BaseModel):
    ok: bool = True


class Recorder:
    def __init__(self) -> None:
        self.events: list[EngineEvent] = []

    def notify(self, event: EngineEvent) -> None:
        self.events.append(event)


def blocking_worker(entered: asyncio.Event, cancelled: list[bool]) -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.1)
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return Output()

    return worker


def retry_worker(retry_delay_s: float | None = None) -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        raise RetryableError(retry_delay_s=retry_delay_s)

    return worker


def build(
    worker: Worker,
    transport: InMemoryTransport | None = None,
    observers: list[Recorder] | None = None,
    hold_s: float | None = None,
    **settings: object,
) -> tuple[Engine, InMemoryTransport]:
    transport = transport or InMemoryTransport()
    engine = Engine(
        worker,
        load_settings(settings, read_environment=False),
        transport,
        InlineExecutor(),
        observers=observers or [],
        hold_s=hold_s,
    )
    return engine, transport


def deliver(transport: InMemoryTransport, body: bytes = BODY, **kwargs: int) -> Delivery:
    transport.put(body, **kwargs)
    delivery = transport.take()
    assert delivery is not None
    return delivery


async def test_abort_gives_the_delivery_back_uncounted_with_no_failure_report(
    decisions: pytest.LogCaptureFixture,
) -> None:
    entered, cancelled = asyncio.Event(), []
    engine, transport = build(blocking_worker(entered, cancelled))
    stop = StopSignal()
    handling = asyncio.create_task(engine.handle(deliver(transport), stop))
    await entered.wait()
    stop.aborted.cancel("grace period over")
    settlement = await handling
    assert (settlement.outcome, settlement.action) == (
        Outcome.SHUTDOWN_REQUEUED,
        Action.NACK_REQUEUE,
    )
    assert settlement.requeue_counted is False
    assert cancelled == [True]
    assert [p.report.type for p in transport.published] == ["started"]  # no progress, no failure
    [message] = transport.ready
    assert message.delivery_count == 0  # a give-back does not burn an attempt
    assert message.redelivered is True
    [line] = decision_records(decisions)
    assert "outcome=shutdown_requeued action=nack-requeue" in line.getMessage()


async def test_a_delivery_cancel_stops_the_handler_and_publishes_nothing_more() -> None:
    entered, cancelled = asyncio.Event(), []
    engine, transport = build(blocking_worker(entered, cancelled))
    delivery = deliver(transport)
    handling = asyncio.create_task(engine.handle(delivery))
    await entered.wait()
    delivery.cancel_token.cancel("task token is stale")
    delivery.cancel_token.cancel("twice is harmless")
    settlement = await handling
    assert (settlement.outcome, settlement.action) == (Outcome.CANCELLED, Action.NONE)
    assert transport.unacked_count == 1  # nothing was sent: the transport owns the consequence
    assert delivery.cancel_token.reason == "task token is stale"
    assert cancelled == [True]
    assert [p.report.type for p in transport.published] == ["started"]


async def test_cancelling_the_caller_gives_the_delivery_back_and_propagates() -> None:
    entered, cancelled = asyncio.Event(), []
    engine, transport = build(blocking_worker(entered, cancelled))
    handling = asyncio.create_task(engine.handle(deliver(transport)))
    await entered.wait()
    handling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handling
    assert cancelled == [True]
    assert transport.ready_count == 1 and transport.unacked_count == 0
    assert transport.ready[0].delivery_count == 0


async def test_draining_cuts_a_retry_backoff_short_and_still_counts_the_attempt() -> None:
    started = asyncio.Event()
    engine, transport = build(
        retry_worker(),
        InMemoryTransport(on_publish=lambda published: started.set()),
        worker_retry_backoff_s=600,
        worker_retry_backoff_max_s=600,
    )
    stop = StopSignal()
    handling = asyncio.create_task(engine.handle(deliver(transport), stop))
    await started.wait()  # the started report is out: the handler runs, then backs off
    await asyncio.sleep(0)
    stop.draining.cancel("SIGTERM")
    settlement = await asyncio.wait_for(handling, timeout=5)
    assert settlement.outcome is Outcome.RETRY
    assert settlement.requeue_counted is True
    assert transport.ready[0].delivery_count == 1


async def test_a_retry_after_the_drain_started_does_not_wait() -> None:
    engine, transport = build(retry_worker(retry_delay_s=600), worker_retry_backoff_max_s=600)
    stop = StopSignal()
    stop.draining.cancel("SIGTERM")
    settlement = await asyncio.wait_for(engine.handle(deliver(transport), stop), timeout=5)
    assert settlement.outcome is Outcome.RETRY


def test_the_backoff_doubles_per_attempt_and_is_capped() -> None:
    settings = load_settings(
        {"worker_retry_backoff_s": 1, "worker_retry_backoff_max_s": 5}, read_environment=False
    )
    error = RetryableError()
    assert [retry_backoff_s(n, error.retry_delay_s, settings, 1.0) for n in range(1, 6)] == [
        1,
        2,
        4,
        5,
        5,
    ]
    assert retry_backoff_s(2, error.retry_delay_s, settings, 0.5) == 1
    assert retry_backoff_s(1, 3, settings, 1.0) == 3
    assert retry_backoff_s(1, 60, settings, 1.0) == 5


async def test_a_classic_queue_gets_one_retry_then_concludes_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="async_task_api_worker")
    engine, transport = build(
        retry_worker(), InMemoryTransport(count_deliveries=False), worker_retry_backoff_s=0
    )
    transport.put(BODY)
    first = await engine.handle(transport.take())  # type: ignore[arg-type]
    second_delivery = transport.take()
    assert second_delivery is not None
    assert second_delivery.delivery_count is None and second_delivery.redelivered
    second = await engine.handle(second_delivery)
    assert (first.outcome, first.attempt, first.delivery_limit) == (Outcome.RETRY, 1, 2)
    assert (second.outcome, second.code, second.attempt) == (Outcome.FAILURE, "TRANSIENT_ERROR", 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("gives no delivery count" in message for message in warnings)


class FailingSettleTransport(InMemoryTransport):
    async def ack(self, delivery: Delivery) -> None:
        raise SettleError("channel closed") from ConnectionResetError()


async def test_a_failed_ack_is_recorded_not_raised(decisions: pytest.LogCaptureFixture) -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    recorder = Recorder()
    engine, transport = build(worker, FailingSettleTransport(), [recorder])
    settlement = await engine.handle(deliver(transport))
    assert settlement.outcome is Outcome.SUCCESS
    assert settlement.settled is False
    assert any(isinstance(e, AckFailed) for e in recorder.events)
    assert len(decision_records(decisions)) == 1
    warnings = [r.getMessage() for r in decisions.records if r.levelno == logging.WARNING]
    assert any("ConnectionResetError" in w and "reported twice" in w for w in warnings)


class BrokenObserver:
    def notify(self, event: EngineEvent) -> None:
        raise RuntimeError("observer bug")


async def test_a_failing_observer_is_logged_and_never_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    recorder = Recorder()
    engine = Engine(
        worker,
        load_settings({}, read_environment=False),
        transport := InMemoryTransport(),
        InlineExecutor(),
        observers=[BrokenObserver(), recorder],  # type: ignore[list-item]
    )
    settlement = await engine.handle(deliver(transport))
    assert settlement.outcome is Outcome.SUCCESS
    assert any(isinstance(e, TaskStarted) for e in recorder.events)
    [settled] = [e for e in recorder.events if isinstance(e, DeliverySettled)]
    assert settled.handler_ran is True and settled.duration_s >= 0
    assert any("Observer" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


class ExplodingTransport(InMemoryTransport):
    async def publish(self, delivery: Delivery, report: object) -> None:  # type: ignore[override]
        raise ZeroDivisionError("a bug in an adapter")


async def test_an_engine_error_requeues_counted_and_logs_once(
    decisions: pytest.LogCaptureFixture,
) -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    engine, transport = build(worker, ExplodingTransport())
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action, settlement.requeue_counted) == (
        Outcome.ENGINE_ERROR,
        Action.NACK_REQUEUE,
        True,
    )
    assert len(decision_records(decisions)) == 1
    assert transport.ready[0].delivery_count == 1


def test_settlement_is_a_frozen_record() -> None:
    settlement = Settlement(Outcome.SUCCESS, Action.ACK, None, "t", 1, 5)
    with pytest.raises(AttributeError):
        settlement.code = "X"  # type: ignore[misc]


async def test_a_held_progress_update_is_never_published_after_an_external_cancel() -> None:
    entered, cancelled = asyncio.Event(), []
    recorder = Recorder()
    engine, transport = build(
        blocking_worker(entered, cancelled),
        observers=[recorder],
        worker_progress_min_interval_s=0.05,
    )
    handling = asyncio.create_task(engine.handle(deliver(transport)))
    await entered.wait()  # the handler's progress(0.1) is held for 50 ms
    handling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handling
    settled = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, settled.set)
    await settled.wait()  # past the throttle window: a leaked timer would have published by now
    assert [p.report.type for p in transport.published] == ["started"]
    assert [e.reason for e in recorder.events if isinstance(e, ProgressDropped)] == ["after_end"]


class BuggySettleTransport(InMemoryTransport):
    async def retry(self, delivery: Delivery) -> None:
        raise KeyError("adapter bug")


async def test_an_adapter_bug_in_a_settle_is_contained(
    decisions: pytest.LogCaptureFixture,
) -> None:
    engine, transport = build(retry_worker(), BuggySettleTransport(), worker_retry_backoff_s=0)
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.settled) == (Outcome.RETRY, False)
    assert len(decision_records(decisions)) == 1


class FlakyPublish(InMemoryTransport):
    """Refuses the first ``failures`` publishes of terminal reports."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.tries = 0

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        if report.type in ("success", "failure"):
            self.tries += 1
            if self.tries <= self.failures:
                raise PublishError("not confirmed")
        await super().publish(delivery, report)


def ok_worker() -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    return worker


async def test_an_unconfirmed_report_is_retried_in_place_until_it_is_confirmed() -> None:
    transport = FlakyPublish(failures=2)
    engine, _ = build(ok_worker(), transport, worker_retry_backoff_max_s=5)
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert transport.tries == 3
    assert [p.report.type for p in transport.published] == ["started", "success"]


async def test_past_the_hold_the_delivery_is_given_back_without_burning_an_attempt() -> None:
    transport = FlakyPublish(failures=1000)
    engine, _ = build(
        ok_worker(),
        transport,
        hold_s=1.5,
        worker_task_timeout_s=0.1,
        worker_retry_backoff_s=0.1,
        worker_retry_backoff_max_s=0.1,
    )
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action) == (Outcome.PUBLISH_FAILED, Action.NACK_REQUEUE)
    assert settlement.requeue_counted is False
    assert transport.tries >= 4  # tried again, to the end of the 1.5 s hold
    assert transport.ready[0].delivery_count == 0


async def test_a_withdrawn_delivery_stops_retrying_and_is_not_settled() -> None:
    transport = FlakyPublish(failures=1000)
    engine, _ = build(ok_worker(), transport, worker_retry_backoff_max_s=600)
    delivery = deliver(transport)
    handling = asyncio.create_task(engine.handle(delivery))
    while transport.tries == 0:
        await asyncio.sleep(0)
    delivery.cancel_token.cancel("the channel closed")
    settlement = await asyncio.wait_for(handling, timeout=5)
    assert (settlement.outcome, settlement.action) == (Outcome.CANCELLED, Action.NONE)
    assert transport.unacked_count == 1  # nothing sent: the broker already requeued it


class BrokenExecutor(InlineExecutor):
    """An executor that cannot run the call at all (a fork that fails, a disk that is full)."""

    async def execute(self, request: object) -> object:  # type: ignore[override]
        raise OSError("no room left to start the task")


async def test_an_executor_that_fails_itself_gives_the_delivery_back_without_a_failure_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    transport = InMemoryTransport()
    engine = Engine(worker, load_settings({}, read_environment=False), transport, BrokenExecutor())
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action) == (Outcome.ENGINE_ERROR, Action.NACK_REQUEUE)
    assert settlement.requeue_counted  # a broken executor cannot loop a task forever
    # No terminal report: another attempt reports (``started`` may or may not have gone out).
    assert {report.report.type for report in transport.published} <= {"started"}
    assert "OSError" in caplog.text


class LapsedExecutor(InlineExecutor):
    """An executor whose task's lease lapsed: its process stopped itself (issue 30)."""

    async def execute(self, request: object) -> object:  # type: ignore[override]
        return LeaseLapsed()


async def test_a_run_whose_lease_lapsed_reports_nothing_and_is_given_back_uncounted() -> None:
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:  # pragma: no cover
        return Output()

    transport = InMemoryTransport()
    engine = Engine(worker, load_settings({}, read_environment=False), transport, LapsedExecutor())
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action, settlement.reason) == (
        Outcome.CANCELLED,
        Action.NACK_REQUEUE,
        "lease_lapsed",
    )
    assert settlement.requeue_counted is False
    assert {report.report.type for report in transport.published} <= {"started"}
    assert transport.ready[0].delivery_count == 0


async def test_a_result_reported_after_its_delivery_writes_one_decision_line_and_settles_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from async_task_api_worker.conclusion import Failure
    from async_task_api_worker.engine.decision import Reason
    from async_task_api_worker.engine.verdict import Swept

    caplog.set_level(logging.INFO)
    recorder = Recorder()
    engine, transport = build(
        blocking_worker(asyncio.Event(), []), observers=[recorder], worker_delivery_limit=4
    )
    settlement = await engine.report_swept(
        Swept(Failure("WORKER_DIED", "lost"), Reason.SWEPT_EXPIRY),
        via=transport.report_only(),
        task_id="t-9",
        client_id=None,  # lost with the task's state
        attempt=1,
        delivery_limit=None,  # lost too: the queue's own
    )
    assert (settlement.outcome, settlement.action) == (Outcome.FAILURE, Action.NONE)
    assert (settlement.attempt, settlement.delivery_limit) == (1, 4)
    ((published),) = transport.published
    assert published.report.type == "failure" and published.report.report.client_id is None
    (line,) = decision_records(caplog)
    assert line.getMessage().endswith("code=WORKER_DIED attempt=1/4 reason=swept_expiry")
    assert [type(event).__name__ for event in recorder.events][-1] == "DeliverySettled"
