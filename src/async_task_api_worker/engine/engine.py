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

from async_task_api_worker.conclusion import Failure, HandedOff
from async_task_api_worker.definition import Worker
from async_task_api_worker.engine.admission import (
    UNKNOWN_COUNT_LIMIT,
    Admitted,
    Attempt,
    Refused,
    admit,
    attempt_of,
    handed_out_before,
)
from async_task_api_worker.engine.cancels import CancelBook, Cancels
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.engine.execution import StopSignal, confirming, execute
from async_task_api_worker.engine.progress import ProgressThrottle
from async_task_api_worker.engine.reporting import DeliveryReporter
from async_task_api_worker.engine.retries import retry_backoff_s, wait_before_retry
from async_task_api_worker.engine.settlement import Settler, conclude
from async_task_api_worker.engine.verdict import (
    Ending,
    EngineFailed,
    GivenBack,
    Stopped,
    Swept,
    Verdict,
    decide,
    retries,
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
#: A delivery whose caller was cancelled goes back uncounted; one the engine failed, counted.
_CALLER_CANCELLED = decide(GivenBack(Outcome.CANCELLED), Attempt(1, 1, count_known=True))
_ENGINE_FAILED = decide(EngineFailed(), Attempt(1, 1, count_known=True))


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
        hold_s: the longest a report that cannot get out holds its delivery, from its arrival,
            in seconds; default: until the broker could time it out
            (``WorkerSettings.delivery_hold_s``).

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
        hold_s: float | None = None,
    ) -> None:
        self._task, self._error_hooks = worker.task_definition, worker.task_error_hooks
        self._service = worker.name
        self._settings = settings
        self._transport = transport
        self._executor = executor
        self._observers = tuple(observers)
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._jitter = jitter
        self._timeout_s = settings.task_timeout_s(self._task.timeout_s)
        # A report that cannot get out holds its delivery until the broker could time it out.
        self._hold_s = settings.delivery_hold_s(self._timeout_s) if hold_s is None else hold_s
        # An executor whose work outlives the delivery (``hands_off``) publishes ``started``
        # before its hand-off, and says which tasks it handed out before (``ports.Executor``).
        self._hands_off = bool(getattr(executor, "hands_off", False))
        self._handed_out: Callable[[str], bool] | None = (
            getattr(executor, "handed_out", None) if self._hands_off else None
        )
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

        Admission, ``started``, the call, the terminal report and the settle run in this one
        scope, and the delivery is settled exactly once on the way out, whatever happened.

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
        # Current up to the settle, the parent of every span and log line of the delivery.
        with tracing.processing(self._transport, delivery) as span:
            verdict = _CALLER_CANCELLED  # what stands when the caller's cancel cuts through
            try:
                verdict = await self._process(run, stop)
            except Exception as exc:
                _logger.error(
                    "Engine error while processing a delivery (%s); requeued\n%s",
                    exception_type_name(exc),
                    safe_traceback(exc),
                    extra={"task_id": run.task_id},
                )
                verdict = _ENGINE_FAILED
            finally:
                span.task(run.task_id, run.client_id)
                settlement = await self._settler.settle(run, verdict, arrived_at)
                span.ended(settlement)
            return settlement

    async def give_back(self, delivery: Delivery, reason: Reason) -> Settlement:
        """Give back a delivery the runtime never started (``shutdown_requeued``, ``reason``).

        It goes back without counting an attempt, with its decision line and metrics.

        Raises:
            asyncio.CancelledError: the caller was cancelled during the settle (it stands).
        """
        arrived_at = self._monotonic()
        self._notify(_RECEIVED)
        run = self.reporter_for(delivery, arrived_at)
        self.admit(run)  # its task id, for the line, when the body has one
        ending = GivenBack(Outcome.SHUTDOWN_REQUEUED, reason)
        return await self._settler.settle(run, await conclude(run, ending), arrived_at)

    async def report_swept(
        self,
        swept: Swept,
        *,
        via: Delivery,
        task_id: str,
        client_id: str | None,
        attempt: int,
        delivery_limit: int | None,
    ) -> Settlement:
        """Report the conclusion of a task whose delivery was settled already, and log it.

        The ``tick`` command's sweep reports each result and expiry here: the terminal report
        goes out held as for a delivery, then the decision line (``action=none``, the swept
        ``reason``) and the metrics. ``client_id`` is ``None`` and ``delivery_limit`` is
        ``None`` (the queue's own) when the task's marker was lost. ``via`` is the
        transport's delivery that reports and settles nothing
        (``RabbitMQTransport.report_only``): its delivery was acked at hand-off. The report's
        timestamp is ``swept.made_at`` where given.

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
        if (made_at := swept.made_at) is not None:
            run.wall_clock = lambda: made_at
        return await self._settler.settle(run, await conclude(run, swept), arrived_at)

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
        attempt = self._attempt_of(delivery)
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
            # Held until the broker could time it out: sooner would count an attempt (no fault).
            hold_until=arrived_at + self._hold_s,
            max_report_bytes=self._settings.worker_max_report_bytes,
            abort=(stop or self._never).aborted,
            arrived_at=arrived_at,
        )

    def admit(self, run: DeliveryReporter) -> Admitted | Refused:
        """Admit ``run``'s delivery (``engine.admission``); an admitted task's ids go on ``run``."""
        admission = admit(
            run.delivery,
            self._attempt_of(run.delivery),  # its hand-out too, which the reporter does not keep
            task=self._task,
            service=self._service,
        )
        if isinstance(admission, Admitted):
            run.task_id, run.client_id = admission.fields.task_id, admission.fields.client_id
        return admission

    async def _process(self, run: DeliveryReporter, stop: StopSignal) -> Verdict:
        admission = self.admit(run)
        if isinstance(admission, Refused):
            run.task_id, run.client_id = admission.task_id, admission.client_id
        if handed_out_before(admission, self._handed_out):
            return await conclude(run, HandedOff(already=True))
        if isinstance(admission, Refused):
            return await conclude(run, admission)
        if self._hands_off:  # its work outlives the delivery: no cancel reaches it
            return await self._run_task(run, admission, stop, None)
        task_id = admission.fields.task_id
        cancel = self._cancels.book.start(task_id, run)
        verdict: Verdict | None = None
        try:
            if cancel.cancelled:  # its cancel came first: it concludes without running
                verdict = await conclude(run, Stopped(Outcome.CANCELLED_BY_CLIENT))
            else:
                verdict = await self._run_task(run, admission, stop, cancel)
            return verdict
        finally:
            concluded = verdict is not None and verdict.action in (Action.ACK, Action.CONCLUDE)
            self._cancels.book.finish(task_id, cancel, concluded=concluded)

    async def _run_task(
        self, run: DeliveryReporter, task: Admitted, stop: StopSignal, cancel: CancelToken | None
    ) -> Verdict:
        """Run the task and publish its terminal report, ``started`` held beside both."""
        self._notify(TaskStarted(task.fields.task_id))
        if not self._hands_off:
            # Confirmed while the handler runs: one confirm round trip per task, not two.
            run.begin_started()
        try:
            ending = await self._call(run, task, stop, cancel)
            if retries(ending, self._attempt(run)) and await self._back_off(
                run, ending, stop, cancel
            ):  # cancelled during the backoff: it concludes, with no next attempt
                ending = Stopped(Outcome.CANCELLED_BY_CLIENT)
            verdict = await conclude(run, ending)
        finally:
            run.end_started()  # no terminal report took it over: it is not waited for
        if run.started_error is not None:
            raise run.started_error  # refused for its content: the engine's error, not the task's
        return replace(verdict, handler_ran=True)

    async def _call(
        self, run: DeliveryReporter, task: Admitted, stop: StopSignal, cancel: CancelToken | None
    ) -> Ending:
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
            started=confirming(run.publish_started) if self._hands_off else None,
            on_error=self._error_hooks,
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
        # A held progress update goes out before the terminal report; none after it, and none
        # for a run that stopped or whose conclusion is void.
        await throttle.close(flush=not isinstance(result, (Stopped, GivenBack)))
        return result

    async def _back_off(
        self, run: DeliveryReporter, failure: Failure, stop: StopSignal, cancel: CancelToken | None
    ) -> bool:
        """Wait before a retry; whether the task's client cancelled it meanwhile."""
        delay_s = retry_backoff_s(
            run.attempt, failure.retry_delay_s, self._settings, self._jitter()
        )
        await wait_before_retry(run, delay_s, stop, cancel=cancel, service=self._service)
        return cancel is not None and cancel.cancelled

    def _attempt_of(self, delivery: Delivery) -> Attempt:
        """``delivery``'s attempt and hand-out under the settings' limits."""
        return attempt_of(
            delivery,
            delivery_limit=self._settings.worker_delivery_limit,
            acquired_limit=self._settings.worker_acquired_limit,
        )

    @staticmethod
    def _attempt(run: DeliveryReporter) -> Attempt:
        return Attempt(run.attempt, run.limit, run.count_known)

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
