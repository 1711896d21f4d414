"""Contexts for calling a handler directly in a test, and a recorder of its progress."""

from __future__ import annotations

import threading
from typing import Any

from async_task_api_worker.context import (
    ProgressDropReason,
    ProgressUpdate,
    SyncTaskContext,
    TaskContext,
)
from async_task_api_worker.protocol.envelope import InputRef

__all__ = ["ProgressRecorder", "make_sync_task_context", "make_task_context"]


class ProgressRecorder:
    """Collects what a handler reports through its context, unthrottled.

    Attributes:
        updates: every accepted update, in order (``fraction`` and ``payload``).
        dropped: the reason of every refused update (``backwards``, ``out_of_range``...).
    """

    def __init__(self) -> None:
        self.updates: list[ProgressUpdate] = []
        self.dropped: list[ProgressDropReason] = []
        self._lock = threading.Lock()

    def offer(self, update: ProgressUpdate) -> None:
        """Record an accepted update."""
        with self._lock:
            self.updates.append(update)

    def drop(self, reason: ProgressDropReason) -> None:
        """Record a refused update."""
        with self._lock:
            self.dropped.append(reason)


def _fields(
    *,
    recorder: ProgressRecorder | None,
    task_id: str,
    client_id: str,
    service: str,
    attempt: int,
    delivery_limit: int,
    input_refs: tuple[InputRef, ...],
) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "client_id": client_id,
        "service": service,
        "attempt": attempt,
        "delivery_limit": delivery_limit,
        "input_refs": tuple(input_refs),
        "sink": recorder if recorder is not None else ProgressRecorder(),
    }


def make_task_context(
    recorder: ProgressRecorder | None = None,
    *,
    task_id: str = "test-task",
    client_id: str = "test-client",
    service: str = "test-service",
    attempt: int = 1,
    delivery_limit: int = 5,
    input_refs: tuple[InputRef, ...] = (),
) -> TaskContext:
    """Build the context of an ``async def`` handler, to call the handler directly.

    Progress goes to ``recorder`` (checked as in production, not throttled).
    """
    return TaskContext(
        **_fields(
            recorder=recorder,
            task_id=task_id,
            client_id=client_id,
            service=service,
            attempt=attempt,
            delivery_limit=delivery_limit,
            input_refs=input_refs,
        )
    )


def make_sync_task_context(
    recorder: ProgressRecorder | None = None,
    *,
    task_id: str = "test-task",
    client_id: str = "test-client",
    service: str = "test-service",
    attempt: int = 1,
    delivery_limit: int = 5,
    input_refs: tuple[InputRef, ...] = (),
) -> SyncTaskContext:
    """Build the context of a ``def`` handler, to call the handler directly.

    Progress goes to ``recorder`` in the calling thread (checked, not throttled).
    """
    return SyncTaskContext(
        **_fields(
            recorder=recorder,
            task_id=task_id,
            client_id=client_id,
            service=service,
            attempt=attempt,
            delivery_limit=delivery_limit,
            input_refs=input_refs,
        ),
    )
