"""Who a handler call works for, and the context it gets (:mod:`.call` runs it)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from async_task_api_worker.context import (
    ProgressDropReason,
    ProgressSink,
    ProgressUpdate,
    SyncTaskContext,
    TaskContext,
)
from async_task_api_worker.definition import HandlerKind, TaskDefinition
from async_task_api_worker.observability import tracing
from async_task_api_worker.ports import CancelToken
from async_task_api_worker.protocol.envelope import InputRef

__all__ = ["DISCARD_PROGRESS", "TaskFields", "context_for", "fields_of"]


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

    For handing the call to another process, which continues the trace (``call.call_here``).
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
