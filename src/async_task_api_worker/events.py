"""What the engine decides for a delivery, and what it tells its observers (metrics, audit).

:class:`Settlement` is the one decision per delivery (its ``Outcome`` and ``Action``); the
events say what happened, one per thing. The engine calls :meth:`Observer.notify` for each;
an observer must not block, and a failing one is logged, never fatal. The metrics
(``observability.metrics``) are the main observer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

__all__ = [
    "AckFailed",
    "Action",
    "CancelCause",
    "CancelRequested",
    "CancelResult",
    "ConsumerCancelled",
    "DeliveryReceived",
    "DeliverySettled",
    "EngineEvent",
    "Observer",
    "Outcome",
    "ProgressDropped",
    "PublishFailed",
    "ReportPublished",
    "Reason",
    "Settlement",
    "TaskStarted",
]


class Outcome(StrEnum):
    """What happened to a delivery (the decision line's ``outcome``)."""

    SUCCESS = "success"
    FAILURE = "failure"
    POISON = "poison"
    RETRY = "retry"
    PUBLISH_FAILED = "publish_failed"
    SHUTDOWN_REQUEUED = "shutdown_requeued"
    CANCELLED = "cancelled"
    CANCELLED_BY_CLIENT = "cancelled_by_client"
    """The task's client cancelled it: concluded with ``failure TASK_CANCELLED``."""
    ENGINE_ERROR = "engine_error"
    DETACHED = "detached"
    """Handed to a detached worker (the ``tick`` command); its report comes from a sweep."""


class Reason(StrEnum):
    """Every ``reason=`` a decision line may carry (``Settlement.reason``), in one place."""

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


class Action(StrEnum):
    """How a delivery was settled with the broker (the decision line's ``action``).

    - ``ack``: the task succeeded and its ``success`` report was confirmed, then acked;
    - ``conclude``: the task ended with a confirmed ``failure`` report, then acked;
    - ``nack-requeue``: put back in the queue, to be delivered again (``requeue_counted`` on the
      settlement tells a failed attempt from a give-back; RabbitMQ gets ``basic.reject`` for the
      first, which 4.3 counts, and ``basic.nack`` for the second, which it does not);
    - ``reject``: refused without requeue (dead-lettered where the queue has a dead-letter
      exchange): a poison body whose task id could not be recovered, so nobody can be told;
    - ``none``: nothing is sent to the broker: the transport withdrew the delivery (its channel
      closed, so the broker requeued it; or its Step Functions task token went stale).
    """

    ACK = "ack"
    CONCLUDE = "conclude"
    NACK_REQUEUE = "nack-requeue"
    REJECT = "reject"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Settlement:
    """The engine's decision for one delivery; exactly one per delivery.

    Attributes:
        outcome: what happened.
        action: how the delivery was settled.
        code: the failure report's code; for a retry, the ``RetryableError``'s code; ``None``
            for a success, a give-back or an unreported poison body.
        task_id: the task id, when known.
        attempt: this delivery's attempt number, from 1.
        delivery_limit: the attempts the task gets (2 when the broker gives no count).
        requeue_counted: for ``nack-requeue``, whether the requeue counts as a failed attempt.
        poison_reason: for ``poison``, why the body was refused.
        settled: whether the broker accepted the settle (``False``: the ack/requeue/reject
            failed, and the broker will redeliver on its own).
        reason: for a give-back of a task that was not at fault, why (``publish_failed``: its
            report could not get out before the broker could time the delivery out).
    """

    outcome: Outcome
    action: Action
    code: str | None
    task_id: str | None
    attempt: int
    delivery_limit: int
    requeue_counted: bool = False
    poison_reason: str | None = None
    settled: bool = True
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveryReceived:
    """The engine took a delivery; exactly one :class:`DeliverySettled` follows it."""


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """A handler is about to run (its ``started`` report was confirmed)."""

    task_id: str


@dataclass(frozen=True, slots=True)
class DeliverySettled:
    """A delivery was settled; ``duration_s`` runs from its arrival to its settle."""

    settlement: Settlement
    duration_s: float
    handler_ran: bool


@dataclass(frozen=True, slots=True)
class ReportPublished:
    """A report was confirmed by the broker; ``report_type`` is a :class:`ReportType` value."""

    report_type: str


@dataclass(frozen=True, slots=True)
class PublishFailed:
    """One try to publish a report was not confirmed (a retried report may fail several times)."""

    report_type: str


@dataclass(frozen=True, slots=True)
class AckFailed:
    """A settle (ack, requeue or reject) did not reach the broker."""


@dataclass(frozen=True, slots=True)
class ProgressDropped:
    """A progress update was not published; ``reason`` is from a fixed set."""

    reason: str


class CancelResult(StrEnum):
    """What a cancel request did here (the ``result`` label of the cancels metric)."""

    #: A task running here was stopped.
    RUNNING = "running"
    #: The task is not running here: remembered, for when its delivery comes.
    REMEMBERED = "remembered"
    #: The task finished here lately: its terminal report stands, nothing changes.
    FINISHED = "finished"
    #: Not running here, and remembering is off (``WORKER_CANCEL_MEMORY=0``).
    NOT_REMEMBERED = "not_remembered"
    #: The body is not a cancel request.
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A client's cancel request arrived; ``result`` says what it did (a ``CancelResult``)."""

    result: str


class CancelCause(StrEnum):
    """Why the broker cancelled the worker's consumer (the ``cause`` label of its metric)."""

    #: A delivery was held past the consumer timeout (RabbitMQ 4.3+ cancels the consumer).
    CONSUMER_TIMEOUT = "consumer_timeout"
    #: Anything else: the queue was deleted, or a quorum queue's leader moved.
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class ConsumerCancelled:
    """The broker cancelled the consumer (``basic.cancel``); the transport consumes again.

    Told by the transport itself (``Transport.observe``), not by the engine.
    """

    cause: CancelCause


EngineEvent = (
    DeliveryReceived
    | TaskStarted
    | DeliverySettled
    | ReportPublished
    | PublishFailed
    | AckFailed
    | ProgressDropped
    | CancelRequested
    | ConsumerCancelled
)


class Observer(Protocol):
    """Learns what the engine did (metrics, audit). Must not block; failures are logged only."""

    def notify(self, event: EngineEvent) -> None:
        """Record one event."""
        ...
