"""Settlement: a verdict becomes one broker call, one decision line and one set of metrics.

Every face settles here: the engine (``run``, ``dev``, the harness) for each delivery and each
give-back, and the ``tick`` command for each delivery it takes and each result or expiry its
sweep reports. So a delivery writes exactly one decision line (``engine.decision``) and moves
the same metrics (``DeliverySettled``, ``AckFailed``) whatever face ran it. The verdict itself
is decided in ``engine.verdict``; :func:`conclude` publishes the terminal report it owes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from async_task_api_worker.conclusion import Failure
from async_task_api_worker.context import task_log_extra
from async_task_api_worker.engine.admission import Attempt
from async_task_api_worker.engine.decision import Reason, log_decision
from async_task_api_worker.engine.reporting import DeliveryReporter
from async_task_api_worker.engine.verdict import (
    Ending,
    Swept,
    Verdict,
    decide,
    terminal_report,
    withdrawn,
)
from async_task_api_worker.errors import ReportEncodeError, SettleError
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import (
    AckFailed,
    Action,
    DeliverySettled,
    EngineEvent,
    Settlement,
    Transport,
)
from async_task_api_worker.task_call import unreportable

__all__ = ["Settler", "conclude"]

_logger = logging.getLogger("async_task_api_worker.engine")


async def conclude(run: DeliveryReporter, ending: Ending) -> Verdict:
    """Publish the terminal report ``ending`` owes (if any) and return its verdict.

    A response that cannot go out as a report (too large, not JSON) becomes its failure
    (``task_call.unreportable``), reported instead.
    """
    attempt = Attempt(run.attempt, run.limit, run.count_known)
    report = terminal_report(ending, attempt)
    if report is None:
        return decide(ending, attempt, run.gave_up)  # ``started``'s, for a stop by it
    if isinstance(report, Failure):
        published = await run.publish_failure(report.code, report.message)
    else:
        try:
            published = await run.publish_success(report.value)
        except ReportEncodeError as exc:
            failure = unreportable(exc)
            published = await run.publish_failure(failure.code, failure.message)
            # A swept result stays swept: its delivery was acked at hand-off, nothing to settle.
            ending = replace(ending, conclusion=failure) if isinstance(ending, Swept) else failure
    return decide(ending, attempt, None if published else run.gave_up or Reason.HOLD_EXPIRED)


class Settler:
    """Settles verdicts with the broker, and logs and counts each settlement.

    Args:
        transport: where deliveries are settled.
        service: the worker's service name (for the decision line).
        notify: told of ``DeliverySettled`` and ``AckFailed`` (the metrics).
        monotonic: the clock ``arrived_at`` is on, in seconds.
    """

    def __init__(
        self,
        transport: Transport,
        service: str,
        notify: Callable[[EngineEvent], None],
        monotonic: Callable[[], float],
    ) -> None:
        self._transport = transport
        self._service = service
        self._notify = notify
        self._monotonic = monotonic

    async def settle(
        self, run: DeliveryReporter, verdict: Verdict, arrived_at: float
    ) -> Settlement:
        """Settle the delivery with the broker and log the decision: once per delivery.

        Never raises but ``asyncio.CancelledError``: a settle the broker did not take is logged
        and counted, and the settlement says ``settled=False`` (the broker will deliver it
        again). A cancel of the caller does not cut the settle in half: the transport finishes
        a settle and a release whose awaiter is cancelled (the port's rule), and the decision
        line and the metrics are written before the cancel goes on.

        Raises:
            asyncio.CancelledError: the caller was cancelled while the broker call or the
                release was awaited.
        """
        if run.delivery.cancel_token.cancelled:
            verdict = withdrawn(verdict)  # the broker requeued it already
        settlement = Settlement(
            outcome=verdict.outcome,
            action=verdict.action,
            code=verdict.code,
            task_id=run.task_id,
            attempt=run.attempt,
            delivery_limit=run.limit,
            requeue_counted=verdict.counted,
            poison_reason=verdict.poison_reason,
            reason=verdict.reason,
        )
        cut: asyncio.CancelledError | None = None
        try:
            if verdict.action is not Action.NONE:
                with tracing.settling(self._transport, run.delivery, _METHOD[verdict.action]):
                    await self._settle(run, verdict)
        except asyncio.CancelledError as exc:
            cut = exc  # the call was made, and stands
        except Exception as exc:
            # SettleError is the adapter's word for it; anything else is an adapter bug, but the
            # delivery is as unsettled either way, and the worker must go on.
            cause = exc.__cause__ if isinstance(exc, SettleError) and exc.__cause__ else exc
            settlement = replace(settlement, settled=False)
            _logger.warning(
                "The %s of the delivery did not reach the broker (%s); %s",
                verdict.action.value,
                exception_type_name(cause),
                # A message deleted on pickup is never delivered again: only its caller's own
                # timeout (Step Functions' HeartbeatSeconds) ends the task now.
                "the caller's timeout ends the task now (it was deleted on pickup)"
                if not run.delivery.requeueable
                else "the broker will deliver it again, and its task may be reported twice",
                extra=task_log_extra(
                    {"task_id": run.task_id, "service": self._service, "attempt": run.attempt}
                ),
            )
            self._notify(AckFailed())
        log_decision(settlement, service=self._service)
        self._notify(
            DeliverySettled(settlement, self._monotonic() - arrived_at, verdict.handler_ran)
        )
        try:
            await run.delivery.release()
        except asyncio.CancelledError as exc:
            cut = cut or exc
        except Exception as exc:  # the contract says it never raises: an adapter bug, logged
            _logger.error(
                "The transport failed to release a delivery (%s)", exception_type_name(exc)
            )
        if cut is not None:
            raise cut
        return settlement

    @staticmethod
    async def _settle(run: DeliveryReporter, verdict: Verdict) -> None:
        delivery = run.delivery
        if verdict.action is Action.NACK_REQUEUE:
            # One that cannot be requeued is never retried (``attempt_of``: 1/1); a counted
            # give-back of it (an engine error) hands it back to its caller all the same.
            if verdict.counted and delivery.requeueable:
                await delivery.retry()
            else:
                await delivery.give_back()
        elif not delivery.requeueable:
            return  # it left the queue at pickup: an ack or a reject has nothing to tell
        elif verdict.action is Action.REJECT:
            await delivery.reject()
        else:
            await delivery.ack()


#: The settle span's operation (``observability.tracing.settling``) of each broker call.
_METHOD = {
    Action.ACK: "ack",
    Action.CONCLUDE: "ack",
    Action.NACK_REQUEUE: "nack",
    Action.REJECT: "reject",
}
