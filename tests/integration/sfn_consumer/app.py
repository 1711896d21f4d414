"""Seed 000's consumer example, parent side: unchanged but for the imports and the queue URL."""

import logging
import os

from pydantic import ConfigDict

from async_task_api_worker.sfn import NonEmptyStr, SubprocessCrashError, Worker, WorkerRequest


class MyRequest(WorkerRequest):
    model_config = ConfigDict(frozen=True, extra="ignore")

    asset_upload_type: NonEmptyStr


class UnsupportedAssetUploadType(Exception):
    pass


def _select_subprocess_module(request: MyRequest) -> str:
    match request.asset_upload_type:
        case "atmos":
            return "tests.integration.sfn_consumer.atmos.validator"
        case _:
            raise UnsupportedAssetUploadType(f"unsupported: {request.asset_upload_type}")


def make_worker() -> Worker[MyRequest]:
    return Worker(
        request_schema=MyRequest,
        select_subprocess_module=_select_subprocess_module,
        sqs_queue_url=os.environ["QUEUE_URL"],
        heartbeat_interval_seconds=15.0,
        message_processing_timeout_minutes=30,
        exception_levels={
            UnsupportedAssetUploadType: logging.ERROR,
            SubprocessCrashError: logging.WARNING,
            # ... domain exceptions raised by handler ...
        },
    )


def main() -> None:
    make_worker().run()


if __name__ == "__main__":
    main()
