"""Running one handler call as its own task, stoppable by a shutdown or a delivery cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from async_task_api_worker.conclusion import ExecutionResult
from async_task_api_worker.context import bind_task_fields
from async_task_api_worker.ports import CancelToken, ExecutionRequest, Executor, Outcome

__all__ = ["StopSignal", "Stopped", "execute"]


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


@dataclass(frozen=True, slots=True)
class Stopped:
    """How the handler was stopped from outside.

    ``shutdown_requeued``, ``cancelled``, or ``publish_failed`` (``started`` could not get out).
    """

    outcome: Outcome


async def execute(
    executor: Executor,
    request: ExecutionRequest,
    *,
    task_fields: Mapping[str, Any],
    stop: StopSignal,
    delivery_cancel: CancelToken,
    report_gave_up: CancelToken | None = None,
) -> ExecutionResult | Stopped:
    """Run ``request`` through ``executor`` and say how it ended.

    The call runs as its own task, so that a shutdown abort, a delivery cancel or a report
    that gave up (``report_gave_up``: ``started`` could not get out) stops the handler alone;
    a cancel of the caller's own task still propagates.

    Raises:
        asyncio.CancelledError: the calling task itself was cancelled.
        Exception: the executor itself failed (it could not start a process, write a state
            file...): not the task's failure, so the engine gives the delivery back
            (``engine_error``) instead of reporting one.
    """
    with bind_task_fields(task_fields):
        # The task copies the context here, so the handler's log records carry the fields.
        execution = asyncio.ensure_future(executor.execute(request))
    stopped_by: list[Outcome] = []

    def stopper(outcome: Outcome) -> Callable[[], None]:
        def stop_execution() -> None:
            if not execution.done():
                stopped_by.append(outcome)
                execution.cancel()

        return stop_execution

    remove_abort = stop.aborted.add_callback(stopper(Outcome.SHUTDOWN_REQUEUED))
    remove_cancel = delivery_cancel.add_callback(stopper(Outcome.CANCELLED))
    remove_gave_up = (
        report_gave_up.add_callback(stopper(Outcome.PUBLISH_FAILED))
        if report_gave_up is not None
        else None
    )
    try:
        return await execution
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if stopped_by and not (current is not None and current.cancelling()):
            return Stopped(stopped_by[0])
        raise
    finally:
        remove_abort()
        remove_cancel()
        if remove_gave_up is not None:
            remove_gave_up()
        if not execution.done():
            execution.cancel()
