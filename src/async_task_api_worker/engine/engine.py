"""One delivery in, one settlement out.

The engine admits the delivery (``engine.admission``: the envelope, the attempt against the
delivery limit, the input), publishes ``started``, runs the handler through an executor under
its timeout (the executor concludes it: ``task_call``), publishes the terminal report, and
settles the delivery (``engine.settlement``): every delivery exactly once, with one decision
line. A task is acked only after its terminal report is confirmed (publisher confirms).

It learns of a shutdown through a :class:`StopSignal` argument, never from signals, and imports
no transport: the runtime (or the test harness) hands it one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime

from async_task_api_worker.conclusion import Conclusion, Failure, HandedOff
from async_task_api_worker.definition import Worker
from async_task_api_worker.engine.admission import (
    UNKNOWN_COUNT_LIMIT,
    Admitted,
    Attempt,
    Refused,
    admit,
    attempt_of,
)
from async_task_api_worker.engine.cancels import CancelBook, Cancels
from async_task_api_worker.engine.execution import Stopped, StopSignal, execute
from async_task_api_worker.engine.hold import GiveUp
from async_task_api_worker.engine.progress import ProgressThrottle
from async_task_api_worker.engine.reporting import DeliveryReporter
from async_task_api_worker.engine.retries import requeue_for_retry, retry_backoff_s
from async_task_api_worker.engine.settlement import (
    Settler,
    Verdict,
    give_back_unreported,
    report_cancelled,
    report_conclusion,
    report_refusal,
)
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.ports import (
    Action,
    CancelToken,
    Delivery,
    DeliveryReceived,
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
from async_task_api_worker.settings import WorkerSettings
from async_task_api_worker.task_call import context_for

__all__ = ["UNKNOWN_COUNT_LIMIT", "Engine", "StopSignal", "retry_backoff_s"]

_logger = logging.getLogger("async_task_api_worker.engine")

_RECEIVED = DeliveryReceived()


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
        max_hold_s: the longest a report may hold its delivery, in seconds; default: until the
            broker could time the delivery out (``delivery_hold_s``). A face with a budget (the
            ``tick`` command) holds for less.
        handed_out: the ``tick`` command's: whether a task id was handed out already (its
            redelivery is acked, ``outcome=detached reason=already_handed_out``).

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
        max_hold_s: float | None = None,
        handed_out: Callable[[str], bool] | None = None,
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
        self._hold_s = settings.delivery_hold_s()
        if max_hold_s is not None:
            self._hold_s = min(self._hold_s, max_hold_s)
        self._handed_out = handed_out
        self._cancels = Cancels(
            CancelBook(settings.worker_cancel_memory, settings.worker_cancel_memory_s, monotonic),
            self._service,
            self._notify,
        )
        self._never = StopSignal()
        self._settler = Settler(transport, self._service, self._notify, monotonic)

    @property
    def task_timeout_s(self) -> float:
        """The effective task timeout, in seconds."""
        return self._timeout_s

    @property
    def cancels(self) -> Cancels:
        """The clients' cancel requests (``engine.cancels``): ``request``, ``request_body``."""
        return self._cancels

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
        run = self.reporter_for(delivery, arrived_at, stop)
        # The delivery's span is current from here to its settle: the handler's spans, the
        # reports' and the settle's are its children, and the task's log lines carry its ids.
        with tracing.processing(self._transport, delivery) as span:
            try:
                verdict = await self._process(run, stop)
            except asyncio.CancelledError:
                given_back = Verdict(Outcome.CANCELLED, Action.NACK_REQUEUE)
                span.ended(await self._settler.settle(run, given_back, arrived_at))
                raise
            except Exception as exc:
                _logger.error(
                    "Engine error while processing a delivery (%s); requeued\n%s",
                    exception_type_name(exc),
                    safe_traceback(exc),
                    extra={"task_id": run.task_id},
                )
                verdict = Verdict(Outcome.ENGINE_ERROR, Action.NACK_REQUEUE, counted=True)
            span.task(run.task_id, run.client_id)
            settlement = await self._settler.settle(run, verdict, arrived_at)
            span.ended(settlement)
            return settlement

    async def give_back(self, delivery: Delivery, reason: str) -> Settlement:
        """Give back a delivery the runtime never started (``shutdown_requeued``, ``reason``).

        It goes back without counting an attempt, with its decision line and metrics.

        Raises:
            asyncio.CancelledError: the caller was cancelled during the settle (it stands).
        """
        arrived_at = self._monotonic()
        self._notify(_RECEIVED)
        run = self.reporter_for(delivery, arrived_at)
        self.admit(run)  # its task id, for the line, when the body has one
        verdict = Verdict(Outcome.SHUTDOWN_REQUEUED, Action.NACK_REQUEUE, reason=reason)
        return await self._settler.settle(run, verdict, arrived_at)

    async def report_result(
        self,
        conclusion: Conclusion,
        *,
        via: Delivery,
        task_id: str,
        client_id: str | None,
        attempt: int,
        delivery_limit: int | None,
        reason: str,
    ) -> Settlement:
        """Report the conclusion of a task whose delivery was settled already, and log it.

        The ``tick`` command's sweep reports each result and expiry here: the terminal report
        goes out held as for a delivery, then the decision line (``action=none``, ``reason``:
        ``swept_result``, ``swept_expiry``) and the metrics. ``client_id`` is ``None`` and
        ``delivery_limit`` is ``None`` (the queue's own) when the task's marker was lost.
        ``via`` is the transport's delivery that reports and settles nothing
        (``RabbitMQTransport.report_only``).

        Returns:
            ``success`` or ``failure`` once the report is confirmed, else ``publish_failed``.
        """
        arrived_at = self._monotonic()
        self._notify(_RECEIVED)
        run = self.reporter_for(via, arrived_at)
        run.task_id, run.client_id = task_id, client_id
        run.attempt = attempt
        if delivery_limit is not None:
            run.limit = delivery_limit
        run.seq = 1  # after the ``started`` report of the hand-off
        verdict = await report_conclusion(run, conclusion)
        return await self._settler.settle(
            run, replace(verdict, action=Action.NONE, reason=reason), arrived_at
        )

    def reporter_for(
        self, delivery: Delivery, arrived_at: float, stop: StopSignal | None = None
    ) -> DeliveryReporter:
        """The reporter of one delivery, its attempt counted under the queue's rule.

        Args:
            delivery: the delivery (one that settles nothing for a report alone, such as a
                swept result).
            arrived_at: when it arrived, on the engine's monotonic clock.
            stop: the shutdown signal whose abort ends a held report.
        """
        attempt = attempt_of(delivery, delivery_limit=self._settings.worker_delivery_limit)
        return DeliveryReporter(
            delivery=delivery,
            attempt=attempt.number,
            limit=attempt.limit,
            count_known=attempt.count_known,
            service=self._service,
            transport=self._transport,
            wall_clock=self._wall_clock,
            notify=self._notify,
            monotonic=self._monotonic,
            # A report that cannot get out holds its delivery until the broker could time it
            # out: giving it back sooner would count an attempt against a task not at fault.
            hold_until=arrived_at + self._hold_s,
            max_report_bytes=self._settings.worker_max_report_bytes,
            abort=(stop or self._never).aborted,
        )

    def admit(self, run: DeliveryReporter) -> Admitted | Refused:
        """Admit ``run``'s delivery (``engine.admission``); an admitted task's ids go on ``run``."""
        admission = admit(
            run.delivery,
            Attempt(run.attempt, run.limit, run.count_known),
            task=self._task,
            service=self._service,
        )
        if isinstance(admission, Admitted):
            run.task_id, run.client_id = admission.fields.task_id, admission.fields.client_id
        return admission

    async def _process(self, run: DeliveryReporter, stop: StopSignal) -> Verdict:
        admission = self.admit(run)
        if isinstance(admission, Refused):
            return await report_refusal(run, admission)
        if self._handed_out is not None:  # the tick: no cancel reaches it (docs/detached.md)
            if self._handed_out(admission.fields.task_id):
                return Verdict(Outcome.DETACHED, Action.ACK, reason="already_handed_out")
            # A hand-off outlives the delivery, so it may start only once ``started`` is in.
            if not await run.publish_started():
                return give_back_unreported(run)
            return await self._start_task(run, admission, stop, None)
        task_id = admission.fields.task_id
        cancel = self._cancels.book.start(task_id)
        verdict: Verdict | None = None
        try:
            if cancel.cancelled:  # its cancel came first: it concludes without running
                verdict = await report_cancelled(run)
            else:
                # Confirmed while the handler runs: one confirm round trip per task, not two.
                run.begin_started()
                verdict = await self._start_task(run, admission, stop, cancel)
            return verdict
        finally:
            concluded = verdict is not None and verdict.action in (Action.ACK, Action.CONCLUDE)
            self._cancels.book.finish(task_id, cancel, concluded=concluded)

    async def _start_task(
        self, run: DeliveryReporter, task: Admitted, stop: StopSignal, cancel: CancelToken | None
    ) -> Verdict:
        self._notify(TaskStarted(task.fields.task_id))
        try:
            verdict = await self._run_task(run, task, stop, cancel)
        finally:
            run.end_started()  # no terminal report took it over: it is not waited for
        if run.started_error is not None:
            raise run.started_error  # refused for its content: the engine's error, not the task's
        return replace(verdict, handler_ran=True)

    async def _run_task(
        self, run: DeliveryReporter, task: Admitted, stop: StopSignal, cancel: CancelToken | None
    ) -> Verdict:
        throttle = ProgressThrottle(
            interval_s=self._settings.worker_progress_min_interval_s,
            publish=run.publish_progress,
            on_drop=lambda reason: self._notify(ProgressDropped(reason.value)),
            clock=self._monotonic,
        )
        request = ExecutionRequest(
            handler=self._task.handler,
            task_input=task.task_input,
            raw_input=task.envelope.input,
            context=context_for(
                self._task, task.fields, throttle, asyncio.get_running_loop(), cancel
            ),
            timeout_s=self._timeout_s,
            task_id=task.fields.task_id,
            output_model=self._task.output_model,
        )
        try:
            result = await execute(
                self._executor,
                request,
                task_fields=task.fields.log_fields,
                stop=stop,
                delivery_cancel=run.delivery.cancel_token,
                report_gave_up=run.started_gave_up,
                client_cancel=cancel,
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
                return Verdict(Outcome.CANCELLED, Action.NONE)
            if result.outcome is Outcome.PUBLISH_FAILED:
                return give_back_unreported(run)  # ``started`` could not get out
            if result.outcome is Outcome.CANCELLED_BY_CLIENT:
                return await report_cancelled(run)
            return Verdict(
                Outcome.SHUTDOWN_REQUEUED, Action.NACK_REQUEUE, reason=GiveUp.ABORTED.value
            )
        if isinstance(result, HandedOff):
            return Verdict(Outcome.DETACHED, Action.ACK)  # the hand-off is the durable receipt
        return await self._conclude(run, result, stop, cancel)

    async def _conclude(
        self,
        run: DeliveryReporter,
        conclusion: Conclusion,
        stop: StopSignal,
        cancel: CancelToken | None,
    ) -> Verdict:
        if isinstance(conclusion, Failure) and conclusion.retryable and run.attempt < run.limit:
            delay_s = retry_backoff_s(
                run.attempt, conclusion.retry_delay_s, self._settings, self._jitter()
            )
            verdict = await requeue_for_retry(
                run, conclusion, delay_s, stop, cancel=cancel, service=self._service
            )
            # A cancel during the backoff concludes the task here, with no next attempt.
            return await report_cancelled(run) if cancel and cancel.cancelled else verdict
        return await report_conclusion(run, conclusion)

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
