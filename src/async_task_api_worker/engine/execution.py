"""Running one handler call, stoppable by a shutdown, a delivery cancel or a lost report."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from async_task_api_worker.conclusion import Conclusion, HandedOff, LeaseLapsed
from async_task_api_worker.context import bind_task_fields
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.engine.verdict import GivenBack, Stopped
from async_task_api_worker.engine.waits import CutShort, until_cut
from async_task_api_worker.ports import CancelToken, ExecutionRequest, Executor, Outcome

__all__ = ["StartedNotConfirmed", "StopSignal", "Stopped", "confirming", "execute"]

#: A run whose lease lapsed: given back uncounted, nothing reported (withdrawn instead where the
#: transport has withdrawn the delivery already: ``engine.settlement``).
_LAPSED = GivenBack(Outcome.CANCELLED, Reason.LEASE_LAPSED)


class StartedNotConfirmed(Exception):
    """``ExecutionRequest.started`` gave up: the executor hands nothing off (``publish_failed``)."""


def confirming(publish: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[None]]:
    """``ExecutionRequest.started`` for an executor whose work outlives the delivery.

    It publishes ``started`` through ``publish`` and returns once the broker confirmed it.

    Raises:
        StartedNotConfirmed: it gave up (the report's own ``gave_up`` says why).
    """

    async def started() -> None:
        if not await publish():
            raise StartedNotConfirmed

    return started


class StopSignal:
    """How the runtime tells the engine that the process is shutting down.

    Attributes:
        draining: cancelled when the drain starts: a retry backoff stops waiting and the
            delivery is requeued at once.
        aborted: cancelled when the grace period is over: running handlers are stopped and
            their deliveries given back (requeued without counting an attempt, no report).
    """

    def __init__(self) -> None:
        self.draining = CancelToken()
        self.aborted = CancelToken()


async def execute(
    executor: Executor,
    request: ExecutionRequest,
    *,
    task_fields: Mapping[str, Any],
    stop: StopSignal,
    delivery_cancel: CancelToken,
    report_gave_up: CancelToken | None = None,
    client_cancel: CancelToken | None = None,
) -> Conclusion | HandedOff | Stopped | GivenBack:
    """Run ``request`` through ``executor`` and say how it ended.

    A shutdown abort, a delivery cancel, a report that gave up (``report_gave_up``: ``started``
    could not get out) or the task's client (``client_cancel``) stops the handler alone, and
    says so; a cancel of the caller's own task still propagates. A run whose lease lapsed
    (``conclusion.LeaseLapsed``) is given back, its conclusion void (``reason=lease_lapsed``).

    Raises:
        asyncio.CancelledError: the calling task itself was cancelled.
        Exception: the executor itself failed (it could not start a process, write a state
            file...): not the task's failure, so the engine gives the delivery back
            (``engine_error``) instead of reporting one.
    """
    stoppers: dict[CancelToken | None, Outcome] = {
        stop.aborted: Outcome.SHUTDOWN_REQUEUED,
        delivery_cancel: Outcome.CANCELLED,
    }
    if report_gave_up is not None:
        stoppers[report_gave_up] = Outcome.PUBLISH_FAILED
    if client_cancel is not None:
        stoppers[client_cancel] = Outcome.CANCELLED_BY_CLIENT
    # In this task, not one of its own: the handler's log records carry the task fields, and a
    # stop cancels the executor's await here (``engine.waits``).
    with bind_task_fields(task_fields):
        try:
            result = await until_cut(executor.execute(request), None, *stoppers)
        except StartedNotConfirmed:
            return Stopped(Outcome.PUBLISH_FAILED)
    if isinstance(result, CutShort):
        return Stopped(stoppers[result.by])
    if isinstance(result, LeaseLapsed):
        return _LAPSED
    return result
