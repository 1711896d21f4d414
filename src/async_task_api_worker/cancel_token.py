"""A one-shot cancellation with callbacks: how a stop reaches a running task without a waiter.

The engine, the executors, the transports and a handler's context share it (a delivery
withdrawn, a shutdown's abort, a client's cancel); ``ports`` re-exports it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = ["CancelToken"]


class CancelToken:
    """A one-shot cancellation that runs callbacks instead of needing a waiter task.

    ``cancel()`` marks the token and runs each registered callback once, on the caller's thread
    (call it on the event loop). Registering on a cancelled token runs the callback at once.
    """

    __slots__ = ("_callbacks", "_reason")

    def __init__(self) -> None:
        # Keyed by registration, so that unregistering is one dict pop: every report and every
        # handler call registers and unregisters here.
        self._callbacks: dict[object, Callable[[], None]] = {}
        self._reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """The reason given to :meth:`cancel`, or ``None``."""
        return self._reason

    def cancel(self, reason: str) -> None:
        """Cancel (idempotent: only the first call's reason is kept)."""
        if self._reason is not None:
            return
        self._reason = reason
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            callback()

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback()`` on cancel; returns a function that unregisters it."""
        if self._reason is not None:
            callback()
            return _nothing
        key = object()
        self._callbacks[key] = callback
        return functools.partial(self._callbacks.pop, key, None)  # type: ignore[return-value]


def _nothing() -> None:
    return None
