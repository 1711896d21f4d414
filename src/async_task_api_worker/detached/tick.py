"""One budgeted tick on RabbitMQ: a face of the engine whose tasks outlive their delivery.

The ``tick`` command (seed 002 applied to the worker's own queue) is the engine with a transport
that takes one delivery at a time (prefetch 1: nothing unstarted is held) and the detached
executor (docs/architecture.md, "The tick"):

1. connect (at most a third of the budget, and 10 s);
2. **sweep first, always**: every finished result is reported as its task's terminal report,
   every marker past its deadline as a ``WORKER_DIED`` or ``TASK_TIMEOUT`` failure, through the
   engine's reporting and settlement (``Engine.report_swept``), with a decision line each;
3. take up to ``max_new`` deliveries through ``Engine.handle``: the same admission, ``started``
   report and settlement as ``run``; the executor (:class:`DetachedExecutor`) waits for
   ``started``'s confirm, writes the marker and spawns the detached worker, and the delivery is
   acked only then (the marker is the durable receipt, ``outcome=detached``); a task it handed
   out before it concludes at once (``reason=already_handed_out``);
4. stop taking work once less than ``margin_s`` of the budget is left, give back what the broker
   pushed meanwhile, close (at most 5 s).

A report that cannot get out is held for a short while only (:func:`hold_for`): the tick's
budget is short, so its engine's settings say that a delivery times out then. A tick that
could not report or settle something says so on one line and ends with :attr:`TickReport.ok`
false (the command exits 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.conclusion import (
    ExecutionResult,
    HandedOff,
)
from async_task_api_worker.definition import Worker
from async_task_api_worker.detached.outcomes import detached_conclusion, report_made_at
from async_task_api_worker.detached.spawn import spawn_detached
from async_task_api_worker.detached.state import handed_out
from async_task_api_worker.detached.sweep import SweepReport, Undeliverable, sweep
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.engine.engine import Engine
from async_task_api_worker.engine.verdict import Swept
from async_task_api_worker.errors import BrokerUnavailableError, SettingsError
from async_task_api_worker.ports import Delivery, ExecutionRequest, Observer, Outcome, Settlement
from async_task_api_worker.runtime.entry import transport_for
from async_task_api_worker.settings import WorkerSettings
from async_task_api_worker.task_call import TaskFields, fields_of
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport

__all__ = [
    "DetachedExecutor",
    "TickReport",
    "hold_for",
    "margin_for",
    "run_tick",
    "sweep_and_report",
]

_logger = logging.getLogger("async_task_api_worker.detached")

#: Seconds a tick waits for a new delivery before it decides there is none.
IDLE_WAIT_S: Final = 1.0
#: Seconds closing the connection may take.
CLOSE_TIMEOUT_S: Final = 5.0
#: The longest a tick holds a report the broker does not take, in seconds.
MAX_TICK_HOLD_S: Final = 10.0
#: The outcomes of a delivery that went as it should (anything else makes the tick fail).
_SETTLED_WELL: Final = frozenset(
    {Outcome.SUCCESS, Outcome.FAILURE, Outcome.POISON, Outcome.DETACHED}
)


def margin_for(budget_s: float) -> float:
    """The part of the budget a tick keeps free at its end: 25 %, at least 6 s.

    It covers the last spawn, the give-back of a pushed delivery and the close (5 s at most).
    """
    return max(6.0, 0.25 * budget_s)


def hold_for(margin_s: float) -> float:
    """How long a tick holds a report the broker does not take: 10 s, at most half the margin."""
    return min(MAX_TICK_HOLD_S, margin_s / 2)


@dataclass
class TickReport:
    """What a tick did.

    Attributes:
        swept: what the sweep delivered, expired and moved aside.
        spawned: task ids handed to a detached worker.
        concluded: task ids concluded at once (a refused delivery: poison, invalid input...).
        problems: one line for each report or settle that did not go through (the tick is
            then not :attr:`ok`).
    """

    swept: SweepReport = field(default_factory=SweepReport)
    spawned: list[str] = field(default_factory=list)
    concluded: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every report and settle of the tick went through."""
        return not self.problems

    def record(self, settlement: Settlement) -> None:
        """Count one delivery's settlement."""
        if not settlement.settled or settlement.outcome not in _SETTLED_WELL:
            self.problems.append(
                f"task {settlement.task_id or '(unknown)'}: outcome={settlement.outcome.value} "
                f"settled={str(settlement.settled).lower()}"
            )
        elif settlement.outcome is Outcome.DETACHED:
            if settlement.reason is None and settlement.task_id:
                self.spawned.append(settlement.task_id)
        elif settlement.task_id:
            self.concluded.append(settlement.task_id)


