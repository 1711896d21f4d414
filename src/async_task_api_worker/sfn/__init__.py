"""The Step Functions worker: SQS + ``waitForTaskToken``, heartbeats, ECS task protection.

Seed 000's framework, installed with the ``aws`` extra (``pip install
'async-task-api-worker[aws]'``; importing it without boto3 raises ``ImportError`` saying so).
The parent (:class:`Worker`) polls SQS and runs one subprocess per message; the subprocess
calls :func:`run_handler`. ``docs/sfn.md`` has the details.

Extraction note: this package imports nothing from the rest of ``async_task_api_worker`` but
the process group and output drain of the process executor
(``executors.process.group``, ``executors.process.output``); ``tests/unit/sfn`` checks it.
"""

from async_task_api_worker.sfn import _aws  # noqa: F401 - fails early without boto3
from async_task_api_worker.sfn.errors import (
    AbortedStaleTask,
    MalformedMessage,
    MalformedSubprocessOutput,
    SubprocessCrashError,
    SubprocessOutputTooLarge,
    SubprocessTimeoutError,
    UnknownSubprocessError,
)
from async_task_api_worker.sfn.handler import run_handler
from async_task_api_worker.sfn.request import ErrorOutput, NonEmptyStr, WorkerRequest
from async_task_api_worker.sfn.worker import Worker

__all__ = [
    "AbortedStaleTask",
    "ErrorOutput",
    "MalformedMessage",
    "MalformedSubprocessOutput",
    "NonEmptyStr",
    "SubprocessCrashError",
    "SubprocessOutputTooLarge",
    "SubprocessTimeoutError",
    "UnknownSubprocessError",
    "Worker",
    "WorkerRequest",
    "run_handler",
]
