"""Cutting work short in the caller's own task: a token, a deadline, a cancel from elsewhere."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from async_task_api_worker.engine.waits import CutShort, until, until_cut
from async_task_api_worker.ports import CancelToken


def cancelling() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


async def test_finished_work_returns_its_result() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    assert await until_cut(work(), 5.0, CancelToken()) == 7


async def test_a_token_cuts_the_work_at_its_await_and_the_task_is_not_left_cancelling() -> None:
    token = CancelToken()
    reached = asyncio.Event()
    unwound: list[bool] = []

    async def work() -> None:
        reached.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.append(True)

    async def cut_when_reached() -> None:
        await reached.wait()
        token.cancel("stop")

    cutter = asyncio.ensure_future(cut_when_reached())
    assert await until_cut(work(), None, None, token) == CutShort(token)
    await cutter
    assert unwound == [True]
    assert cancelling() == 0
    await asyncio.sleep(0)  # the cut left nothing pending for a later await


async def test_the_deadline_cuts_the_work() -> None:
    assert await until(asyncio.Event().wait(), 0.01) is False
    assert cancelling() == 0


@contextmanager
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


async def test_work_past_its_token_or_deadline_never_runs() -> None:
    ran: list[bool] = []

    async def work() -> None:
        ran.append(True)

    token = CancelToken()
    token.cancel("already")
    with no_warnings():  # the coroutine is closed, not left unawaited
        assert await until_cut(work(), 5.0, token) == CutShort(token)
        assert await until_cut(work(), 0.0) == CutShort(None)
    assert ran == []


async def test_a_cancel_from_elsewhere_propagates_even_when_a_token_fires_too() -> None:
    token = CancelToken()
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    waiting = asyncio.ensure_future(until_cut(work(), None, token))
    await started.wait()
    waiting.cancel()
    token.cancel("at the same time")
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_work_that_swallows_the_cut_keeps_its_result() -> None:
    token = CancelToken()
    started = asyncio.Event()

    async def stubborn() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "finished anyway"
        return "never"

    async def cut() -> None:
        await started.wait()
        token.cancel("stop")

    cutter = asyncio.ensure_future(cut())
    assert await until_cut(stubborn(), None, token) == "finished anyway"
    await cutter
    assert cancelling() == 0
