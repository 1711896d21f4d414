"""Cancelling a task from its client (docs/protocol.md, "Cancelling a task"), in the engine.

Through the harness, which cancels as a cancel request does: a running ``async def`` handler is
cancelled, a ``def`` handler sees ``ctx.cancelled``, a task whose cancel came first concludes
without running, and every one of them ends with one ``failure TASK_CANCELLED``, acked.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker
from async_task_api_worker.engine.cancels import CancelBook
from async_task_api_worker.errors import TaskCancelledError
from async_task_api_worker.ports import (
    CancelRequested,
    CancelResult,
    CancelToken,
    EngineEvent,
    Outcome,
)
from async_task_api_worker.protocol.cancel import encode_cancel
from async_task_api_worker.runtime import ExitCode, Runner
from async_task_api_worker.settings import load_settings
from async_task_api_worker.testing import WorkerHarness
from async_task_api_worker.transports.memory import InMemoryTransport


class In(BaseModel):
    n: int = 0


class Out(BaseModel):
    n: int


def _async_worker(started: asyncio.Event, cleaned: list[str]) -> Worker:
    worker = Worker("cancels")

    @worker.task(timeout=30)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cleaned.append(ctx.task_id)
            raise
        return Out(n=task_input.n)

    return worker


async def test_a_running_async_handler_is_cancelled_and_concludes_task_cancelled() -> None:
    started, cleaned = asyncio.Event(), []
    async with WorkerHarness(_async_worker(started, cleaned)) as harness:
        run = asyncio.ensure_future(harness.submit({"n": 1}, task_id="t-1"))
        await started.wait()
        assert harness.cancel("t-1") == "running"
        result = await run
    result.assert_failed("TASK_CANCELLED")
    assert result.message_types == ("started", "failure")
    assert result.settlement.outcome is Outcome.CANCELLED_BY_CLIENT
    assert cleaned == ["t-1"]
    assert harness.transport.acked
    assert CancelRequested("running") in harness.events


async def test_a_cancel_that_came_first_concludes_the_task_without_running_it() -> None:
    started, cleaned = asyncio.Event(), []
    async with WorkerHarness(_async_worker(started, cleaned)) as harness:
        assert harness.cancel("t-2") == "remembered"
        result = await harness.submit({"n": 1}, task_id="t-2")
    result.assert_failed("TASK_CANCELLED")
    assert result.message_types == ("failure",)
    assert not started.is_set()
    assert result.settlement.outcome is Outcome.CANCELLED_BY_CLIENT


async def test_a_remembered_cancel_is_used_once() -> None:
    worker = Worker("once")

    @worker.task(timeout=5)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(n=task_input.n)

    async with WorkerHarness(worker) as harness:
        harness.cancel("t-3")
        first = await harness.submit({"n": 1}, task_id="t-3")
        second = await harness.submit({"n": 2}, task_id="t-3")
    first.assert_failed("TASK_CANCELLED")
    second.assert_succeeded()


async def test_a_cancel_for_a_task_that_finished_here_changes_nothing() -> None:
    worker = Worker("finished")

    @worker.task(timeout=5)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(n=task_input.n)

    async with WorkerHarness(worker) as harness:
        done = await harness.submit({"n": 1}, task_id="t-4")
        assert harness.cancel("t-4") == "finished"
        again = await harness.submit({"n": 1}, task_id="t-4")
    done.assert_succeeded()
    again.assert_succeeded()  # a duplicate delivery is not cancelled by a late cancel


async def test_a_def_handler_sees_ctx_cancelled_and_its_task_concludes_at_once() -> None:
    worker = Worker("sync-cancels")
    started = threading.Event()
    stopped = threading.Event()

    @worker.task(timeout=30)
    def handle(task_input: In, ctx: SyncTaskContext) -> Out:
        started.set()
        while not ctx.cancelled:
            stopped.wait(0.01)
        stopped.set()
        ctx.raise_if_cancelled()
        return Out(n=0)  # pragma: no cover - raise_if_cancelled raised

    async with WorkerHarness(worker) as harness:
        run = asyncio.ensure_future(harness.submit({}, task_id="t-5"))
        await asyncio.to_thread(started.wait, 5)
        harness.cancel("t-5")
        result = await run
        await asyncio.to_thread(stopped.wait, 5)
    result.assert_failed("TASK_CANCELLED")
    assert stopped.is_set()


async def test_cancels_from_the_request_body_and_malformed_ones_are_counted() -> None:
    started, cleaned = asyncio.Event(), []
    events: list[EngineEvent] = []

    class Recorder:
        def notify(self, event: EngineEvent) -> None:
            events.append(event)

    transport = InMemoryTransport()
    runner = Runner(
        _async_worker(started, cleaned),
        load_settings({}, read_environment=False),
        transport,
        observers=[Recorder()],
    )
    transport.put(
        b'{"protocol_version":1,"task_id":"t-6","client_id":"c","service":"cancels","input":{}}'
    )
    serving = asyncio.create_task(runner.serve())
    await started.wait()
    body, _ = encode_cancel("t-6", "client-a", datetime.now(UTC))
    assert transport.publish_cancel(b"{not json") == 1  # the running worker listens
    assert transport.publish_cancel(body) == 1
    await transport.join()
    runner.request_shutdown("test")
    assert await serving is ExitCode.OK
    [started_report, failure] = [p.report for p in transport.published]
    assert (started_report.type, failure.type) == ("started", "failure")
    assert b"TASK_CANCELLED" in failure.body
    assert cleaned == ["t-6"]
    assert [e.result for e in events if isinstance(e, CancelRequested)] == [
        CancelResult.MALFORMED.value,
        CancelResult.RUNNING.value,
    ]


class _Run:
    def __init__(self, attempt: int, arrived_at: float) -> None:
        self.attempt = attempt
        self.arrived_at = arrived_at


#: A run the tests do not read back.
RUN = _Run(1, 0.0)


def test_the_book_forgets_the_oldest_and_the_expired() -> None:
    now = [0.0]
    book = CancelBook(memory=2, memory_s=10.0, monotonic=lambda: now[0])
    assert book.request("a") is CancelResult.REMEMBERED
    assert book.request("b") is CancelResult.REMEMBERED
    assert book.request("c") is CancelResult.REMEMBERED  # "a" is dropped: the oldest
    assert not book.start("a", RUN).cancelled
    now[0] = 11.0
    assert not book.start("b", RUN).cancelled  # expired
    assert not book.start("c", RUN).cancelled


def test_a_book_without_memory_remembers_nothing() -> None:
    book = CancelBook(memory=0, memory_s=10.0, monotonic=lambda: 0.0)
    assert book.request("a") is CancelResult.NOT_REMEMBERED
    assert not book.start("a", RUN).cancelled


def test_a_cancel_stops_every_run_of_the_task_here() -> None:
    book = CancelBook(memory=10, memory_s=10.0, monotonic=lambda: 0.0)
    first, second = book.start("a", RUN), book.start("a", RUN)
    assert book.request("a") is CancelResult.RUNNING
    assert first.cancelled and second.cancelled
    book.finish("a", first, concluded=True)
    book.finish("a", second, concluded=True)
    assert book.request("a") is CancelResult.FINISHED


def test_raise_if_cancelled_raises_only_once_cancelled() -> None:
    from async_task_api_worker.context import SyncTaskContext as Ctx

    token = CancelToken()
    ctx = Ctx(
        task_id="t",
        client_id="c",
        service="s",
        attempt=1,
        delivery_limit=5,
        input_refs=(),
        sink=lambda update: None,  # type: ignore[arg-type,return-value]
        cancel=token,
    )
    ctx.raise_if_cancelled()
    token.cancel("test")
    assert ctx.cancelled
    with pytest.raises(TaskCancelledError):
        ctx.raise_if_cancelled()


async def test_a_cancel_during_a_retry_backoff_concludes_the_task_instead_of_a_retry() -> None:
    from async_task_api_worker import RetryableError

    worker = Worker("backoff")
    raised = asyncio.Event()

    @worker.task(timeout=5)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        raised.set()
        raise RetryableError("BUSY", "try later", retry_delay_s=30)

    overrides = {"worker_retry_backoff_max_s": 60}
    async with WorkerHarness(worker, settings_overrides=overrides) as harness:
        run = asyncio.ensure_future(harness.submit({}, task_id="t-7"))
        await raised.wait()
        harness.cancel("t-7")
        result = await asyncio.wait_for(run, 10)  # not the 30 s backoff
    result.assert_failed("TASK_CANCELLED")
    assert result.settlement.outcome is Outcome.CANCELLED_BY_CLIENT


def test_a_cancelled_run_that_did_not_conclude_leaves_its_cancel_remembered() -> None:
    book = CancelBook(memory=10, memory_s=10.0, monotonic=lambda: 0.0)
    token = book.start("a", RUN)
    book.request("a")
    book.finish("a", token, concluded=False)  # given back: its report could not get out
    assert book.start("a", RUN).cancelled  # the next delivery concludes without running


# --- what runs now, for inspect ----------------------------------------------------------------


def test_the_book_says_what_runs_with_its_attempt_and_elapsed_time() -> None:
    now = [100.0]
    book = CancelBook(10, 60.0, lambda: now[0])
    first = book.start("t-1", _Run(1, 90.0))
    again = book.start("t-1", _Run(2, 99.5))  # a second delivery of one task, at once
    book.start("t-2", _Run(3, 100.0))
    assert sorted(book.running()) == [("t-1", 1, 10.0), ("t-1", 2, 0.5), ("t-2", 3, 0.0)]
    book.finish("t-1", first, concluded=True)
    now[0] = 101.0
    assert sorted(book.running()) == [("t-1", 2, 1.5), ("t-2", 3, 1.0)]
    book.finish("t-1", again, concluded=True)
    assert book.request("t-1") is CancelResult.FINISHED
    assert book.running() == [("t-2", 3, 1.0)]
