"""SIGTERM and SIGINT ask the runner to drain; a second signal ends the grace period."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["shutdown_on_signals"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def shutdown_on_signals(request_shutdown: Callable[[str], None]) -> Iterator[None]:
    """Call ``request_shutdown(signal_name)`` on SIGTERM/SIGINT while in the ``with`` block.

    The handlers run on the event loop (``loop.add_signal_handler``), never in the middle of
    the engine's code; the previous handlers are restored afterwards.
    """
    loop = asyncio.get_running_loop()
    for number in _SIGNALS:
        loop.add_signal_handler(number, request_shutdown, signal.Signals(number).name)
    try:
        yield
    finally:
        for number in _SIGNALS:
            loop.remove_signal_handler(number)
