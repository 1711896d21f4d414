"""Which event loop a worker process runs on: asyncio's own, or uvloop (``WORKER_EVENT_LOOP``).

uvloop runs the same code with less CPU per callback and per socket write; on the throughput
benchmark it is the largest single gain (docs/benchmarks.md). It is an optional extra
(the SDK's ``uvloop`` extra, docs/getting-started.md, "Install"), so ``auto`` falls
back to asyncio.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from async_task_api_worker.errors import SettingsError
from async_task_api_worker.settings import EventLoopKind

__all__ = ["loop_factory", "run_on"]

_T = TypeVar("_T")


def loop_factory(kind: EventLoopKind) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of new event loops for ``kind``; ``None`` means asyncio's default.

    Raises:
        SettingsError: ``uvloop`` was asked for and is not installed.
    """
    if kind is EventLoopKind.ASYNCIO:
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if kind is EventLoopKind.UVLOOP:
            raise SettingsError(
                "WORKER_EVENT_LOOP=uvloop but uvloop is not installed (the SDK's `uvloop` extra)"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_on(kind: EventLoopKind, main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` to completion in a new event loop of ``kind``, like :func:`asyncio.run`.

    Raises:
        SettingsError: ``uvloop`` was asked for and is not installed (``main`` is closed).
    """
    try:
        factory = loop_factory(kind)
    except SettingsError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
