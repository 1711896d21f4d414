"""SIGTERM and SIGINT ask the runner to drain; a second signal ends the grace period.

A signal that comes again within :data:`ECHO_WINDOW_S` of its last counted arrival is an echo
of the same request, not a second one: a terminal's Ctrl-C reaches every process of the
foreground group, and ``uv run`` (like other launchers) forwards it to the worker once more, so
the worker sees two SIGINTs a few milliseconds apart. A person's deliberate second Ctrl-C
comes later, and still ends the grace period.

A supervised worker process (``runtime.supervised``) also drains when its supervisor dies.
Linux tells it with ``PR_SET_PDEATHSIG``, which fires once per exiting thread of the
supervisor (each in turn becomes the parent): so that signal is one of its own,
:data:`SUPERVISOR_GONE`, and only its first arrival counts. A SIGTERM would have been taken for
a second request, and would have skipped the grace period.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from typing import Final

from async_task_api_worker.observability.logging import when_stream_closed

__all__ = [
    "ECHO_WINDOW_S",
    "LATE_ECHO_WINDOW_S",
    "SUPERVISOR_GONE",
    "drain_once_on",
    "shutdown_on_signals",
]

_logger = logging.getLogger("async_task_api_worker.runtime")

#: The same signal again within this many seconds of its last counted arrival is the same
#: request (a launcher forwarding a terminal's signal), not a second one.
ECHO_WINDOW_S: Final = 0.5
#: Once the drain is over and the handlers are gone, the same signal within this many seconds
#: of its last counted arrival is still taken for the launcher's echo: under load, ``uv run``
#: forwarded it later than :data:`ECHO_WINDOW_S`, and the process, already on its way out,
#: ended with KeyboardInterrupt (130) instead of the drain's exit code.
LATE_ECHO_WINDOW_S: Final = 5.0

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: The signal a supervised worker process gets when its supervisor dies.
SUPERVISOR_GONE: Final = signal.SIGUSR1

_ONCE: set[signal.Signals] = set()


def drain_once_on(number: signal.Signals) -> None:
    """Make ``number`` ask for a drain too, from now on, but only on its first arrival."""
    _ONCE.add(number)


@contextlib.contextmanager
def shutdown_on_signals(
    request_shutdown: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """Call ``request_shutdown(signal_name)`` on SIGTERM/SIGINT while in the ``with`` block.

    The handlers run on the event loop (``loop.add_signal_handler``), never in the middle of
    the engine's code; the previous handlers are restored afterwards. The same signal again
    within :data:`ECHO_WINDOW_S` seconds (on ``clock``) of its last counted arrival is logged
    and not counted. A signal given to :func:`drain_once_on` calls it on its first arrival only.
    """
    loop = asyncio.get_running_loop()
    counted_at: dict[signal.Signals, float] = {}

    def on_signal(number: signal.Signals) -> None:
        now = clock()
        last = counted_at.get(number)
        if last is not None and now - last < ECHO_WINDOW_S:
            _logger.info(
                "%s again %.0f ms later: the same request (a launcher such as uv run forwards "
                "a terminal's signal); send it again after %g s to end the grace period",
                number.name,
                (now - last) * 1000,
                ECHO_WINDOW_S,
            )
            return
        counted_at[number] = now
        request_shutdown(number.name)

    for number in _SIGNALS:
        loop.add_signal_handler(number, on_signal, signal.Signals(number))
    once = tuple(_ONCE)
    arrived: set[signal.Signals] = set()

    def first_time(number: signal.Signals) -> None:
        if number not in arrived:
            arrived.add(number)
            request_shutdown(f"{number.name}: the supervisor is gone")

    for number in once:
        loop.add_signal_handler(number, first_time, number)
    # ``run ... | head``: a worker whose log stream's reader is gone drains, as on SIGTERM,
    # rather than run on writing to nobody (the handler may be on a handler's thread).
    when_stream_closed(
        lambda: loop.call_soon_threadsafe(request_shutdown, "its log stream was closed")
    )
    try:
        yield
    finally:
        when_stream_closed(None)
        for number in (*_SIGNALS, *once):
            loop.remove_signal_handler(number)
            if number in counted_at:  # at once: an echo in between would be KeyboardInterrupt
                _ignore_a_late_echo(number, counted_at[number], clock)


def _ignore_a_late_echo(number: signal.Signals, last: float, clock: Callable[[], float]) -> None:
    """Keep ignoring the echo of the signal counted at ``last`` once the handlers are gone.

    A launcher's forwarded copy can come after the drain ended (a second Ctrl-C ends the grace
    at once): with the previous handler back, it would end the process on its way out with
    KeyboardInterrupt (130), not the drain's exit code. Past :data:`LATE_ECHO_WINDOW_S`, the
    signal does what the previous handler does.
    """
    previous = signal.getsignal(number)

    def late(signum: int, frame: object) -> None:
        if clock() - last < LATE_ECHO_WINDOW_S:
            return
        signal.signal(number, previous)
        signal.raise_signal(number)

    def at_exit() -> None:
        # The interpreter puts back the default action of every signal with a Python handler
        # as it finalizes (after the atexit callbacks): an echo that came then ended the process
        # by the signal (uv run said 130) instead of its exit code. Ignored at the OS level, the
        # handler is left alone.
        if signal.getsignal(number) is late and clock() - last < LATE_ECHO_WINDOW_S:
            signal.signal(number, signal.SIG_IGN)

    signal.signal(number, late)
    atexit.register(at_exit)
