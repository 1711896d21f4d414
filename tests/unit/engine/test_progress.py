"""Progress is latest-state: throttled, a newer update replacing a held one, never going back."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker
from async_task_api_worker.context import ProgressDropReason, ProgressUpdate
from async_task_api_worker.engine import Engine
from async_task_api_worker.engine.progress import ProgressThrottle
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.ports import Delivery, ProgressDropped
from async_task_api_worker.protocol import EncodedReport, ProgressReport
from async_task_api_worker.settings import load_settings
from async_task_api_worker.testing import (
    ProgressRecorder,
    WorkerHarness,
    make_sync_task_context,
    make_task_context,
)
from async_task_api_worker.transports.memory import InMemoryTransport


class Input(BaseModel):
    steps: int = 100


class Output(BaseModel):
    done: bool = True


def dropped(harness: WorkerHarness) -> Counter[str]:
    return Counter(e.reason for e in harness.events if isinstance(e, ProgressDropped))


async def test_a_burst_inside_one_interval_is_one_report_with_the_latest_fraction() -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        for step in range(task_input.steps):
            await ctx.progress(step / task_input.steps, {"step": step})
        return Output()

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"steps": 100})
    progress = [m for m in run.messages if isinstance(m, ProgressReport)]
    assert run.message_types == ("started", "progress", "success")
    assert [(p.fraction, p.payload) for p in progress] == [(0.99, {"step": 99})]
    assert dropped(harness) == Counter({"superseded": 99})


async def test_a_step_back_and_out_of_range_updates_are_dropped_not_raised() -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.6)
        await ctx.progress(0.4)  # back: dropped
        await ctx.progress(1.0)  # the terminal report is the 100%
        await ctx.progress(-0.1)
        await ctx.progress(float("nan"))
        await ctx.progress(True)  # type: ignore[arg-type]
        await ctx.progress("0.7")  # type: ignore[arg-type]
        await ctx.progress(0.7, payload=["not", "an", "object"])  # type: ignore[arg-type]
        return Output()

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({})
    run.assert_succeeded()
    progress = [m for m in run.messages if isinstance(m, ProgressReport)]
    assert [p.fraction for p in progress] == [0.6]
    assert dropped(harness) == Counter({"backwards": 1, "out_of_range": 5, "invalid_payload": 1})


@pytest.mark.parametrize("kind", ["async", "def"])
async def test_a_refused_progress_call_logs_one_warning_per_task_with_what_to_do(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker("svc")
    if kind == "async":

        @worker.task(timeout=5)
        async def handle(task_input: Input, ctx: TaskContext) -> Output:
            await ctx.progress(1.0)  # the natural "done" call
            await ctx.progress(2.0)
            await ctx.progress(0.5, payload=["not", "an", "object"])  # type: ignore[arg-type]
            return Output()

    else:

        @worker.task(timeout=5)
        def handle_in_a_thread(task_input: Input, ctx: SyncTaskContext) -> Output:
            ctx.progress(1.0)
            ctx.progress(2.0)
            return Output()

    caplog.set_level("WARNING", logger="async_task_api_worker.task")
    async with WorkerHarness(worker) as harness:
        first = await harness.submit({})
        second = await harness.submit({})
    first.assert_succeeded()
    second.assert_succeeded()
    warnings = [r for r in caplog.records if "progress update was dropped" in r.getMessage()]
    assert len(warnings) == 2  # one per task, however many calls it made
    assert "(out_of_range)" in warnings[0].getMessage()
    assert "return the result instead of ctx.progress(1.0)" in warnings[0].getMessage()


class _SignallingTransport(InMemoryTransport):
    """Sets an event when a progress report is confirmed."""

    def __init__(self) -> None:
        super().__init__()
        self.progress_published = asyncio.Event()

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        await super().publish(delivery, report)
        if report.type == "progress":
            self.progress_published.set()


async def test_the_window_flushes_the_held_update_while_the_handler_still_runs() -> None:
    transport = _SignallingTransport()
    worker = Worker("svc")
    seen_while_running: list[float] = []

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        for step in range(10):
            await ctx.progress(step / 10)
        await transport.progress_published.wait()
        seen_while_running.extend(
            p.report.report.fraction  # type: ignore[union-attr]
            for p in transport.published
            if p.report.type == "progress"
        )
        await ctx.progress(0.95)
        return Output()

    settings = load_settings({"worker_progress_min_interval_s": 0.01}, read_environment=False)
    engine = Engine(worker, settings, transport, InlineExecutor())
    transport.put(
        b'{"protocol_version":1,"task_id":"t","client_id":"c","service":"svc","input":{}}'
    )
    delivery = transport.take()
    assert delivery is not None
    await engine.handle(delivery)
    fractions = [
        p.report.report.fraction  # type: ignore[union-attr]
        for p in transport.published
        if p.report.type == "progress"
    ]
    assert seen_while_running == [0.9]
    assert fractions == [0.9, 0.95]
    assert [p.report.type for p in transport.published][-1] == "success"


async def test_a_progress_publish_failure_is_counted_and_the_task_goes_on() -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.5)
        return Output()

    async with WorkerHarness(worker) as harness:
        harness.fail_next_publish("progress")
        run = await harness.submit({})
    run.assert_succeeded()
    assert run.message_types == ("started", "success")
    assert dropped(harness) == Counter({"publish_failed": 1})


@pytest.mark.parametrize(
    "payload",
    [{"value": float("nan")}, {"file": "report-\udcff.csv"}, {"k\ud800": 1}],
    ids=["nan", "lone-surrogate", "lone-surrogate-in-a-key"],
)
async def test_a_payload_that_cannot_be_encoded_is_dropped(payload: dict[str, Any]) -> None:
    # A lone surrogate too: valid Unicode, as a response must be (docs/protocol.md).
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.5, payload)
        return Output()

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({})
    run.assert_succeeded()
    assert run.message_types == ("started", "success")
    assert dropped(harness) == Counter({"invalid_payload": 1})


async def test_a_pydantic_payload_is_published_as_json() -> None:
    class Stage(BaseModel):
        stage: str

    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await ctx.progress(0.25, Stage(stage="download"))
        return Output()

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({})
    progress = [m for m in run.messages if isinstance(m, ProgressReport)]
    assert [p.payload for p in progress] == [{"stage": "download"}]


async def test_a_def_handler_reports_progress_from_its_thread() -> None:
    worker = Worker("svc")
    threads: list[str] = []

    @worker.task(timeout=5)
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        threads.append(threading.current_thread().name)
        ctx.progress(0.2)
        ctx.progress(0.1)  # back: dropped
        ctx.progress(0.3, {"n": 3})
        return Output()

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({})
    progress = [m for m in run.messages if isinstance(m, ProgressReport)]
    assert threads[0] != threading.main_thread().name
    assert [(p.fraction, p.payload) for p in progress] == [(0.3, {"n": 3})]
    assert dropped(harness) == Counter({"backwards": 1, "superseded": 1})


def test_a_sync_context_built_for_a_test_records_in_the_calling_thread() -> None:
    recorder = ProgressRecorder()
    ctx = make_sync_task_context(recorder, task_id="t-9", attempt=2)
    ctx.progress(0.1)
    ctx.progress(0.05)
    assert recorder.updates == [ProgressUpdate(0.1, None)]
    assert recorder.dropped == [ProgressDropReason.BACKWARDS]
    assert (ctx.task_id, ctx.attempt, ctx.delivery_limit) == ("t-9", 2, 5)
    assert repr(ctx) == "SyncTaskContext(task_id='t-9', service='test-service', attempt=2/5)"


async def test_a_context_built_for_a_test_has_its_fields_and_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = make_task_context(task_id="t-1", client_id="c-1", service="svc", attempt=3)
    caplog.set_level("INFO")
    ctx.logger.info("hello", extra={"mine": 1})
    [record] = caplog.records
    assert (record.task_id, record.service, record.attempt, record.mine) == (  # type: ignore[attr-defined]
        "t-1",
        "svc",
        3,
        1,
    )
    assert ctx.client_id == "c-1" and ctx.input_refs == ()


async def test_the_throttle_drops_updates_after_it_is_closed() -> None:
    published: list[ProgressUpdate] = []
    drops: list[ProgressDropReason] = []

    async def publish(update: ProgressUpdate) -> bool:
        published.append(update)
        return True

    throttle = ProgressThrottle(
        interval_s=60, publish=publish, on_drop=drops.append, clock=lambda: 0
    )
    throttle.offer(ProgressUpdate(0.1))
    await throttle.close(flush=False)
    throttle.offer(ProgressUpdate(0.2))
    assert published == []
    assert drops == [ProgressDropReason.AFTER_END, ProgressDropReason.AFTER_END]


async def test_the_throttle_waits_a_whole_interval_between_reports() -> None:
    now = [0.0]
    published: list[tuple[float, float]] = []
    sent = asyncio.Event()

    async def publish(update: ProgressUpdate) -> bool:
        published.append((now[0], update.fraction))
        sent.set()
        return True

    throttle = ProgressThrottle(
        interval_s=0.02, publish=publish, on_drop=lambda reason: None, clock=lambda: now[0]
    )
    throttle.offer(ProgressUpdate(0.1))
    await sent.wait()
    sent.clear()
    throttle.offer(ProgressUpdate(0.2))
    throttle.offer(ProgressUpdate(0.3))
    await sent.wait()
    await throttle.close(flush=True)
    assert [fraction for _, fraction in published] == [0.1, 0.3]


async def test_close_waits_for_a_publish_already_on_the_wire() -> None:
    gate, on_the_wire = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def publish(update: ProgressUpdate) -> bool:
        order.append(f"begin {update.fraction}")
        on_the_wire.set()
        await gate.wait()
        order.append(f"end {update.fraction}")
        return True

    throttle = ProgressThrottle(
        interval_s=0, publish=publish, on_drop=lambda r: None, clock=lambda: 0
    )
    throttle.offer(ProgressUpdate(0.1))
    await on_the_wire.wait()
    throttle.offer(ProgressUpdate(0.2))
    closing = asyncio.create_task(throttle.close(flush=True))
    await asyncio.sleep(0)
    gate.set()
    await closing
    assert order == ["begin 0.1", "end 0.1", "begin 0.2", "end 0.2"]


@pytest.mark.parametrize("payload", [{"ok": [1, 2]}, None])
def test_accepted_payloads(payload: Any) -> None:
    recorder = ProgressRecorder()
    ctx = make_sync_task_context(recorder)
    ctx.progress(0.5, payload)
    assert recorder.updates == [ProgressUpdate(0.5, payload)]
