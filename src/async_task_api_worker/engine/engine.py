"""One delivery in, one settlement out.

The engine decodes the envelope, checks the attempt against the delivery limit, publishes
``started``, runs the handler through an executor under its timeout, publishes the terminal
report, and settles the delivery: every delivery exactly once, through :meth:`Engine._settle`,
with one decision line. A task is acked only after its terminal report is confirmed (publisher
confirms); a report that is not confirmed leaves the delivery requeued.

It learns of a shutdown through a :class:`StopSignal` argument, never from signals, and imports
no transport: the runtime (or the test harness) hands it one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from async_task_api_worker.context import ProgressDropReason, SyncTaskContext, TaskContext
from async_task_api_worker.definition import HandlerKind, Worker
from async_task_api_worker.engine.decision import log_decision
from async_task_api_worker.engine.execution import Raised, Returned, Stopped, StopSignal, execute
from async_task_api_worker.engine.progress import ProgressThrottle
from async_task_api_worker.engine.reporting import DeliveryReporter, GiveUp, until
from async_task_api_worker.errors import (
    EnvelopeDecodeError,
    IsolatedTaskError,
    ReportEncodeError,
    RetryableError,
    SettleError,
    TaskError,
    TaskTimeoutError,
    is_well_formed,
)
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.ports import (
    AckFailed,
    Action,
    Delivery,
    DeliveryReceived,
    DeliverySettled,
    EngineEvent,
    ExecutionRequest,
    Executor,
    Observer,
    Outcome,
    ProgressDropped,
    Settlement,
    TaskStarted,
    Transport,
)
from async_task_api_worker.protocol.codes import ErrorCode, PoisonReason
from async_task_api_worker.protocol.envelope import (
    Envelope,
    decode_envelope,
    describe_validation_error,
    model_field_names,
)
from async_task_api_worker.settings import WorkerSettings

__all__ = ["UNKNOWN_COUNT_LIMIT", "Engine", "StopSignal", "retry_backoff_s"]

_logger = logging.getLogger("async_task_api_worker.engine")

#: Attempts a task gets when the broker gives no delivery count: the first, and one retry.
UNKNOWN_COUNT_LIMIT = 2


@dataclass(frozen=True, slots=True)
class _Verdict:
    outcome: Outcome
    action: Action
    code: str | None = None
    counted: bool = False
    poison_reason: str | None = None
    handler_ran: bool = False
    reason: str | None = None


def _publish_failed(run: DeliveryReporter, code: str | None = None) -> _Verdict:
    """Give the delivery back without burning an attempt, and say why.

    The task was not at fault: its report could not get out, held as long as the broker allows.
    """
    why = run.gave_up or GiveUp.HOLD_EXPIRED
    if why is GiveUp.ABORTED:
        return _Verdict(Outcome.SHUTDOWN_REQUEUED, Action.NACK_REQUEUE, code=code, reason=why.value)
    return _Verdict(Outcome.PUBLISH_FAILED, Action.NACK_REQUEUE, code=code, reason=why.value)


_RECEIVED = DeliveryReceived()


def retry_backoff_s(
    attempt: int, error: RetryableError, settings: WorkerSettings, jitter: float
) -> float:
    """The wait before requeueing a ``RetryableError``, in seconds.

    ``error.retry_delay_s`` if given, else ``WORKER_RETRY_BACKOFF_S * 2**(attempt - 1) *
    jitter``; always capped by ``WORKER_RETRY_BACKOFF_MAX_S`` (which the time-budget rule counts).
    """
    if error.retry_delay_s is not None:
        delay_s = error.retry_delay_s
    else:
        delay_s = settings.worker_retry_backoff_s * 2 ** (attempt - 1) * jitter
    return min(delay_s, settings.worker_retry_backoff_max_s)


class Engine:
    """Settles deliveries for one worker.

    Args:
        worker: the worker definition (its one task is used).
        settings: the worker's settings.
        transport: where reports are published and deliveries settled.
        executor: runs the handler (inline for ``async def``, a thread pool for ``def``).
        observers: told of every event (metrics); a failing observer is logged, never fatal.
        monotonic: monotonic clock, in seconds (durations, the progress throttle).
        wall_clock: the current UTC time (report timestamps).
        jitter: returns a factor in [0.5, 1] applied to each exponential retry backoff.

    Raises:
        NoTaskError: the worker has no task.
    """

    def __init__(
        self,
        worker: Worker,
        settings: WorkerSettings,
        transport: Transport,
        executor: Executor,
        *,
        observers: Iterable[Observer] = (),
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0),  # noqa: S311 - not crypto
    ) -> None:
        self._task = worker.task_definition
        self._service = worker.name
        self._settings = settings
        self._transport = transport
        self._executor = executor
        self._observers = tuple(observers)
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._jitter = jitter
        self._timeout_s = settings.task_timeout_s(self._task.timeout_s)
        self._output = TypeAdapter(self._task.output_model)
        self._input_names = model_field_names(self._task.input_model)
        self._never = StopSignal()
        self._settling: set[asyncio.Future[Settlement]] = set()

    @property
    def task_timeout_s(self) -> float:
        """The effective task timeout, in seconds."""
        return self._timeout_s

    async def handle(self, delivery: Delivery, stop: StopSignal | None = None) -> Settlement:
        """Process and settle one delivery; never raises except ``asyncio.CancelledError``.

        Args:
            delivery: the delivery, as the transport handed it out.
            stop: the shutdown signal; ``None`` for one that never fires.

        Returns:
            The settlement, also logged as the delivery's decision line.

        Raises:
            asyncio.CancelledError: the calling task was cancelled; the delivery was given back
                first (requeued without counting an attempt).
        """
        arrived_at = self._monotonic()
        self._notify(_RECEIVED)
        stop = stop or self._never
        run = self._reporter_for(delivery, arrived_at, stop)
        try:
            verdict = await self._process(run, stop)
        except asyncio.CancelledError:
            given_back = _Verdict(Outcome.CANCELLED, Action.NACK_REQUEUE)
            await self._settle_shielded(run, given_back, arrived_at)
            raise
        except Exception as exc:
            _logger.error(
                "Engine error while processing a delivery (%s); requeued\n%s",
                exception_type_name(exc),
                safe_traceback(exc),
                extra={"task_id": run.task_id},
            )
            verdict = _Verdict(Outcome.ENGINE_ERROR, Action.NACK_REQUEUE, counted=True)
        return await self._settle_shielded(run, verdict, arrived_at)

    async def _settle_shielded(
        self, run: DeliveryReporter, verdict: _Verdict, arrived_at: float
    ) -> Settlement:
        # A cancel that lands during the settle must not cut it in half: the broker call and
        # the decision line finish in the background, and the cancel still propagates.
        settling = asyncio.ensure_future(self._settle(run, verdict, arrived_at))
        self._settling.add(settling)
        settling.add_done_callback(self._settling.discard)
        return await asyncio.shield(settling)

    def _reporter_for(
        self, delivery: Delivery, arrived_at: float, stop: StopSignal
    ) -> DeliveryReporter:
        limit = self._settings.worker_delivery_limit
        count_known = delivery.delivery_count is not None and self._transport.delivery_count_known
        if not count_known:
            # No broker count (a classic queue): only "first delivery or not" is known, so a
            # retry is allowed once, and a crash loop cannot be detected.
            attempt = 2 if delivery.redelivered else 1
            limit = min(limit, UNKNOWN_COUNT_LIMIT)
        else:
            attempt = max(0, delivery.delivery_count or 0) + 1
        return DeliveryReporter(
            delivery=delivery,
            attempt=attempt,
            limit=limit,
            count_known=count_known,
            service=self._service,
            transport=self._transport,
            wall_clock=self._wall_clock,
            notify=self._notify,
            monotonic=self._monotonic,
            # A report that cannot get out holds its delivery until the broker could time it
            # out: giving it back sooner would count an attempt against a task not at fault.
            hold_until=arrived_at + self._settings.delivery_hold_s(),
            max_report_bytes=self._settings.worker_max_report_bytes,
            abort=stop.aborted,
        )

    async def _process(self, run: DeliveryReporter, stop: StopSignal) -> _Verdict:
        try:
            envelope = decode_envelope(
                run.delivery.body, max_body_bytes=self._settings.worker_max_message_bytes
            )
            if envelope.service != self._service:
                raise EnvelopeDecodeError(
                    PoisonReason.WRONG_SERVICE,
                    f"envelope is for another service than this worker's ({self._service})",
                    task_id=envelope.task_id,
                    client_id=envelope.client_id,
                )
        except EnvelopeDecodeError as exc:
            return await self._poison(run, exc)
        run.task_id, run.client_id = envelope.task_id, envelope.client_id

        if run.attempt > run.limit:
            return await self._fail(
                run,
                ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES,
                f"the task was delivered {run.attempt} times, more than its limit of "
                f"{run.limit}; it was not run again",
            )
        try:
            task_input = self._task.input_model.model_validate(envelope.input)
        except ValidationError as exc:
            return await self._fail(
                run,
                ErrorCode.INVALID_INPUT,
                f"invalid input: {describe_validation_error(exc, known_names=self._input_names)}",
            )
        if not await run.publish_started():
            return _publish_failed(run)
        self._notify(TaskStarted(envelope.task_id))
        return replace(await self._run_task(run, envelope, task_input, stop), handler_ran=True)

    async def _run_task(
        self, run: DeliveryReporter, envelope: Envelope, task_input: BaseModel, stop: StopSignal
    ) -> _Verdict:
        throttle = ProgressThrottle(
            interval_s=self._settings.worker_progress_min_interval_s,
            publish=run.publish_progress,
            on_drop=self._progress_dropped,
            clock=self._monotonic,
        )
        request = ExecutionRequest(
            handler=self._task.handler,
            task_input=task_input,
            raw_input=envelope.input,
            context=self._context(run, envelope, throttle),
            timeout_s=self._timeout_s,
            task_id=envelope.task_id,
        )
        try:
            result = await execute(
                self._executor,
                request,
                task_fields={
                    "task_id": run.task_id,
                    "service": self._service,
                    "attempt": run.attempt,
                },
                stop=stop,
                delivery_cancel=run.delivery.cancel_token,
            )
        except BaseException:
            # Cancelled from outside: the delivery is given back, so nothing may follow for it;
            # a progress report already on the wire is let finish first, to keep the order.
            throttle.abandon()
            await throttle.idle()
            raise
        # A held progress update goes out before the terminal report; none after it.
        await throttle.close(flush=not isinstance(result, Stopped))
        if isinstance(result, Stopped):
            if result.outcome is Outcome.CANCELLED:
                return _Verdict(Outcome.CANCELLED, Action.NONE)
            return _Verdict(Outcome.SHUTDOWN_REQUEUED, Action.NACK_REQUEUE)
        return await self._conclude(run, result, stop)

    async def _conclude(
        self, run: DeliveryReporter, result: Returned | Raised, stop: StopSignal
    ) -> _Verdict:
        if isinstance(result, Returned):
            return await self._succeed(run, result.value)
        error = result.error
        if isinstance(error, TaskError) and is_well_formed(error):
            if isinstance(error, RetryableError):
                return await self._retry_or_fail(run, error, stop)
            return await self._fail(run, error.task_code, error.message)
        if isinstance(error, IsolatedTaskError):
            _logger.error(
                "The task's process ended without a result: %s",
                error.message,
                extra=self._fields(run),
            )
            return await self._fail(run, error.task_code, error.message)
        if isinstance(error, TaskTimeoutError):
            _logger.warning(
                "Task handler ran past its timeout of %g s",
                self._timeout_s,
                extra=self._fields(run),
            )
            return await self._fail(
                run, ErrorCode.TASK_TIMEOUT, f"the task did not finish within {self._timeout_s:g} s"
            )
        _logger.error(
            "Task handler raised %s; reported as INTERNAL_ERROR without its message\n%s",
            exception_type_name(error),
            safe_traceback(error),
            extra=self._fields(run),
        )
        return await self._fail(
            run, ErrorCode.INTERNAL_ERROR, "the task failed with an internal error"
        )

    async def _succeed(self, run: DeliveryReporter, value: Any) -> _Verdict:
        output_model = self._task.output_model
        try:
            model = value if isinstance(value, output_model) else output_model.model_validate(value)
            # Serialized as the declared model: a subclass's extra fields are not published, and
            # a value of the wrong type (model_construct, a mutated field) is an error, not a
            # warning.
            response = self._output.dump_python(model, mode="json", warnings="error")
        except ValidationError as exc:
            return await self._fail(
                run,
                ErrorCode.INVALID_RESULT,
                f"the handler's result failed its output model: {describe_validation_error(exc)}",
            )
        except Exception as exc:  # a serializer of the user's model failed
            return await self._fail(
                run,
                ErrorCode.INVALID_RESULT,
                f"the handler's result could not be serialized ({exception_type_name(exc)})",
            )
        try:
            published = await run.publish_success(response)
        except ReportEncodeError as exc:
            code = ErrorCode.RESULT_TOO_LARGE if exc.too_large else ErrorCode.INVALID_RESULT
            return await self._fail(run, code, f"the handler's result cannot be reported: {exc}")
        if not published:
            return _publish_failed(run)
        return _Verdict(Outcome.SUCCESS, Action.ACK)

    async def _retry_or_fail(
        self, run: DeliveryReporter, error: RetryableError, stop: StopSignal
    ) -> _Verdict:
        if run.attempt >= run.limit:
            return await self._fail(run, error.task_code, error.message)
        if not run.count_known:
            _logger.warning(
                "The broker gives no delivery count (a classic queue?): this task gets one retry, "
                "then concludes; use a quorum queue for retries up to WORKER_DELIVERY_LIMIT",
                extra=self._fields(run),
            )
        await self._backoff(run.attempt, error, stop)
        return _Verdict(Outcome.RETRY, Action.NACK_REQUEUE, code=error.task_code, counted=True)

    async def _backoff(self, attempt: int, error: RetryableError, stop: StopSignal) -> None:
        delay_s = retry_backoff_s(attempt, error, self._settings, self._jitter())
        if delay_s > 0:
            await until(asyncio.sleep(delay_s), delay_s, stop.draining)  # a drain cuts it short

    async def _poison(self, run: DeliveryReporter, exc: EnvelopeDecodeError) -> _Verdict:
        run.task_id, run.client_id = exc.task_id, exc.client_id
        _logger.warning(
            "Poison message: %s",
            exc,
            extra={"task_id": exc.task_id, "poison_reason": exc.reason, "attempt": run.attempt},
        )
        if exc.task_id is None:
            return _Verdict(Outcome.POISON, Action.REJECT, poison_reason=exc.reason)
        verdict = await self._fail(run, ErrorCode.POISON_MESSAGE, f"the message was refused: {exc}")
        return replace(
            verdict,
            outcome=Outcome.POISON if verdict.outcome is Outcome.FAILURE else verdict.outcome,
            poison_reason=exc.reason,
        )

    async def _fail(self, run: DeliveryReporter, code: str, message: str) -> _Verdict:
        if not await run.publish_failure(code, message):
            return _publish_failed(run, code)
        return _Verdict(Outcome.FAILURE, Action.CONCLUDE, code=code)

    def _fields(self, run: DeliveryReporter) -> dict[str, Any]:
        return {"task_id": run.task_id, "service": self._service, "attempt": run.attempt}

    def _progress_dropped(self, reason: ProgressDropReason) -> None:
        self._notify(ProgressDropped(reason.value))

    def _context(
        self, run: DeliveryReporter, envelope: Envelope, throttle: ProgressThrottle
    ) -> TaskContext | SyncTaskContext:
        fields: dict[str, Any] = {
            "task_id": envelope.task_id,
            "client_id": envelope.client_id,
            "service": self._service,
            "attempt": run.attempt,
            "delivery_limit": run.limit,
            "input_refs": envelope.input_refs,
            "sink": throttle,
            "loop": asyncio.get_running_loop(),
        }
        if self._task.kind is HandlerKind.ASYNC:
            return TaskContext(**fields)
        return SyncTaskContext(**fields)

    async def _settle(
        self, run: DeliveryReporter, verdict: _Verdict, arrived_at: float
    ) -> Settlement:
        """Settle the delivery with the broker and log the decision: once per delivery."""
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
        try:
            if verdict.action is Action.NACK_REQUEUE:
                await self._transport.requeue(run.delivery, count_attempt=verdict.counted)
            elif verdict.action is Action.REJECT:
                await self._transport.reject(run.delivery)
            elif verdict.action is not Action.NONE:
                await self._transport.ack(run.delivery)
        except Exception as exc:
            # SettleError is the adapter's word for it; anything else is an adapter bug, but the
            # delivery is as unsettled either way, and the worker must go on.
            cause = exc.__cause__ if isinstance(exc, SettleError) and exc.__cause__ else exc
            settlement = replace(settlement, settled=False)
            _logger.warning(
                "The %s of the delivery did not reach the broker (%s); the broker will deliver it "
                "again, and its task may be reported twice",
                verdict.action.value,
                exception_type_name(cause),
                extra=self._fields(run),
            )
            self._notify(AckFailed())
        log_decision(settlement, service=self._service)
        self._notify(
            DeliverySettled(settlement, self._monotonic() - arrived_at, verdict.handler_ran)
        )
        return settlement

    def _notify(self, event: EngineEvent) -> None:
        for observer in self._observers:
            try:
                observer.notify(event)
            except Exception as exc:
                _logger.error(
                    "Observer %r failed on %s (%s); ignored",
                    observer,
                    type(event).__name__,
                    exception_type_name(exc),
                )
