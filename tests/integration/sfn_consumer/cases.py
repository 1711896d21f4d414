"""Subprocesses for the failure taxonomy tests: one module per behaviour, picked by ``case``."""

from __future__ import annotations

import logging
import os

from pydantic import ConfigDict

from async_task_api_worker.sfn import (
    AbortedStaleTask,
    NonEmptyStr,
    SubprocessCrashError,
    Worker,
    WorkerRequest,
)


class CaseRequest(WorkerRequest):
    model_config = ConfigDict(frozen=True, extra="ignore")

    case: NonEmptyStr


class AssetRejected(Exception):
    """A registered domain exception."""


def select(request: CaseRequest) -> str:
    return f"tests.integration.sfn_consumer.case_{request.case}"


def make_worker() -> Worker[CaseRequest]:
    return Worker(
        request_schema=CaseRequest,
        select_subprocess_module=select,
        sqs_queue_url=os.environ["QUEUE_URL"],
        heartbeat_interval_seconds=float(os.environ.get("HEARTBEAT_S", "1")),
        message_processing_timeout_minutes=float(os.environ.get("TIMEOUT_MIN", "2")),
        exception_levels={
            AssetRejected: logging.WARNING,
            SubprocessCrashError: logging.WARNING,
            AbortedStaleTask: logging.INFO,
        },
        poll_wait_seconds=1,
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    make_worker().run()
