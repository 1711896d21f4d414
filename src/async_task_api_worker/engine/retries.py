"""A retryable failure on an attempt before the last: the backoff, then the requeue.

The rule (docs/protocol.md, "Attempts and the delivery limit"): a ``RetryableError`` on an
attempt below the delivery limit publishes no terminal report; the delivery is requeued after
a backoff, and the requeue counts as a failed attempt. The rule itself is
``engine.verdict.retries``; this module holds the wait.
"""

from __future__ import annotations

import asyncio
import logging

from async_task_api_worker.engine.execution import StopSignal
from async_task_api_worker.engine.reporting import DeliveryReporter
from async_task_api_worker.engine.waits import until
from async_task_api_worker.ports import CancelToken
from async_task_api_worker.settings import WorkerSettings

__all__ = ["wait_before_retry", "retry_backoff_s"]

_logger = logging.getLogger("async_task_api_worker.engine")


def retry_backoff_s(
    attempt: int, retry_delay_s: float | None, settings: WorkerSettings, jitter: float
) -> float:
    """The wait before requeueing a ``RetryableError``, in seconds.

    ``retry_delay_s`` (the error's own) if given, else ``WORKER_RETRY_BACKOFF_S * 2**(attempt -
    1) * jitter``; always capped by ``WORKER_RETRY_BACKOFF_MAX_S`` (which the time-budget rule
    counts).
    """
    if retry_delay_s is not None:
        delay_s = retry_delay_s
    else:
        delay_s = settings.worker_retry_backoff_s * 2 ** (attempt - 1) * jitter
    return min(delay_s, settings.worker_retry_backoff_max_s)


async def wait_before_retry(
    run: DeliveryReporter,
    delay_s: float,
    stop: StopSignal,
    *,
    cancel: CancelToken | None,
    service: str,
) -> None:
    """Wait ``delay_s`` seconds before the delivery is requeued, counted (``engine.verdict``).

    A drain cuts the wait short, and so does the task's client's ``cancel`` (the caller then
    concludes the task instead of requeueing it).
    """
    if not run.count_known:
        _logger.warning(
            "The broker gives no delivery count (a classic queue?): this task gets one retry, "
            "then concludes; use a quorum queue for retries up to WORKER_DELIVERY_LIMIT",
            extra={"task_id": run.task_id, "service": service, "attempt": run.attempt},
        )
    if delay_s > 0:
        await until(asyncio.sleep(delay_s), delay_s, stop.draining, cancel)
