"""Handlers and adapters that misbehave: every delivery is still settled once, honestly.

Each test here reproduces a bug found by attacking the engine, and fails without its fix.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from typing import Any

import pytest
from pydantic import BaseModel, field_serializer

from async_task_api_worker import FatalError, SyncTaskContext, TaskContext, Worker
from async_task_api_worker.engine import Engine
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.ports import Delivery, ProgressDropped
from async_task_api_worker.protocol import EncodedReport, ProgressReport
from async_task_api_worker.settings import load_settings
from async_task_api_worker.testing import Outcome, WorkerHarness
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.conftest import decision_records

BODY = b'{"protocol_version":1,"task_id":"t-1","client_id":"c","service":"svc","input":{}}'


class Input(BaseModel):
    pass


class Output(BaseModel):
    value: int = 1


class CustomBaseException(BaseException):
    pass


def async_worker(handler: Any, timeout: float = 5.0) -> Worker:
    worker = Worker("svc")
    worker.task(timeout=timeout)(handler)
    return worker


def dropped(harness: WorkerHarness) -> list[str]:
    return [e.reason for e in harness.events if isinstance(e, ProgressDropped)]


@pytest.mark.parametrize("kind", [CustomBaseException, GeneratorExit, KeyboardInterrupt])
async def test_a_base_exception_from_an_async_handler_is_an_internal_error(
    kind: type[BaseException], decisions: pytest.LogCaptureFixture
) -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        raise kind()

    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit({})
        again = await harness.submit({})
    run.assert_failed(code="INTERNAL_ERROR")
    again.assert_failed(code="INTERNAL_ERROR")
    assert len(decision_records(decisions)) == 2


@pytest.mark.parametrize("kind", [CustomBaseException, KeyboardInterrupt, SystemExit])
async def test_a_base_exception_from_a_def_handler_is_an_internal_error(
    kind: type[BaseException],
) -> None:
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        raise kind()

    worker = Worker("svc")
    worker.task(timeout=5)(handle)
    async with WorkerHarness(worker) as harness:
        run = await harness.submit({})
    run.assert_failed(code="INTERNAL_ERROR")


class SlowAckTransport(InMemoryTransport):
    def __init__(self) -> None:
        super().__init__()
        self.ack_started = asyncio.Event()
        self.release_ack = asyncio.Event()

    async def ack(self, delivery: Delivery) -> None:
        # Taken when called, then slow to come back (the port's rule for a settle).
        await super().ack(delivery)
        self.ack_started.set()
        await self.release_ack.wait()


async def test_a_cancel_during_the_ack_still_settles_and_logs_once(
    decisions: pytest.LogCaptureFixture,
) -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    transport = SlowAckTransport()
    engine = Engine(
        async_worker(handle), load_settings({}, read_environment=False), transport, InlineExecutor()
    )
    transport.put(BODY)
    delivery = transport.take()
    assert delivery is not None
    handling = asyncio.create_task(engine.handle(delivery))
    await transport.ack_started.wait()
    handling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handling
    transport.release_ack.set()
    await transport.join()
    assert len(transport.acked) == 1
    [line] = decision_records(decisions)
    assert "outcome=success action=ack" in line.getMessage()


class OrderedTransport(InMemoryTransport):
    """Records broker operations in order; progress confirms wait for a release."""

    def __init__(self) -> None:
        super().__init__()
        self.operations: list[str] = []
        self.progress_on_wire = asyncio.Event()
        self.release_progress = asyncio.Event()

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        if report.type == "progress":
            self.progress_on_wire.set()
            await self.release_progress.wait()
        await super().publish(delivery, report)
        self.operations.append(report.type)

    async def give_back(self, delivery: Delivery) -> None:
        await super().give_back(delivery)
        self.operations.append("give_back")


async def test_a_progress_report_on_the_wire_lands_before_the_give_back() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.1)
        await asyncio.Event().wait()
        return Output()

    transport = OrderedTransport()
    settings = load_settings({"worker_progress_min_interval_s": 0}, read_environment=False)
    engine = Engine(async_worker(handle), settings, transport, InlineExecutor())
    transport.put(BODY)
    delivery = transport.take()
    assert delivery is not None
    handling = asyncio.create_task(engine.handle(delivery))
    await transport.progress_on_wire.wait()
    handling.cancel()
    await asyncio.sleep(0)
    transport.release_progress.set()
    with pytest.raises(asyncio.CancelledError):
        await handling
    assert transport.operations == ["started", "progress", "give_back"]


class Exploding(BaseModel):
    value: int = 1

    @field_serializer("value")
    def explode(self, value: int) -> int:
        raise RuntimeError("serializer bug")


class ExplodingDict(dict[str, Any]):
    def __iter__(self) -> Any:
        raise RuntimeError("iteration bug")

    def items(self) -> Any:
        raise RuntimeError("iteration bug")


async def test_progress_never_raises_into_the_handler() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(10**400)
        await ctx.progress(0.1, Exploding())
        await ctx.progress(0.2, ExplodingDict(a=1))
        return Output()

    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit({})
    run.assert_succeeded()
    assert dropped(harness) == ["out_of_range", "invalid_payload", "invalid_payload"]


async def test_a_payload_is_copied_at_the_call_and_a_bad_one_keeps_the_held_update() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        state = {"stage": "download"}
        await ctx.progress(0.1, state)
        state["stage"] = "changed after the call"
        await ctx.progress(0.2, {"bad": {1, 2}})  # a set: not JSON
        return Output()

    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit({})
    progress = [m for m in run.messages if isinstance(m, ProgressReport)]
    assert [(p.fraction, p.payload) for p in progress] == [(0.1, {"stage": "download"})]
    assert dropped(harness) == ["invalid_payload"]


async def test_a_handler_that_swallows_its_cancel_and_returns_late_is_a_timeout() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # returns late: still running after its cut
        return Output()

    async with WorkerHarness(async_worker(handle, timeout=0.05)) as harness:
        run = await harness.submit({})
    run.assert_failed(code="TASK_TIMEOUT")


async def test_a_handler_that_never_stops_is_abandoned_and_reported_stuck() -> None:
    stop = asyncio.Event()

    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        while not stop.is_set():
            try:
                await stop.wait()
            except asyncio.CancelledError:
                continue
        return Output()

    transport = InMemoryTransport()
    executor = InlineExecutor(cancel_grace_s=0.05)
    engine = Engine(
        async_worker(handle, timeout=0.05),
        load_settings({}, read_environment=False),
        transport,
        executor,
    )
    transport.put(BODY)
    delivery = transport.take()
    assert delivery is not None
    settlement = await asyncio.wait_for(engine.handle(delivery), timeout=10)
    assert settlement.code == "TASK_TIMEOUT"
    assert executor.stuck_task_ids == ("t-1",)
    stop.set()
    for _ in range(100):
        await asyncio.sleep(0)
    assert executor.stuck_task_ids == ()


async def test_def_handlers_run_on_daemon_threads() -> None:
    seen: list[bool] = []

    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        seen.append(threading.current_thread().daemon)
        return Output()

    worker = Worker("svc")
    worker.task(timeout=5)(handle)
    async with WorkerHarness(worker) as harness:
        (await harness.submit({})).assert_succeeded()
    assert seen == [True]


class Public(BaseModel):
    value: int


class WithSecret(Public):
    secret: str


async def test_the_output_is_published_as_the_declared_model_only() -> None:
    async def leaky(task_input: Input, ctx: TaskContext) -> Public:
        return WithSecret(value=1, secret="s3cr3t")

    async with WorkerHarness(async_worker(leaky)) as harness:
        run = await harness.submit({})
    assert run.response == {"value": 1}


async def test_an_output_built_without_validation_and_wrong_is_invalid_result() -> None:
    async def constructed(task_input: Input, ctx: TaskContext) -> Public:
        return Public.model_construct(value="not an int")  # type: ignore[arg-type]

    # As in production, where pydantic's serializer warning is only a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        async with WorkerHarness(async_worker(constructed)) as harness:
            run = await harness.submit({})
    run.assert_failed(code="INVALID_RESULT")


class SkipsInit(FatalError):
    def __init__(self) -> None:  # no super().__init__: no code, no message
        pass


async def test_a_malformed_task_error_is_an_internal_error_not_a_crash_loop() -> None:
    async def mutated(task_input: Input, ctx: TaskContext) -> Output:
        error = FatalError("FINE", "fine")
        error.task_code = "not a code"
        raise error

    async def skipped(task_input: Input, ctx: TaskContext) -> Output:
        raise SkipsInit()

    for handler in (mutated, skipped):
        async with WorkerHarness(async_worker(handler)) as harness:
            run = await harness.submit({})
        run.assert_failed(code="INTERNAL_ERROR")
        assert run.outcome is Outcome.ACKED


async def test_a_negative_delivery_count_is_a_first_attempt() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit({}, delivery_count=-1)
    run.assert_succeeded()
    assert run.messages[0].attempt == 1


async def test_progress_from_another_thread_does_not_wedge_the_throttle() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await asyncio.to_thread(asyncio.run, ctx.progress(0.1))
        for step in range(2, 6):
            await ctx.progress(step / 10)
            await asyncio.sleep(0.03)  # work between two updates, past the 0.01 s throttle
        return Output()

    overrides = {"worker_progress_min_interval_s": 0.01}
    async with WorkerHarness(async_worker(handle), settings_overrides=overrides) as harness:
        run = await harness.submit({})
    fractions = [m.fraction for m in run.messages if isinstance(m, ProgressReport)]
    # Without the hand-off, the first update armed a timer on the thread's own dead loop and
    # nothing was published until the final flush: one report.
    assert len(fractions) >= 3
    assert fractions == sorted(fractions)


async def test_the_harness_runs_at_most_worker_concurrency_deliveries_at_once() -> None:
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        time.sleep(0.2)  # work: two in a row fit no 0.35 s timeout, had one waited for another
        return Output()

    worker = Worker("svc")
    worker.task(timeout=0.35)(handle)
    async with WorkerHarness(worker) as harness:
        runs = await asyncio.gather(*(harness.submit({}) for _ in range(3)))
    for run in runs:
        run.assert_succeeded()


async def test_a_wrong_service_is_not_echoed() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    body = BODY.replace(b'"service":"svc"', b'"service":"SECRETzz9"')
    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit_raw(body)
    run.assert_failed(code="POISON_MESSAGE")
    assert all(b"SECRETzz9" not in raw for raw in run.raw)


class Scores(BaseModel):
    scores: dict[str, int]
    model_config = {"extra": "forbid"}


async def test_invalid_input_does_not_echo_keys_of_the_input() -> None:
    async def handle(task_input: Scores, ctx: TaskContext) -> Output:
        return Output()

    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit({"scores": {"alice@example.com": "x"}, "password=hunter2": 1})
    run.assert_failed(code="INVALID_INPUT")
    assert run.error is not None
    assert run.error.message == ("invalid input: scores.<key>: int_parsing; <key>: extra_forbidden")


async def test_an_empty_task_id_is_kept_and_refused_not_replaced() -> None:
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    async with WorkerHarness(async_worker(handle)) as harness:
        run = await harness.submit({}, task_id="")
    assert run.outcome is Outcome.REJECTED
    assert run.task_id is None
