"""Holding a report the broker does not take: how long, how often, and why a hold ends.

A report other than ``progress`` is tried again with a backoff from
:data:`PUBLISH_RETRY_FIRST_S` to :data:`PUBLISH_RETRY_MAX_S`, until the broker could time the
delivery out (``WORKER_CONSUMER_TIMEOUT_S``: ``settings.delivery_hold_s``) or a face's shorter
hold; ``progress`` is best effort and never retried (``engine.reporting``). Why a hold ended
is a decision line's reason (``engine.decision.Reason``).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "HOLD_LOG_EVERY_S",
    "LAST_TRY_MARGIN_S",
    "PROGRESS_CONFIRM_WAIT_S",
    "PUBLISH_RETRY_FIRST_S",
    "PUBLISH_RETRY_MAX_S",
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
