"""A process-isolated worker that answers with the trace context its child process sees."""

from __future__ import annotations

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, Worker
from async_task_api_worker.observability import tracing

traced = Worker("traced")


class Ask(BaseModel):
    pass


class Seen(BaseModel):
    trace_id: str
    parent_span_id: str
    pid: int


@traced.task(timeout=30, isolation="process")
def report_trace(task_input: Ask, ctx: SyncTaskContext) -> Seen:
    """Runs in a child process, which has no tracer provider: the context is what it was sent."""
    import os

    trace_id, span_id = tracing.current_ids() or ("", "")
    return Seen(trace_id=trace_id, parent_span_id=span_id, pid=os.getpid())
