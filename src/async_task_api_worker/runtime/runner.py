"""The runner: consume deliveries, hand each to the engine, and stop gracefully.

States: ``created → starting → running → draining → stopped``. A shutdown request is
idempotent and safe in any state; the first one drains, a second one ends the grace period at
once. The drain: stop consuming (deliveries in hand but not started are given back), let the
in-flight tasks finish within ``WORKER_SHUTDOWN_GRACE_S``, give back the ones that did not
(without burning a delivery attempt, and with no report), then close the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from enum import StrEnum
from typing import Final

from async_task_api_worker.definition import HandlerKind, Worker
from async_task_api_worker.engine import Engine, StopSignal
from async_task_api_worker.errors import TransportError
from async_task_api_worker.executors import InlineExecutor, ThreadExecutor
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import Delivery, Executor, Observer, Transport
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.settings import WorkerSettings

__all__ = ["GIVE_BACK_TIMEOUT_S", "Runner", "RunnerState"]

_logger = logging.getLogger("async_task_api_worker.runtime")

#: Time the given-back deliveries get for their nacks after the grace period, in seconds.
GIVE_BACK_TIMEOUT_S: Final = 5.0
#: Time the transport gets to close, in seconds.
CLOSE_TIMEOUT_S: Final = 5.0


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
            ``WORKER_CONCURRENCY`` threads for ``def``.
        observers: told of every engine event.
    """

    def __init__(
        self,
        worker: Worker,
        settings: WorkerSettings,
        transport: Transport,
        *,
        executor: Executor | None = None,
        observers: Iterable[Observer] = (),
    ) -> None:
        self._worker = worker
        self._settings = settings
        self._transport = transport
        task = worker.task_definition
        self._executor: Executor = executor or (
            InlineExecutor()
            if task.kind is HandlerKind.ASYNC
            else ThreadExecutor(settings.worker_concurrency)
        )
        self._engine = Engine(worker, settings, transport, self._executor, observers=observers)
        self._state = RunnerState.CREATED
        self._stop = StopSignal()
        self._shutdown_requested = asyncio.Event()
        self._grace_over = asyncio.Event()
        self._in_flight: set[asyncio.Task[object]] = set()
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self._exit_code = ExitCode.OK

    @property
    def state(self) -> RunnerState:
        """The current state."""
        return self._state

    @property
    def in_flight(self) -> int:
        """Deliveries being processed right now."""
        return len(self._in_flight)

    def request_shutdown(self, reason: str = "requested") -> None:
        """Ask for a graceful stop; a second call ends the grace period at once. Idempotent."""
        if self._shutdown_requested.is_set():
            if not self._grace_over.is_set():
                _logger.warning("Second shutdown request (%s): ending the grace period", reason)
                self._grace_over.set()
            return
        _logger.info("Shutdown requested (%s): draining", reason)
        if self._state is RunnerState.RUNNING:
            self._state = RunnerState.DRAINING  # at once: readiness must say so from now on
        self._shutdown_requested.set()

    async def serve(self) -> ExitCode:
        """Connect, consume until a shutdown request (or a transport failure), then drain.

        Returns:
            ``OK`` after a clean stop, ``FAILURE`` if the transport gave up.

        Raises:
            RuntimeError: :meth:`serve` was already called.
            BrokerRefusedError: the broker refused the connection (a configuration error).
            BrokerUnavailableError: the broker could not be reached within its deadline.
        """
        if self._state is not RunnerState.CREATED:
            raise RuntimeError(f"serve() was already called (state: {self._state})")
        self._state = RunnerState.STARTING
        try:
            connecting = asyncio.ensure_future(self._transport.connect())
            requested = asyncio.ensure_future(self._shutdown_requested.wait())
            await asyncio.wait({connecting, requested}, return_when=asyncio.FIRST_COMPLETED)
            if not connecting.done():  # a shutdown during startup does not wait for it
                connecting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await connecting
                await self._close()
                return ExitCode.OK
            requested.cancel()
            connecting.result()
            self._state = RunnerState.RUNNING
            consuming = asyncio.ensure_future(self._consume())
            waiter = asyncio.ensure_future(self._shutdown_requested.wait())
            await asyncio.wait({consuming, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            await self._drain(consuming)
        finally:
            self._state = RunnerState.STOPPED
            await self._executor.aclose()
        return self._exit_code

    async def _consume(self) -> None:
        try:
            async for delivery in self._transport.deliveries():
                try:
                    await self._slots.acquire()
                except asyncio.CancelledError:
                    # In hand but never started: give it back without burning an attempt.
                    with contextlib.suppress(Exception):
                        await self._transport.requeue(delivery, count_attempt=False)
                    raise
                task = asyncio.ensure_future(self._handle(delivery))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
        except TransportError as exc:
            _logger.error("The transport gave up (%s): %s", exception_type_name(exc), exc)
            self._exit_code = ExitCode.FAILURE
            self._shutdown_requested.set()

    async def _handle(self, delivery: Delivery) -> None:
        try:
            await self._engine.handle(delivery, self._stop)
        finally:
            self._slots.release()

    async def _drain(self, consuming: asyncio.Future[None]) -> None:
        self._state = RunnerState.DRAINING
        self._stop.draining.cancel("shutdown")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._transport.stop_consuming(), timeout=CLOSE_TIMEOUT_S)
        consuming.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await consuming
        if self._in_flight:
            _logger.info(
                "Waiting up to %g s for %d in-flight tasks",
                self._settings.worker_shutdown_grace_s,
                len(self._in_flight),
            )
            grace = asyncio.ensure_future(self._grace_over.wait())
            everything = asyncio.ensure_future(asyncio.wait(set(self._in_flight)))
            await asyncio.wait(
                {grace, everything},
                timeout=self._settings.worker_shutdown_grace_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            grace.cancel()
            everything.cancel()
        if self._in_flight:
            _logger.warning(
                "Grace period over: giving back %d unfinished deliveries", len(self._in_flight)
            )
            self._stop.aborted.cancel("grace period over")
            await asyncio.wait(set(self._in_flight), timeout=GIVE_BACK_TIMEOUT_S)
        await self._close()

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._transport.close(), timeout=CLOSE_TIMEOUT_S)