class DetachedExecutor:
    """Hands each task to a detached worker (seed 002): the tick's executor.

    ``execute`` waits for ``started``'s confirm (``request.started``: a hand-off outlives its
    delivery), writes the task's input and in-flight marker in ``state_dir`` and starts a
    detached worker running ``target``'s task through the task call, then returns
    :class:`~async_task_api_worker.conclusion.HandedOff`: the worker's result is reported by a
    later sweep. The marker's ``meta`` holds the task's fields, for that report. The engine asks
    :meth:`handed_out` before it admits a delivery: a task handed out before is concluded as
    ``HandedOff(already=True)``, with no ``started`` and no second run, whatever its count.

    Args:
        state_dir: the state directory.
        target: ``module:worker`` of the worker (the detached worker loads it again).
    """

    #: Its work outlives the delivery: the engine leaves ``started`` to it (``ports.Executor``).
    hands_off: Final = True

    def __init__(self, state_dir: Path, target: str) -> None:
        self._state_dir = state_dir
        self._target = target

    async def start(self) -> None:
        """Nothing to prepare."""

    async def aclose(self) -> None:
        """Nothing to release: detached workers outlive the tick on purpose."""

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Write the marker and spawn the worker (in a thread: it forks and fsyncs).

        Raises:
            OSError: the state files could not be written (nothing was started).
            Exception: whatever ``request.started`` raised (it gave up: nothing was started).
        """
        fields = fields_of(request.context)
        if request.started is not None:
            await request.started()
        work = {"input": dict(request.raw_input), "context": fields.to_json()}
        try:
            await asyncio.to_thread(
                spawn_detached,
                self._state_dir,
                fields.task_id,
                work,
                handler=self._target,
                deadline_s=request.timeout_s,
                meta=_meta(fields),
                sdk_worker=True,
                forget_reported=False,
            )
        except FileExistsError:  # another tick's hand-out of it committed first
            return HandedOff(already=True)
        return HandedOff()

    def handed_out(self, task_id: str) -> bool:
        """Whether ``task_id`` was handed out already (``state.handed_out``: the one test).

        Its marker, its result (claimed by a sweep in flight or not) or its ``.done``. What a
        hand-out killed before its commit left (a temporary file) is not: the task runs again.
        """
        return handed_out(self._state_dir, task_id)


def _meta(fields: TaskFields) -> dict[str, Any]:
    document = fields.to_json()
    del document["input_refs"]
    return document


class _ResultNotReported(Exception):
    """The broker did not take a swept result's report: the sweep keeps the file and stops."""


async def _report_swept(
    engine: Engine,
    service: str,
    correlation_id: str,
    result: dict[str, Any],
    reason: Reason,
    *,
    via: Delivery,
) -> Settlement:
    # Lost state (an unreadable marker, no input left) leaves the task id (the file's name)
    # and nothing else: attempt 1 under the queue's limit, and no client id (docs/protocol.md).
    meta = {"service": service, "task_id": correlation_id, **(result.get("meta") or {})}
    client_id = meta.get("client_id")
    try:
        attempt = int(meta.get("attempt", 1))
        limit = None if meta.get("delivery_limit") is None else int(meta["delivery_limit"])
    except (TypeError, ValueError) as exc:
        raise Undeliverable(f"meta that cannot be read ({type(exc).__name__})") from exc
    return await engine.report_swept(
        Swept(detached_conclusion(result), reason, report_made_at(result)),
        via=via,
        task_id=str(meta["task_id"]),
        client_id=None if client_id is None else str(client_id),
        attempt=attempt,
        delivery_limit=limit,
    )


