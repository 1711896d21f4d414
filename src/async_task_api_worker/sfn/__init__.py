"""The Step Functions worker: SQS + ``waitForTaskToken``, heartbeats, ECS task protection.

The Step Functions worker's own API, with the SDK's ``aws`` extra (boto3), installed from where
the SDK was installed (a clone: ``pip install '/path/to/async-task-api-worker[aws]'``);
importing it without boto3 raises ``ImportError`` saying so. The parent (:class:`Worker`)
runs on the engine with the SQS + Step Functions transport and one subprocess per message; the
subprocess calls :func:`run_handler`. ``docs/sfn.md`` has the details.
"""

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
from async_task_api_worker.transports.sqs_sfn import aws  # noqa: F401 - fails early without boto3

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
