"""The one bounded poll of the suite, for state that has no event to wait on.

A file another process writes, the process table, another process's log, a broker's or moto's
answers: nothing tells this process when they change, so a test asks again every
``INTERVAL_S`` until a deadline. Anything this process can be told about (an asyncio or
threading event, a future, a message the broker pushes) is awaited instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Seconds between two looks: short against what a test waits for, long against a look's cost.
INTERVAL_S = 0.05


def _said(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def wait_for(
    predicate: Callable[[], object],
    timeout_s: float = 30.0,
    what: str | Callable[[], str] = "condition",
) -> None:
    """Look at ``predicate()`` until it is true.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds; the message names ``what``
            (a callable is asked then: a log read at the end).
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {_said(what)}")
        time.sleep(INTERVAL_S)


async def until(
    predicate: Callable[[], object],
    timeout_s: float = 30.0,
    what: str | Callable[[], str] = "condition",
) -> None:
    """:func:`wait_for` on an event loop: the loop runs on between two looks."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {_said(what)}")
        await asyncio.sleep(INTERVAL_S)
