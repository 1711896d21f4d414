"""Executors run handlers under their deadline; a thread that cannot stop is reported."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import BaseModel

from async_task_api_worker.conclusion import Failure, Response
from async_task_api_worker.executors import InlineExecutor, ThreadExecutor
from async_task_api_worker.ports import ExecutionRequest
from async_task_api_worker.testing import make_sync_task_context, make_task_context
from tests.polling import until


class Model(BaseModel):
    pass


class Out(BaseModel):
    value: str


def sync_request(handler: object, timeout_s: float, task_id: str) -> ExecutionRequest:
    return ExecutionRequest(
        handler=handler,  # type: ignore[arg-type]
        task_input=Model(),
        raw_input={},
        context=make_sync_task_context(),
        timeout_s=timeout_s,
        task_id=task_id,
        output_model=Out,
    )


def request(handler: object, timeout_s: float = 5.0, task_id: str = "t") -> ExecutionRequest:
    return ExecutionRequest(
        handler=handler,  # type: ignore[arg-type]
        task_input=Model(),
        raw_input={},
        context=make_task_context(),
        timeout_s=timeout_s,
        task_id=task_id,
        output_model=Out,
    )


async def test_inline_concludes_the_handlers_value_by_its_output_model() -> None:
    async def handler(task_input: Model, ctx: object) -> dict[str, str]:
        return {"value": "7"}

    assert await InlineExecutor().execute(request(handler)) == Response({"value": "7"})


async def test_inline_concludes_task_timeout_at_the_deadline() -> None:
    async def handler(task_input: Model, ctx: object) -> None:
        await asyncio.Event().wait()

    conclusion = await InlineExecutor().execute(request(handler, timeout_s=0.01))
    assert conclusion == Failure("TASK_TIMEOUT", "the task did not finish within 0.01 s")


async def test_threads_past_their_deadline_are_reported_until_they_finish() -> None:
    release = threading.Event()
    finished = threading.Event()

    def handler(task_input: Model, ctx: object) -> str:
        release.wait(10)
        finished.set()
        return "late"

    executor = ThreadExecutor(max_threads=2)
    req = sync_request(handler, 0.01, "slow")
    conclusion = await executor.execute(req)
    assert isinstance(conclusion, Failure) and conclusion.code == "TASK_TIMEOUT"
    assert executor.stuck_task_ids == ("slow",)
    release.set()
    await asyncio.get_running_loop().run_in_executor(None, finished.wait, 5)
    # The thread's end reaches the executor on the loop, a turn or more after it.
    await until(lambda: executor.stuck_task_ids == (), 1.0, "no stuck task left")
    await executor.aclose()


async def test_a_cancelled_thread_task_is_reported_stuck() -> None:
    release = threading.Event()
    started = threading.Event()

    def handler(task_input: Model, ctx: object) -> None:
        started.set()
        release.wait(10)

    executor = ThreadExecutor(max_threads=1)
    req = sync_request(handler, 30, "drained")
    running = asyncio.create_task(executor.execute(req))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert executor.stuck_task_ids == ("drained",)
    release.set()
    await executor.aclose()


async def test_a_thread_raising_timeout_error_itself_is_not_a_task_timeout() -> None:
    def handler(task_input: Model, ctx: object) -> None:
        raise TimeoutError("socket")

    executor = ThreadExecutor(max_threads=1)
    conclusion = await executor.execute(sync_request(handler, 5, "t"))
    assert conclusion == Failure("INTERNAL_ERROR", "the task failed with an internal error")
    await executor.aclose()


async def test_an_abandoned_thread_is_replaced_so_the_next_task_runs() -> None:
    release = threading.Event()
    ran: list[str] = []

    def handler(task_input: Model, ctx: object) -> Out:
        ran.append(threading.current_thread().name)
        if len(ran) == 1:
            release.wait(10)
        return Out(value="done")

    executor = ThreadExecutor(max_threads=1)

    stuck = await executor.execute(sync_request(handler, 0.05, "stuck"))
    assert isinstance(stuck, Failure) and stuck.code == "TASK_TIMEOUT"
    assert await executor.execute(sync_request(handler, 5, "next")) == Response({"value": "done"})
    assert len(ran) == 2 and ran[0] != ran[1]
    release.set()
    await executor.aclose()
