"""The one INFO line the engine logs per delivery: its decision.

``Delivery settled: outcome=failure action=conclude code=NOT_ALLOWED attempt=1/5`` with the
structured fields ``task_id``, ``attempt``, ``delivery_limit``, ``outcome``, ``action`` and
``code`` (seed, "Probes, metrics and logs"), so that ``grep <task_id>`` tells a task's story.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from async_task_api_worker.ports import Settlement

__all__ = ["DECISION_MESSAGE", "DECISION_WITH_REASON", "Reason", "log_decision"]

DECISION_MESSAGE = "Delivery settled: outcome=%s action=%s code=%s attempt=%d/%d"
#: The same line for a give-back that says why (``reason=report_held_until_consumer_timeout``).
DECISION_WITH_REASON = DECISION_MESSAGE + " reason=%s"

_logger = logging.getLogger("async_task_api_worker.engine")


class Reason(StrEnum):
    """Every ``reason=`` a decision line may carry, in one place."""

    #: A report still unconfirmed when the broker could soon time the delivery out.
    HOLD_EXPIRED = "report_held_until_consumer_timeout"
    #: The transport withdrew the delivery (its channel closed; the broker requeued it).
    WITHDRAWN = "delivery_withdrawn"
    #: The grace period of a shutdown ran out (a report was held, or the handler ran).
    ABORTED = "grace_period_over"
    #: A process-isolated task's lease lapsed while it ran (``ports.Lease``): its process
    #: stopped itself, and another worker may run the task now; nothing is reported.
    LEASE_LAPSED = "lease_lapsed"
    #: The runtime gave back a delivery it never started (a drain).
    NEVER_STARTED = "never_started"
    #: A redelivery of a task whose work a detached worker has already (the tick).
    ALREADY_HANDED_OUT = "already_handed_out"
    #: The tick's sweep reported a detached worker's result.
    SWEPT_RESULT = "swept_result"
    #: The tick's sweep reported a marker past its deadline.
    SWEPT_EXPIRY = "swept_expiry"


def log_decision(settlement: Settlement, *, service: str) -> None:
    """Log ``settlement`` as the delivery's decision line (INFO, logger ``...engine``)."""
    values: tuple[object, ...] = (
        settlement.outcome.value,
        settlement.action.value,
        settlement.code or "-",
        settlement.attempt,
        settlement.delivery_limit,
    )
    if settlement.reason is not None:
        message, values = DECISION_WITH_REASON, (*values, settlement.reason)
    else:
        message = DECISION_MESSAGE
    _logger.info(
        message,
        *values,
        extra={
            "task_id": settlement.task_id,
            "service": service,
            "attempt": settlement.attempt,
            "delivery_limit": settlement.delivery_limit,
            "outcome": settlement.outcome.value,
            "action": settlement.action.value,
            "code": settlement.code,
            "requeue_counted": settlement.requeue_counted,
            "poison_reason": settlement.poison_reason,
            "settled": settlement.settled,
            "reason": settlement.reason,
        },
    )
