"""The call itself: the handler called, under its deadline, and concluded.

Executors decide only where the call runs: :func:`call_async` is the handler's own task on the
event loop, :func:`call_sync` runs in a thread, :func:`call_in_time` holds either to its
deadline, and :func:`call_here` is the whole call in a child process (a process-isolated task, a
detached worker, a Step Functions child); :func:`call_function` calls a detached worker's plain
function (seed 002). Whatever the handler raises, ``SystemExit`` and
``KeyboardInterrupt`` included, becomes a conclusion here (:mod:`.conclude`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from async_task_api_worker.conclusion import Conclusion, Failure, Response
from async_task_api_worker.context import ProgressSink, bind_task_fields
from async_task_api_worker.definition import HandlerKind, TaskDefinition
from async_task_api_worker.observability import tracing
from async_task_api_worker.ports import ExecutionRequest
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.task_call import error_hooks
from async_task_api_worker.task_call.conclude import (
    conclude_error,
    conclude_value,
    timed_out,
    validate_input,
)
from async_task_api_worker.task_call.fields import TaskFields, context_for

__all__ = ["call_async", "call_function", "call_here", "call_in_time", "call_sync"]

_Conclude = Callable[[BaseException], Failure]


def call_sync(request: ExecutionRequest, conclude: _Conclude = conclude_error) -> Conclusion:
    """Call a ``def`` handler in this thread and conclude it; never raises.

    Args:
        request: the call.
        conclude: what an exception means (:func:`~.conclude.conclude_error`).
    """
    try:
        value = request.handler(request.task_input, request.context)
    except BaseException as exc:  # the caller's thread or process decides what ends it
        return _concluded(request, conclude, exc)
    return conclude_value(request.output_model, value)


def _concluded(request: ExecutionRequest, conclude: _Conclude, exc: BaseException) -> Failure:
    """``conclude(exc)``; an ``INTERNAL_ERROR`` is also handed to the worker's error hooks."""
    failure = conclude(exc)
    if request.on_error and failure.code == ErrorCode.INTERNAL_ERROR:
        error_hooks.tell(request.on_error, exc, request.context)
    return failure


async def call_async(request: ExecutionRequest, conclude: _Conclude = conclude_error) -> Conclusion:
    """Await an ``async def`` handler and conclude it.

    A cancel the handler raises by itself (nobody cancelled its task) is its failure.

    Args:
        request: the call.
        conclude: what an exception means (:func:`~.conclude.conclude_error`).

    Raises:
        asyncio.CancelledError: the task running the call was cancelled.
    """
    try:
        value = await request.handler(request.task_input, request.context)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return _concluded(request, conclude, exc)
    except BaseException as exc:  # SystemExit would otherwise end the event loop, and the worker
        return _concluded(request, conclude, exc)
    return conclude_value(request.output_model, value)


async def call_in_time(
    call: asyncio.Future[Conclusion], timeout_s: float, stop: Callable[[], Awaitable[None]]
) -> Conclusion:
    """Await ``call`` (the handler's task, or its thread's future) until its deadline.

    Past the deadline the call is ``TASK_TIMEOUT`` whatever it does later; ``stop()`` then
    cancels or abandons it, as it does when the caller is cancelled.

    Args:
        call: the running call, concluding itself (:func:`call_async`, :func:`call_sync`).
        timeout_s: the deadline, in seconds from now.
        stop: ends or abandons the call (the executor's own way).

    Raises:
        asyncio.CancelledError: the caller was cancelled (the call stopped first).
    """
    try:
        done, _ = await asyncio.wait((call,), timeout=timeout_s)
    except asyncio.CancelledError:
        await stop()
        raise
    if not done:
        await stop()
        return timed_out(timeout_s)
    if call.cancelled():  # by something other than the SDK: the handler's doing
        return conclude_error(asyncio.CancelledError())
    return call.result()


def call_here(
    task: TaskDefinition,
    raw_input: Mapping[str, Any],
    fields: TaskFields,
    sink: ProgressSink,
    *,
    memory_limit_bytes: int | None = None,
    on_exception: Callable[[BaseException], object] | None = None,
) -> Conclusion:
    """Run the task's handler in this thread and conclude: what a child process does.

    The input is validated again here (a child trusts only what it checks), an ``async def``
    handler runs on a loop of its own, the task's fields are bound for the handler's log lines,
    and the trace it was handed continues here. The deadline is the parent's to keep.

    Args:
        task: the task whose handler runs.
        raw_input: the envelope's ``input``.
        fields: who the call works for.
        sink: takes the handler's progress updates.
        memory_limit_bytes: the process's memory limit, in bytes (a ``MemoryError`` under it is
            ``WORKER_CRASHED``).
        on_exception: told first of what the handler raised (a child frees its memory reserve).
    """

    def conclude(exc: BaseException) -> Failure:
        if on_exception is not None:
            on_exception(exc)
        return conclude_error(exc, memory_limit_bytes=memory_limit_bytes)

    with bind_task_fields(fields.log_fields), tracing.continued(fields.trace):
        task_input = validate_input(task, raw_input)
        if isinstance(task_input, Failure):
            return task_input
        request = ExecutionRequest(
            handler=task.handler,
            task_input=task_input,
            raw_input=raw_input,
            context=context_for(task, fields, sink),
            timeout_s=task.timeout_s,
            task_id=fields.task_id,
            output_model=task.output_model,
        )
        if task.kind is not HandlerKind.ASYNC:
            return call_sync(request, conclude)
        try:
            return asyncio.run(call_async(request, conclude))
        except BaseException as exc:  # a Ctrl-C cancels the loop's main task: still concluded
            return conclude(exc)


def call_function(function: Callable[[], Any]) -> Conclusion:
    """Call a plain function (seed 002's detached work: a JSON object out) and conclude it.

    A value that is not a ``dict`` of strict JSON is the function's failure, as is whatever it
    raises (:func:`~.conclude.conclude_error`).
    """
    try:
        response = function()
        if not isinstance(response, dict):
            raise TypeError(f"the handler returned {type(response).__name__}, not a dict")
        json.dumps(response, allow_nan=False)
    except BaseException as exc:  # a crash is a result too
        return conclude_error(exc)
    return Response(response)
