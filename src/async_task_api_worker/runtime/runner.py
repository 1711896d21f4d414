"""The runner: consume deliveries, hand each to the engine, and stop gracefully.

States: ``created → starting → running → draining → stopped``. A shutdown request is
idempotent and safe in any state; the first one drains, a second one ends the grace period at
once. The drain: stop consuming (deliveries in hand but not started are given back), let the
in-flight tasks finish within the grace period (``WORKER_SHUTDOWN_GRACE_S``; on a transport
that deletes on pickup, at least the task timeout: ``hooks.drain_grace_s``), give back the ones
that did not (without burning a delivery attempt, and with no report), then close the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from enum import StrEnum

from async_task_api_worker.broker_rules import lease_expiry_s
from async_task_api_worker.definition import Worker
from async_task_api_worker.engine import Engine, StopSignal
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.errors import TransportError
from async_task_api_worker.executors import executor_for
from async_task_api_worker.observability.metrics import WorkerMetrics
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import Delivery, Executor, Lease, Observer, Transport
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.hooks import (
    GIVE_BACK_TIMEOUT_S,
    STOP_CONSUMING_MIN_S,
    StartupHookError,
    close_timeout_s,
    drain_grace_s,
    run_shutdown_hooks,
    run_startup_hooks,
)
from async_task_api_worker.runtime.inspection import Inspection
from async_task_api_worker.settings import WorkerMode, WorkerSettings

__all__ = ["Runner", "RunnerState", "lease_for"]

_logger = logging.getLogger("async_task_api_worker.runtime")


def lease_for(settings: WorkerSettings, transport: Transport) -> Lease | None:
    """The lease the worker's task processes hold (``ports.Lease``); ``None`` without one.

    It expires after ``broker_rules.lease_expiry_s``, and is renewed while ``transport`` holds
    its deliveries (``Transport.holding``).
    """
    expiry_s = lease_expiry_s(settings)
    return None if expiry_s is None else Lease(expiry_s, lambda: transport.holding)


class RunnerState(StrEnum):
    """Where the runner is in its life."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Runner:
    """Runs one worker on one transport until it is asked to stop.

    Args:
        worker: the worker.
        settings: its settings.
        transport: the broker (connected by :meth:`serve`).
        executor: runs the handler; default: inline for ``async def``, a thread pool of
            ``WORKER_CONCURRENCY`` threads for ``def``, a process per task (holding
            :func:`lease_for`) for ``isolation="process"``.
        observers: told of every engine event, after :attr:`metrics`.
        metrics: the worker's metrics; default: new ones on a registry of their own.
    """

    def __init__(
        self,
        worker: Worker,
        settings: WorkerSettings,
        transport: Transport,
        *,
        executor: Executor | None = None,
        observers: Iterable[Observer] = (),
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._worker = worker
        self.metrics = metrics or WorkerMetrics()
        """The worker's Prometheus metrics (served on ``/metrics``)."""
        self._settings = settings
        self._transport = transport
        self._executor: Executor = executor or executor_for(
            worker.task_definition, settings.worker_concurrency, lease_for(settings, transport)
        )
        observers = (self.metrics, *observers)
        self._engine = Engine(worker, settings, transport, self._executor, observers=observers)
        for observer in observers:  # what the broker does to the consumer (its cancels)
            transport.observe(observer)
        self._grace_s = drain_grace_s(settings, self._engine.task_timeout_s)
        self._state = RunnerState.CREATED
        self._stop = StopSignal()
        self._shutdown_requested = asyncio.Event()
        self._grace_over = asyncio.Event()
        self._in_flight: set[asyncio.Task[object]] = set()
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self._exit_code = ExitCode.OK
        self._started_hooks = False
        self._job = settings.worker_mode is WorkerMode.JOB
        self._quota = settings.worker_job_max_deliveries
        self._quota_reached = False
        self._arrivals = 0
        self._activity = asyncio.Event()
        self.failure: BaseException | None = None
        """Why :meth:`serve` returned ``FAILURE``: the startup hook's or the transport's error
        (``None`` when only a stuck handler made it fail)."""
        self._requested_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def state(self) -> RunnerState:
        """The current state."""
        return self._state

    @property
    def in_flight(self) -> int:
        """Deliveries being processed right now."""
        return len(self._in_flight)

    @property
    def transport(self) -> Transport:
        """The transport this runner consumes from."""
        return self._transport

    @property
    def engine(self) -> Engine:
        """The engine that settles this runner's deliveries."""
        return self._engine

    @property
    def grace_s(self) -> float:
        """The drain's grace period, in seconds (``runtime.hooks.drain_grace_s``)."""
        return self._grace_s

    @property
    def worker(self) -> Worker:
        """The worker being run."""
        return self._worker

    @property
    def settings(self) -> WorkerSettings:
        """The worker's settings."""
        return self._settings

    @property
    def quota_reached(self) -> bool:
        """Job mode: the quota of deliveries is in hand and the consumer cancelled."""
        return self._quota_reached

    def readiness(self) -> dict[str, str]:
        """The runtime's components that are not ready, and why.

        Source: seed "Probes, metrics and logs". ``draining`` once a shutdown is requested or
        a job's quota is in hand; ``broker`` while not connected, the connection not known to
        be alive (a heartbeat without a frame), the consumer not active, or publishing blocked
        by the broker (a memory or disk alarm: reports would be held).
        """
        failing: dict[str, str] = {}
        if self._state in (RunnerState.DRAINING, RunnerState.STOPPED):
            failing["draining"] = "the worker is shutting down"
        elif self._quota_reached:
            failing["draining"] = f"the job's quota is in hand ({self._quota} of {self._quota})"
        elif self._state is not RunnerState.RUNNING:
            failing["broker"] = "not connected yet"
        elif not self._transport.consuming:
            failing["broker"] = "not connected, not known to be alive, or not consuming"
        elif self._transport.publishing_blocked:
            failing["broker"] = "reports cannot be published: the broker blocks them, or is silent"
        return failing

    def request_shutdown(self, reason: str = "requested") -> None:
        """Ask for a graceful stop; a second call ends the grace period at once. Idempotent.

        Safe from any thread: called off the serving loop, it is handed to that loop.
        """
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is not None and running is not self._loop:
            self._loop.call_soon_threadsafe(self.request_shutdown, reason)
            return
        if self._shutdown_requested.is_set():
            if not self._grace_over.is_set():
                _logger.warning("Second shutdown request (%s): ending the grace period", reason)
                self._grace_over.set()
            return
        _logger.info("Shutdown requested (%s): draining", reason)
        self._requested_at = None if running is None else running.time()
        if self._state is RunnerState.RUNNING:
            self._state = RunnerState.DRAINING  # at once: readiness must say so from now on
        self._shutdown_requested.set()

    async def serve(self) -> ExitCode:
        """Run the startup hooks, connect, consume until a shutdown request, then drain.

        Returns:
            ``OK`` after a clean stop; ``FAILURE`` if a startup hook raised, the transport gave
            up, or a handler is still running after the drain (:attr:`stuck_task_ids`).

        Raises:
            RuntimeError: :meth:`serve` was already called.
            BrokerRefusedError: the broker refused the connection (a configuration error).
            BrokerUnavailableError: the broker could not be reached within its deadline.
        """
        if self._state is not RunnerState.CREATED:
            raise RuntimeError(f"serve() was already called (state: {self._state})")
        self._loop = asyncio.get_running_loop()
        self._state = RunnerState.STARTING
        try:
            starting = asyncio.ensure_future(self._start())
            requested = asyncio.ensure_future(self._shutdown_requested.wait())
            await asyncio.wait({starting, requested}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():  # a shutdown during startup does not wait for it
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await starting
                await self._close()
                return self._exit_code
            requested.cancel()
            starting.result()
            self._state = RunnerState.RUNNING
            consuming = asyncio.ensure_future(self._consume())
            waiter = asyncio.ensure_future(self._shutdown_requested.wait())
            # In job mode, consuming ends by design once the quota is in hand: the job ends when
            # its tasks are done (with their own timeouts, not the grace period), or when idle.
            # A transport failure still requests the shutdown.
            watched = {waiter, asyncio.ensure_future(self._watch_job()) if self._job else consuming}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for future in watched - {consuming}:
                future.cancel()
            await self._drain(consuming)
        except StartupHookError as exc:
            _logger.error("The worker did not start: %s", exc)
            self._exit_code = ExitCode.FAILURE
            self.failure = exc
            await self._close()
        finally:
            self._state = RunnerState.STOPPED
            if self._started_hooks:
                await run_shutdown_hooks(
                    self._worker.shutdown_hooks, self._settings.worker_shutdown_hooks_timeout_s
                )
            self._check_stuck()
            await self._executor.aclose()
        return self._exit_code

    async def _start(self) -> None:
        await run_startup_hooks(self._worker.startup_hooks)
        self._started_hooks = True
        await self._executor.start()
        if not self._transport.listen_for_cancels(self._engine.cancels.request_body):
            _logger.info("This transport receives no cancel requests")
        # Optional, like an executor's ``hands_off``: RabbitMQ's control exchange carries them.
        if (answer := getattr(self._transport, "answer_inspections", None)) is not None:
            concurrency, running = self._settings.worker_concurrency, self._engine.cancels.book
            answer(Inspection(self._worker.name, concurrency, running.running).answer)
        await self._transport.connect()

    @property
    def stuck_task_ids(self) -> tuple[str, ...]:
        """Tasks whose handler still runs after the drain (a thread cannot be stopped)."""
        stuck = getattr(self._executor, "stuck_task_ids", ())
        return tuple(stuck)

    def _check_stuck(self) -> None:
        stuck = self.stuck_task_ids
        for task_id in stuck:
            _logger.error(
                "The handler of task %s is still running after the drain and cannot be stopped",
                task_id,
                extra={"task_id": task_id},
            )
        if stuck:
            self._exit_code = ExitCode.FAILURE

    async def _watch_job(self) -> None:
        """Job mode: return once the quota is in hand and done, or after an idle wait."""
        loop = asyncio.get_running_loop()
        idle_s = self._settings.worker_job_idle_timeout_s
        idle_since = loop.time()
        while True:
            if self._quota_reached and not self._in_flight:
                _logger.info("Job quota done (%d of %d deliveries)", self._quota, self._quota)
                return
            self._activity.clear()
            if self._in_flight or self._quota_reached:
                await self._activity.wait()
                idle_since = loop.time()
                continue
            try:
                await asyncio.wait_for(
                    self._activity.wait(), timeout=max(0.0, idle_since + idle_s - loop.time())
                )
            except TimeoutError:
                _logger.info("No delivery for %g s: the job ends", idle_s)
                return
            idle_since = loop.time()

    async def _consume(self) -> None:
        try:
            async for delivery in self._transport.deliveries():
                self._arrivals += 1
                try:
                    await self._slots.acquire()
                except asyncio.CancelledError:
                    # In hand but never started: given back without burning an attempt.
                    await self._engine.give_back(delivery, Reason.NEVER_STARTED)
                    raise
                task = asyncio.ensure_future(self._handle(delivery))
                self._in_flight.add(task)
                task.add_done_callback(self._finished)
                self._activity.set()
                if self._job and self._arrivals >= self._quota:
                    # The last one is in hand (and registered): consume no more, so that no
                    # other message is held, or pushed towards its delivery limit, by a job
                    # about to exit.
                    self._quota_reached = True
                    await self._stop_consuming()
        except TransportError as exc:
            _logger.error("The transport gave up (%s): %s", exception_type_name(exc), exc)
            self._exit_code = ExitCode.FAILURE
            self.failure = exc
            self._shutdown_requested.set()

    async def _stop_consuming(self) -> None:
        """Stop the consumer; what it received and never handed out goes back.

        Each through the engine's give-back: a decision line each, no attempt counted.
        """
        left: Sequence[Delivery] = ()
        with contextlib.suppress(Exception):
            left = await asyncio.wait_for(
                self._transport.stop_consuming(), timeout=STOP_CONSUMING_MIN_S
            )
        for delivery in left:
            await self._engine.give_back(delivery, Reason.NEVER_STARTED)

    async def _handle(self, delivery: Delivery) -> None:
        try:
            await self._engine.handle(delivery, self._stop)
        finally:
            self._slots.release()

    def _finished(self, task: asyncio.Task[object]) -> None:
        # Signalled only once the task has left the in-flight set, so that a watcher woken
        # by it sees the set as it now is.
        self._in_flight.discard(task)
        self._activity.set()

    async def _drain(self, consuming: asyncio.Future[None]) -> None:
        self._state = RunnerState.DRAINING
        self._stop.draining.cancel("shutdown")
        await self._stop_consuming()
        consuming.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await consuming
        loop = asyncio.get_running_loop()
        # The grace period runs from the signal, stopping the consumer included.
        grace_ends = (self._requested_at or loop.time()) + self._grace_s
        if self._in_flight and not self._grace_over.is_set():
            _logger.info(
                "Waiting up to %.1f s for the in-flight tasks (%d)",
                max(0.0, grace_ends - loop.time()),
                len(self._in_flight),
            )
            grace = asyncio.ensure_future(self._grace_over.wait())
            everything = asyncio.ensure_future(asyncio.wait(set(self._in_flight)))
            await asyncio.wait(
                {grace, everything},
                timeout=max(0.0, grace_ends - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            grace.cancel()
            everything.cancel()
        if self._in_flight:
            _logger.warning(
                "Grace period over: giving back the unfinished deliveries (%d)",
                len(self._in_flight),
            )
            self._stop.aborted.cancel("grace period over")
            await asyncio.wait(set(self._in_flight), timeout=GIVE_BACK_TIMEOUT_S)
        await self._close()

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._transport.close(), timeout=close_timeout_s(self._settings))
