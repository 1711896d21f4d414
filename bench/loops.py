"""Running a benchmark process's coroutine on asyncio's loop or on uvloop.

The bench's own processes (the raw loop, the engine alone, the peers) stay off the package's
``runtime.loops``: the raw loop is meant to owe nothing to the SDK, and ``bench.engine_only``
must also run older checkouts of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

_T = TypeVar("_T")


def run(main: Coroutine[Any, Any, _T], *, uvloop: bool | None) -> _T:
    """Run ``main`` like :func:`asyncio.run`, on uvloop if ``uvloop`` is true.

    ``uvloop=None`` takes uvloop when it is importable, as ``faststream run`` and
    ``taskiq worker`` do.

    Raises:
        ImportError: ``uvloop=True`` and uvloop is not installed.
    """
    if uvloop is False:
        return asyncio.run(main)
    try:
        import uvloop as module
    except ImportError:
        if uvloop:
            main.close()
            raise
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=module.new_event_loop) as runner:
        return runner.run(main)
