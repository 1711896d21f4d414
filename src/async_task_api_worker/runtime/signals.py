"""SIGTERM and SIGINT ask the runner to drain; a second signal ends the grace period.

A supervised worker process (``runtime.supervised``) also drains when its supervisor dies.
Linux tells it with ``PR_SET_PDEATHSIG``, which fires once per exiting thread of the
supervisor (each in turn becomes the parent): so that signal is one of its own,
:data:`SUPERVISOR_GONE`, and only its first arrival counts. A SIGTERM would have been taken for
a second request, and would have skipped the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Final

__all__ = ["SUPERVISOR_GONE", "drain_once_on", "shutdown_on_signals"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: The signal a supervised worker process gets when its supervisor dies.
SUPERVISOR_GONE: Final = signal.SIGUSR1

_ONCE: set[signal.Signals] = set()


def drain_once_on(number: signal.Signals) -> None:
    """Make ``number`` ask for a drain too, from now on, but only on its first arrival."""
    _ONCE.add(number)


@contextlib.contextmanager
def shutdown_on_signals(request_shutdown: Callable[[str], None]) -> Iterator[None]:
    """Call ``request_shutdown(signal_name)`` on SIGTERM/SIGINT while in the ``with`` block.

    The handlers run on the event loop (``loop.add_signal_handler``), never in the middle of
    the engine's code; the previous handlers are restored afterwards. A signal given to
    :func:`drain_once_on` calls it on its first arrival only.
    """
    loop = asyncio.get_running_loop()
    for number in _SIGNALS:
        loop.add_signal_handler(number, request_shutdown, signal.Signals(number).name)
    once = tuple(_ONCE)
    arrived: set[signal.Signals] = set()

    def first_time(number: signal.Signals) -> None:
        if number not in arrived:
            arrived.add(number)
            request_shutdown(f"{number.name}: the supervisor is gone")

    for number in once:
        loop.add_signal_handler(number, first_time, number)
    try:
        yield
    finally:
        for number in (*_SIGNALS, *once):
            loop.remove_signal_handler(number)
