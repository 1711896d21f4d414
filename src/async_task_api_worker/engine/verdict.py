"""The verdict: what becomes of a delivery, as one pure function of how it ended.

Every delivery ends one way (an :data:`Ending`): admission refused it, the handler concluded or
handed off, something stopped it, the engine failed, or the worker gave it back unstarted. From
that ending and the attempt, :func:`terminal_report` says which terminal report is owed (if
any), and :func:`decide` says how the delivery settles once that report got out or not. No
I/O, no awaits: the engine (``engine.engine``) publishes and settles around them, and every
settle of every face (a delivery, a give-back, a swept result) is decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypeGuard

from async_task_api_worker.conclusion import Conclusion, Failure, HandedOff, Response
from async_task_api_worker.engine.admission import Attempt, Refused
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.events import Action, Outcome
from async_task_api_worker.task_call import CANCELLED_BY_CLIENT

__all__ = [
    "EngineFailed",
    "Ending",
    "GivenBack",
    "Stopped",
    "Swept",
    "Verdict",
    "decide",
    "retries",
    "terminal_report",
    "withdrawn",
]


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


@dataclass(frozen=True, slots=True)
class Stopped:
    """How the handler was stopped from outside.

    ``shutdown_requeued`` (the grace period is over), ``cancelled`` (the transport withdrew
    the delivery), ``publish_failed`` (``started`` could not get out), or
    ``cancelled_by_client``.
    """

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class GivenBack:
    """The worker gives the delivery back, uncounted, before it concluded.

    ``outcome`` is ``shutdown_requeued`` (never started: ``reason``) or ``cancelled`` (the
    caller's own task was cancelled; or the run's lease lapsed, ``reason`` ``lease_lapsed``:
    what it concluded is void).
    """

    outcome: Outcome
    reason: Reason | None = None


@dataclass(frozen=True, slots=True)
class EngineFailed:
    """The engine itself failed on the delivery (not the task): requeued, counted."""


@dataclass(frozen=True, slots=True)
class Swept:
    """A task's conclusion collected after its delivery was settled (the tick's sweep).

    Its report is owed as for any conclusion, never retried; nothing is settled (``none``).
    ``made_at``: the report's timestamp, when a sweep first made it (the state keeps it): sent
    again after a killed sweep, the report is then the same bytes under the same message id.
    """

    conclusion: Conclusion
    reason: Reason
    made_at: datetime | None = None


#: How a delivery ended, as far as the verdict needs to know.
Ending = Refused | Response | Failure | HandedOff | Stopped | GivenBack | EngineFailed | Swept


def retries(ending: Ending, attempt: Attempt) -> TypeGuard[Failure]:
    """Whether ``ending`` is a retryable failure with attempts left (requeued, not reported)."""
    return isinstance(ending, Failure) and ending.retryable and attempt.number < attempt.limit


def terminal_report(ending: Ending, attempt: Attempt) -> Conclusion | None:
    """The terminal report owed for ``ending``: ``None`` when none is (a give-back, a retry...)."""
    if isinstance(ending, Refused):
        return ending.failure
    if isinstance(ending, Swept):
        return ending.conclusion
    if isinstance(ending, Stopped) and ending.outcome is Outcome.CANCELLED_BY_CLIENT:
        return CANCELLED_BY_CLIENT
    if isinstance(ending, Response | Failure) and not retries(ending, attempt):
        return ending
    return None


def decide(ending: Ending, attempt: Attempt, unsent: Reason | None = None) -> Verdict:
    """How the delivery that ended so settles.

    Args:
        ending: how it ended.
        attempt: its attempt (number and limit).
        unsent: why the report :func:`terminal_report` owed did not get out (or, for a stop
            by ``publish_failed``, why ``started`` did not); ``None`` when it was confirmed or
            none was owed.
    """
    if isinstance(ending, Swept):
        settled = _reported(ending.conclusion, unsent)
        return Verdict(settled.outcome, Action.NONE, code=settled.code, reason=ending.reason)
    if isinstance(ending, Refused):
        if ending.failure is None:
            return Verdict(Outcome.POISON, Action.REJECT, poison_reason=ending.poison_reason)
        settled = _reported(ending.failure, unsent)
        if ending.poison_reason is None:
            return settled
        poisoned = Outcome.POISON if settled.outcome is Outcome.FAILURE else settled.outcome
        return Verdict(
            poisoned,
            settled.action,
            code=settled.code,
            poison_reason=ending.poison_reason,
            reason=settled.reason,
        )
    if isinstance(ending, HandedOff):  # the hand-off is the durable receipt
        return Verdict(
            Outcome.DETACHED,
            Action.ACK,
            reason=Reason.ALREADY_HANDED_OUT if ending.already else None,
        )
    if isinstance(ending, GivenBack):
        return Verdict(ending.outcome, Action.NACK_REQUEUE, reason=ending.reason)
    if isinstance(ending, EngineFailed):
        return Verdict(Outcome.ENGINE_ERROR, Action.NACK_REQUEUE, counted=True)
    if isinstance(ending, Stopped):
        return _stopped(ending.outcome, unsent)
    if retries(ending, attempt):
        return Verdict(Outcome.RETRY, Action.NACK_REQUEUE, code=ending.code, counted=True)
    return _reported(ending, unsent)


def withdrawn(settled: Verdict) -> Verdict:
    """``settled`` for a delivery the transport withdrew meanwhile: nothing more is sent.

    The broker requeued it already; whatever got as far as a failed publish stands as
    ``cancelled`` with no broker call (a give-back of a shutdown is said as such).
    """
    if settled.outcome is Outcome.SHUTDOWN_REQUEUED:
        return settled
    return Verdict(
        Outcome.CANCELLED,
        Action.NONE,
        code=settled.code,
        poison_reason=settled.poison_reason,
        handler_ran=settled.handler_ran,
        reason=settled.reason,
    )


def _stopped(outcome: Outcome, unsent: Reason | None) -> Verdict:
    if outcome is Outcome.CANCELLED:
        return Verdict(Outcome.CANCELLED, Action.NONE)
    if outcome is Outcome.PUBLISH_FAILED:  # ``started`` could not get out
        return _given_back(unsent)
    if outcome is Outcome.CANCELLED_BY_CLIENT:
        settled = _reported(CANCELLED_BY_CLIENT, unsent)
        if settled.outcome is Outcome.FAILURE:
            return Verdict(Outcome.CANCELLED_BY_CLIENT, Action.CONCLUDE, code=settled.code)
        return settled
    return Verdict(Outcome.SHUTDOWN_REQUEUED, Action.NACK_REQUEUE, reason=Reason.ABORTED)


def _reported(conclusion: Conclusion, unsent: Reason | None) -> Verdict:
    code = conclusion.code if isinstance(conclusion, Failure) else None
    if unsent is not None:
        return _given_back(unsent, code)
    if isinstance(conclusion, Failure):
        return Verdict(Outcome.FAILURE, Action.CONCLUDE, code=code)
    return Verdict(Outcome.SUCCESS, Action.ACK)


def _given_back(why: Reason | None, code: str | None = None) -> Verdict:
    """Back without burning an attempt: the task was not at fault, its report did not get out.

    Held as long as the broker allows, or until the grace period of a shutdown ran out.
    """
    why = why or Reason.HOLD_EXPIRED
    outcome = Outcome.SHUTDOWN_REQUEUED if why is Reason.ABORTED else Outcome.PUBLISH_FAILED
    return Verdict(outcome, Action.NACK_REQUEUE, code=code, reason=why)
