"""Seed 000's consumer example, subprocess side: unchanged but for the import."""

from pydantic import BaseModel

from async_task_api_worker.sfn import NonEmptyStr, WorkerRequest, run_handler


class MyDomainRequest(WorkerRequest):
    asset_upload_type: NonEmptyStr
    bucket: NonEmptyStr
    key: NonEmptyStr


class MyDomainResult(BaseModel):
    is_valid: bool


def _handle(request: MyDomainRequest) -> MyDomainResult:
    # ... domain work ...
    return MyDomainResult(is_valid=True)


def main() -> None:
    run_handler(MyDomainRequest, _handle)


if __name__ == "__main__":
    main()
