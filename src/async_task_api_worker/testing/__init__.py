"""Test a worker without a broker: the real engine on an in-memory transport.

See docs/testing.md, "Testing your worker".
"""

from async_task_api_worker.testing.context import (
    ProgressRecorder,
    make_sync_task_context,
    make_task_context,
)
from async_task_api_worker.testing.harness import Outcome, TaskRun, WorkerHarness

__all__ = [
    "Outcome",
    "ProgressRecorder",
    "TaskRun",
    "WorkerHarness",
    "make_sync_task_context",
    "make_task_context",
]
