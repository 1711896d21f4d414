"""Holding a report the broker does not take: how long, how often, and why a hold ends.

A report other than ``progress`` is tried again with a backoff from
:data:`PUBLISH_RETRY_FIRST_S` to :data:`PUBLISH_RETRY_MAX_S`, until the broker could time the
delivery out (``WORKER_CONSUMER_TIMEOUT_S``: ``settings.delivery_hold_s``) or a face's shorter
hold; ``progress`` is best effort and never retried (``engine.reporting``). Why a hold ended
is a decision line's reason (``engine.decision.Reason``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from async_task_api_worker.broker_rules import PLACED_CONFIRM_WAIT_S
from async_task_api_worker.cancel_token import CancelToken
from async_task_api_worker.protocol.codes import ReportType

__all__ = [
    "HOLD_LOG_EVERY_S",
    "LAST_TRY_MARGIN_S",
    "PLACED_CONFIRM_WAIT_S",
    "PROGRESS_CONFIRM_WAIT_S",
    "PUBLISH_RETRY_FIRST_S",
    "PUBLISH_RETRY_MAX_S",
    "abort_sparing_the_wire",
]

#: The first and the longest wait before publishing an unconfirmed report again, in seconds.
PUBLISH_RETRY_FIRST_S: Final = 0.1
PUBLISH_RETRY_MAX_S: Final = 5.0
#: How long a ``progress`` report (best-effort, never retried) waits for its confirm, in seconds.
PROGRESS_CONFIRM_WAIT_S: Final = 30.0
#: The last try of a held report starts at least this long before the hold ends, in seconds.
LAST_TRY_MARGIN_S: Final = 0.5
#: While a report is held, its refusals are logged at most once per this many seconds.
HOLD_LOG_EVERY_S: Final = 60.0


def abort_sparing_the_wire(
    abort: CancelToken | None, on_wire: list[bool], kind: ReportType
) -> tuple[CancelToken | None, Callable[[], None]]:
    """The abort a report of ``kind`` obeys, and the function that unregisters it from ``abort``.

    A terminal report (``success``, ``failure``) follows ``abort`` at once while it is not on
    the wire (``on_wire[0]`` false); once it is, only after ``PLACED_CONFIRM_WAIT_S`` more
    for its confirm (``broker_rules``: the time budget counts it; the drain's
    ``GIVE_BACK_TIMEOUT_S`` allows it): the broker has it, or is about to, and a give-back now
    would run the task again and report it twice. Any other report follows ``abort`` itself.
    """
    if abort is None or not kind.terminal:
        return abort, _nothing
    cut = CancelToken()

    def on_abort() -> None:
        why = abort.reason or "aborted"
        if on_wire[0]:
            asyncio.get_running_loop().call_later(PLACED_CONFIRM_WAIT_S, cut.cancel, why)
        else:
            cut.cancel(why)

    return cut, abort.add_callback(on_abort)


def _nothing() -> None:
    return None
