"""Admission: whether a delivery may run, decided once for every face.

A delivery is admitted when its body is a valid envelope for this worker's service, its attempt
is within the delivery limit under the queue's counting rule, its hand-out within the hand-out
limit where the broker counts hand-outs, and its input passes the task's input model.
Otherwise the admission says how the delivery is settled without running:

- a poison body whose task id is lost: rejected, nobody to tell;
- a poison body with a task id, or an envelope for another service: ``POISON_MESSAGE``;
- an attempt past ``WORKER_DELIVERY_LIMIT`` (a crash loop), or a hand-out past
  ``WORKER_ACQUIRED_LIMIT`` (RabbitMQ 4.3+: a loop of give-backs or consumer timeouts, which
  cost no attempt there): ``TASK_ABANDONED_AFTER_REDELIVERIES``;
- input the model refuses: ``INVALID_INPUT``, naming the model's fields only.

A redelivery of a task a hands-off executor handed out before (the tick's) is not run, whatever
its count: :func:`handed_out_before`.

``run`` and ``dev`` (through the engine), the test harness and the ``tick`` command all admit
here; the task call (:mod:`async_task_api_worker.task_call`) owns the input rule itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel

from async_task_api_worker.conclusion import Failure
from async_task_api_worker.definition import TaskDefinition
from async_task_api_worker.errors import EnvelopeDecodeError
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.codes import ErrorCode, PoisonReason
from async_task_api_worker.protocol.envelope import Envelope
from async_task_api_worker.task_call import TaskFields, validate_input

__all__ = [
    "UNKNOWN_COUNT_LIMIT",
    "Admitted",
    "Attempt",
    "Refused",
    "admit",
    "attempt_of",
    "handed_out_before",
]

_logger = logging.getLogger("async_task_api_worker.engine")

#: Attempts a task gets when the broker gives no delivery count: the first, and one retry.
UNKNOWN_COUNT_LIMIT: Final = 2


@dataclass(frozen=True, slots=True)
class Attempt:
    """A delivery's attempt under the queue's counting rule.

    Attributes:
        number: this delivery's attempt, from 1.
        limit: the attempts the task gets.
        count_known: whether the broker counts deliveries (a quorum queue); without a count
            only "first delivery or not" is known.
        handout: this delivery's hand-out, from 1, where the broker counts every hand-out
            (``Delivery.acquired_count``, RabbitMQ 4.3+); ``None`` elsewhere.
        handout_limit: the hand-outs the message gets (``WORKER_ACQUIRED_LIMIT``), with
            ``handout``.
    """

    number: int
    limit: int
    count_known: bool
    handout: int | None = None
    handout_limit: int | None = None


def attempt_of(
    delivery: Delivery, *, delivery_limit: int, acquired_limit: int | None = None
) -> Attempt:
    """The attempt of ``delivery``, under its broker's counting rule.

    Args:
        delivery: as the transport handed it out.
        delivery_limit: ``WORKER_DELIVERY_LIMIT``.
        acquired_limit: ``WORKER_ACQUIRED_LIMIT``; ``None``: hand-outs are not limited.

    A delivery its broker cannot hand out again (``requeueable`` false: SQS deletes on pickup,
    and Step Functions is the only retry source) is its task's one attempt (``1/1``). With a
    count, the attempt is the count plus one. Without one (a classic queue), a redelivery is
    attempt 2 and the limit is at most :data:`UNKNOWN_COUNT_LIMIT`: a retry is allowed once,
    and a crash loop cannot be detected. Where the broker counts every hand-out
    (``acquired_count``), the hand-out is that count plus one, limited by ``acquired_limit``.
    """
    if not delivery.requeueable:
        return Attempt(1, 1, True)
    handout = None
    if delivery.acquired_count is not None and acquired_limit is not None:
        handout = max(0, delivery.acquired_count) + 1
    limit = None if handout is None else acquired_limit
    if delivery.delivery_count is None:
        number = 2 if delivery.redelivered else 1
        return Attempt(number, min(delivery_limit, UNKNOWN_COUNT_LIMIT), False, handout, limit)
    return Attempt(max(0, delivery.delivery_count) + 1, delivery_limit, True, handout, limit)


def _past_a_limit(attempt: Attempt) -> str | None:
    """Why ``attempt`` is past one of its limits (the failure's message), or ``None``."""
    if attempt.number > attempt.limit:
        return (
            f"the task was delivered {attempt.number} times, more than its limit of "
            f"{attempt.limit}; it was not run again"
        )
    if (
        attempt.handout is not None
        and attempt.handout_limit is not None
        and attempt.handout > attempt.handout_limit
    ):
        return (
            f"the task was handed out {attempt.handout} times (give-backs and consumer timeouts "
            f"included), more than its hand-out limit of {attempt.handout_limit} "
            "(WORKER_ACQUIRED_LIMIT); it was not run again"
        )
    return None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A delivery that may run: its envelope, its validated input and its task's fields."""

    envelope: Envelope
    task_input: BaseModel
    fields: TaskFields


@dataclass(frozen=True, slots=True)
class Refused:
    """A delivery that is settled without running.

    Attributes:
        task_id: the task id, when the body gave a valid one.
        client_id: the client id, when the body gave a valid one.
        failure: the failure to report; ``None`` when there is nobody to report to (the
            delivery is rejected).
        poison_reason: why the body was refused, for a poison message
            (``protocol.codes.PoisonReason``); ``None`` otherwise.
    """

    task_id: str | None
    client_id: str | None
    failure: Failure | None
    poison_reason: str | None = None


def admit(
    delivery: Delivery,
    attempt: Attempt,
    *,
    task: TaskDefinition,
    service: str,
) -> Admitted | Refused:
    """Decide whether ``delivery`` runs (see the module); a poison message is logged here.

    Args:
        delivery: the delivery.
        attempt: its attempt (:func:`attempt_of`).
        task: the worker's task (its input model).
        service: the worker's service name; an envelope for another one is poison.
    """
    envelope = delivery.envelope
    if not isinstance(envelope, EnvelopeDecodeError) and envelope.service != service:
        envelope = EnvelopeDecodeError(
            PoisonReason.WRONG_SERVICE,
            f"envelope is for another service than this worker's ({service})",
            task_id=envelope.task_id,
            client_id=envelope.client_id,
        )
    if isinstance(envelope, EnvelopeDecodeError):
        exc = envelope
        _logger.warning(
            "Poison message: %s",
            exc,
            extra={"task_id": exc.task_id, "poison_reason": exc.reason, "attempt": attempt.number},
        )
        failure = (
            None
            if exc.task_id is None
            else Failure(ErrorCode.POISON_MESSAGE, f"the message was refused: {exc}")
        )
        return Refused(exc.task_id, exc.client_id, failure, poison_reason=exc.reason)
    abandoned = _past_a_limit(attempt)
    if abandoned is not None:
        return Refused(
            envelope.task_id,
            envelope.client_id,
            Failure(ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES, abandoned),
        )
    task_input = validate_input(task, envelope.input)
    if isinstance(task_input, Failure):
        return Refused(envelope.task_id, envelope.client_id, task_input)
    fields = TaskFields(
        task_id=envelope.task_id,
        client_id=envelope.client_id,
        service=service,
        attempt=attempt.number,
        delivery_limit=attempt.limit,
        input_refs=envelope.input_refs,
    )
    return Admitted(envelope, task_input, fields)


def handed_out_before(
    admission: Admitted | Refused, handed_out: Callable[[str], bool] | None
) -> bool:
    """Whether a hands-off executor handed this delivery's task out before (``ports.Executor``).

    Asked before a limit's refusal stands: a redelivery of work out already (a tick killed
    before its ack) is its sweep's to report, however often it came back. A poison body was
    never handed out.
    """
    if handed_out is None:
        return False
    if isinstance(admission, Admitted):
        return handed_out(admission.fields.task_id)
    task_id = admission.task_id
    return admission.poison_reason is None and task_id is not None and handed_out(task_id)