async def run_tick(
    worker: Worker,
    target: str,
    settings: WorkerSettings,
    state_dir: Path,
    *,
    budget_s: float,
    max_new: int = 1,
    margin_s: float | None = None,
    observers: Iterable[Observer] = (),
) -> TickReport:
    """Run one tick (see the module) and return what it did, within ``budget_s`` seconds.

    Args:
        worker: the worker whose task the detached workers run.
        target: its ``module:worker`` reference (for the detached workers).
        settings: the worker's settings.
        state_dir: the state directory.
        budget_s: the tick's budget, in seconds.
        max_new: the most deliveries to take.
        margin_s: the part of the budget kept free at the end (default :func:`margin_for`).
        observers: told of the engine's events (metrics), as in ``run``.

    Raises:
        BrokerRefusedError, BrokerUnavailableError: the broker could not be used.
    """
    loop = asyncio.get_running_loop()
    ends = loop.time() + budget_s
    keep_free_s = margin_for(budget_s) if margin_s is None else margin_s
    if max_new > 0 and budget_s <= keep_free_s:
        _logger.warning(
            "A budget of %g s leaves no room for new work (the last %g s are kept free): this "
            "tick only sweeps",
            budget_s,
            keep_free_s,
        )
    state_dir = Path(state_dir)
    # One delivery at a time (prefetch 1); the tick bounds the connect itself, below.
    transport = transport_for(worker, settings.model_copy(update={"worker_concurrency": 1}))
    if not isinstance(transport, RabbitMQTransport):  # its sweep reports with report_only
        raise SettingsError(
            "invalid setting WORKER_TRANSPORT: the tick command runs on RabbitMQ (rabbitmq)"
        )
    executor = DetachedExecutor(state_dir, target)
    # The tick's engine holds a report only as long as the tick may, or the broker lets it.
    timeout_s = settings.task_timeout_s(worker.task_definition.timeout_s)
    hold_s = min(hold_for(keep_free_s), settings.delivery_hold_s(timeout_s))
    engine = Engine(worker, settings, transport, executor, observers=observers, hold_s=hold_s)
    report = TickReport()
    connect_s = max(1.0, min(10.0, budget_s / 3))
    try:
        async with asyncio.timeout(connect_s):
            await transport.connect()
    except TimeoutError:
        raise BrokerUnavailableError(
            f"the broker did not answer within {connect_s:.3g} s (a third of the budget, 10 s "
            "at most)"
        ) from None
    try:
        report.swept = await sweep_and_report(
            engine, worker.name, state_dir, hold_s, report, via=transport.report_only()
        )
        if report.ok:
            deliveries = transport.deliveries()
            taken = 0
            while taken < max_new and (left := ends - keep_free_s - loop.time()) > 0:
                delivery = await _next(deliveries, min(IDLE_WAIT_S, left))
                if delivery is None:
                    break
                taken += 1
                report.record(await engine.handle(delivery))
        for never_started in await transport.stop_consuming():
            await engine.give_back(never_started, Reason.NEVER_STARTED)
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await transport.close()
    for problem in report.problems:
        _logger.error("The tick did not report or settle everything: %s", problem)
    return report


async def sweep_and_report(
    engine: Engine,
    service: str,
    state_dir: Path,
    hold_s: float,
    report: TickReport,
    *,
    via: Delivery,
) -> SweepReport:
    """Sweep ``state_dir`` in a thread; each result goes out through the engine on this loop.

    ``via`` is the delivery that carries the reports (and settles nothing); ``hold_s`` bounds
    each report's hold, in seconds. A result the broker did not take stops the sweep, its
    file kept for the next tick (``report`` says so).

    Returns:
        What went out, also when the sweep stopped half-way.
    """
    loop = asyncio.get_running_loop()

    sent = SweepReport()  # what went out, kept if the sweep stops half-way

    def send(correlation_id: str, result: dict[str, Any]) -> None:
        expired = bool(result.get("expired"))
        reason = Reason.SWEPT_EXPIRY if expired else Reason.SWEPT_RESULT
        future = asyncio.run_coroutine_threadsafe(
            _report_swept(engine, service, correlation_id, result, reason, via=via), loop
        )
        settlement = future.result(timeout=hold_s + CLOSE_TIMEOUT_S)
        if settlement.outcome not in _SETTLED_WELL:
            report.record(settlement)
            raise _ResultNotReported(correlation_id)
        (sent.expired if expired else sent.delivered).append(correlation_id)

    # A marker that cannot be read is given the task timeout, from its last write, to finish.
    timeout_s = engine.task_timeout_s
    try:
        return await asyncio.to_thread(sweep, state_dir, send, fallback_deadline_s=timeout_s)
    except _ResultNotReported:
        return sent
    except Exception as exc:  # the state directory failed under the sweep: say so, go no further
        report.problems.append(f"the sweep stopped ({type(exc).__name__}: {exc})")
        return sent


async def _next(deliveries: AsyncIterator[Delivery], wait_s: float) -> Delivery | None:
    try:
        async with asyncio.timeout(wait_s):  # in this task: no task of its own per delivery
            return await anext(deliveries)
    except (TimeoutError, StopAsyncIteration):
        return None
