"""Settlement: a verdict becomes one broker call, one decision line and one set of metrics.

Every face settles here: the engine (``run``, ``dev``, the harness) for each delivery, and the
``tick`` command for each delivery it takes and each result or expiry its sweep reports. So a
delivery writes exactly one decision line (``engine.decision``) and moves the same metrics
(``DeliverySettled``, ``AckFailed``) whatever face ran it.

The verdicts that come from reporting live here too: reporting a conclusion, a refusal or a
failure, and giving a delivery back when its report could not get out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from async_task_api_worker.conclusion import Conclusion, Failure
from async_task_api_worker.context import task_log_extra
from async_task_api_worker.engine.admission import Refused
from async_task_api_worker.engine.decision import log_decision
from async_task_api_worker.engine.hold import GiveUp
from async_task_api_worker.engine.reporting import DeliveryReporter
from async_task_api_worker.errors import ReportEncodeError, SettleError
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import (
    AckFailed,
    Action,
    DeliverySettled,
    EngineEvent,
    Outcome,
    Settlement,
    Transport,
)
from async_task_api_worker.task_call import CANCELLED_BY_CLIENT, unreportable

__all__ = [
    "Settler",
    "Verdict",
    "give_back_unreported",
    "report_cancelled",
    "report_conclusion",
    "report_failure",
    "report_refusal",
]

_logger = logging.getLogger("async_task_api_worker.engine")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What is to become of a delivery, before it is settled.

    Attributes:
        outcome: the decision line's ``outcome``.
        action: the broker call (``ports.Action``).
        code: the failure report's code, or the ``RetryableError``'s for a retry.
        counted: for ``nack-requeue``, whether the requeue counts as a failed attempt.
        poison_reason: for ``poison``, why the body was refused.
        handler_ran: whether the handler was called (for the duration metric).
        reason: why, for a give-back or a settle that needs saying.
    """

    outcome: Outcome
    action: Action
    code: str | None = None
    counted: bool = False
    poison_reason: str | None = None
    handler_ran: bool = False
    reason: str | None = None


def give_back_unreported(run: DeliveryReporter, code: str | None = None) -> Verdict:
    """Give the delivery back without burning an attempt, and say why.

    The task was not at fault: its report could not get out, held as long as the broker allows
    (or until the grace period of a shutdown ran out).
    """
    why = run.gave_up or GiveUp.HOLD_EXPIRED
    outcome = Outcome.SHUTDOWN_REQUEUED if why is GiveUp.ABORTED else Outcome.PUBLISH_FAILED
    return Verdict(outcome, Action.NACK_REQUEUE, code=code, reason=why.value)


async def report_failure(run: DeliveryReporter, failure: Failure) -> Verdict:
    """Publish ``failure`` as the task's terminal report: ``conclude``, or a give-back."""
    if not await run.publish_failure(failure.code, failure.message):
        return give_back_unreported(run, failure.code)
    return Verdict(Outcome.FAILURE, Action.CONCLUDE, code=failure.code)


async def report_cancelled(run: DeliveryReporter) -> Verdict:
    """Publish ``failure TASK_CANCELLED`` for a client's cancel: ``cancelled_by_client``.

    A report that could not get out gives the delivery back, to conclude next time.
    """
    verdict = await report_failure(run, CANCELLED_BY_CLIENT)
    if verdict.outcome is Outcome.FAILURE:
        return replace(verdict, outcome=Outcome.CANCELLED_BY_CLIENT)
    return verdict


async def report_conclusion(run: DeliveryReporter, conclusion: Conclusion) -> Verdict:
    """Publish the terminal report of ``conclusion`` (a retryable failure is not retried here).

    A response that cannot go out as a report (too large, not JSON) becomes its failure
    (``task_call.unreportable``).
    """
    if isinstance(conclusion, Failure):
        return await report_failure(run, conclusion)
    try:
        published = await run.publish_success(conclusion.value)
    except ReportEncodeError as exc:
        return await report_failure(run, unreportable(exc))
    if not published:
        return give_back_unreported(run)
    return Verdict(Outcome.SUCCESS, Action.ACK)


async def report_refusal(run: DeliveryReporter, refused: Refused) -> Verdict:
    """Report what admission refused: a failure, or a rejection when nobody can be told."""
    run.task_id, run.client_id = refused.task_id, refused.client_id
    if refused.failure is None:
        return Verdict(Outcome.POISON, Action.REJECT, poison_reason=refused.poison_reason)
    verdict = await report_failure(run, refused.failure)
    if refused.poison_reason is None:
        return verdict
    return replace(
        verdict,
        outcome=Outcome.POISON if verdict.outcome is Outcome.FAILURE else verdict.outcome,
        poison_reason=refused.poison_reason,
    )


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
        if run.delivery.cancel_token.cancelled and verdict.outcome is not Outcome.SHUTDOWN_REQUEUED:
            # The transport withdrew it (the broker requeued it already): whatever got as far
            # as a failed publish, nothing more is sent for it.
            verdict = replace(verdict, outcome=Outcome.CANCELLED, action=Action.NONE, counted=False)
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
