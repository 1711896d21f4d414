"""Runs long, with two grandchildren tagged by the request's marker."""

import subprocess
import sys
import time

from pydantic import ConfigDict

from async_task_api_worker.sfn import NonEmptyStr, WorkerRequest, run_handler


class LongRequest(WorkerRequest):
    model_config = ConfigDict(frozen=True, extra="ignore")

    case: NonEmptyStr
    marker: str


def handle(request: LongRequest) -> dict[str, object]:
    for _ in range(2):
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", request.marker],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    time.sleep(300)
    return {"done": True}


if __name__ == "__main__":
    run_handler(LongRequest, handle)
