import hashlib
import os

from pydantic import ConfigDict

from async_task_api_worker.sfn import NonEmptyStr, WorkerRequest, run_handler


class EchoRequest(WorkerRequest):
    model_config = ConfigDict(frozen=True, extra="ignore")

    case: NonEmptyStr
    data: str = ""


def handle(request: EchoRequest) -> dict[str, object]:
    print("a print from the handler, kept off the result")
    os.write(1, b"and a raw write to fd 1\n")
    return {
        "sha256": hashlib.sha256(request.data.encode("utf-8")).hexdigest(),
        "chars": len(request.data),
        "via_file": "WORKER_REQUEST_FILE" in os.environ,
    }


if __name__ == "__main__":
    run_handler(EchoRequest, handle)
