"""The one INFO line the engine logs per delivery: its decision.

``Delivery settled: outcome=failure action=conclude code=NOT_ALLOWED attempt=1/5`` with the
structured fields ``task_id``, ``attempt``, ``delivery_limit``, ``outcome``, ``action`` and
``code`` (seed, "Probes, metrics and logs"), so that ``grep <task_id>`` tells a task's story.
"""

from __future__ import annotations

import logging

from async_task_api_worker.events import Reason
from async_task_api_worker.ports import Settlement

__all__ = ["DECISION_MESSAGE", "DECISION_WITH_REASON", "Reason", "log_decision"]

DECISION_MESSAGE = "Delivery settled: outcome=%s action=%s code=%s attempt=%d/%d"
#: The same line for a give-back that says why (``reason=report_held_until_consumer_timeout``).
DECISION_WITH_REASON = DECISION_MESSAGE + " reason=%s"

_logger = logging.getLogger("async_task_api_worker.engine")


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
