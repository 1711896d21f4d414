"""The contracts between the engine and its adapters, and the values they exchange.

A transport (RabbitMQ, in-memory, SQS/Step Functions) implements :class:`Transport` and yields
its own :class:`Delivery` subclass, which carries its envelope and attempt and reports and
settles itself; an executor (inline, thread, process) implements :class:`Executor`. The engine
imports only this module, never an adapter. What the engine decides and tells its observers
(``Outcome``, ``Action``, ``Settlement``, the events, ``Observer``) lives in
:mod:`async_task_api_worker.events` and is re-exported here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from pydantic import BaseModel

from async_task_api_worker.cancel_token import CancelToken
from async_task_api_worker.conclusion import ExecutionResult
from async_task_api_worker.context import SyncTaskContext, TaskContext
from async_task_api_worker.errors import EnvelopeDecodeError, PublishError, SettleError
from async_task_api_worker.events import (
    AckFailed,
    Action,
    CancelCause,
    CancelRequested,
    CancelResult,
    ConsumerCancelled,
    DeliveryReceived,
    DeliverySettled,
    EngineEvent,
    Observer,
    Outcome,
    ProgressDropped,
    PublishFailed,
    ReportPublished,
    Settlement,
    TaskStarted,
)
from async_task_api_worker.protocol.envelope import Envelope
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.task_definition import TaskErrorHook

__all__ = [
    "AckFailed",
    "Action",
    "CancelCause",
    "CancelRequested",
    "CancelResult",
    "CancelToken",
    "ConsumerCancelled",
    "Delivery",
    "DeliveryReceived",
    "DeliverySettled",
    "EngineEvent",
    "ExecutionRequest",
    "Executor",
    "Lease",
    "Observer",
    "Outcome",
    "ProgressDropped",
    "PublishFailed",
    "ReportPublished",
    "Settlement",
    "TaskStarted",
    "Transport",
]


class Delivery:
    """One message handed out by a broker: what the engine reads of it, and how it is settled.

    A transport yields deliveries of its own subclass, which implements the settles its broker
    has; one it lacks raises :class:`~async_task_api_worker.errors.SettleError`, and the engine
    never asks for it (``requeueable`` says which). Every settle and :meth:`release` is taken
    when called: if its awaiter is cancelled, the delivery still finishes it (the engine settles
    in the delivery's own task, with no shield of its own: ``engine.settlement``). Every method
    raises only :class:`~async_task_api_worker.errors.TransportError` subclasses.

    Attributes:
        envelope: the message decoded as the protocol's envelope, within the transport's body
            limit (``WORKER_MAX_MESSAGE_BYTES``), or why it could not be (an
            :class:`~async_task_api_worker.errors.EnvelopeDecodeError`, whose ``task_id`` is
            set when the task can still be told). RabbitMQ's body is the envelope; an SQS body
            is the Step Functions request, its task token held aside.
        headers: the message headers (AMQP headers, SQS message attributes), read-only.
        delivery_count: how many times the broker handed this message out before this
            delivery that count as attempts (RabbitMQ's ``x-delivery-count``: 0 on the first
            delivery; from RabbitMQ 4.3 a give-back or a consumer timeout does not count);
            ``None`` when the broker does not count (a classic queue).
        acquired_count: how many times the broker handed this message out before this
            delivery, whatever came of them (RabbitMQ 4.3+'s ``x-acquired-count``); ``None``
            where the broker has no such count (the memory broker, SQS, RabbitMQ before 4.3).
        redelivered: the broker's redelivered flag (AMQP ``redelivered``).
        requeueable: whether the broker can hand the message out again. ``False`` for one that
            left the queue as it was handed out (SQS + Step Functions deletes on pickup): it is
            its task's one attempt, an ack or a reject has nothing to tell the broker, and a
            give-back hands the task back to its caller (Step Functions), the only retry
            source.
        cancel_token: cancelled by the transport when the delivery can no longer be reported
            on (a stale Step Functions task token, a closed channel): the engine stops the
            handler, publishes nothing, and settles with outcome ``cancelled``.
    """

    __slots__ = (
        "acquired_count",
        "cancel_token",
        "delivery_count",
        "envelope",
        "headers",
        "redelivered",
        "requeueable",
    )

    def __init__(
        self,
        envelope: Envelope | EnvelopeDecodeError,
        *,
        headers: Mapping[str, Any] | None = None,
        delivery_count: int | None = 0,
        acquired_count: int | None = None,
        redelivered: bool = False,
        requeueable: bool = True,
    ) -> None:
        self.envelope = envelope
        self.headers: Mapping[str, Any] = headers if headers is not None else {}
        self.delivery_count = delivery_count
        self.acquired_count = acquired_count
        self.redelivered = redelivered
        self.requeueable = requeueable
        self.cancel_token = CancelToken()

    async def report(
        self, report: EncodedReport, *, placed: Callable[[], None] | None = None
    ) -> None:
        """Publish a report about this delivery and wait for its confirm, in the caller's task.

        Reports reach the broker in the order of the calls. ``placed`` is called once, on the
        event loop, as soon as the report holds its place (no report sent after it can
        overtake it), and not when it failed before that: the engine holds a delivery's
        ``started`` in the background and sends the terminal report once ``started`` is
        placed, without waiting for its confirm. A broker whose calls cannot overlap (Step
        Functions) says ``placed`` once the call went through.

        Raises:
            ReportRefusedError: refused for what it holds (its size, its content); sending it
                again cannot help.
            PublishError: the broker refused it or did not confirm it.
        """
        raise PublishError("this delivery cannot be reported on")

    async def ack(self) -> None:
        """Acknowledge: the delivery is done and leaves the queue (RabbitMQ ``basic.ack``).

        Raises:
            SettleError: the ack did not reach the broker, or the broker has none.
        """
        raise SettleError("this broker has no ack")

    async def retry(self) -> None:
        """Put the delivery back for another attempt, counted towards the delivery limit.

        RabbitMQ: ``basic.reject(requeue=True)``.

        Raises:
            SettleError: the requeue did not reach the broker, or the broker cannot requeue.
        """
        raise SettleError("this broker cannot put a delivery back")

    async def give_back(self) -> None:
        """Give the delivery back without counting an attempt (the task was not at fault).

        RabbitMQ: ``basic.nack(requeue=True)``, which RabbitMQ 4.3+ counts in
        ``x-acquired-count`` only (earlier versions count it as an attempt).

        Raises:
            SettleError: the give-back did not reach the broker.
        """
        raise SettleError("this broker cannot give a delivery back")

    async def reject(self) -> None:
        """Refuse without requeue: dead-lettered if the queue has a dead-letter exchange.

        Raises:
            SettleError: the reject did not reach the broker, or the broker has none.
        """
        raise SettleError("this broker has no reject")

    async def release(self) -> None:
        """Forget the delivery: the engine settled it, whatever the action (``none`` too).

        Called once per delivery, after its settle; never raises. Where a transport holds
        something for a delivery (Step Functions heartbeats, ECS task protection), it lets go
        here; by default nothing is held.
        """
        return None


@runtime_checkable
class Transport(Protocol):
    """A broker, as the runtime consumes from it.

    Every method raises only :class:`~async_task_api_worker.errors.TransportError` subclasses
    (the adapter maps its client library's exceptions, keeping them as ``__cause__``). What is
    done with one delivery (its reports and its settle) is asked of the :class:`Delivery`.
    """

    @property
    def holding(self) -> bool:
        """Whether the deliveries in hand are still this worker's, for all it knows right now.

        The connection they came on is up and known to be alive (RabbitMQ: a frame within the
        last heartbeat; SQS: the last receive went through), a drain included. The worker
        renews its process-isolated tasks' leases only while it holds (:class:`Lease`).
        """
        ...

    @property
    def consuming(self) -> bool:
        """Whether the transport holds (:attr:`holding`) and its consumer is active (readiness)."""
        ...

    @property
    def publishing_blocked(self) -> bool:
        """Whether reports cannot be published right now (the broker blocks them: readiness)."""
        ...

    def span_attributes(self, delivery: Delivery | None) -> Mapping[str, str | int]:
        """The messaging attributes of a trace span (``observability.tracing``).

        Of consuming ``delivery`` (its ``process`` and settle spans), or, for ``None``, of
        publishing a report (its ``send`` span): ``messaging.system``,
        ``messaging.destination.name`` (the queue), and the system's own
        (``messaging.rabbitmq.message.delivery_tag``). Asked only when a span records.
        """
        ...

    async def connect(self) -> None:
        """Connect and declare what the worker needs."""
        ...

    def listen_for_cancels(self, handler: Callable[[bytes], object]) -> bool:
        """Hand every cancel request's body to ``handler``, on the event loop, from ``connect``.

        Call it before :meth:`connect`, which then sets the listening up with the rest.

        Returns:
            ``False`` when this transport receives no cancels (the docs of its face say so).
        """
        ...

    def observe(self, observer: Observer) -> None:
        """Tell ``observer`` of what the broker did to the consumer (``ConsumerCancelled``)."""
        ...

    def deliveries(self) -> AsyncIterator[Delivery]:
        """Yield deliveries as the broker hands them out, until :meth:`stop_consuming`."""
        ...

    async def stop_consuming(self) -> Sequence[Delivery]:
        """Stop receiving new deliveries; in-flight ones can still be reported and settled.

        Returns:
            The deliveries received but not yet handed out by :meth:`deliveries`: the caller
            gives each back through the engine (``Engine.give_back``, with its decision line).
        """
        ...

    async def close(self) -> None:
        """Close the connection; idempotent."""
        ...


#: Renewals a lease gets within its expiry: a task process stops itself only after missing
#: this many in a row. The last one before a freeze came at most one period before it, so a
#: freeze shorter than the expiry less one period (1.75 heartbeats) stops nothing.
RENEWALS_PER_LEASE: Final = 8


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease a worker's task processes hold: the fence between a task and its next run.

    The worker renews it every :attr:`renew_every_s` while it is alive and :attr:`held` says
    so; a task process whose lease was not renewed for :attr:`expiry_s` kills its whole
    process group, whether its worker died, froze, or lost the broker. The worker then reports
    nothing it concluded (``conclusion.LeaseLapsed``): the broker may have handed the task to
    another worker meanwhile.

    Attributes:
        expiry_s: seconds a task process runs on without a renewal
            (``broker_rules.lease_expiry_s``): the bound on two runs of one task at once.
        held: whether the worker may renew now (``Transport.holding``).
    """

    expiry_s: float
    held: Callable[[], bool]

    @property
    def renew_every_s(self) -> float:
        """Seconds between two renewals: :data:`RENEWALS_PER_LEASE` per expiry."""
        return self.expiry_s / RENEWALS_PER_LEASE


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """One handler call for an executor to run.

    Attributes:
        handler: the user's ``async def`` or ``def`` handler.
        task_input: the input, validated by the handler's input model.
        raw_input: the envelope's ``input`` object as decoded (for executors that re-validate
            in another process).
        context: the context passed to the handler.
        timeout_s: the handler's deadline, in seconds from the call.
        task_id: the task's id, for the executor's own logs.
        output_model: the task's output model, which concludes a returned value
            (``task_call.conclude_value``).
        on_error: the worker's ``on_task_error`` hooks, told of an exception the call
            concludes as ``INTERNAL_ERROR`` (``task_call.error_hooks``); empty: none.
        started: for an executor whose work outlives the delivery (``hands_off = True``): it
            publishes ``started`` and returns once it is confirmed; the executor hands the
            work off only after it (it raises when ``started`` gave up: let that through).
            ``None`` for any other executor (the engine holds ``started`` beside the call).
    """

    handler: Callable[..., Any]
    task_input: BaseModel
    raw_input: Mapping[str, Any]
    context: TaskContext | SyncTaskContext
    timeout_s: float
    task_id: str
    output_model: type[BaseModel]
    started: Callable[[], Awaitable[None]] | None = None
    on_error: tuple[TaskErrorHook, ...] = ()


class Executor(Protocol):
    """Runs a handler under its deadline and concludes it.

    ``execute`` returns the call's :data:`~async_task_api_worker.conclusion.Conclusion`, made
    by the task call (:mod:`async_task_api_worker.task_call`) wherever the handler ran:
    ``TASK_TIMEOUT`` at the deadline, never an exception for what the handler did. Cancelling
    the ``execute`` coroutine stops the work as far as the executor can (an asyncio cancel, a
    process-group kill; a thread cannot be stopped and is reported as stuck).
    """

    async def start(self) -> None:
        """Get ready before the first task (start a fork server); a failure is logged."""
        ...

    def execute(self, request: ExecutionRequest) -> Awaitable[ExecutionResult]:
        """Run ``request.handler(request.task_input, request.context)`` and conclude it.

        Returns:
            The call's conclusion; or ``HandedOff`` from an executor whose workers outlive the
            delivery (the ``tick`` command's detached executor, whose ``hands_off`` attribute
            is true: it awaits ``request.started`` first; its ``handed_out(task_id) -> bool``
            tells the engine, before admission's limits, which tasks it handed off before,
            and those conclude as ``HandedOff(already=True)`` without a call).
        """
        ...

    async def aclose(self) -> None:
        """Release the executor's resources (threads, processes)."""
        ...
