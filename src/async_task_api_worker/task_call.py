"""The task call: the handler's context, the call, and its conclusion, for every face.

One handler call is the same wherever it runs: on the event loop (the inline executor), in a
thread (the thread executor), in a process-isolated child, in a detached worker or in a Step
Functions child. Each of them builds the context, calls the handler and concludes here, so that
the same handler raising the same exception is reported with the same code and message
whatever face runs it (docs/architecture.md, "The task call"):

- a return value is validated by the task's output model and dumped as JSON
  (``INVALID_RESULT`` when it fails);
- a well-formed ``FatalError`` or ``RetryableError`` gives its code and message;
- a deadline passed gives ``TASK_TIMEOUT``;
- an ``IsolatedTaskError`` (a child that died, a broken channel) gives its own code;
- anything else gives ``INTERNAL_ERROR``, its text never published: the log gets its type and
  frames (``observability.redaction``).

The conclusion's value types and their JSON shape are in :mod:`async_task_api_worker.conclusion`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, TypeAdapter, ValidationError

from async_task_api_worker.conclusion import Conclusion, Failure, Response
from async_task_api_worker.context import (
    ProgressDropReason,
    ProgressSink,
    ProgressUpdate,
    SyncTaskContext,
    TaskContext,
    bind_task_fields,
)
from async_task_api_worker.definition import HandlerKind, TaskDefinition
from async_task_api_worker.errors import (
    IsolatedTaskError,
    ReportEncodeError,
    TaskCancelledError,
    TaskError,
    TaskTimeoutError,
    is_well_formed,
)
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.ports import CancelToken
from async_task_api_worker.protocol.cancel import TASK_CANCELLED_MESSAGE
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.protocol.envelope import (
    InputRef,
    describe_validation_error,
    model_field_names,
)

__all__ = [
    "CANCELLED_BY_CLIENT",
    "DISCARD_PROGRESS",
    "TaskFields",
    "call_here",
    "conclude_error",
    "conclude_value",
    "context_for",
    "fields_of",
    "invalid_input",
    "timed_out",
    "unreportable",
    "validate_input",
]

_logger = logging.getLogger("async_task_api_worker.engine")


class _DiscardProgress:
    """The sink of a call with nobody to tell its progress to (a detached worker)."""

    def offer(self, update: ProgressUpdate) -> None:
        return None

    def drop(self, reason: ProgressDropReason) -> None:
        return None


#: Progress updates of a call with nobody to tell them to are dropped here.
DISCARD_PROGRESS: ProgressSink = _DiscardProgress()


@dataclass(frozen=True, slots=True)
class TaskFields:
    """Who a handler call works for: what its context exposes and its log lines carry.

    Attributes:
        task_id: the envelope's task id.
        client_id: the envelope's client id.
        service: the worker's service name.
        attempt: this delivery's attempt, from 1.
        delivery_limit: the attempts the task gets (under the queue's counting rule).
        input_refs: the envelope's input references.
        trace: the delivery's trace context (``traceparent``, ``tracestate``), which a child
            process continues (``observability.tracing``); empty when nothing is traced.
    """

    task_id: str
    client_id: str
    service: str
    attempt: int
    delivery_limit: int
    input_refs: tuple[InputRef, ...] = ()
    trace: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def log_fields(self) -> dict[str, Any]:
        """The fields every log line of the task carries."""
        return {"task_id": self.task_id, "service": self.service, "attempt": self.attempt}

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object (for a child process or a detached worker)."""
        return {
            "task_id": self.task_id,
            "client_id": self.client_id,
            "service": self.service,
            "attempt": self.attempt,
            "delivery_limit": self.delivery_limit,
            "input_refs": [ref.model_dump(mode="json") for ref in self.input_refs],
            **({"trace": dict(self.trace)} if self.trace else {}),
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> TaskFields:
        """Read the fields back.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            return cls(
                task_id=str(document["task_id"]),
                client_id=str(document["client_id"]),
                service=str(document["service"]),
                attempt=int(document["attempt"]),
                delivery_limit=int(document["delivery_limit"]),
                input_refs=tuple(
                    InputRef.model_validate(ref) for ref in document.get("input_refs") or ()
                ),
                trace={
                    str(name): str(value)
                    for name, value in (document.get("trace") or {}).items()
                    if name in tracing.TRACE_HEADERS
                },
            )
        except (KeyError, TypeError, AttributeError, ValidationError) as exc:
            raise ValueError(f"not the fields of a task ({type(exc).__name__})") from exc


# The fields a context exposes under the same names (all but the trace context).
_FIELD_NAMES: Final = tuple(
    field.name for field in dataclasses.fields(TaskFields) if field.name != "trace"
)


def fields_of(context: TaskContext | SyncTaskContext) -> TaskFields:
    """The fields a context was built from, and the current trace context.

    For handing the call to another process, which continues the trace (:func:`call_here`).
    """
    return TaskFields(
        **{name: getattr(context, name) for name in _FIELD_NAMES}, trace=tracing.carrier()
    )


def context_for(
    task: TaskDefinition,
    fields: TaskFields,
    sink: ProgressSink,
    loop: asyncio.AbstractEventLoop | None = None,
    cancel: CancelToken | None = None,
) -> TaskContext | SyncTaskContext:
    """The context the handler gets: ``TaskContext`` for ``async def``, else ``SyncTaskContext``.

    ``sink`` takes its progress updates; ``loop`` is where the sink lives (``None``: the
    caller's thread, as in a child process); ``cancel`` is the client's cancel of this run
    (``ctx.cancelled``).
    """
    context_type = TaskContext if task.kind is HandlerKind.ASYNC else SyncTaskContext
    return context_type(
        **{name: getattr(fields, name) for name in _FIELD_NAMES},
        sink=sink,
        loop=loop,
        cancel=cancel,
    )


@functools.cache
def _output_adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    return TypeAdapter(model)


@functools.cache
def _input_names(model: type[BaseModel]) -> frozenset[str]:
    return model_field_names(model)


def invalid_input(model: type[BaseModel], exc: ValidationError) -> Failure:
    """``INVALID_INPUT`` for input that failed ``model``: field names and error types only.

    A name the model does not declare (the client's own key) is masked, as the envelope's rule
    says (docs/protocol.md, "Payloads and secrets").
    """
    why = describe_validation_error(exc, known_names=_input_names(model))
    return Failure(ErrorCode.INVALID_INPUT, f"invalid input: {why}")


def validate_input(task: TaskDefinition, raw_input: Mapping[str, Any]) -> BaseModel | Failure:
    """The task's input model built from ``raw_input``, or its ``INVALID_INPUT`` failure."""
    try:
        return task.input_model.model_validate(raw_input)
    except ValidationError as exc:
        return invalid_input(task.input_model, exc)


def conclude_value(model: type[BaseModel], value: Any) -> Response | Failure:
    """What the handler returned, as the task's output ``model`` dumped to JSON.

    Serialized as the declared model: a subclass's extra fields are not published, and a value
    of the wrong type (``model_construct``, a field mutated after validation) is an
    ``INVALID_RESULT``, not a warning.
    """
    try:
        validated = value if isinstance(value, model) else model.model_validate(value)
        response = _output_adapter(model).dump_python(validated, mode="json", warnings="error")
    except ValidationError as exc:
        why = describe_validation_error(exc)
        return Failure(
            ErrorCode.INVALID_RESULT, f"the handler's result failed its output model: {why}"
        )
    except Exception as exc:  # a serializer of the user's model failed
        return Failure(
            ErrorCode.INVALID_RESULT,
            f"the handler's result could not be serialized ({exception_type_name(exc)})",
        )
    if not isinstance(response, dict):  # a RootModel of a list: not a JSON object
        return Failure(ErrorCode.INVALID_RESULT, "the handler's result is not a JSON object")
    return Response(response)


#: The conclusion of a task its client cancelled (docs/protocol.md, "Cancelling a task").
CANCELLED_BY_CLIENT: Final = Failure(ErrorCode.TASK_CANCELLED, TASK_CANCELLED_MESSAGE)


def timed_out(timeout_s: float) -> Failure:
    """``TASK_TIMEOUT`` for a handler that ran past ``timeout_s`` seconds (logged as a warning)."""
    _logger.warning("Task handler ran past its timeout of %g s", timeout_s)
    return Failure(ErrorCode.TASK_TIMEOUT, f"the task did not finish within {timeout_s:g} s")


def conclude_error(exc: BaseException, *, timeout_s: float | None = None) -> Failure:
    """What a raised exception means for the task (see the module); logs what it must.

    Args:
        exc: what the handler (or its executor) raised.
        timeout_s: the task's timeout, for the message of a ``TaskTimeoutError``.
    """
    if isinstance(exc, TaskError) and is_well_formed(exc):
        delay = getattr(exc, "retry_delay_s", None)
        return Failure(exc.task_code, exc.message, retryable=exc.retryable, retry_delay_s=delay)
    if isinstance(exc, TaskTimeoutError):
        return timed_out(timeout_s if timeout_s is not None else float("nan"))
    if isinstance(exc, TaskCancelledError):
        return CANCELLED_BY_CLIENT
    if isinstance(exc, IsolatedTaskError):
        _logger.error("The task's process ended without a result: %s", exc.message)
        return Failure(exc.task_code, exc.message)
    _logger.error(
        "Task handler raised %s; reported as INTERNAL_ERROR without its message\n%s",
        exception_type_name(exc),
        safe_traceback(exc),
    )
    return Failure(ErrorCode.INTERNAL_ERROR, "the task failed with an internal error")


def unreportable(exc: ReportEncodeError) -> Failure:
    """The failure of a response that cannot go out as a report (too large, not JSON)."""
    code = ErrorCode.RESULT_TOO_LARGE if exc.too_large else ErrorCode.INVALID_RESULT
    return Failure(code, f"the handler's result cannot be reported: {exc}")


def call_here(
    task: TaskDefinition,
    raw_input: Mapping[str, Any],
    fields: TaskFields,
    sink: ProgressSink,
    *,
    on_exception: Callable[[BaseException], Failure | None] | None = None,
) -> Conclusion:
    """Run the task's handler in this thread and conclude: what a child process does.

    The input is validated again here (a child trusts only what it checks), an ``async def``
    handler runs on a loop of its own, and whatever the handler raises, ``SystemExit`` and
    ``KeyboardInterrupt`` included, becomes a conclusion. The task's fields are bound for the
    handler's log lines, and the trace it was handed continues here (the handler's spans are
    children of the delivery's).

    Args:
        task: the task whose handler runs.
        raw_input: the envelope's ``input``.
        fields: who the call works for.
        sink: takes the handler's progress updates.
        on_exception: asked first what an exception means (a process's own limits); ``None``
            leaves it to :func:`conclude_error`.
    """
    with bind_task_fields(fields.log_fields), tracing.continued(fields.trace):
        task_input = validate_input(task, raw_input)
        if isinstance(task_input, Failure):
            return task_input
        context = context_for(task, fields, sink)
        try:
            if task.kind is HandlerKind.ASYNC:
                value = asyncio.run(task.handler(task_input, context))
            else:
                value = task.handler(task_input, context)
        except BaseException as exc:  # the caller's process decides what ends it, not this
            own = on_exception(exc) if on_exception is not None else None
            return own if own is not None else conclude_error(exc)
        return conclude_value(task.output_model, value)
